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
import { expect } from 'chai';
import { req, until } from '../helpers/http';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { findVm } from '../../domain/vsphere/inventory';
import { keys } from '../../platform/redis';
import { startDaemonProc, startWorkerProc, type Proc } from '../helpers/procs';
import { PLAN_CAPS, PlanStack, startPlanStack } from './fixture';
import type { PlanView } from '../helpers/api-types';
import path from 'node:path';

const PREFIX = 'planresume';
type Vm = PlanView['vms'][number];
type Daemon = PlanStack['daemons'][number];

describe('plans: a new leader resumes a rollback and a source removal whose jobs no worker could run yet @vm', function () {
  this.timeout(4_800_000);
  let s: PlanStack;
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
  const claimOf = (v: Vm, action: 'rollback' | 'remove_source') => (v.actions ?? []).filter((a) => a.action === action);

  /** Kills the leader while the claim is open and its job queued; returns a daemon still alive once another leads. */
  async function killLeaderWith(name: string, action: 'rollback' | 'remove_source'): Promise<Daemon> {
    const l = await leader();
    const via = alive().find((d) => d !== l)!;
    const open = await until(async () => { const a = claimOf(vmOf(await plan(via), name), action); return a.length === 1 && !!a[0].job_id && !a[0].done_at && a[0]; }, 300_000, `${name}'s ${action} claimed`);
    expect((await record(open.job_id ?? '')).state, `${action} job waiting for a worker`).to.equal('QUEUED');
    await l.kill();
    await until(async () => { const x = await leader(); return x && x !== l; }, 60_000, 'another daemon to take the plans lease');
    return via;
  }

  before(async function () {
    this.timeout(900_000);
    const tiny = await ensureTinyGuest();
    s = await startPlanStack({ prefix: PREFIX, daemons: 2, workers: {} });
    await s.addVm({ name: 'r0', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:06:00:10' }, { path: tiny, bytes: TINY_GUEST_BYTES });
    await s.addVm({ name: 's0', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:06:00:11' }, { path: tiny, bytes: TINY_GUEST_BYTES });
  });
  after(async () => { await s?.stop(); });

  it('the rollback and the source removal each run once, as the one job their claim names, taken over by the next leader', async () => {
    const body = s.plan('resume', [], { limits: { per_plan: 1 } });
    body.vms = [
      { vm_path: s.vm('r0'), options: { virt_test: { expect: 'FERRY-NEVER-SHOWN', timeout_seconds: 20 } } },
      { vm_path: s.vm('s0'), options: { remove_source: true, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 180 } } },
    ];
    expect((await req(s.url, 'POST', '/plans', body)).status).to.equal(201);
    expect((await req(s.url, 'POST', '/plans/resume/start')).status).to.equal(200);

    // r0: its job gets to the boot check on a full worker, which is then stopped: no worker can roll it back.
    const w1 = await worker(PLAN_CAPS);
    const r0Job = await until(async () => vmOf(await s.get('resume'), 'r0').job_id, 60_000, 'r0\'s job');
    await until(async () => (await phase(r0Job)) === 'boot', 1_800_000, 'r0\'s boot check');
    await stopWorker(w1);
    const ledger = JSON.parse((await record(r0Job)).ledger || '[]') as { kind: string; id: string }[];
    const domain = ledger.find((e) => e.kind === 'domain')?.id;
    const volume = path.join(s.lv.poolDir, 'r0.qcow2');
    expect(domain, 'r0\'s ledger lists its domain').to.be.a('string');
    expect(ledger.filter((e) => e.kind === 'volume').map((e) => e.id), 'r0\'s ledger lists its volume').to.include(volume);
    const via1 = await killLeaderWith('r0', 'rollback');
    // A third daemon for the second take-over.
    s.daemons.push(await startDaemonProc(s.env, path.join(s.dir, 'daemon.yaml')));
    expect(await s.domains(), 'r0 still on the target while no worker can roll it back').to.include('r0');

    await worker(['libvirt_access']);
    const r0 = await until(async () => { const v = vmOf(await plan(via1), 'r0'); return v.status === 'rolled_back' && v; }, 300_000, 'r0 rolled back');
    const [rb] = claimOf(r0, 'rollback');
    expect(claimOf(r0, 'rollback')).to.have.length(1);
    expect(rb).to.include({ key: r0Job, job_id: `${r0Job}.rollback`, resumed: 1 });
    expect(rb.done_at).to.be.a('string');
    const rbJob = await record(rb.job_id!);
    expect([rbJob.state, rbJob.attempts]).to.deep.equal(['COMPLETED', '1']);
    // Gone by the identities the ledger lists: the domain's UUID, the volume's key (its path in this dir pool).
    expect(r0.rollback!.detail).to.include(domain!).and.include(`volume ${volume} removed`);
    expect(await s.lv.virsh(['dominfo', domain!]).then(() => 'still there', () => 'gone')).to.equal('gone');
    expect(await s.lv.virsh(['vol-key', volume]).then(() => 'still there', () => 'gone')).to.equal('gone');
    expect(await s.domains()).to.not.include('r0');

    // s0: migrated on a full worker, stopped during its boot check: its removal waits for a vsphere_access worker.
    const w3 = await worker(PLAN_CAPS);
    const s0Job = await until(async () => vmOf(await plan(via1), 's0').job_id, 120_000, 's0\'s job');
    await until(async () => (await phase(s0Job)) === 'boot', 1_800_000, 's0\'s boot check');
    await stopWorker(w3);
    expect((await record(s0Job)).state, 's0\'s job').to.equal('COMPLETED');
    const via2 = await killLeaderWith('s0', 'remove_source');
    expect((await findVm(s.m, s.vm('s0')).then(() => 'there')), 's0 still on vSphere while no worker can remove it').to.equal('there');

    await worker(['vsphere_access']);
    const p = await until(async () => { const x = await plan(via2); return ['completed', 'failed'].includes(x.status) && x; }, 300_000, 'the plan to end');
    const s0 = vmOf(p, 's0');
    expect(s0.status, s0.error!).to.equal('completed');
    expect(s0.source).to.include({ action: 'removed' });
    const [rs] = claimOf(s0, 'remove_source');
    expect(claimOf(s0, 'remove_source')).to.have.length(1);
    expect(rs).to.include({ key: s0Job, job_id: `${s0Job}.remove_source`, resumed: 1 });
    const rsJob = await record(rs.job_id!);
    expect([rsJob.state, rsJob.attempts]).to.deep.equal(['COMPLETED', '1']);
    expect(await findVm(s.m, s.vm('s0')).then(() => 'still there', (e: Error) => e.message)).to.match(/no VM at/);
    expect((await s.lv.virsh(['domstate', 's0'])).trim()).to.equal('running');
    // Every claim of the plan done, each effect's job id unique to its claim: no second job of either.
    for (const v of p.vms) for (const a of v.actions ?? []) expect(a.done_at, `${v.vm_path} ${a.action}`).to.be.a('string');
    const ids = (await s.rc.keys(k.job('*'))).map((x) => x.slice(k.job('').length)).filter((x) => !x.includes(':'));
    expect(ids.filter((x) => /\.(rollback|remove_source)/.test(x)).sort()).to.deep.equal([`${r0Job}.rollback`, `${s0Job}.remove_source`].sort());
    expect(p.status).to.equal('failed'); // r0 rolled back, s0 completed
  });
});
