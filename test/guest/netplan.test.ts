// The netplan Debian 12 guest (test/fixtures/debian-guest.ts 'netplan': netplan with the systemd-networkd renderer
// holding ens192's static address, and a data disk mounted as `/dev/sdb1 /data` without nofail), issue 20 items
// 1, 4 and 5:
// - the source boots on SATA, its data disk on pvscsi as on VMware, and prints its marker on ens192 with every fstab mount present;
//   (a property of the cached fixture: booted once per fixture build, its record re-checked after,
//   test/fixtures/source-proof.ts)
// - a migrate job with both disks (every repair, virt_test with the same marker) makes two outputs that boot on
//   virtio-blk with a virtio NIC: the NIC renamed in netplan's own file, /data found by its UUID on the second
//   virtio disk;
// - read back: fstab names each file system by the UUID its output disk holds, netplan's file names the KVM NIC
//   (the original in /ferry-backup), and the source VMDKs are byte-identical.
// - then it boots twice more on overlays (test/helpers/second-boot.ts): the appended initramfs until the first-boot
//   unit rebuilt it with the guest's own generator, then the generator's image to the marker (issue 34).
// That this guest's initramfs does not find its root on virtio-blk is the plain variant's (fixture.test.ts): the
// netplan layer keeps the plain disk's boot loader and initramfs. Serial logs of a failed check stay in
// test/artifacts/guest-netplan-*.log.
// The job, the outputs' boot and their read-back are a reused proof (test/helpers/proofs.ts; the gateway and worker
// start only when it runs): with every input unchanged (the code the gateway and worker load among them) the same
// check() re-asserts the evidence of the last passing run.
import { expect } from 'chai';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { sha256File } from '../../domain/qemu';
import { GuestSession } from '../../domain/converter/guestfs';
import { kvmNicName } from '../../domain/converter/nic-names';
import { DebianGuest, ensureDebianGuest, GUEST_CACHE, repairManifest } from '../fixtures/debian-guest';
import { asOnVmware, provedSourceBoot } from '../fixtures/source-proof';
import { keepTextOnFailure } from '../helpers/boot-logs';
import { bootTwice, checkTwoBoots, expectAppended, type TwoBoots } from '../helpers/second-boot';
import { consoleOf, fixtureInputs, readBack, reusedProof } from '../helpers/proofs';
import { startStack } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';
import type { PipelineReport } from '../../domain/converter/stages/report';
import type { FixAction } from '../../domain/converter/types';

const BOOT_TIMEOUT = 600;

