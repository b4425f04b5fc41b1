// A plan's VM repaired with its preflight's reading (issue 34 item 4), as an operator runs it against the real
// daemon, the simulator and the tests' libvirtd: the plan's start reads the tiny guest in place (a guest_preflight
// job), the VM's guest_inspected finding carries the reading, the plan runner hands it to the VM's shape B job
// (parameters.plan.inspection), and the job's repair takes it instead of running libguestfs's inspection: the
// report on disk says so, and its appliance timings have no inspect-os. The VM completes, repaired and booted.
// The run is a reused proof (test/helpers/proofs.ts): with every input unchanged the same check() re-asserts the
// evidence of the last passing run.
import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { req, until } from '../helpers/http';
import { fixtureInputs, reusedProof } from '../helpers/proofs';
import { awaitWorkers, startWorkerProc } from '../helpers/procs';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { PLAN_CAPS, startPlanStack, type PlanStack } from './fixture';
import type { PlanView } from '../helpers/api-types';
import type { TestBootResult } from '../../domain/converter/testboot';
import type { PipelineReport } from '../../domain/converter/stages/report';
import type { InspectionHint } from '../../domain/converter/inspection-hint';

const PREFIX = 'planread';
const FINAL = ['completed', 'failed', 'cancelled'];

interface Evidence {
  started: { status: number; text: string }; plan: PlanView;
  /** the job's parameters.plan.inspection, as stored in Redis */
  handed: InspectionHint | null;
  boot: TestBootResult | null;
  fix: { guest: Record<string, unknown>; actions: { action: string; status: string }[] } | null;
  timings: string[]; warnings: string[];
}

describe('plans: a VM\'s repair takes its preflight\'s reading of the guest @vm', function () {
  this.timeout(1_800_000);
  let s: PlanStack | undefined;
  after(async () => { await s?.stop(); });

  async function run(disk: string): Promise<Evidence> {
    s = await startPlanStack({ prefix: PREFIX, workers: {}, env: { FERRY_GUEST_PREFLIGHT: '1', FERRY_GUEST_PREFLIGHT_SECONDS: '1200' } });
    // One worker that both reads guests in place (nbd_access) and runs the shape B job.
    const w = await startWorkerProc(s.env, 'pr-w', [...PLAN_CAPS, 'nbd_access'], ['--concurrency', '2']);
    s.workers['pr-w'] = w;
    await awaitWorkers(s.url, [w]);
    await s.addVm({ name: 'pr0', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:0a:00:10' }, { path: disk, bytes: TINY_GUEST_BYTES });
    const c = await req(s.url, 'POST', '/plans', s.plan('pr', ['pr0'], { options: { power_off: 'force', virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 } } }));
    expect(c.status, c.text).to.equal(201);
    // The tiny guest boots from MBR code of its own, not GRUB: the operator accepts what the preflight would block.
    const o = await req(s.url, 'POST', '/plans/pr/overrides', { vm_path: s.vm('pr0'), rule: 'guest_no_bootloader', reason: 'boots from its own MBR code' });
    expect(o.status, o.text).to.equal(200);
    const started = await req<PlanView>(s.url, 'POST', '/plans/pr/start');
    const plan = await until(async () => { const p = await s!.get('pr'); return FINAL.includes(p.status) && p; }, 1_500_000, 'plan pr to end');
    const jobId = plan.vms[0].job_id ?? plan.vms[0].jobs.at(-1);
    const spec = JSON.parse((await s.rc.hget(`${PREFIX}:job:${jobId}`, 'spec')) || '{}') as { parameters?: { plan?: { inspection?: InspectionHint } } };
    const result = JSON.parse((await s.rc.hget(`${PREFIX}:job:${jobId}`, 'result')) || 'null') as { boot: TestBootResult; conversion: { report_path: string } } | null;
    const report = result ? JSON.parse(readFileSync(result.conversion.report_path, 'utf8')) as PipelineReport : undefined;
    const e: Evidence = {
      started: { status: started.status, text: started.text }, plan, handed: spec.parameters?.plan?.inspection ?? null, boot: result?.boot ?? null,
      fix: report ? { guest: (report.stages.fix.result?.guest ?? {}) as Record<string, unknown>, actions: (report.stages.fix.result?.actions ?? []) as { action: string; status: string }[] } : null,
      timings: Object.keys(report?.summary.timings ?? {}), warnings: report?.warnings ?? [],
    };
    return JSON.parse(JSON.stringify(e)) as Evidence;
  }

  function check(e: Evidence) {
    expect(e.started.status, e.started.text).to.equal(200);
    const vm = e.plan.vms[0];
    expect(e.plan.status, JSON.stringify([vm.status, vm.error])).to.equal('completed');
    // What the preflight read, in the plan's record: the job's own device names, UUIDs and file digests.
    const read = vm.findings.find((f) => f.rule === 'guest_inspected')?.guest?.inspection as InspectionHint | undefined;
    expect(read, JSON.stringify(vm.findings.map((f) => f.rule))).to.not.equal(undefined);
    expect(read).to.deep.include({ os: 'linux', distro: 'debian', package_format: 'deb', root: '/dev/sda1' });
    expect(read!.evidence['/etc/fstab']).to.match(/^[0-9a-f]{64}$/);
    expect(read!.evidence['/var/lib/dpkg/status']).to.match(/^[0-9a-f]{64}$/);
    // Handed to the job by the runner, and taken by its repair: no inspect-os in the appliance.
    expect(e.handed).to.deep.equal(read);
    expect(e.fix?.guest).to.deep.include({ os: 'linux', distro: 'debian', root_device: '/dev/sda1', inspection: { from: 'preflight' } });
    expect(e.timings.filter((t) => t.startsWith('appliance: ')), 'the appliance ran').to.not.deep.equal([]);
    expect(e.timings).to.not.include('appliance: inspect-os');
    expect(e.warnings.join(' | ')).to.not.include('inspected again');
    // The repair did its work on what it took, and the output booted.
    expect(e.fix?.actions.find((a) => a.action === 'fstab'), 'fstab').to.include({ status: 'done' });
    expect(e.boot).to.include({ status: 'passed', matched: TINY_GUEST_MARKER });
  }

  it('the preflight reads the guest, the runner hands the reading to the job, the repair takes it (no inspect-os), and the VM completes', async () => {
    const disk = await ensureTinyGuest();
    await reusedProof({ name: 'plans-preflight-reading', entries: [__filename], extra: fixtureInputs(disk) }, () => run(disk), check);
  });
});
