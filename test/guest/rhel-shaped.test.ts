// The RHEL-shaped guest (test/fixtures/debian-guest.ts 'rhel-shaped', scripts/guest-image/rhel-shaped.sh): dracut
// host-only (built on AHCI: no virtio), root and /home on XFS LVs in VG "rhel" with rd.lvm.lv= on the kernel line,
// LVM's devices file naming the SATA disk, NetworkManager's keyfile for ens192 with a static address (issue 20
// items 3-5). Side by side:
// - the source boots on SATA (vmxnet3 in slot 192) and prints its marker on ens192 (/ read-write, / /boot and
//   /home mounted, the address up);
// - on virtio-blk the source does not boot: its dracut image has no virtio_blk and dracut gives up;
//   (both properties of the cached fixture: booted once per fixture build, their records re-checked after,
//   test/fixtures/source-proof.ts)
// - `ferry-convert` (every repair, virt_test with the marker) makes an output that boots on virtio-blk with a virtio
//   NIC and prints the marker on the renamed interface.
// Then the output is read back: the devices file is gone, dracut's configuration carries the virtio drivers and the
// image holds them, the keyfile names the new interface, fstab names no /dev/sd*, and the source is unchanged.
// Serial logs of a failed check stay in test/artifacts/guest-rhel-shaped-*.log.
// The conversion, the output's boot and its read-back are a reused proof (test/helpers/proofs.ts): with every input
// unchanged the same check() re-asserts the evidence of the last passing run.
import { expect } from 'chai';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { sha256File } from '../../domain/qemu';
import { GuestSession } from '../../domain/converter/guestfs';
import { kvmNicName } from '../../domain/converter/nic-names';
import { ensureDebianGuest, DebianGuest } from '../fixtures/debian-guest';
import { asOnKvm, asOnVmware, provedSourceBoot } from '../fixtures/source-proof';
import { keepTextOnFailure } from '../helpers/boot-logs';
import { CommandRun, ferryConvert } from '../helpers/procs';
import { consoleOf, fixtureInputs, readBack, reusedProof } from '../helpers/proofs';
import type { FixedReport } from '../helpers/api-types';
import { bootTwice, checkTwoBoots, imagesAfter, type ImageAfter, type TwoBoots } from '../helpers/second-boot';

const BOOT_TIMEOUT = 900;

/** The marker with every fstab mount: /home's LV is activated only by the booted system's LVM, which obeys the
 *  devices file. */
const ready = (g: DebianGuest) => new RegExp(`${g.ready.source} mounts=/,/boot,/home`);

