// A new leader resumes a rollback and a source removal another leader claimed (docs/plans.md "Claims"): both are
// worker jobs, so a claim stays open for as long as no worker can run its job. Three daemons on one Redis, and
// workers started and stopped by the test: a plan of two tiny real guests, one at a time (limits.per_plan 1).
// r0's boot check waits for text its console never shows, so its job fails after the import, its domain and volume
// on the target; the worker that ran it is told to stop during that boot check (it finishes the job and takes no
// other), so the rollback is claimed and its rollback_kvm job queued with no worker able to run it. The leading
// daemon is SIGKILLed; the next leader takes the claim over; a worker with libvirt_access alone runs the job. Then
// s0 (options.remove_source) migrates on a new full worker, stopped the same way during its boot check, so the
// removal's remove_source job waits for a vsphere_access worker; the second leader is SIGKILLed, the third takes
// over, and a vsphere_access worker runs it. Checked: each claim done once, resumed once, its one job (the id
// derived from the claim) run in one attempt; r0's domain and volume gone by the UUID and key its ledger lists; s0
// gone from the simulator's inventory and running on the target.
// A reused proof (test/helpers/proofs.ts): what the test read on the way is its evidence, and with every input
// unchanged the same check() re-asserts the evidence of the last passing run; the stack starts only when it runs.
import { expect } from 'chai';
import { req, until } from '../helpers/http';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { findVm } from '../../domain/vsphere/inventory';
import { keys } from '../../platform/redis';
import { startDaemonProc, startWorkerProc, type Proc } from '../helpers/procs';
import { PLAN_CAPS, PlanStack, startPlanStack } from './fixture';
import { fixtureInputs, reusedProof } from '../helpers/proofs';
import type { PlanView } from '../helpers/api-types';
import path from 'node:path';

const PREFIX = 'planresume';
type Vm = PlanView['vms'][number];
type Daemon = PlanStack['daemons'][number];
const claimOf = (v: Vm, action: 'rollback' | 'remove_source') => (v.actions ?? []).filter((a) => a.action === action);
/** A job record's state and attempts, as Redis holds them. */
type JobState = { state: string; attempts: string };

/** What the test read on the way: the jobs, the claims and their jobs, the target and the inventory at each step. */
interface Evidence {
  created: number; started: number; vms: { r0: string; s0: string };
  r0Job: string; ledger: { kind: string; id: string }[]; volume: string;
  /** the state of each claim's job while its leader was killed (no worker could run it yet) */
  waiting: { rollback: string; remove_source: string };
  r0WhileWaiting: string[]; r0: Vm; rbJob: JobState;
  /** after the rollback: dominfo of the ledger's UUID, vol-key of its volume ('gone' or 'still there'), the domains */
  domainAfter: string; volumeAfter: string; domainsAfter: string[];
  s0Job: string; s0JobState: string; s0WhileWaiting: string; plan: PlanView; rsJob: JobState;
  s0InInventory: string; s0OnTarget: string; effectJobs: string[];
}

async function run(tiny: string): Promise<Evidence> {
  const s = await startPlanStack({ prefix: PREFIX, daemons: 2, workers: {} });
  try { return await resume(s, tiny); } finally { await s.stop(); }
}

