// The UEFI Debian 12 guest (test/fixtures/debian-guest.ts 'uefi': GPT, the ESP as /dev/sda1 in fstab, grub-efi
// with its boot entry only in the VM's NVRAM, no \EFI\BOOT fallback) under OVMF (issue 20 items 2 and 7):
// - the source boots on SATA with its own NVRAM and prints its marker on ens192;
// - with a fresh NVRAM (what a new KVM domain gets) the source does not boot: the firmware finds no loader, and the
//   test boot says `failed`;
// - after `ferry-convert` (every repair, virt_test with the marker) the output boots on virtio-blk with a virtio
//   NIC under OVMF with a fresh NVRAM; the report says UEFI and why; the fallback loader read back from the output
//   is the guest's grubx64.efi; the source VMDK is unchanged.
// One after the other; the source's two boots are properties of the cached fixture, booted once per fixture build
// and their records re-checked after (test/fixtures/source-proof.ts). Serial logs of a failed check stay in
// test/artifacts/guest-uefi-*.log.
// Then the output boots twice more under OVMF with a fresh NVRAM on an overlay (test/helpers/second-boot.ts): on the
// image Ferry appended virtio to until the first-boot unit rebuilt it with the guest's update-initramfs, then on
// that; the marker both times, the unit gone (issue 34).
// The conversion, the output's boot and its read-back are a reused proof (test/helpers/proofs.ts): with every input
// unchanged (the code ferry-convert loads, this file and its helpers, the fixture, package-lock.json, qemu, OVMF,
// libguestfs and the kernels) the same check() re-asserts the evidence of the last passing run.
import { expect } from 'chai';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { sha256File } from '../../domain/qemu';
import { GuestSession } from '../../domain/converter/guestfs';
import { kvmNicName } from '../../domain/converter/nic-names';
import { DebianGuest, ensureDebianGuest } from '../fixtures/debian-guest';
import { asOnVmware, provedSourceBoot } from '../fixtures/source-proof';
import { keepTextOnFailure } from '../helpers/boot-logs';
import { CommandRun, ferryConvert } from '../helpers/procs';
import { consoleOf, fixtureInputs, reusedProof } from '../helpers/proofs';
import type { FixedReport } from '../helpers/api-types';
import { bootTwice, checkTwoBoots, expectAppended, type TwoBoots } from '../helpers/second-boot';

const BOOT_TIMEOUT = 900;