describe('Ferry on the RHEL-shaped guest (dracut host-only, XFS on LVM, LVM devices file, NetworkManager) @vm', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the fixtures first
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guest-rhel-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('the source boots on SATA only; Ferry\'s output boots on virtio-blk with a virtio NIC and its static address', async () => {
    const g = await ensureDebianGuest('rhel-shaped');
    // The source's boots (recorded: nothing to boot), then Ferry's: one emulated VM at a time.
    const sourceBoots = async () => {
      await provedSourceBoot(g, 'sata', asOnVmware(g, ready(g)), (r, text) => {
        expect(r, 'the source on SATA').to.include({ status: 'passed' });
        expect(ready(g).exec(r.matched!)![1]).to.equal(g.vmwareNic);
        expect(text).to.match(/root=\/dev\/mapper\/rhel-root .*rd\.lvm\.lv=rhel\/root/);
      });
      await provedSourceBoot(g, 'virtio', asOnKvm(g, ready(g)), (r, text) => {
        expect(r, 'the source on virtio-blk').to.include({ status: 'failed' });
        expect(r.detail).to.match(/^(dracut could not boot the root device|systemd timed out waiting for a device|systemd emergency mode)/);
        expect(text).not.to.contain(g.marker);
      });
    };
    const spec = { name: 'guest-rhel-shaped-output', entries: [__filename], extra: fixtureInputs(g.vmdk) };
    if (await reusedProof(spec, () => convert(g, sourceBoots), (e) => check(g, e)) === 'reused') await sourceBoots();
  });

  /** What the check reads: ferry-convert's exit and report, the output's console, the output read back (files,
   *  whether the devices file exists, each kernel's initramfs unpacked by Ferry's reader), the second boot. */
  interface Evidence {
    cli: CommandRun; report: FixedReport; console: string; source: string[];
    readback?: { files: Record<string, string | null>; devicesFile: boolean; images: ImageAfter[] };
    /** Where an image got the appended archive: the output booted twice on an overlay (issue 34). */
    twice?: TwoBoots;
  }
  const FILES = ['/ferry-backup/etc/lvm/devices/system.devices', '/etc/dracut.conf.d/ferry-virtio.conf', '/etc/dracut.conf.d/10-hostonly.conf',
    '/etc/NetworkManager/system-connections/ens192.nmconnection', '/etc/fstab'];

  /** The output's filesystems, read-only. */
  async function mount(s: GuestSession) {
    await s.cmd('vg-activate-all', 'true');
    await s.cmd('mount-ro', '/dev/rhel/root', '/');
    await s.cmd('mount-ro', '/dev/sda1', '/boot');
  }

  async function convert(g: DebianGuest, sourceBoots: () => Promise<void>): Promise<Evidence> {
    const before = await sha256File(g.vmdk);
    const out = path.join(dir, 'out');
    mkdirSync(out);
    const cfg = path.join(out, 'ferry.yaml');
    writeFileSync(cfg, yaml.dump({
      command: 'local', vmdk: g.vmdk, output_dir: out, to_output: 'rhel.qcow2', fstab_mode: 'stabilize-all', update_grub: true, regen_initramfs: true,
      remove_source_hv_tools: true, virt_test: true, virt_test_expect: ready(g).source, virt_test_timeout: BOOT_TIMEOUT, memory: 1024,
    }));
    await sourceBoots();
    const cli = await ferryConvert(['--config', cfg]);
    const report = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as FixedReport;
    const output = path.join(out, 'rhel.qcow2');
    let readback: Evidence['readback'];
    if (existsSync(output)) {
      // Read back independently, in one read-only appliance.
      const s = await GuestSession.open([{ path: output, format: 'qcow2' }], { readonly: true });
      try {
        await mount(s);
        // Each image read archive by archive as the kernel unpacks it (lsinitramfs stops at an appended archive).
        readback = { devicesFile: await s.exists('/etc/lvm/devices/system.devices'), files: await readBack(s, FILES), images: await imagesAfter(s, dir) };
      } finally { await s.close(); }
    }
    const appended = report.stages.fix.result.actions.some((a) => a.action === 'regen_initramfs' && a.method === 'appended');
    const twice = existsSync(output) && appended ? await bootTwice(output, { expect: ready(g), timeoutSeconds: 2 * BOOT_TIMEOUT, memoryMiB: 1024 }, mount, dir) : undefined;
    return { cli, report, console: consoleOf(report), readback, source: [before, await sha256File(g.vmdk)], twice };
  }

  /** The assertions, on a fresh run's evidence or on the record's. */
  function check(g: DebianGuest, e: Evidence) {
    const { report } = e;
    keepTextOnFailure('guest-rhel-shaped-output', e.console, () => {
      expect(report.test_boot, 'the output\'s test boot').to.include({ status: 'passed' });
      expect(ready(g).exec(report.test_boot!.matched!)![1]).to.equal(kvmNicName(0));
    });
    expect(e.cli.code, e.cli.stderr).to.equal(0);
    const actions = report.stages.fix.result.actions;
    expect(actions.filter((a) => a.action === 'verify' && a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);
    expect(actions.filter((a) => a.action === 'disk_pins' && a.status === 'done').map((a) => a.file)).to.include('/etc/lvm/devices/system.devices');
    expect(actions.filter((a) => a.action === 'regen_initramfs' && a.status === 'done').map((a) => a.detail)).to.include.members([
      '/etc/dracut.conf.d/ferry-virtio.conf: added virtio_pci, virtio_blk, virtio_scsi, virtio_net',
    ]);
    // Read back: the devices file gone (kept in the backup), dracut's drivers, the keyfile, fstab, the image.
    if (!e.readback) expect.fail('no output to read back');
    const { files, images } = e.readback;
    expect(e.readback.devicesFile, 'the devices file').to.equal(false);
    expect(files['/ferry-backup/etc/lvm/devices/system.devices']).to.match(/DEVNAME=\/dev\/sda2/);
    expect(files['/etc/dracut.conf.d/ferry-virtio.conf']).to.match(/^add_drivers\+=" virtio_pci virtio_blk virtio_scsi virtio_net "$/m);
    expect(files['/etc/dracut.conf.d/10-hostonly.conf'], 'still host-only').to.match(/^hostonly="yes"$/m);
    const keyfile = files['/etc/NetworkManager/system-connections/ens192.nmconnection'];
    expect(keyfile).to.contain(`interface-name=${kvmNicName(0)}`);
    expect(keyfile).to.contain('address1=10.0.2.15/24,10.0.2.2');
    const fstab = files['/etc/fstab'];
    expect(fstab).not.to.match(/^\/dev\/sd/m);
    expect(fstab).to.match(/^\/dev\/mapper\/rhel-home\s+\/home\s+xfs/m);
    expect(images.length, 'kernels read back').to.be.greaterThan(0);
    for (const i of images) {
      expect(i.problems, i.image).to.deep.equal([]);
      expect(i.modules, i.image).to.include.members(['virtio_blk', 'virtio_pci', 'virtio_net', 'virtio_scsi', 'xfs']);
    }
    expect(e.source[1], 'the source VMDK is byte-identical').to.equal(e.source[0]);
    // Issue 34: an image is appended to, or rebuilt in the appliance for a reason this layout has (its dracut image
    // holds LVM's devices file, which must disappear; dracut's own configuration changed), said in the report.
    const regen = actions.filter((a) => a.action === 'regen_initramfs' && a.kernel);
    expect(regen.length, 'images handled').to.be.greaterThan(0);
    for (const a of regen.filter((y) => y.method !== 'appended')) expect(`${String(a.method)}: ${String(a.fallback)}`).to.match(/^rebuilt: .*(system\.devices must disappear from the image|dracut's configuration\) changed)/);
    if (regen.some((a) => a.method === 'appended')) {
      if (!e.twice) expect.fail('appended, but the output was not booted twice');
      keepTextOnFailure('guest-rhel-shaped-second-boot', `${e.twice.first.console}\n----- second boot -----\n${e.twice.second.console}`, () => checkTwoBoots(e.twice!, ready(g)));
    }
  }
});
