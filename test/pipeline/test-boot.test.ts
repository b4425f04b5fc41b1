// The test boot's verdict when the console never shows a milestone (issue 20 item 7), with the real qemu: a disk
// whose boot code prints nothing and halts is `failed` (a silent boot cannot pass as "inconclusive"), one that
// prints a line only a running userspace prints is `inconclusive` and the detail quotes it, and a disk with no
// boot loader under UEFI (OVMF, fresh NVRAM) is `failed` at the UEFI shell. Each result names its firmware.
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { testBootQemu } from '../../domain/converter/testboot';
import { chooseFirmware } from '../../domain/converter/firmware';
import { makeBootableImage, makeImage } from '../helpers/images';

describe('test boot: no milestone is not a pass @vm', function () {
  this.timeout(300_000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-testboot-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('a boot that shows nothing by the timeout is failed, and says so (BIOS)', async () => {
    const disk = makeBootableImage(dir, 'silent', 'raw', '');
    const r = await testBootQemu({ disks: [{ path: disk, format: 'raw' }], memoryMiB: 64, timeoutSeconds: 8 });
    expect(r.status, r.detail).to.equal('failed');
    expect(r.firmware).to.equal('bios');
    expect(r.detail).to.match(/within 8 s \(bios firmware; the VM was still running\): no boot milestone at all/);
    expect(r.seconds).to.be.at.least(8);
  });

  it('a guest visibly running userspace without a milestone is inconclusive, quoting what the console showed', async () => {
    const disk = makeBootableImage(dir, 'userspace', 'raw', '[  OK  ] Started ferry-probe.service - Probe.');
    const r = await testBootQemu({ disks: [{ path: disk, format: 'raw' }], memoryMiB: 64, timeoutSeconds: 8 });
    expect(r.status, r.detail).to.equal('inconclusive');
    expect(r.detail).to.contain('the guest runs userspace: the console showed "[  OK  ] Started ferry-probe.service - Probe."');
  });

  it('under UEFI with a fresh NVRAM, a disk without a boot loader fails as soon as OVMF gives up on it, the firmware named in the result', async () => {
    const disk = makeImage(dir, 'noloader', 'raw', 8);
    const r = await testBootQemu({ disks: [{ path: disk, format: 'raw' }], memoryMiB: 256, timeoutSeconds: 180, firmware: 'uefi' });
    expect(r.firmware).to.equal('uefi');
    expect(r.status, r.detail).to.equal('failed');
    expect(r.detail).to.match(/^the UEFI firmware found no boot loader to start .*: the serial console showed "BdsDxe: failed to load Boot0001 "UEFI /);
  });
});

describe('firmware choice (pure): the guest\'s boot loaders first, the manifest where both would boot', () => {
  const efiOnly = { partition_table: 'gpt', esp: '/dev/sda1', esp_mount: '/boot/efi', efi_loaders: { debian: ['grubx64.efi'] }, bios_loader: false };
  it('a UEFI-only guest gets UEFI even when the manifest says bios, and the reason says why', () => {
    const c = chooseFirmware('bios', efiOnly);
    expect(c.firmware).to.equal('uefi');
    expect(c.reason).to.equal('the guest boots only through UEFI: a gpt disk with an EFI system partition /dev/sda1 on /boot/efi holding \\EFI\\debian\\{grubx64.efi}, and no GRUB for BIOS (the manifest says bios, which could not boot it)');
  });
  it('a BIOS-only guest gets BIOS; a guest with both follows the manifest; without inspection the manifest decides', () => {
    expect(chooseFirmware('uefi', { efi_loaders: {}, bios_loader: true }).firmware).to.equal('bios');
    expect(chooseFirmware('bios', { ...efiOnly, bios_loader: true }).firmware).to.equal('bios');
    expect(chooseFirmware('uefi', { ...efiOnly, bios_loader: true }).firmware).to.equal('uefi');
    expect(chooseFirmware('uefi', undefined)).to.deep.equal({ firmware: 'uefi', reason: 'the VM\'s firmware is UEFI (manifest vm.firmware); the guest was not inspected' });
    expect(chooseFirmware(undefined, undefined).firmware).to.equal('bios');
  });
});
