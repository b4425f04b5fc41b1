// After Ferry, the real Debian 12 guest (test/fixtures/debian-guest.ts: root by /dev/sda1 or on LVM, an initramfs
// without virtio, GRUB_DISABLE_LINUX_UUID=true, ens192 configured statically, open-vm-tools) boots on virtio-blk
// with a virtio NIC and prints its marker, its interface renamed to the virtio NIC's name and configured as
// before; open-vm-tools is gone; the source VMDK is byte-identical. Each variant through a `migrate` job on the
// gateway with a real worker and virt_test (a real qemu boot of the output, judged from the console), one after the
// other. `ferry-convert` runs the same pipeline (domain/converter) on every layer's guest (btrfs, cloud-init, uefi,
// rhel-shaped, releases), so these two are the job path's. That the source itself does not boot on virtio-blk is
// shown by test/guest/fixture.test.ts. Each output is then read back in a read-only appliance. Serial logs of a
// failed boot are kept in test/artifacts/.
// Then the output boots twice more on an overlay (test/helpers/second-boot.ts): first on the image Ferry appended
// virtio to, until the first-boot unit has rebuilt it with the guest's own update-initramfs, then on that image; the
// marker both times, the unit gone, every kernel's rebuilt image holding the virtio modules (issue 34).
// Each variant's job, boot and read-back are a reused proof (test/helpers/proofs.ts; the gateway and worker start
// only when one runs): with every input unchanged the same check() re-asserts the evidence of the last passing run.
import { expect } from 'chai';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { imageInfo, sha256File } from '../../domain/qemu';
import { GuestSession } from '../../domain/converter/guestfs';
import { kvmNicName } from '../../domain/converter/nic-names';
import { ensureDebianGuest, DebianGuest, DebianVariant, GUEST_CACHE } from '../fixtures/debian-guest';
import { keepTextOnFailure } from '../helpers/boot-logs';
import { consoleOf, fixtureInputs, readBack, reusedProof } from '../helpers/proofs';
import { startStack } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';
import type { PipelineReport } from '../../domain/converter/stages/report';
import type { FixAction } from '../../domain/converter/types';
import { bootTwice, checkTwoBoots, expectAppended, expectHvRemovalAtBoot, type TwoBoots } from '../helpers/second-boot';

const BOOT_TIMEOUT = 420;

/** The boot judged in the report: passed on the marker, naming the interface the guest configured, with its address
 *  (`consoleText`: the boot's whole serial console). */
function expectBooted(name: string, g: DebianGuest, report: PipelineReport, consoleText: string) {
  keepTextOnFailure(`guest-repair-${name}`, consoleText, () => {
    expect(report.test_boot, 'test boot').to.include({ status: 'passed' });
    const m = g.ready.exec(report.test_boot!.matched!);
    expect(m, `marker ${report.test_boot!.matched}`).to.not.equal(null);
    // The interface is renamed to what the virtio NIC is called on KVM (in Ferry's layout, where the test boot
    // puts it) and comes up configured as before, with its static address.
    expect(m![1]).to.equal(kvmNicName(0));
    expect(consoleText).to.match(g.ready);
    expect(consoleText).to.match(new RegExp(`virtio_net \\S+ ${kvmNicName(0)}: renamed from eth0`));
  });
}

