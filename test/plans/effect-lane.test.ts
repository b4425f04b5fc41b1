// The call lane beyond virsh_call (issue 38 item 2): a plan's guest read (guest_preflight), a power action
// (vm_power) and a plan VM's rollback (rollback_kvm) never wait behind long jobs. Real processes: the daemon, the
// simulator, the tests' libvirtd and ONE worker able to do all three, with a single job slot held for the whole
// test by a long job. While it holds the slot: validate reads the tiny real guest in place, /vms/poweroff powers a
// simulator VM off, and a cancelled plan VM is rolled back; Redis shows each on a "calls.*" queue, run by that
// worker in one attempt while the long job was still RUNNING, the rollback claimed once and audited. Unlike the
// daemon's virsh_call, these are operators' jobs: listed by GET /jobs without ?internal=true.
import { expect } from 'chai';
import type { AuditRecord } from '../../platform/audit';
import { keys } from '../../platform/redis';
import { vmDetail } from '../../domain/vsphere/inventory';
import { ensureTinyGuest, TINY_GUEST_BYTES } from '../fixtures/tiny-guest';
import { awaitWorkers, startWorkerProc, type Proc } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DaemonJobList, PlanView, Validation } from '../helpers/api-types';
import { powerOn } from '../vsphere/fixture';
import { PLAN_CAPS, startPlanStack, type PlanStack } from './fixture';

const PREFIX = 'efflane';
/** How long a power action may take while the job slot is busy (before the lane it waited for the slot). */
const BOUND_MS = 15_000;

