// The fix stage's one backup rule (GuestSession.backup), on a real scratch disk in a real appliance: the original
// goes into /ferry-backup/<path> (a root-only tree), never beside the file, where a directory read whole would take
// it for configuration; a file backed up twice keeps what it was first.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { backupPath, GuestSession } from '../../domain/converter/guestfs';

describe('guest backups: one root-only tree, the first copy kept (libguestfs) @vm', function () {
  this.timeout(300_000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-backup-test-'));
  let g: GuestSession;
  const IFCFG = '/etc/sysconfig/network-scripts/ifcfg-ens192';

  before(async () => {
    const disk = path.join(dir, 'scratch.raw');
    execFileSync('qemu-img', ['create', '-q', '-f', 'raw', disk, '64M']);
    g = await GuestSession.open([{ path: disk, format: 'raw' }]);
    await g.cmd('mkfs', 'ext4', '/dev/sda');
    await g.cmd('mount', '/dev/sda', '/');
    await g.cmd('mkdir-p', path.posix.dirname(IFCFG));
    await g.writeFile(IFCFG, 'DEVICE=ens192\nONBOOT=yes\n');
    await g.cmd('chmod', '0640', IFCFG);
  });
  after(async () => {
    await g?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('keeps the original under /ferry-backup with its mode, leaves nothing in the directory read whole, and a second backup keeps the first', async () => {
    const first = await g.backup(IFCFG);
    expect(first).to.equal(`/ferry-backup${IFCFG}`).and.to.equal(backupPath(IFCFG));
    await g.writeFile(IFCFG, 'DEVICE=enp1s0\nONBOOT=yes\n');
    // The same file edited again (two repairs touching it, or Ferry run twice on one disk).
    expect(await g.backup(IFCFG)).to.equal(first);
    await g.writeFile(IFCFG, 'DEVICE=enp1s0\nONBOOT=no\n');

    expect(await g.read(first)).to.equal('DEVICE=ens192\nONBOOT=yes\n');
    expect((await g.stat(first)).mode & 0o7777).to.equal(0o640);
    expect((await g.stat('/ferry-backup')).mode & 0o7777).to.equal(0o700);
    // initscripts and NetworkManager read every ifcfg-* in this directory: only the file itself is there.
    expect(g.lines(await g.cmd('ls', path.posix.dirname(IFCFG)))).to.deep.equal(['ifcfg-ens192']);
  });
});