describe('Ferry on the real Debian 12 guest: the output boots on virtio @vm', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the fixture first
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guest-repair-'));
  // Started only when a proof runs (a reused one needs no gateway nor worker).
  let stack: Awaited<ReturnType<typeof startStack>> | undefined;
  after(async () => {
    await stack?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  /** The two base variants (each layer on the plain disk has its own file in test/guest/). */
  type BiosVariant = Extract<DebianVariant, 'plain' | 'lvm'>;
  /** What the check reads: the job's submission and end, its report, the output's console, the output read back. */
  interface Evidence {
    sub: { status: number; text: string }; final: Pick<JobStatus, 'state' | 'error' | 'result'>; report: PipelineReport; console: string;
    readback?: { files: Record<string, string | null>; unitLink?: string; etcNetwork: string; systemdNetwork: string }; source: string[];
    /** The output booted twice on an overlay: the appended image, then the guest generator's own (issue 34). */
    twice?: TwoBoots;
  }
  const FILES = ['/var/lib/dpkg/status', '/etc/fstab', '/boot/grub/grub.cfg', '/etc/default/grub', '/etc/network/interfaces', '/ferry-backup/etc/network/interfaces'];

  /** The output's filesystems, read-only. */
  async function mountGuest(s: GuestSession, variant: BiosVariant) {
    if (variant === 'lvm') await s.cmd('vg-activate-all', 'true');
    await s.cmd('mount-ro', variant === 'lvm' ? '/dev/vgferry/root' : '/dev/sda1', '/');
    if (variant === 'lvm') await s.cmd('mount-ro', '/dev/sda1', '/boot');
  }

  /** One variant's migrate job and the read-back of its output. */
  async function migrate(g: DebianGuest, variant: BiosVariant): Promise<Evidence> {
    const before = await sha256File(g.vmdk);
    const jobOut = path.join(dir, `${variant}-job`);
    const jobId = `guest-${variant}`;
    const manifest = {
      manifest_version: '1.0', source: { provider: 'test', vm_name: `debian-${variant}` },
      disks: [{ id: 'root', source_format: 'vmdk', bytes: (await imageInfo(g.vmdk, 'vmdk'))['virtual-size'], local_path: g.vmdk, boot_order_hint: 0, disk_type: 'boot' }],
      pipeline: { inspect: { enabled: true }, convert: { enabled: true }, fix: { enabled: true, fstab_mode: 'stabilize-all', update_grub: true, regen_initramfs: true, remove_source_hv_tools: true }, validate: { enabled: true } },
      output: { directory: jobOut, format: 'qcow2', filename: `${variant}.qcow2` },
    };
    // The cached fixture lies outside the default storage roots (the temp dir, /srv): the job may read it.
    stack ??= await startStack('guest-worker', ['img_tool', 'mount_operations'], { FERRY_INPUT_ROOTS: [os.tmpdir(), GUEST_CACHE].join(':') });
    const gw = stack.gw;
    const sub = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: jobId, operation: 'migrate', parameters: { manifest, virt_test: { expect: g.ready.source, timeout_seconds: BOOT_TIMEOUT, memory_mib: 1024 } } });
    expect(sub.status, sub.text).to.equal(201);
    const final = await until(async () => { const j = (await req<JobStatus>(gw.url, 'GET', `/jobs/${jobId}`)).body; return ['COMPLETED', 'FAILED', 'CANCELLED'].includes(j.state) && j; }, 40 * 60_000, `job ${jobId} finished`);
    const report = JSON.parse(readFileSync(path.join(jobOut, 'report.json'), 'utf8')) as PipelineReport;
    const output = path.join(jobOut, `${variant}.qcow2`);
    let readback: Evidence['readback'];
    if (existsSync(output)) {
      // Read back independently, in a read-only appliance.
      const s = await GuestSession.open([{ path: output, format: 'qcow2' }], { readonly: true });
      try {
        await mountGuest(s, variant);
        readback = {
          files: await readBack(s, FILES), unitLink: await s.tryCmd('is-symlink', '/etc/systemd/system/multi-user.target.wants/open-vm-tools.service'),
          etcNetwork: await s.cmd('ls', '/etc/network'), systemdNetwork: await s.cmd('ls', '/etc/systemd/network'),
        };
      } finally { await s.close(); }
    }
    const twice = existsSync(output) ? await bootTwice(output, { expect: g.ready, timeoutSeconds: 2 * BOOT_TIMEOUT, memoryMiB: 1024 }, (s) => mountGuest(s, variant), dir) : undefined;
    return { sub: { status: sub.status, text: sub.text }, final: { state: final.state, error: final.error, result: final.result }, report, console: consoleOf(report), readback, source: [before, await sha256File(g.vmdk)], twice };
  }

  /** The assertions, on a fresh run's evidence or on the record's. */
  function check(g: DebianGuest, variant: BiosVariant, e: Evidence) {
    const { report, final } = e;
    expect(e.sub.status, e.sub.text).to.equal(201);
    expectBooted(`${variant}-job`, g, report, e.console);
    expect(final.state, JSON.stringify(final.error || final.result?.errors)).to.equal('COMPLETED');
    // What the report says held at the end, read back by Ferry itself: every check done, none failed.
    const verify = (report.stages.fix.result!.actions as FixAction[]).filter((a) => a.action === 'verify');
    expect(verify.filter((a) => a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);
    expect(verify.map((a) => a.check)).to.include.members(['/etc/fstab', '/etc/default/grub', '/boot/grub/grub.cfg', 'source hypervisor tools']);
    // Read back independently.
    if (!e.readback) expect.fail('no output to read back');
    const { files } = e.readback;
    const lines = (t: string) => t.split('\n').map((l) => l.trim()).filter(Boolean);
    // open-vm-tools is removed by the guest's dpkg at its first boot on KVM (checkTwoBoots reads dpkg's database
    // after both boots); until then its unit is disabled.
    expectHvRemovalAtBoot(report.stages.fix.result!.actions as FixAction[]);
    expect(files['/var/lib/dpkg/status']).to.match(/^Package: open-vm-tools\nStatus: install ok installed/m);
    expect(e.readback.unitLink).to.not.match(/true/);
    expect(files['/etc/fstab']).not.to.match(/^\/dev\/sd/m);
    const grubCfg = files['/boot/grub/grub.cfg'];
    expect(grubCfg).not.to.match(/root=\/dev\/sd/);
    expect(grubCfg).to.match(variant === 'lvm' ? /root=\/dev\/mapper\/vgferry-root/ : /root=UUID=[0-9a-f-]{36}/);
    expect(files['/etc/default/grub']).not.to.match(/^GRUB_DISABLE_LINUX_UUID=true/m);
    const ifaces = files['/etc/network/interfaces'];
    expect(ifaces).to.match(new RegExp(`iface ${kvmNicName(0)} inet static`));
    expect(ifaces).not.to.contain(g.vmwareNic);
    // The original is kept in Ferry's backup tree, not beside the file where ifupdown or initscripts would read it.
    expect(files['/ferry-backup/etc/network/interfaces']).to.match(new RegExp(`iface ${g.vmwareNic} inet static`));
    expect(lines(e.readback.etcNetwork).filter((f) => f.includes('ferry-backup'))).to.deep.equal([]);
    expect(lines(e.readback.systemdNetwork)).to.include(`10-ferry-${kvmNicName(0)}.link`);
    expect(e.source[1], 'the source VMDK is byte-identical').to.equal(e.source[0]);
    // The test boot above booted the appended image (issue 34): every kernel's image got the archive, none was
    // rebuilt in the appliance; then the first-boot unit rebuilt them with the guest's own generator.
    expectAppended(report.stages.fix.result!.actions as FixAction[]);
    if (!e.twice) expect.fail('the output was not booted twice');
    keepTextOnFailure(`guest-repair-${variant}-second-boot`, `${e.twice.first.console}\n----- second boot -----\n${e.twice.second.console}`, () => checkTwoBoots(e.twice!, g.ready));
  }

  // One after the other: one emulated VM at a time per test file, so the suite's two files at once keep two on the
  // two cores (more starved the guests past systemd's 90 s device timeouts). Each variant is a reused proof.
  for (const variant of ['plain', 'lvm'] as BiosVariant[]) {
    it(`${variant}: a migrate job makes an output that boots on virtio-blk with its network as before; open-vm-tools gone; source unchanged`, async () => {
      const g = await ensureDebianGuest(variant);
      const spec = { name: `guest-repair-${variant}`, entries: [__filename], extra: fixtureInputs(g.vmdk) };
      await reusedProof(spec, () => migrate(g, variant), (e) => check(g, variant, e));
    });
  }
});