describe('the call lane: a guest read, a power action and a rollback run while a long job holds the only job slot @vm', function () {
  this.timeout(1_800_000);
  let s: PlanStack;
  let w: Proc;
  let victim: string;
  /** The long job holding the worker's only job slot the whole test. */
  let LONG: string;
  const k = keys(PREFIX);
  const record = (id: string) => s.rc.hgetall(k.job(id));
  /** Ids of the job records in Redis of `operation`. */
  const idsOf = async (operation: string) => {
    const out: string[] = [];
    for (const key of await s.rc.keys(`${PREFIX}:job:*`)) {
      if (key.split(':').length !== 3) continue; // a record's history, events: not the record
      if ((JSON.parse((await s.rc.hget(key, 'spec')) || '{}') as { operation?: string }).operation === operation) out.push(key.split(':')[2]);
    }
    return out;
  };
  /** The job ran once, on the call lane `queue`, by the one worker, and completed while the long job ran. */
  const onLane = async (id: string, queue: string) => {
    const r = await record(id);
    expect(r, JSON.stringify(r)).to.include({ queue, worker_id: 'el-w', state: 'COMPLETED', attempts: '1' });
    expect((await record(LONG)).state, 'the long job still holds the job slot').to.equal('RUNNING');
  };

  before(async function () {
    this.timeout(600_000);
    s = await startPlanStack({ prefix: PREFIX, workers: {}, env: { FERRY_GUEST_PREFLIGHT: '1', FERRY_GUEST_PREFLIGHT_SECONDS: '1200', FERRY_SECRET_KEY: 'efflane-secret-key-0123456789' } });
    // The worker loads (a few seconds) while the VMs are made; it is waited for below.
    w = await startWorkerProc(s.env, 'el-w', [...PLAN_CAPS, 'nbd_access'], ['--concurrency', '1']);
    s.workers['el-w'] = w;
    const disk = await ensureTinyGuest();
    [, victim] = await Promise.all([
      s.addVm({ name: 'el-guest', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:0e:00:01' }, { path: disk, bytes: TINY_GUEST_BYTES }),
      s.addVm({ name: 'el-victim', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:0e:00:02' }, { path: disk, bytes: TINY_GUEST_BYTES }),
    ]);
    await powerOn(s.m, victim);
    expect((await req(s.url, 'POST', '/plans', s.plan('el', ['el-guest']))).status).to.equal(201);
    await awaitWorkers(s.url, [w]);
    const long = await req<{ job_id: string }>(s.url, 'POST', '/jobs/operation', { operation: 'noop', parameters: { sleep_ms: 1_500_000 } });
    expect(long.status, long.text).to.equal(201);
    LONG = long.body.job_id;
    await until(async () => (await record(LONG)).state === 'RUNNING', 60_000, 'the long job running');
    expect((await record(LONG)).worker_id).to.equal('el-w');
  });
  after(async () => { await s?.stop(); });

  it('validate reads the guest in place through a guest_preflight job on the call lane', async () => {
    const t = Date.now();
    const v = await req<Validation>(s.url, 'POST', '/plans/el/validate');
    expect(v.status, v.text).to.equal(200);
    const rules = v.body.vms[0].findings.map((f) => f.rule);
    console.log(`      with the only job slot busy: validate (the guest read) ${Math.round((Date.now() - t) / 1000)} s; findings ${rules.join(', ') || 'none'}`);
    // The guest was read (Debian 12.5 found); this tiny guest has no boot loader and little space: blockers.
    expect(rules).to.include('guest_inspected').and.not.include('guest_unreadable').and.not.include('guest_preflight_no_worker');
    expect(v.body.vms[0].findings.find((f) => f.rule === 'guest_inspected')?.message).to.include('Debian 12.5');
    const reads = await idsOf('guest_preflight');
    expect(reads).to.have.length(1);
    await onLane(reads[0], 'calls.mount_operations+nbd_access+vsphere_access');
  });

  it('/vms/poweroff answers within the bound through a vm_power job on the call lane, listed as an operator\'s job', async () => {
    const t = Date.now();
    const off = await req<{ message: string }>(s.url, 'POST', '/vms/poweroff', { vm_path: victim });
    const ms = Date.now() - t;
    console.log(`      with the only job slot busy: POST /vms/poweroff ${ms} ms`);
    expect(off.status, off.text).to.equal(200);
    expect((await vmDetail(s.m, victim)).power_state).to.equal('poweredOff');
    expect(ms).to.be.below(BOUND_MS);
    const [id] = await idsOf('vm_power');
    await onLane(id, 'calls.vsphere_access');
    const listed = (await req<DaemonJobList>(s.url, 'GET', '/jobs?limit=100')).body.jobs.map((j) => j.id);
    expect(listed).to.include(id);
  });

  it('a cancelled plan VM is rolled back by a rollback_kvm job on the call lane, claimed once and audited', async () => {
    // A plan of the VM powered off above, without the guest read (validate's is the first test's): its start is quick.
    expect((await req(s.url, 'POST', '/plans', s.plan('el2', ['el-victim'], { options: { power_off: 'force', guest_preflight: false } }))).status).to.equal(201);
    const st = await req(s.url, 'POST', '/plans/el2/start');
    expect(st.status, st.text).to.be.oneOf([200, 202]);
    const job = await until(async () => { const v = (await req<PlanView>(s.url, 'GET', '/plans/el2')).body.vms[0]; return v.job_id && v.status === 'running' && v.job_id; }, 120_000, 'the VM\'s job submitted');
    // Its migration waits for the job slot the long job holds. (The plan shows the job id from its claim, a moment
    // before the job's record is written: the record is awaited, then its state checked.)
    expect(await until(async () => (await record(job)).state, 30_000, 'the VM\'s job record')).to.equal('QUEUED');
    expect((await req(s.url, 'POST', '/plans/el2/cancel', { vm_path: victim })).status).to.be.oneOf([200, 202]);
    const vm = await until(async () => { const v = (await req<PlanView>(s.url, 'GET', '/plans/el2')).body.vms[0]; return v.status === 'cancelled' && v; }, 120_000, 'the VM cancelled and rolled back');
    const rollbacks = (vm.actions ?? []).filter((a) => a.action === 'rollback');
    expect(rollbacks, JSON.stringify(vm.actions)).to.have.length(1);
    expect(rollbacks[0].done_at).to.be.a('string');
    expect(await idsOf('rollback_kvm')).to.deep.equal([rollbacks[0].job_id]);
    await onLane(rollbacks[0].job_id!, 'calls.libvirt_access');
    // The audit log has the effect, acting as the plan's starter, on that VM's job.
    const effects = (await s.rc.zrange(`${PREFIX}:audit`, 0, -1)).map((r) => JSON.parse(r) as AuditRecord).filter((r) => r.method === 'EFFECT');
    expect(effects.map((r) => `${r.service} ${r.route} ${String(r.targets.of_job)}`)).to.deep.equal([`worker rollback_kvm ${job}`]);
    expect((await record(LONG)).state).to.equal('RUNNING');
  });
});