describe('Ferry on the netplan Debian 12 guest with a data disk: both disks and the static address after the move @vm', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the fixtures first
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guest-netplan-'));
  // Started only when the proof runs (a reused one needs no gateway nor worker).
  let stack: Awaited<ReturnType<typeof startStack>> | undefined;
  after(async () => {
    await stack?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('the source boots on SATA; a migrate job\'s two outputs boot on virtio with /data mounted and netplan\'s address on the renamed NIC', async () => {
    const g = await ensureDebianGuest('netplan');
    const ready = new RegExp(`${g.ready.source} mounts=/,/data`);
    // The source's boot (recorded: nothing to boot), then Ferry's: one emulated VM at a time.
    const sourceBoot = async () => {
      await provedSourceBoot(g, 'sata', asOnVmware(g, ready, { disks: [{ path: g.vmdk, format: 'vmdk' }, { path: g.dataVmdk!, format: 'vmdk', bus: 'pvscsi' }] }), (r) => {
        expect(r, 'the source on SATA').to.include({ status: 'passed' });
        expect(ready.exec(r.matched!)![1]).to.equal(g.vmwareNic);
      });
    };
    const spec = { name: 'guest-netplan-output', entries: [__filename], extra: fixtureInputs(g.vmdk, g.dataVmdk) };
    if (await reusedProof(spec, () => migrate(g, ready, sourceBoot), (e) => check(g, ready, e)) === 'reused') await sourceBoot();
  });

  /** What the check reads: the job's submission and end, its report, the outputs' console, the outputs read back. */
  interface Evidence {
    sub: { status: number; text: string }; final: Pick<JobStatus, 'state' | 'error' | 'result'>; report: PipelineReport; console: string;
    readback?: { rootUuid: string; dataUuid: string; files: Record<string, string | null> }; source: string[][]; twice?: TwoBoots;
  }
  const PLAN = '/etc/netplan/01-vmware.yaml';

  async function migrate(g: DebianGuest, ready: RegExp, sourceBoot: () => Promise<void>): Promise<Evidence> {
    const data = g.dataVmdk!;
    const sums = await Promise.all([sha256File(g.vmdk), sha256File(data)]);
    const out = path.join(dir, 'out');
    const manifest = await repairManifest(g, out, 'netplan.qcow2', 'test');
    stack = await startStack('netplan-worker', ['img_tool', 'mount_operations'], { FERRY_INPUT_ROOTS: [os.tmpdir(), GUEST_CACHE].join(':') });
    const gw = stack.gw.url;
    await sourceBoot();
    const sub = await req(gw, 'POST', '/jobs?queue=true', { job_id: 'guest-netplan', operation: 'migrate', parameters: { manifest, virt_test: { expect: ready.source, timeout_seconds: BOOT_TIMEOUT, memory_mib: 1024 } } });
    expect(sub.status, sub.text).to.equal(201);
    const final = await until(async () => { const j = (await req<JobStatus>(gw, 'GET', '/jobs/guest-netplan')).body; return ['COMPLETED', 'FAILED', 'CANCELLED'].includes(j.state) && j; }, 40 * 60_000, 'the migrate job');
    const report = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as PipelineReport;
    const outs = ['root', 'data'].map((id) => ({ path: path.join(out, `netplan-${id}.qcow2`), format: 'qcow2' }));
    let readback: Evidence['readback'];
    if (outs.every((o) => existsSync(o.path))) {
      // Read back independently: the system disk's fstab and netplan's file, both disks' UUIDs.
      const s = await GuestSession.open(outs, { readonly: true });
      try {
        const [rootUuid, dataUuid] = [await s.cmd('vfs-uuid', '/dev/sda1'), await s.cmd('vfs-uuid', '/dev/sdb1')].map((u) => u.trim());
        await s.cmd('mount-ro', '/dev/sda1', '/');
        readback = { rootUuid, dataUuid, files: await readBack(s, ['/etc/fstab', PLAN, `/ferry-backup${PLAN}`]) };
      } finally { await s.close(); }
    }
    const twice = readback ? await bootTwice(outs.map((o) => o.path), { expect: ready, timeoutSeconds: 2 * BOOT_TIMEOUT, memoryMiB: 1024 }, async (s) => { await s.cmd('mount-ro', '/dev/sda1', '/'); }, dir) : undefined;
    const source = [sums, await Promise.all([sha256File(g.vmdk), sha256File(data)])];
    return { sub: { status: sub.status, text: sub.text }, final: { state: final.state, error: final.error, result: final.result }, report, console: consoleOf(report), readback, source, twice };
  }

  /** The assertions, on a fresh run's evidence or on the record's. */
  function check(g: DebianGuest, ready: RegExp, e: Evidence) {
    const { report, final } = e;
    expect(e.sub.status, e.sub.text).to.equal(201);
    keepTextOnFailure('guest-netplan-output', e.console, () => {
      expect(final.state, JSON.stringify(final.error || final.result?.errors)).to.equal('COMPLETED');
      expect(report.test_boot, 'the outputs\' test boot').to.include({ status: 'passed' });
      expect(ready.exec(report.test_boot!.matched!)![1]).to.equal(kvmNicName(0));
    });
    const actions = report.stages.fix.result!.actions as FixAction[];
    expect(actions.filter((a) => a.action === 'verify' && a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);
    expect(actions.filter((a) => a.action === 'nic_names' && a.file === PLAN).map((a) => a.status)).to.deep.equal(['done']);
    // Read back: the system disk's fstab names /data by the UUID the output data disk holds.
    if (!e.readback) expect.fail('no outputs to read back');
    const { rootUuid, dataUuid, files } = e.readback;
    const fstab = (files['/etc/fstab'] ?? '').split('\n').map((l) => l.trim()).filter((l) => l && !l.startsWith('#')).map((l) => l.split(/\s+/).slice(0, 2));
    expect(fstab).to.deep.equal([[`UUID=${rootUuid}`, '/'], [`UUID=${dataUuid}`, '/data']]);
    expect(files[PLAN]).to.match(new RegExp(`^    ${kvmNicName(0)}:$`, 'm')).and.not.contain(g.vmwareNic);
    expect(files[`/ferry-backup${PLAN}`]).to.match(new RegExp(`^    ${g.vmwareNic}:$`, 'm'));
    expect(e.source[1], 'the source VMDKs are byte-identical').to.deep.equal(e.source[0]);
    // The test boot booted the appended image (issue 34); the first-boot unit then rebuilt it with the guest's own
    // generator, and the next boot (both disks, /data mounted) is on that image.
    expectAppended(actions);
    if (!e.twice) expect.fail('the outputs were not booted twice');
    keepTextOnFailure('guest-netplan-second-boot', `${e.twice.first.console}\n----- second boot -----\n${e.twice.second.console}`, () => checkTwoBoots(e.twice!, ready));
  }
});
