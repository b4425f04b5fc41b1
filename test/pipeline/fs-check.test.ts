// The file system checks around the repair (domain/converter/fs-check.ts, issue 35 item 4), on one real disk: a
// clean guest is checked before and after and stays mounted; a damaged file system the repair would write on is
// refused by name before any change; damage found after the repair fails it.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { GuestSession } from '../../domain/converter/guestfs';
import { fixGuest } from '../../domain/converter/guest';
import { devicesToCheck, RECHECK_FILESYSTEMS } from '../../domain/converter/fs-check';
import { ConverterError } from '../../domain/converter/errors';
import type { FixAction, FixOptions, FixResult, GuestInfo } from '../../domain/converter/types';
import type { FixRun } from '../../domain/converter/steps';

const info = (mountpoints: Record<string, string>, filesystems: Record<string, string>): GuestInfo => ({
  os: 'linux', distro: 'debian', root_device: mountpoints['/'], mountpoints, filesystems, lvm: false, kernels: [], hypervisor_tools: [], package_format: 'deb',
});

describe('file system checks: which file systems', () => {
  it('those the repair writes on, once each (a btrfs subvolume by its file system), with a checker', () => {
    const i = info({ '/': 'btrfsvol:/dev/sda1/@', '/home': 'btrfsvol:/dev/sda1/@home', '/boot': '/dev/sda2', '/boot/efi': '/dev/sda3', '/srv': '/dev/sdb1', '/var': '/dev/sdb2' },
      { '/dev/sda1': 'btrfs', 'btrfsvol:/dev/sda1/@': 'btrfs', '/dev/sda2': 'ext4', '/dev/sda3': 'vfat', '/dev/sdb1': 'xfs', '/dev/sdb2': 'jfs' });
    expect(devicesToCheck(i)).to.deep.equal([{ device: '/dev/sda1', type: 'btrfs' }, { device: '/dev/sda2', type: 'ext4' }, { device: '/dev/sda3', type: 'vfat' }]);
  });
});

describe('file system checks before and after the repair, on one real disk @vm', function () {
  this.timeout(20 * 60 * 1000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-fs-check-'));
  const FSTAB = '/dev/sda1 / ext4 defaults 0 1\n/dev/sda2 /boot xfs defaults 0 2\n';
  const guest = info({ '/': '/dev/sda1', '/boot': '/dev/sda2' }, { '/dev/sda1': 'ext4', '/dev/sda2': 'xfs' });
  const options = { fstab_mode: 'stabilize-all', dry_run: false, backup: true, regen_initramfs: false, update_grub: false } as FixOptions;
  let s: GuestSession;

  before(async () => {
    const disk = path.join(dir, 'disk.raw');
    execFileSync('qemu-img', ['create', '-q', '-f', 'raw', disk, '640M']);
    s = await GuestSession.open([{ path: disk, format: 'raw' }]);
    await s.cmd('part-init', '/dev/sda', 'mbr');
    await s.cmd('part-add', '/dev/sda', 'p', '2048', '206847');
    await s.cmd('part-add', '/dev/sda', 'p', '206848', '-2048');
    await s.cmd('mkfs', 'ext4', '/dev/sda1');
    await s.cmd('mkfs', 'xfs', '/dev/sda2');
    await s.cmd('mount', '/dev/sda1', '/');
    await s.cmd('mkdir-p', '/etc');
    await s.cmd('mkdir-p', '/boot');
    await s.writeFile('/etc/fstab', FSTAB);
    await s.cmd('mount', '/dev/sda2', '/boot');
  });
  after(async () => { await s?.close(); rmSync(dir, { recursive: true, force: true }); });

  it('a clean guest: / and /boot checked before any change and after the last, the guest left mounted', async () => {
    const r = await fixGuest(s, guest, options, () => undefined); // the repair's log lines are not what this test checks
    const acts = r.actions.filter((a) => /check_filesystems/.test(a.action)).map((a) => [a.action, a.status, a.detail]);
    expect(acts).to.deep.equal([
      ['check_filesystems', 'done', 'clean: /dev/sda1 (ext4), /dev/sda2 (xfs)'],
      ['recheck_filesystems', 'done', 'clean after the repair: /dev/sda1 (ext4), /dev/sda2 (xfs)'],
    ]);
    expect(r.steps.indexOf('check_filesystems')).to.be.below(r.steps.indexOf('fstab'));
    expect(r.steps.at(-1)).to.equal('recheck_filesystems');
    expect(await s.read('/etc/fstab'), 'mounted again, with the repair in it').to.match(/^UUID=/);
    expect(await s.isDir('/boot'), '/boot mounted again').to.equal(true);
  });

  it('damage on /boot: refused by name before any change, as a guest fault; after a repair, it fails the repair', async () => {
    const before = await s.read('/etc/fstab');
    await s.cmd('umount-all');
    // xfs's superblock 0 keeps the geometry; bytes over its start break the first AG's header checks.
    await s.cmd('pwrite-device', '/dev/sda2', 'x'.repeat(100), '512');
    await s.cmd('mount', '/dev/sda1', '/');
    const e = await fixGuest(s, guest, options, () => undefined).then(() => undefined, (x: unknown) => x);
    expect(e).to.be.instanceOf(ConverterError);
    expect(e).to.include({ step: 'check_filesystems', retryable: false, fault: 'guest' });
    expect((e as Error).message).to.match(/^the file system check found damage: \/dev\/sda2 \(xfs\): xfs_repair -n found corruption; .*nothing in the source was changed$/);
    expect(await s.read('/etc/fstab'), 'nothing written').to.equal(before);

    const actions: FixAction[] = [];
    await RECHECK_FILESYSTEMS.run({ g: s, info: guest, o: options, r: { modified: true } as FixResult, act: (a: FixAction) => { actions.push(a); } } as unknown as FixRun);
    expect(actions.map((a) => [a.status, a.detail])).to.deep.equal([['failed', '/dev/sda2 (xfs) after the repair: xfs_repair -n found corruption']]);
  });
});
