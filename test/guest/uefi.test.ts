// The UEFI Debian 12 guest (test/fixtures/debian-guest.ts 'uefi': GPT, the ESP as /dev/sda1 in fstab, grub-efi
// with its boot entry only in the VM's NVRAM, no \EFI\BOOT fallback) under OVMF (issue 20 items 2 and 7):
// - the source boots on SATA with its own NVRAM and prints its marker on ens192;
// - with a fresh NVRAM (what a new KVM domain gets) the source does not boot: the firmware finds no loader, and the
//   test boot says `failed`;
// - after `ferry-convert` (every repair, virt_test with the marker) the output boots on virtio-blk with a virtio
//   NIC under OVMF with a fresh NVRAM; the report says UEFI and why; the fallback loader read back from the output
//   is the guest's grubx64.efi; the source VMDK is unchanged.
// The three run side by side. Serial logs of a failed check stay in test/artifacts/guest-uefi-*.log.
import { expect } from 'chai';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { sha256File } from '../../shared/qemu';
import { GuestSession } from '../../shared/converter/guestfs';
import { kvmNicName } from '../../shared/converter/nic-names';
import { testBoot, TestBootResult } from '../../shared/converter/testboot';
import { ensureDebianGuest, DebianGuest } from '../fixtures/debian-guest';
import { keepOnFailure } from '../helpers/boot-logs';
import { ferryConvert } from '../helpers/procs';

const BOOT_TIMEOUT = 900;

/** The source as on VMware: SATA, vmxnet3 in slot 192, OVMF with `nvram` (its own) or a fresh one. */
function bootSource(g: DebianGuest, dir: string, own: boolean): Promise<[TestBootResult, string]> {
  const consoleLog = path.join(dir, `source-${own ? 'own' : 'fresh'}-nvram.log`);
  return testBoot({
    name: `ferry-uefi-source-${own ? 'own' : 'fresh'}`, disks: [{ path: g.vmdk, format: 'vmdk' }], bus: 'sata', nic: 'vmxnet3', nicSlot: g.vmwareNicSlot, mac: g.mac,
    firmware: 'uefi', ...(own ? { nvram: g.nvram } : {}), expect: g.ready, timeoutSeconds: BOOT_TIMEOUT, consoleLog,
  }).then((r) => [r, consoleLog]);
}

describe('Ferry on the UEFI Debian 12 guest: a fresh NVRAM boots the output', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the fixtures first
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guest-uefi-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('the source boots only with its own NVRAM; Ferry\'s output boots on virtio under OVMF with a fresh one', async () => {
    const g = await ensureDebianGuest('uefi');
    const before = await sha256File(g.vmdk);
    const out = path.join(dir, 'out');
    mkdirSync(out);
    const cfg = path.join(out, 'ferry.yaml');
    writeFileSync(cfg, yaml.dump({
      command: 'local', vmdk: g.vmdk, output_dir: out, to_output: 'uefi.qcow2', fstab_mode: 'stabilize-all', update_grub: true, regen_initramfs: true,
      remove_source_hv_tools: true, virt_test: true, virt_test_expect: g.ready.source, virt_test_timeout: BOOT_TIMEOUT, memory: 1024,
    }));
    const [own, fresh, cli] = await Promise.all([bootSource(g, dir, true), bootSource(g, dir, false), ferryConvert(['--config', cfg])]);

    keepOnFailure('guest-uefi-source-own-nvram', own[1], () => {
      expect(own[0], 'the source with its own NVRAM').to.include({ status: 'passed', firmware: 'uefi' });
      expect(g.ready.exec(own[0].matched!)![1]).to.equal(g.vmwareNic);
    });
    keepOnFailure('guest-uefi-source-fresh-nvram', fresh[1], () => {
      expect(fresh[0], 'the source with a fresh NVRAM').to.include({ status: 'failed', firmware: 'uefi' });
      expect(fresh[0].detail).to.match(/^the UEFI firmware found no boot loader to start/);
      expect(readFileSync(fresh[1], 'latin1')).not.to.contain(g.marker);
    });

    const report = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8'));
    keepOnFailure('guest-uefi-output', report.test_boot?.console_log ?? '', () => {
      expect(report.test_boot, 'the output\'s test boot').to.include({ status: 'passed', firmware: 'uefi' });
      expect(g.ready.exec(report.test_boot.matched)![1]).to.equal(kvmNicName(0));
    });
    expect(cli.code, cli.stderr).to.equal(0);
    expect(report.firmware.firmware).to.equal('uefi');
    expect(report.firmware.reason).to.match(/^the guest boots only through UEFI: a gpt disk with an EFI system partition \/dev\/sda1 on \/boot\/efi holding \\EFI\\debian\\\{grubx64\.efi\}, and no GRUB for BIOS/);
    const actions = report.stages.fix.result.actions as any[];
    expect(actions.filter((a) => a.action === 'uefi_fallback').map((a) => [a.status, a.detail])).to.deep.equal([['done', '\\EFI\\debian\\grubx64.efi -> \\EFI\\BOOT\\BOOTX64.EFI']]);
    expect(actions.filter((a) => a.action === 'verify' && a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);

    // Read back independently: the fallback loader is the guest's own GRUB EFI binary; fstab names no /dev/sd*.
    const s = await GuestSession.open([{ path: path.join(out, 'uefi.qcow2'), format: 'qcow2' }], { readonly: true });
    try {
      await s.cmd('mount-ro', '/dev/sda2', '/');
      await s.cmd('mount-ro', '/dev/sda1', '/boot/efi');
      expect(await s.cmd('checksum', 'sha256', '/boot/efi/EFI/BOOT/BOOTX64.EFI')).to.equal(await s.cmd('checksum', 'sha256', '/boot/efi/EFI/debian/grubx64.efi'));
      expect(await s.read('/etc/fstab')).not.to.match(/^\/dev\/sd/m);
    } finally { await s.close(); }
    expect(await sha256File(g.vmdk), 'the source VMDK is byte-identical').to.equal(before);
  });
});