describe('Ferry on the UEFI Debian 12 guest: a fresh NVRAM boots the output @vm', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the fixtures first
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guest-uefi-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('the source boots only with its own NVRAM; Ferry\'s output boots on virtio under OVMF with a fresh one', async () => {
    const g = await ensureDebianGuest('uefi');
    // The source's boots (recorded: nothing to boot), then Ferry's: one emulated VM at a time.
    const sourceBoots = async () => {
      await provedSourceBoot(g, 'own-nvram', asOnVmware(g, g.ready, { firmware: 'uefi', nvram: g.nvram }), (r) => {
        expect(r, 'the source with its own NVRAM').to.include({ status: 'passed', firmware: 'uefi' });
        expect(g.ready.exec(r.matched!)![1]).to.equal(g.vmwareNic);
      });
      await provedSourceBoot(g, 'fresh-nvram', asOnVmware(g, g.ready, { firmware: 'uefi' }), (r, text) => {
        expect(r, 'the source with a fresh NVRAM').to.include({ status: 'failed', firmware: 'uefi' });
        expect(r.detail).to.match(/^the UEFI firmware found no boot loader to start/);
        expect(text).not.to.contain(g.marker);
      });
    };
    const spec = { name: 'guest-uefi-output', entries: [__filename], extra: fixtureInputs(g.vmdk, g.nvram) };
    if (await reusedProof(spec, () => convert(g, sourceBoots), (e) => check(g, e)) === 'reused') await sourceBoots();
  });

  /** What the check reads: ferry-convert's exit and report, the output's serial console, the output read back. */
  interface Evidence {
    cli: CommandRun; report: FixedReport; console: string; readback?: { bootx64: string; grubx64: string; fstab: string }; source: string[];
    /** The output booted twice on an overlay under OVMF with a fresh NVRAM: the appended image, then the guest
     *  generator's own (issue 34). */
    twice?: TwoBoots;
  }

  async function convert(g: DebianGuest, sourceBoots: () => Promise<void>): Promise<Evidence> {
    const before = await sha256File(g.vmdk);
    const out = path.join(dir, 'out');
    mkdirSync(out);
    const cfg = path.join(out, 'ferry.yaml');
    writeFileSync(cfg, yaml.dump({
      command: 'local', vmdk: g.vmdk, output_dir: out, to_output: 'uefi.qcow2', fstab_mode: 'stabilize-all', update_grub: true, regen_initramfs: true,
      remove_source_hv_tools: true, virt_test: true, virt_test_expect: g.ready.source, virt_test_timeout: BOOT_TIMEOUT, memory: 1024,
    }));
    await sourceBoots();
    const cli = await ferryConvert(['--config', cfg]);
    const report = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as FixedReport;
    const consoleText = consoleOf(report);
    // Read back independently (when there is an output: the check says why not): the fallback loader and the
    // guest's GRUB EFI binary, fstab.
    const output = path.join(out, 'uefi.qcow2');
    let readback: Evidence['readback'];
    if (existsSync(output)) {
      const s = await GuestSession.open([{ path: output, format: 'qcow2' }], { readonly: true });
      try {
        await s.cmd('mount-ro', '/dev/sda2', '/');
        await s.cmd('mount-ro', '/dev/sda1', '/boot/efi');
        readback = { bootx64: await s.cmd('checksum', 'sha256', '/boot/efi/EFI/BOOT/BOOTX64.EFI'), grubx64: await s.cmd('checksum', 'sha256', '/boot/efi/EFI/debian/grubx64.efi'), fstab: await s.read('/etc/fstab') };
      } finally { await s.close(); }
    }
    const mount = async (s: GuestSession) => { await s.cmd('mount-ro', '/dev/sda2', '/'); await s.cmd('mount-ro', '/dev/sda1', '/boot/efi'); };
    const twice = existsSync(output) ? await bootTwice(output, { expect: g.ready, firmware: 'uefi', timeoutSeconds: 2 * BOOT_TIMEOUT, memoryMiB: 1024 }, mount, dir) : undefined;
    return { cli, report, console: consoleText, readback, source: [before, await sha256File(g.vmdk)], twice };
  }

  /** The assertions, on a fresh run's evidence or on the record's. */
  function check(g: DebianGuest, e: Evidence) {
    const { report, readback } = e;
    keepTextOnFailure('guest-uefi-output', e.console, () => {
      expect(report.test_boot, 'the output\'s test boot').to.include({ status: 'passed', firmware: 'uefi' });
      expect(g.ready.exec(report.test_boot!.matched!)![1]).to.equal(kvmNicName(0));
    });
    expect(e.cli.code, e.cli.stderr).to.equal(0);
    expect(report.firmware!.firmware).to.equal('uefi');
    expect(report.firmware!.reason).to.match(/^the guest boots only through UEFI: a gpt disk with an EFI system partition \/dev\/sda1 on \/boot\/efi holding \\EFI\\debian\\\{grubx64\.efi\}, and no GRUB for BIOS/);
    const actions = report.stages.fix.result.actions;
    expect(actions.filter((a) => a.action === 'uefi_fallback').map((a) => [a.status, a.detail])).to.deep.equal([['done', '\\EFI\\debian\\grubx64.efi -> \\EFI\\BOOT\\BOOTX64.EFI']]);
    expect(actions.filter((a) => a.action === 'verify' && a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);
    // Read back: the fallback loader is the guest's own GRUB EFI binary; fstab names no /dev/sd*.
    if (!readback) expect.fail('no output to read back');
    expect(readback.bootx64).to.equal(readback.grubx64);
    expect(readback.fstab).not.to.match(/^\/dev\/sd/m);
    expect(e.source[1], 'the source VMDK is byte-identical').to.equal(e.source[0]);
    // The test boot booted the appended image; the first-boot unit then rebuilt it with update-initramfs.
    expectAppended(actions);
    if (!e.twice) expect.fail('the output was not booted twice');
    keepTextOnFailure('guest-uefi-second-boot', `${e.twice.first.console}\n----- second boot -----\n${e.twice.second.console}`, () => checkTwoBoots(e.twice!, g.ready));
  }
});