async function resume(s: PlanStack, tiny: string): Promise<Evidence> {
  await s.addVm({ name: 'r0', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:06:00:10' }, { path: tiny, bytes: TINY_GUEST_BYTES });
  await s.addVm({ name: 's0', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:06:00:11' }, { path: tiny, bytes: TINY_GUEST_BYTES });
  const k = keys(PREFIX);
  let n = 0;
  // Workers finish a running job when stopped (within the grace), then exit having taken no other.
  const worker = async (caps: string[]) => { const w = await startWorkerProc({ ...s.env, FERRY_SHUTDOWN_GRACE_SECONDS: '600' }, `rw${++n}`, caps); s.workers[`rw${n}`] = w; return w; };
  const stopWorker = async (w: Proc) => {
    const exited = new Promise((r) => w.proc.once('exit', r));
    w.proc.kill('SIGTERM');
    await exited;
  };
  const leader = async () => {
    const lease = await until(() => s.rc.get(`${PREFIX}:leader:plans`), 60_000, 'a plans leader');
    return s.daemons.find((d) => lease.startsWith(`${d.proc.pid}:`))!;
  };
  const alive = () => s.daemons.filter((d) => d.proc.exitCode === null && !d.proc.signalCode);
  const plan = async (via: Daemon) => (await req<PlanView>(via.url, 'GET', '/plans/resume')).body;
  const vmOf = (p: PlanView, name: string) => p.vms.find((x) => x.vm_path === s.vm(name))!;
  const phase = async (id: string) => (JSON.parse((await s.rc.hget(k.job(id), 'latest_event')) || 'null') as { phase?: string } | null)?.phase;
  const record = async (id: string) => s.rc.hgetall(k.job(id));
  const jobState = async (id: string): Promise<JobState> => { const r = await record(id); return { state: r.state, attempts: r.attempts }; };
  const gone = (args: string[]) => s.lv.virsh(args).then(() => 'still there', () => 'gone');

  /** Kills the leader while the claim is open and its job queued; returns a daemon still alive once another leads,
   *  and the state of the claim's job when the leader was killed. */
  async function killLeaderWith(name: string, action: 'rollback' | 'remove_source'): Promise<[Daemon, string]> {
    const l = await leader();
    const via = alive().find((d) => d !== l)!;
    const open = await until(async () => { const a = claimOf(vmOf(await plan(via), name), action); return a.length === 1 && !!a[0].job_id && !a[0].done_at && a[0]; }, 300_000, `${name}'s ${action} claimed`);
    const state = (await record(open.job_id ?? '')).state;
    await l.kill();
    await until(async () => { const x = await leader(); return x && x !== l; }, 60_000, 'another daemon to take the plans lease');
    return [via, state];
  }

  const body = s.plan('resume', [], { limits: { per_plan: 1 } });
  body.vms = [
    { vm_path: s.vm('r0'), options: { virt_test: { expect: 'FERRY-NEVER-SHOWN', timeout_seconds: 20 } } },
    { vm_path: s.vm('s0'), options: { remove_source: true, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 180 } } },
  ];
  const created = (await req(s.url, 'POST', '/plans', body)).status;
  const started = (await req(s.url, 'POST', '/plans/resume/start')).status;

  // r0: its job gets to the boot check on a full worker, which is then stopped: no worker can roll it back.
  const w1 = await worker(PLAN_CAPS);
  const r0Job = await until(async () => vmOf(await s.get('resume'), 'r0').job_id, 60_000, 'r0\'s job');
  await until(async () => (await phase(r0Job)) === 'boot', 1_800_000, 'r0\'s boot check');
  await stopWorker(w1);
  const ledger = JSON.parse((await record(r0Job)).ledger || '[]') as { kind: string; id: string }[];
  const [via1, rbWaiting] = await killLeaderWith('r0', 'rollback');
  // A third daemon for the second take-over.
  s.daemons.push(await startDaemonProc(s.env, path.join(s.dir, 'daemon.yaml')));
  const r0WhileWaiting = await s.domains();

  await worker(['libvirt_access']);
  const r0 = await until(async () => { const v = vmOf(await plan(via1), 'r0'); return v.status === 'rolled_back' && v; }, 300_000, 'r0 rolled back');
  const rbJob = await jobState(claimOf(r0, 'rollback')[0]?.job_id ?? '');
  const volume = path.join(s.lv.poolDir, 'r0.qcow2');
  const domainAfter = await gone(['dominfo', ledger.find((e) => e.kind === 'domain')?.id ?? '']);
  const volumeAfter = await gone(['vol-key', volume]);
  const domainsAfter = await s.domains();

  // s0: migrated on a full worker, stopped during its boot check: its removal waits for a vsphere_access worker.
  const w3 = await worker(PLAN_CAPS);
  const s0Job = await until(async () => vmOf(await plan(via1), 's0').job_id, 120_000, 's0\'s job');
  await until(async () => (await phase(s0Job)) === 'boot', 1_800_000, 's0\'s boot check');
  await stopWorker(w3);
  const s0JobState = (await record(s0Job)).state;
  const [via2, rsWaiting] = await killLeaderWith('s0', 'remove_source');
  const s0WhileWaiting = await findVm(s.m, s.vm('s0')).then(() => 'there', (e: Error) => e.message);

  await worker(['vsphere_access']);
  const p = await until(async () => { const x = await plan(via2); return ['completed', 'failed'].includes(x.status) && x; }, 300_000, 'the plan to end');
  const rsJob = await jobState(claimOf(vmOf(p, 's0'), 'remove_source')[0]?.job_id ?? '');
  const s0InInventory = await findVm(s.m, s.vm('s0')).then(() => 'still there', (e: Error) => e.message);
  const s0OnTarget = (await s.lv.virsh(['domstate', 's0'])).trim();
  const effectJobs = (await s.rc.keys(k.job('*'))).map((x) => x.slice(k.job('').length)).filter((x) => !x.includes(':') && /\.(rollback|remove_source)/.test(x)).sort();
  const e: Evidence = {
    created, started, vms: { r0: s.vm('r0'), s0: s.vm('s0') }, r0Job, ledger, volume, waiting: { rollback: rbWaiting, remove_source: rsWaiting },
    r0WhileWaiting, r0, rbJob, domainAfter, volumeAfter, domainsAfter, s0Job, s0JobState, s0WhileWaiting, plan: p, rsJob, s0InInventory, s0OnTarget, effectJobs,
  };
  return JSON.parse(JSON.stringify(e)) as Evidence;
}

function check(e: Evidence) {
  expect([e.created, e.started]).to.deep.equal([201, 200]);
  // r0's job got as far as the import: its ledger lists its domain and its volume.
  const domain = e.ledger.find((x) => x.kind === 'domain')?.id;
  expect(domain, 'r0\'s ledger lists its domain').to.be.a('string');
  expect(e.ledger.filter((x) => x.kind === 'volume').map((x) => x.id), 'r0\'s ledger lists its volume').to.include(e.volume);
  expect(e.waiting.rollback, 'rollback job waiting for a worker').to.equal('QUEUED');
  expect(e.r0WhileWaiting, 'r0 still on the target while no worker can roll it back').to.include('r0');
  // The next leader took the claim over; a worker with libvirt_access alone ran its one job, in one attempt.
  const rbs = claimOf(e.r0, 'rollback');
  expect(rbs).to.have.length(1);
  expect(rbs[0]).to.include({ key: e.r0Job, job_id: `${e.r0Job}.rollback`, resumed: 1 });
  expect(rbs[0].done_at).to.be.a('string');
  expect([e.rbJob.state, e.rbJob.attempts]).to.deep.equal(['COMPLETED', '1']);
  // Gone by the identities the ledger lists: the domain's UUID, the volume's key (its path in this dir pool).
  expect(e.r0.rollback!.detail).to.include(domain!).and.include(`volume ${e.volume} removed`);
  expect(e.domainAfter).to.equal('gone');
  expect(e.volumeAfter).to.equal('gone');
  expect(e.domainsAfter).to.not.include('r0');

  // s0: its job completed; its removal waited for a vsphere_access worker, then ran once under the next leader.
  expect(e.s0JobState, 's0\'s job').to.equal('COMPLETED');
  expect(e.waiting.remove_source, 'remove_source job waiting for a worker').to.equal('QUEUED');
  expect(e.s0WhileWaiting, 's0 still on vSphere while no worker can remove it').to.equal('there');
  const s0 = e.plan.vms.find((x) => x.vm_path === e.vms.s0)!;
  expect(s0.status, s0.error!).to.equal('completed');
  expect(s0.source).to.include({ action: 'removed' });
  const rss = claimOf(s0, 'remove_source');
  expect(rss).to.have.length(1);
  expect(rss[0]).to.include({ key: e.s0Job, job_id: `${e.s0Job}.remove_source`, resumed: 1 });
  expect([e.rsJob.state, e.rsJob.attempts]).to.deep.equal(['COMPLETED', '1']);
  expect(e.s0InInventory).to.match(/no VM at/);
  expect(e.s0OnTarget).to.equal('running');
  // Every claim of the plan done, each effect's job id unique to its claim: no second job of either.
  for (const v of e.plan.vms) for (const a of v.actions ?? []) expect(a.done_at, `${v.vm_path} ${a.action}`).to.be.a('string');
  expect(e.effectJobs).to.deep.equal([`${e.r0Job}.rollback`, `${e.s0Job}.remove_source`].sort());
  expect(e.plan.status).to.equal('failed'); // r0 rolled back, s0 completed
}

describe('plans: a new leader resumes a rollback and a source removal whose jobs no worker could run yet @vm', function () {
  this.timeout(4_800_000);

  it('the rollback and the source removal each run once, as the one job their claim names, taken over by the next leader', async () => {
    const tiny = await ensureTinyGuest();
    await reusedProof({ name: 'plans-resume-effects', entries: [__filename], extra: fixtureInputs(tiny) }, () => run(tiny), check);
  });
});
