// The cloud-init Debian 12 guest (test/fixtures/debian-guest.ts 'cloud-init': cloud-init renders its NoCloud seed's
// static address for ens192 into netplan's 50-cloud-init.yaml at every boot), issue 20 items 1 and 5:
// - the source boots on SATA and prints its marker on ens192;
//   (a property of the cached fixture: booted once per fixture build, its record re-checked after,
//   test/fixtures/source-proof.ts)
// - `ferry-convert` (every repair, virt_test with the same marker) makes an output that boots on virtio-blk with a
//   virtio NIC and its static address on the renamed NIC, cloud-init running in that boot;
// - read back: cloud-init is told to leave the network alone (Ferry's 99-ferry-network.cfg), the file it rendered
//   names the KVM NIC (the original in /ferry-backup), and the source VMDK is byte-identical.
// Then the control: the same output with Ferry's hold deleted (on an overlay) boots without the address on the
// renamed NIC, since cloud-init renders the seed's ens192 again: the hold is what keeps the network. Its marker
// waits as long as the held boot took (+30 s) instead of 180 s before saying NOT-READY, and the first-boot units,
// which touch neither, are off in it.
// Last, the held output boots twice more on an overlay (test/helpers/second-boot.ts): the appended image until the
// first-boot unit rebuilt it with the guest's own generator, then the generator's image to the marker.
// Serial logs of a failed check stay in test/artifacts/guest-cloud-init-*.log.
// The conversion, the output's boot, its read-back and the control boot are a reused proof (test/helpers/proofs.ts):
// with every input unchanged the same check() re-asserts the evidence of the last passing run.
import { expect } from 'chai';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { run, sha256File } from '../../domain/qemu';
import { GuestSession } from '../../domain/converter/guestfs';
import { CLOUD_INIT_HOLD } from '../../domain/converter/linux/nics';
import { kvmNicName } from '../../domain/converter/nic-names';
import { unitLink } from '../../domain/converter/linux/firstboot-unit';
import { HV_PURGE } from '../../domain/converter/linux/hv-tools';
import { REBUILD } from '../../domain/converter/linux/initrd-firstboot';
import { testBoot, TestBootResult } from '../../domain/converter/testboot';
import { DebianGuest, ensureDebianGuest } from '../fixtures/debian-guest';
import { asOnVmware, provedSourceBoot } from '../fixtures/source-proof';
import { keepTextOnFailure } from '../helpers/boot-logs';
import { bootTwice, checkTwoBoots, expectAppended, type TwoBoots } from '../helpers/second-boot';
import { CommandRun, ferryConvert } from '../helpers/procs';
import { consoleOf, fixtureInputs, readBack, reusedProof } from '../helpers/proofs';
import type { PipelineReport } from '../../domain/converter/stages/report';
import type { FixAction } from '../../domain/converter/types';

const BOOT_TIMEOUT = 600;
const RENDERED = '/etc/netplan/50-cloud-init.yaml';
/** The guest's marker (scripts/guest-image/guest-ready-mounts.sh, installed by cloud-init.sh). */
const MARKER_SCRIPT = '/usr/local/sbin/ferry-guest-ready';

