// Debian 11 (bullseye: kernel 5.10, systemd 247) and Debian 13 (trixie: kernel 6.12, systemd 257, compressed
// modules) beside the Debian 12 guests (issue 20 item 1): the plain layout (test/fixtures/debian-guest.ts 'debian11',
// 'debian13': one ext4 root named /dev/sda1 in fstab and on the kernel line, a MODULES=dep initramfs built on AHCI,
// ifupdown's static address on ens192, open-vm-tools). For each release, one after the other:
// - the source boots on SATA (vmxnet3 in slot 192) and prints its marker on ens192;
// - on virtio-blk with a virtio NIC the source does not boot: its initramfs gives up on the root device;
//   (both properties of the cached fixture: booted once per fixture build, their records re-checked after,
//   test/fixtures/source-proof.ts)
// - `ferry-convert` (every repair, virt_test with the marker) makes an output that boots on virtio-blk with a virtio
//   NIC and prints the marker on the renamed interface.
// Then the output is read back: fstab and grub.cfg name no /dev/sd*, ifupdown names the new interface, the
// initramfs holds virtio_blk and virtio_pci, open-vm-tools is gone, and the source is byte-identical. The initramfs
// is read as the kernel unpacks it, archive by archive (Ferry's reader, domain/converter/initrd-image.ts): the repair
// appends an archive to the guest's image, and Debian 11's lsinitramfs stops at the first one.
// Then it boots twice more (on an overlay, test/helpers/second-boot.ts): the appended image until the first-boot unit
// has rebuilt it with the guest's own generator, then on the generator's image to the marker; the unit is gone and
// each kernel's image holds every virtio module.
// Serial logs of a failed check stay in test/artifacts/guest-<release>-*.log.
// Each release's conversion, output boot and read-back are a reused proof (test/helpers/proofs.ts): with every input
// unchanged the same check() re-asserts the evidence of the last passing run.
import { expect } from 'chai';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { sha256File } from '../../domain/qemu';
import { effectiveTree, InitrdParseError, readInitrd } from '../../domain/converter/initrd-image';
import { GuestSession } from '../../domain/converter/guestfs';
import { kvmNicName } from '../../domain/converter/nic-names';
import { DebianGuest, ensureDebianGuest } from '../fixtures/debian-guest';
import { asOnKvm, asOnVmware, INITRAMFS_GAVE_UP, provedSourceBoot } from '../fixtures/source-proof';
import { keepTextOnFailure } from '../helpers/boot-logs';
import { CommandRun, ferryConvert } from '../helpers/procs';
import { bootTwice, checkTwoBoots, expectAppended, expectHvRemovalAtBoot, type TwoBoots } from '../helpers/second-boot';
import { consoleOf, fixtureInputs, readBack, reusedProof } from '../helpers/proofs';
import type { FixedReport } from '../helpers/api-types';

const BOOT_TIMEOUT = 900;

for (const variant of ['debian11', 'debian13'] as const) {
  describe(`Ferry on the ${variant} guest: the output boots on virtio @vm`, function () {
    this.timeout(3 * 3600 * 1000); // a fresh machine builds the fixture first (its own debootstrap and first boot)
    const dir = mkdtempSync(path.join(os.tmpdir(), `ferry-guest-${variant}-`));
    after(() => rmSync(dir, { recursive: true, force: true }));

    it('the source boots on SATA only; ferry-convert\'s output boots on virtio-blk with its static address on the renamed NIC', async () => {
      const g = await ensureDebianGuest(variant);
      // The source's boots (recorded: nothing to boot), then Ferry's: one emulated VM at a time.
      const sourceBoots = async () => {
        await provedSourceBoot(g, 'sata', asOnVmware(g, g.ready), (r, text) => {
          expect(r, 'the source on SATA').to.include({ status: 'passed' });
          expect(g.ready.exec(r.matched!)![1]).to.equal(g.vmwareNic);
          expect(text).to.contain(`root=${g.rootDevice}`);
        });
        // Stops at the marker (a fixture that is wrong) or the initramfs giving up, whichever comes first.
        await provedSourceBoot(g, 'virtio', asOnKvm(g, new RegExp(`${g.ready.source}|${INITRAMFS_GAVE_UP.source}`)), (_r, text) => {
          expect(text, 'the source on virtio-blk').to.match(INITRAMFS_GAVE_UP);
          expect(text).not.to.contain(g.marker);
        });
      };
      const spec = { name: `guest-${variant}-output`, entries: [__filename], extra: fixtureInputs(g.vmdk) };
      if (await reusedProof(spec, () => convert(g, dir, sourceBoots), (e) => check(g, e)) === 'reused') await sourceBoots();
    });
  });
}

/** What the check reads: ferry-convert's exit and report, the output's console, the output read back (files, whether
 *  vmtoolsd is there, the kernel's modules.builtin, the initramfs's files as the kernel unpacks them). */
interface Evidence {
  cli: CommandRun; report: FixedReport; console: string; source: string[];
  readback?: { files: Record<string, string | null>; vmtoolsd: boolean; builtin?: string; listing: ImageListing };
  twice?: TwoBoots;
}

