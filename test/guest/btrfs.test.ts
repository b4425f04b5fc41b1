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
// - then it boots twice more on overlays (test/helpers/second-boot.ts): the appended initramfs until the first-boot
//   unit rebuilt it with the guest's own generator, then the generator's image to the marker (issue 34).
// That this guest's MODULES=dep initramfs has no virtio is checked by its build (btrfs.sh), as for plain. Serial
// logs of a failed check stay in test/artifacts/guest-btrfs-*.log.
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
import { DebianGuest, ensureDebianGuest } from '../fixtures/debian-guest';
import { asOnVmware, provedSourceBoot } from '../fixtures/source-proof';
import { keepTextOnFailure } from '../helpers/boot-logs';
import { bootTwice, checkTwoBoots, expectAppended, type TwoBoots } from '../helpers/second-boot';
import { CommandRun, ferryConvert } from '../helpers/procs';
import { consoleOf, fixtureInputs, reusedProof } from '../helpers/proofs';
import type { PipelineReport } from '../../domain/converter/stages/report';
import type { FixAction } from '../../domain/converter/types';

const BOOT_TIMEOUT = 600;

describe('Ferry on the btrfs Debian 12 guest: subvolumes kept, the output boots on virtio @vm', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the fixtures first
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guest-btrfs-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('the source boots on SATA; ferry-convert\'s output boots on virtio with / and /home on their subvolumes', async () => {
    const g = await ensureDebianGuest('btrfs');
    const ready = new RegExp(`${g.ready.source} mounts=/,/home`);
    // The source's boot (recorded: nothing to boot), then Ferry's: one emulated VM at a time.
    const sourceBoot = async () => {
      await provedSourceBoot(g, 'sata', asOnVmware(g, ready), (r) => {
        expect(r, 'the source on SATA').to.include({ status: 'passed' });
        expect(ready.exec(r.matched!)![1]).to.equal(g.vmwareNic);
      });
    };
    const spec = { name: 'guest-btrfs-output', entries: [__filename], extra: fixtureInputs(g.vmdk) };
    if (await reusedProof(spec, () => convert(g, ready, sourceBoot), (e) => check(ready, e)) === 'reused') await sourceBoot();
  });

  /** What the check reads: ferry-convert's exit and report, the output's serial console, the output read back. */
  interface Evidence { cli: CommandRun; report: PipelineReport; console: string; readback?: { uuid: string; fstab: string; grubCfg: string }; source: string[]; twice?: TwoBoots }

  async function convert(g: DebianGuest, ready: RegExp, sourceBoot: () => Promise<void>): Promise<Evidence> {
    const before = await sha256File(g.vmdk);
    const out = path.join(dir, 'out');
    mkdirSync(out);
    const cfg = path.join(out, 'ferry.yaml');
    writeFileSync(cfg, yaml.dump({
      command: 'local', vmdk: g.vmdk, output_dir: out, to_output: 'btrfs.qcow2', fstab_mode: 'stabilize-all', update_grub: true, regen_initramfs: true,
      remove_source_hv_tools: true, virt_test: true, virt_test_expect: ready.source, virt_test_timeout: BOOT_TIMEOUT, memory: 1024,
    }));
    await sourceBoot();
    const cli = await ferryConvert(['--config', cfg]);
    const report = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as PipelineReport;
    // Read back independently (when there is an output: the check says why not).
    const output = path.join(out, 'btrfs.qcow2');
    let readback: Evidence['readback'];
    if (existsSync(output)) {
      const s = await GuestSession.open([{ path: output, format: 'qcow2' }], { readonly: true });
      try {
        const uuid = (await s.cmd('vfs-uuid', '/dev/sda1')).trim();
        await s.cmd('mount-options', 'subvol=@,ro', '/dev/sda1', '/');
        readback = { uuid, fstab: await s.read('/etc/fstab'), grubCfg: await s.read('/boot/grub/grub.cfg') };
      } finally { await s.close(); }
    }
    const twice = existsSync(output) ? await bootTwice(output, { expect: ready, timeoutSeconds: 2 * BOOT_TIMEOUT, memoryMiB: 1024 }, async (s) => { await s.cmd('mount-options', 'subvol=@,ro', '/dev/sda1', '/'); }, dir) : undefined;
    return { cli, report, console: consoleOf(report), readback, source: [before, await sha256File(g.vmdk)], twice };
  }

  /** The assertions, on a fresh run's evidence or on the record's. */
  function check(ready: RegExp, e: Evidence) {
    const { report, readback } = e;
    keepTextOnFailure('guest-btrfs-output', e.console, () => {
      expect(report.test_boot, 'the output\'s test boot').to.include({ status: 'passed' });
      expect(ready.exec(report.test_boot!.matched!)![1]).to.equal(kvmNicName(0));
    });
    expect(e.cli.code, e.cli.stderr).to.equal(0);
    const actions = report.stages.fix.result!.actions as FixAction[];
    expect(actions.filter((a) => a.action === 'verify' && a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);
    // Read back: UUID= with each subvol= kept, GRUB's kernel line on the UUID and the subvolume.
    if (!readback) expect.fail('no output to read back');
    const { uuid } = readback;
    const fstab = readback.fstab.split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#')).map((l) => l.split(/\s+/).slice(0, 4));
    expect(fstab).to.deep.equal([[`UUID=${uuid}`, '/', 'btrfs', 'subvol=@'], [`UUID=${uuid}`, '/home', 'btrfs', 'subvol=@home']]);
    expect(readback.grubCfg).to.match(new RegExp(`root=UUID=${uuid} ro rootflags=subvol=@ `)).and.not.match(/root=\/dev\/sd/);
    expect(e.source[1], 'the source VMDK is byte-identical').to.equal(e.source[0]);
    // The test boot booted the appended image (issue 34); the first-boot unit then rebuilt it with the guest's own
    // generator, and the next boot is on that image.
    expectAppended(actions);
    if (!e.twice) expect.fail('the output was not booted twice');
    keepTextOnFailure('guest-btrfs-second-boot', `${e.twice.first.console}\n----- second boot -----\n${e.twice.second.console}`, () => checkTwoBoots(e.twice!, ready));
  }
});