describe('Ferry on the cloud-init Debian 12 guest: the static address cloud-init rendered survives the move @vm', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the fixtures first
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guest-cloud-init-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('the source boots on SATA; ferry-convert\'s output boots on virtio with the address on the renamed NIC and cloud-init held', async () => {
    const g = await ensureDebianGuest('cloud-init');
    const ready = new RegExp(`${g.ready.source} mounts=/`);
    // The source's boot (recorded: nothing to boot), then Ferry's: one emulated VM at a time.
    const sourceBoot = async () => {
      await provedSourceBoot(g, 'sata', asOnVmware(g, ready), (r) => {
        expect(r, 'the source on SATA').to.include({ status: 'passed' });
        expect(ready.exec(r.matched!)![1]).to.equal(g.vmwareNic);
      });
    };
    const spec = { name: 'guest-cloud-init-output', entries: [__filename], extra: fixtureInputs(g.vmdk) };
    if (await reusedProof(spec, () => convert(g, ready, sourceBoot), (e) => check(ready, e)) === 'reused') await sourceBoot();
  });

  /** What the check reads: ferry-convert's exit and report, the output's console, the output read back, and the
   *  control boot without the hold (its marker script as found, its result and console). */
  interface Evidence {
    cli: CommandRun; report: PipelineReport; console: string; readback?: Record<string, string | null>; source: string[];
    control?: { made: CommandRun; marker: string | null; unheld?: TestBootResult; console: string }; twice?: TwoBoots;
  }

  async function convert(g: DebianGuest, ready: RegExp, sourceBoot: () => Promise<void>): Promise<Evidence> {
    const before = await sha256File(g.vmdk);
    const out = path.join(dir, 'out');
    mkdirSync(out);
    const cfg = path.join(out, 'ferry.yaml');
    writeFileSync(cfg, yaml.dump({
      command: 'local', vmdk: g.vmdk, output_dir: out, to_output: 'cloud-init.qcow2', fstab_mode: 'stabilize-all', update_grub: true, regen_initramfs: true,
      remove_source_hv_tools: true, virt_test: true, virt_test_expect: ready.source, virt_test_timeout: BOOT_TIMEOUT, memory: 1024,
    }));
    await sourceBoot();
    const cli = await ferryConvert(['--config', cfg]);
    const report = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as PipelineReport;
    const output = path.join(out, 'cloud-init.qcow2');
    let readback: Evidence['readback'];
    if (existsSync(output)) {
      // Read back independently: cloud-init held, its rendered file naming the KVM NIC.
      const s = await GuestSession.open([{ path: output, format: 'qcow2' }], { readonly: true });
      try {
        await s.cmd('mount-ro', '/dev/sda1', '/');
        readback = await readBack(s, [CLOUD_INIT_HOLD, RENDERED, `/ferry-backup${RENDERED}`]);
      } finally { await s.close(); }
    }
    // The control only after a passing output boot (the check stops before it otherwise).
    const control = report.test_boot?.status === 'passed' ? await unheldBoot(output, report.test_boot.seconds) : undefined;
    const twice = control ? await bootTwice(output, { expect: ready, timeoutSeconds: 2 * BOOT_TIMEOUT, memoryMiB: 1024 }, async (s) => { await s.cmd('mount-ro', '/dev/sda1', '/'); }, dir) : undefined;
    return { cli, report, console: consoleOf(report), readback, control, source: [before, await sha256File(g.vmdk)], twice };
  }

  /** The control: without the hold, cloud-init renders ens192 again and the renamed NIC gets no address. The guest's
   *  marker gives its verdict after 180 s without the address; here after as long as the whole held boot took to
   *  show READY (+30 s): the address came up within that on the same disk with the hold, and nothing but the hold
   *  differs, so waiting longer only costs time. */
  async function unheldBoot(output: string, heldSeconds: number): Promise<NonNullable<Evidence['control']>> {
    const overlay = path.join(dir, 'unheld.qcow2');
    const made = await run('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', 'qcow2', '-b', output, overlay]);
    if (made.code !== 0) return { made, marker: null, console: '' };
    const verdictAfter = Math.ceil(heldSeconds) + 30;
    const w = await GuestSession.open([{ path: overlay, format: 'qcow2' }]);
    let marker: string | null;
    try {
      await w.cmd('mount', '/dev/sda1', '/');
      await w.cmd('rm', CLOUD_INIT_HOLD);
      // The first-boot units (the tools' removal, the initramfs rebuild) stay off in the control: they touch neither
      // cloud-init nor the network, and under TCG they were the control's only busy work (the rest of its 335-365 s
      // is the guest waiting: systemd-networkd-wait-online's 120 s, then the marker's verdict); the held output's own
      // first boot runs them (bootTwice below).
      for (const u of [HV_PURGE, REBUILD]) await w.cmd('rm-f', unitLink(u));
      marker = (await readBack(w, [MARKER_SCRIPT]))[MARKER_SCRIPT];
      if (marker && verdictAfter < 180) {
        await w.writeFile(MARKER_SCRIPT, `${marker.replace(/-lt 180\b/, `-lt ${verdictAfter}`)}\n`);
        await w.cmd('chmod', '0755', MARKER_SCRIPT);
      }
    } finally { await w.close(); }
    const unheldLog = path.join(dir, 'unheld.log');
    // Its verdict comes only after the boot the held one took and then the verdict's own wait (verdictAfter, in the
    // guest's time): at load, twice the held boot outlasted BOOT_TIMEOUT (2026-11-29: no verdict at 600 s).
    const unheld = await testBoot({ name: 'ferry-cloud-init-unheld', disks: [{ path: overlay, format: 'qcow2' }], bus: 'virtio', nic: 'virtio',
      expect: /FERRY-GUEST-(?:NOT-)?READY[^\r\n]*/, timeoutSeconds: Math.max(BOOT_TIMEOUT, 2 * Math.ceil(heldSeconds) + verdictAfter + 120), consoleLog: unheldLog });
    return { made, marker, unheld, console: existsSync(unheldLog) ? readFileSync(unheldLog, 'latin1') : '' };
  }

  /** The assertions, on a fresh run's evidence or on the record's. */
  function check(ready: RegExp, e: Evidence) {
    const { report, readback, control } = e;
    keepTextOnFailure('guest-cloud-init-output', e.console, () => {
      expect(report.test_boot, 'the output\'s test boot').to.include({ status: 'passed' });
      expect(ready.exec(report.test_boot!.matched!)![1]).to.equal(kvmNicName(0));
      expect(e.console, 'cloud-init ran in the output\'s boot').to.match(/Cloud-init v\. \S+ running 'init-local'/);
    });
    expect(e.cli.code, e.cli.stderr).to.equal(0);
    const actions = report.stages.fix.result!.actions as FixAction[];
    expect(actions.filter((a) => a.action === 'verify' && a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);
    expect(actions.filter((a) => a.action === 'cloud_init').map((a) => a.status)).to.deep.equal(['done']);
    expectAppended(actions);
    // Read back: cloud-init held, its rendered file naming the KVM NIC.
    if (!readback) expect.fail('no output to read back');
    expect(readback[CLOUD_INIT_HOLD]).to.match(/^network: \{config: disabled\}$/m);
    const rendered = yaml.load(readback[RENDERED] ?? '') as { network: { ethernets: Record<string, { addresses: string[] }> } };
    expect(Object.keys(rendered.network.ethernets)).to.deep.equal([kvmNicName(0)]);
    expect(rendered.network.ethernets[kvmNicName(0)].addresses).to.deep.equal(['10.0.2.15/24']);
    expect(readback[`/ferry-backup${RENDERED}`]).to.contain('ens192');
    // The control: without the hold, the guest's own verdict is NOT-READY.
    if (!control) expect.fail('no control boot');
    expect(control.made.code, control.made.stderr).to.equal(0);
    expect(control.marker, 'the marker\'s wait').to.match(/-lt 180\b/);
    keepTextOnFailure('guest-cloud-init-unheld', control.console, () => {
      expect(control.unheld?.matched, 'the guest\'s own verdict without the hold').to.match(/^FERRY-GUEST-NOT-READY /);
    });
    expect(e.source[1], 'the source VMDK is byte-identical').to.equal(e.source[0]);
    // The held output again, twice (issue 34): the appended image until the first-boot unit rebuilt it with the
    // guest's own generator, then that image to the marker with the address on the renamed NIC.
    if (!e.twice) expect.fail('the output was not booted twice');
    keepTextOnFailure('guest-cloud-init-second-boot', `${e.twice.first.console}\n----- second boot -----\n${e.twice.second.console}`, () => checkTwoBoots(e.twice!, ready));
  }
});
