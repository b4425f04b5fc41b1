// The btrfs Debian 12 guest (test/fixtures/debian-guest.ts 'btrfs': one btrfs file system on /dev/sda1 with the
// subvolumes @ as / and @home as /home, both named by device with subvol= in fstab, rootflags=subvol=@ from GRUB),
// issue 20 items 1 and 4:
// - the source boots on SATA and prints its marker on ens192 with / and /home mounted;
//   (a property of the cached fixture: booted once per fixture build, its record re-checked after,
//   test/fixtures/source-proof.ts)
// - `ferry-convert` (every repair, virt_test with the same marker) makes an output that boots on virtio-blk with a
//   virtio NIC, both subvolumes mounted;
// - read back: fstab names the file system by UUID with each `subvol=` kept as it was, grub.cfg boots root=UUID
//   with rootflags=subvol=@, the source VMDK is byte-identical.
// That this guest's MODULES=dep initramfs has no virtio is checked by its build (btrfs.sh), as for plain. Serial
// logs of a failed check stay in test/artifacts/guest-btrfs-*.log.
import { expect } from 'chai';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { sha256File } from '../../shared/qemu';
import { GuestSession } from '../../shared/converter/guestfs';
import { kvmNicName } from '../../shared/converter/nic-names';
import { ensureDebianGuest } from '../fixtures/debian-guest';
import { asOnVmware, provedSourceBoot } from '../fixtures/source-proof';
import { keepOnFailure } from '../helpers/boot-logs';
import { ferryConvert } from '../helpers/procs';
import type { PipelineReport } from '../../shared/converter/stages/report';
import type { FixAction } from '../../shared/converter/types';

const BOOT_TIMEOUT = 600;

describe('Ferry on the btrfs Debian 12 guest: subvolumes kept, the output boots on virtio', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the fixtures first
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guest-btrfs-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('the source boots on SATA; ferry-convert\'s output boots on virtio with / and /home on their subvolumes', async () => {
    const g = await ensureDebianGuest('btrfs');
    const before = await sha256File(g.vmdk);
    const ready = new RegExp(`${g.ready.source} mounts=/,/home`);
    const out = path.join(dir, 'out');
    mkdirSync(out);
    const cfg = path.join(out, 'ferry.yaml');
    writeFileSync(cfg, yaml.dump({
      command: 'local', vmdk: g.vmdk, output_dir: out, to_output: 'btrfs.qcow2', fstab_mode: 'stabilize-all', update_grub: true, regen_initramfs: true,
      remove_source_hv_tools: true, virt_test: true, virt_test_expect: ready.source, virt_test_timeout: BOOT_TIMEOUT, memory: 1024,
    }));
    // The source's boots first (recorded: nothing to boot), then Ferry's: one emulated VM at a time.
    await provedSourceBoot(g, 'sata', asOnVmware(g, ready), (r) => {
      expect(r, 'the source on SATA').to.include({ status: 'passed' });
      expect(ready.exec(r.matched!)![1]).to.equal(g.vmwareNic);
    });
    const cli = await ferryConvert(['--config', cfg]);

    const report = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as PipelineReport;
    keepOnFailure('guest-btrfs-output', report.test_boot?.console_log ?? '', () => {
      expect(report.test_boot, 'the output\'s test boot').to.include({ status: 'passed' });
      expect(ready.exec(report.test_boot!.matched!)![1]).to.equal(kvmNicName(0));
    });
    expect(cli.code, cli.stderr).to.equal(0);
    const actions = report.stages.fix.result!.actions as FixAction[];
    expect(actions.filter((a) => a.action === 'verify' && a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);

    // Read back independently: UUID= with each subvol= kept, GRUB's kernel line on the UUID and the subvolume.
    const s = await GuestSession.open([{ path: path.join(out, 'btrfs.qcow2'), format: 'qcow2' }], { readonly: true });
    try {
      const uuid = (await s.cmd('vfs-uuid', '/dev/sda1')).trim();
      await s.cmd('mount-options', 'subvol=@,ro', '/dev/sda1', '/');
      const fstab = s.lines(await s.read('/etc/fstab')).filter((l) => !l.startsWith('#')).map((l) => l.split(/\s+/).slice(0, 4));
      expect(fstab).to.deep.equal([[`UUID=${uuid}`, '/', 'btrfs', 'subvol=@'], [`UUID=${uuid}`, '/home', 'btrfs', 'subvol=@home']]);
      const grubCfg = await s.read('/boot/grub/grub.cfg');
      expect(grubCfg).to.match(new RegExp(`root=UUID=${uuid} ro rootflags=subvol=@ `)).and.not.match(/root=\/dev\/sd/);
    } finally { await s.close(); }
    expect(await sha256File(g.vmdk), 'the source VMDK is byte-identical').to.equal(before);
  });
});