/** The image's file names after every archive is unpacked, or the reason the kernel's unpacker would fail. */
interface ImageListing { names: string[]; error?: string }

async function listImage(file: string): Promise<ImageListing> {
  try {
    const archives = await readInitrd(readFileSync(file));
    return { names: [...effectiveTree(archives).keys()] };
  } catch (e) {
    if (!(e instanceof InitrdParseError)) throw e;
    return { names: [], error: e.message };
  }
}

async function convert(g: DebianGuest, dir: string, sourceBoots: () => Promise<void>): Promise<Evidence> {
  const before = await sha256File(g.vmdk);
  const out = path.join(dir, 'out');
  mkdirSync(out);
  const cfg = path.join(out, 'ferry.yaml');
  writeFileSync(cfg, yaml.dump({
    command: 'local', vmdk: g.vmdk, output_dir: out, to_output: `${g.variant}.qcow2`, fstab_mode: 'stabilize-all', update_grub: true,
    regen_initramfs: true, remove_source_hv_tools: true, virt_test: true, virt_test_expect: g.ready.source, virt_test_timeout: BOOT_TIMEOUT,
    memory: 1024,
  }));
  await sourceBoots();
  const cli = await ferryConvert(['--config', cfg]);
  const report = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as FixedReport;
  const output = path.join(out, `${g.variant}.qcow2`);
  let readback: Evidence['readback'];
  if (existsSync(output)) {
    // Read back independently, in one read-only appliance.
    const s = await GuestSession.open([{ path: output, format: 'qcow2' }], { readonly: true });
    const initrd = path.join(dir, 'initrd.img');
    let builtin: string | undefined;
    let files: Record<string, string | null>;
    let vmtoolsd: boolean;
    try {
      await s.cmd('mount-ro', '/dev/sda1', '/');
      files = await readBack(s, ['/etc/fstab', '/boot/grub/grub.cfg', '/etc/network/interfaces']);
      vmtoolsd = await s.exists('/usr/bin/vmtoolsd');
      const kernel = s.lines(await s.cmd('ls', '/lib/modules'))[0];
      await s.cmd('download', `/boot/initrd.img-${kernel}`, initrd);
      builtin = await s.read(`/lib/modules/${kernel}/modules.builtin`);
    } finally { await s.close(); }
    readback = { files, vmtoolsd, builtin, listing: await listImage(initrd) };
  }
  const twice = existsSync(output) ? await bootTwice(output, { expect: g.ready, timeoutSeconds: 2 * BOOT_TIMEOUT, memoryMiB: 1024 }, async (s) => { await s.cmd('mount-ro', '/dev/sda1', '/'); }, dir) : undefined;
  return { cli, report, console: consoleOf(report), readback, source: [before, await sha256File(g.vmdk)], twice };
}

/** The assertions, on a fresh run's evidence or on the record's. */
function check(g: DebianGuest, e: Evidence) {
  const { report } = e;
  keepTextOnFailure(`guest-${g.variant}-output`, e.console, () => {
    expect(report.test_boot, 'the output\'s test boot').to.include({ status: 'passed' });
    expect(g.ready.exec(report.test_boot!.matched!)![1]).to.equal(kvmNicName(0));
  });
  expect(e.cli.code, e.cli.stderr).to.equal(0);
  const actions = report.stages.fix.result.actions;
  expect(actions.filter((a) => a.action === 'verify' && a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);
  expectAppended(actions);
  if (!e.readback) expect.fail('no output to read back');
  const { files, listing, builtin } = e.readback;
  expect(files['/etc/fstab']).not.to.match(/^\/dev\/sd/m);
  expect(files['/boot/grub/grub.cfg']).to.match(/root=UUID=/).and.not.match(/root=\/dev\/sd/);
  expect(files['/etc/network/interfaces']).to.contain(`iface ${kvmNicName(0)} inet static`).and.not.contain(g.vmwareNic);
  // open-vm-tools is removed by the guest's dpkg at its first boot on KVM (checkTwoBoots reads dpkg's database).
  expectHvRemovalAtBoot(actions);
  expect(e.readback.vmtoolsd, 'open-vm-tools still there until the first boot').to.equal(true);
  expect(listing.error, 'the initramfs unpacks as the kernel reads it').to.equal(undefined);
  // In the image, or built into the kernel (Debian 13's kernel has virtio_pci built in).
  for (const m of ['virtio_blk', 'virtio_pci', 'virtio_net']) {
    expect(`${listing.names.join('\n')}\n${builtin ?? ''}`, m).to.match(new RegExp(`/${m}\\.ko(\\.[a-z]+)?$`, 'm'));
  }
  expect(e.source[1], 'the source VMDK is byte-identical').to.equal(e.source[0]);
  // The test boot above booted the appended image (issue 34); then the first-boot unit rebuilt each image with the
  // guest's own generator, and the next boot is on that image.
  if (!e.twice) expect.fail('the output was not booted twice');
  keepTextOnFailure(`guest-${g.variant}-second-boot`, `${e.twice.first.console}\n----- second boot -----\n${e.twice.second.console}`, () => checkTwoBoots(e.twice!, g.ready));
}
