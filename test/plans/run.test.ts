// Plans running, as an operator watches them: real shape B jobs on two workers against the simulator and the
// tests' libvirtd. The VMs' disks hold random data (small, made by qemu-img from random blocks), so each job
// exports for real and then fails at the guest inspection: enough to see the limits (sampled in Redis and from
// the jobs' states), the rollback that follows a failure (a source Ferry powered off is powered back on), a
// window that closes, and a cancel mid-plan leaving nothing on the target. One VM is the tiny real guest, which
// gets all the way to the target's boot check and fails it there: its rollback removes a real domain and volume,
// those its job's ledger lists (test/security/ledger.test.ts has the attacks on rollback).
// A reused proof (test/helpers/proof-tests.ts): the five plans run in order on one stack, what the test read while
// and after each ran (the sampled limits, the plans, the jobs, virsh, the inventory, the webhook deliveries) is the
// evidence, and each test is its check on it. It acts on what it observes (a cancel mid-plan, a window that closes),
// so a reuse re-checks the recorded run's interleaving, as the plan of eight's does: any change to what the daemon
// and workers load, to the plan stack or to a tool runs it again, and FERRY_FRESH_PROOFS=1 samples a new one.
import { expect } from 'chai';
import path from 'node:path';
import { writeFileSync } from 'node:fs';
import { answer, req, until, type Answer } from '../helpers/http';
import { vmDetail } from '../../domain/vsphere/inventory';
import { makeDisks, powerOn } from '../vsphere/fixture';
import { ensureTinyGuest, TINY_GUEST_BYTES } from '../fixtures/tiny-guest';
import { PlanStack, startPlanStack } from './fixture';
import { fixtureInputs } from '../helpers/proofs';
import { proofTests } from '../helpers/proof-tests';
import { tolerate } from '../helpers/teardown';
import type { DaemonJob, DeliveryLog, PlanView } from '../helpers/api-types';

const FINAL = ['completed', 'failed', 'cancelled'];
const HOSTS: Record<string, string> = { a0: 'DC0_H0', a1: 'DC0_H0', b0: 'DC0_C0_H0', b2: 'DC0_C0_H0' };
type Vm = PlanView['vms'][number];

interface Evidence {
  vms: Record<string, string>; poolDir: string;
  wave: {
    hook: Answer; created: Answer; started: Answer & { u0?: Vm }; samples: number; max: Record<string, number>; reasons: string[];
    plan: PlanView; jobs: Record<string, string>; b2Power: string; domains: string[]; volumes: string[]; events: string[];
  };
  night: { created: Answer; first: string; plan: PlanView; cancel: Answer; end: PlanView };
  stop: { created: Answer; cancel: Answer; plan: PlanView; jobs: Record<string, string>; domains: string[]; volumes: string[] };
  again: { before: Vm; rollbacks: (Answer & { a0?: Vm })[]; domains: string[]; volumes: string[]; never: number };
  bootfail: { created: Answer; started: number; vm: Vm; job: string; domains: string[]; volumes: string[]; power: string };
}

/** The plan stack with the VMs the plans take: four on two hosts and datastores, u0 on an unmapped network, b2 on. */
async function startStack(): Promise<PlanStack> {
  const s = await startPlanStack({ prefix: 'plansrun', workers: { w1: 2, w2: 2 }, config: 'webhooks:\n  allow_loopback: true\n' });
  try {
    const disks = makeDisks(s.dir, 2);
    let mac = 0x10;
    for (const [name, host] of Object.entries(HOSTS)) {
      await s.addVm({ name, host, ds: host === 'DC0_H0' ? 'LocalDS_0' : 'LocalDS_1', mac: `00:50:56:02:00:${(mac++).toString(16)}` }, { path: disks.sparse, bytes: disks.bytes });
    }
    await s.addVm({ name: 'u0', host: 'DC0_H0', ds: 'LocalDS_0', network: 'DC0_DVPG0', mac: '00:50:56:02:00:99' }, { path: disks.sparse, bytes: disks.bytes });
    await powerOn(s.m, s.vm('b2'));
    return s;
  } catch (e) { await s.stop(); throw e; }
}

const done = (s: PlanStack, id: string, ms = 480_000) => until(async () => { const p = await s.get(id); return FINAL.includes(p.status) && p; }, ms, `plan ${id} to end`);
const jobStatuses = async (s: PlanStack, p: PlanView) => {
  const out: Record<string, string> = {};
  for (const x of p.vms) if (x.job_id) out[x.vm_path] = (await req<DaemonJob>(s.url, 'GET', `/jobs/${x.job_id}`)).body.status;
  return out;
};

/** The wave: every VM a shape B job, the limits sampled from Redis's slot leases and the jobs' states as it runs. */
async function wave(s: PlanStack): Promise<Evidence['wave']> {
  const hook = answer(await req(s.url, 'POST', '/webhooks', { url: 'http://127.0.0.1:9/plans', events: ['plan.started', 'plan.vm_failed', 'plan.vm_rolled_back', 'plan.completed'] }));
  const created = answer(await req(s.url, 'POST', '/plans', s.plan('wave', [...Object.keys(HOSTS), 'u0'], { limits: { per_plan: 4, per_esxi_host: 1, per_datastore: 1 } })));
  const st = await req<PlanView>(s.url, 'POST', '/plans/wave/start');
  const max: Record<string, number> = {};
  const reasons = new Set<string>();
  let samples = 0;
  let plan: PlanView;
  for (;;) {
    plan = await s.get('wave');
    for (const x of plan.vms) if (x.waiting_reason) reasons.add(x.waiting_reason);
    // The truth from both sides: live slot leases in Redis, and jobs RUNNING per host.
    const running: Record<string, number> = {};
    for (const x of plan.vms) if (x.job_status === 'running') running[HOSTS[x.vm_path.split('/').pop()!]] = (running[HOSTS[x.vm_path.split('/').pop()!]] ?? 0) + 1;
    for (const [k, n] of Object.entries({
      ...running,
      'slots:DC0_H0': (await s.holders(`esxi:${s.manager}:DC0_H0`)).length,
      'slots:DC0_C0_H0': (await s.holders(`esxi:${s.manager}:DC0_C0_H0`)).length,
      'slots:LocalDS_0': (await s.holders(`datastore:${s.manager}:LocalDS_0`)).length,
      'slots:LocalDS_1': (await s.holders(`datastore:${s.manager}:LocalDS_1`)).length,
    })) max[k] = Math.max(max[k] ?? 0, n);
    samples++;
    if (FINAL.includes(plan.status)) break;
    await new Promise((r) => setTimeout(r, 150));
  }
  console.log(`      a VM's job failed with: ${plan.vms[0]?.error}`);
  // The plan's events went into the webhook machinery (no notifier runs here: the deliveries wait, pending).
  const events = (await req<DeliveryLog>(s.url, 'GET', '/webhooks/0/deliveries')).body.deliveries.map((d) => d.event);
  return {
    hook, created, started: { ...answer(st), u0: st.body.vms?.find((x) => x.vm_path === s.vm('u0')) }, samples, max, reasons: [...reasons], plan,
    jobs: await jobStatuses(s, plan), b2Power: (await vmDetail(s.m, s.vm('b2'))).power_state, domains: await s.domains(), volumes: await s.volumes(), events,
  };
}

/** A window that closes while the first VM runs. */
async function night(s: PlanStack): Promise<Evidence['night']> {
  const end = new Date(Date.now() + 3000).toISOString();
  const created = answer(await req(s.url, 'POST', '/plans', s.plan('night', ['a0', 'a1', 'b0'], { limits: { per_plan: 1 }, windows: [{ start: new Date(Date.now() - 60_000).toISOString(), end }] })));
  await req(s.url, 'POST', '/plans/night/start');
  const first = await until(async () => { const p = await s.get('night'); return p.vms.find((x) => x.job_id); }, 20_000, 'a first job');
  await until(() => Date.now() > Date.parse(end) + 2500, 10_000, 'the window to close');
  const plan = await until(async () => { const x = await s.get('night'); return x.vms.every((y) => y.status !== 'running') && x; }, 300_000, 'the started VM to end');
  const cancel = answer(await req(s.url, 'POST', '/plans/night/cancel'));
  return { created, first: first.vm_path, plan, cancel, end: await done(s, 'night', 20_000) };
}

/** A plan cancelled while a job runs. */
async function stop(s: PlanStack): Promise<Evidence['stop']> {
  const created = answer(await req(s.url, 'POST', '/plans', s.plan('stop', ['a0', 'a1', 'b0'], { limits: { per_plan: 2 } })));
  await req(s.url, 'POST', '/plans/stop/start');
  await until(async () => (await s.get('stop')).vms.some((x) => x.job_status === 'running'), 60_000, 'a job running');
  const cancel = answer(await req(s.url, 'POST', '/plans/stop/cancel'));
  const plan = await done(s, 'stop', 120_000);
  return { created, cancel, plan, jobs: await jobStatuses(s, plan), domains: await s.domains(), volumes: await s.volumes() };
}

/** What someone else made under a0's name after its job failed (at the guest inspection, so it made nothing): a
 *  domain a0 with its disk a0.qcow2, a second disk a0-disk1.qcow2, beside a volume of another name; then a0 rolled
 *  back twice through the admin route. */
async function rollbackAgain(s: PlanStack): Promise<Evidence['again']> {
  const vols = ['a0.qcow2', 'a0-disk1.qcow2', 'keep-me.qcow2'];
  for (const vol of vols) await s.lv.virsh(['vol-create-as', s.lv.pool, vol, '1M', '--format', 'qcow2']);
  const xml = path.join(s.dir, 'a0.xml');
  writeFileSync(xml, `<domain type="qemu"><name>a0</name><memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os><devices><disk type="file" device="disk"><driver name="qemu" type="qcow2"/><source file="${s.lv.poolDir}/a0.qcow2"/><target dev="vda" bus="virtio"/></disk></devices></domain>`);
  await s.lv.virsh(['define', xml]);
  try {
    const before = (await s.get('wave')).vms.find((x) => x.vm_path === s.vm('a0'))!;
    const rollbacks: Evidence['again']['rollbacks'] = [];
    for (let i = 0; i < 2; i++) {
      const r = await req<PlanView>(s.url, 'POST', `/plans/wave/vms/${encodeURIComponent(s.vm('a0'))}/rollback`);
      rollbacks.push({ ...answer(r), a0: r.body.vms?.find((x) => x.vm_path === s.vm('a0')) });
    }
    const never = (await req(s.url, 'POST', '/plans/wave/vms/u0/rollback')).status;
    return { before, rollbacks, domains: await s.domains(), volumes: await s.volumes(), never };
  } finally {
    await s.lv.virsh(['undefine', 'a0']).catch(tolerate('undefine a0'));
    for (const vol of vols) await s.lv.virsh(['vol-delete', '--pool', s.lv.pool, vol]).catch(tolerate(`vol-delete ${vol}`));
  }
}

/** The tiny real guest goes all the way to the target, but the boot check waits for text its console never shows. */
async function bootFail(s: PlanStack, disk: string): Promise<Evidence['bootfail']> {
  await s.addVm({ name: 'bc0', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:02:00:b0' }, { path: disk, bytes: TINY_GUEST_BYTES });
  await powerOn(s.m, s.vm('bc0'));
  const created = answer(await req(s.url, 'POST', '/plans', s.plan('bootfail', ['bc0'], { options: { power_off: 'force', virt_test: { expect: 'FERRY-NEVER-SHOWN', timeout_seconds: 15 } } })));
  const started = (await req(s.url, 'POST', '/plans/bootfail/start')).status;
  // The domain and its volume were made on the target (the job got as far as the boot check) ...
  await until(async () => (await s.domains()).includes('bc0'), 480_000, 'the domain bc0 defined on the target');
  const vm = (await done(s, 'bootfail')).vms[0];
  console.log(`      the VM failed with: ${vm.error?.slice(0, 200)}; rollback: ${vm.rollback?.detail}`);
  return {
    created, started, vm, job: (await req<DaemonJob>(s.url, 'GET', `/jobs/${vm.job_id}`)).body.status,
    domains: await s.domains(), volumes: await s.volumes(), power: (await vmDetail(s.m, s.vm('bc0'))).power_state,
  };
}

async function produce(disk: string): Promise<Evidence> {
  const s = await startStack();
  try {
    // In order: the wave's rolled-back a0 is what the rollback test rolls back again.
    const e: Evidence = {
      vms: Object.fromEntries(['a0', 'u0', 'bc0'].map((n) => [n, s.vm(n)])), poolDir: s.lv.poolDir,
      wave: await wave(s), night: await night(s), stop: await stop(s), again: await rollbackAgain(s), bootfail: await bootFail(s, disk),
    };
    return JSON.parse(JSON.stringify(e)) as Evidence;
  } finally { await s.stop(); }
}

function checkWave({ wave: w, vms }: Evidence) {
  expect(w.hook.status, w.hook.text).to.be.oneOf([200, 201]);
  expect(w.created.status, w.created.text).to.equal(201);
  expect(w.started.status, w.started.text).to.equal(200);
  expect(w.started.u0).to.include({ status: 'blocked' });
  expect(w.samples).to.be.greaterThan(5);
  for (const [k, n] of Object.entries(w.max)) expect(n, `${k} (max over ${w.samples} samples)`).to.be.at.most(1);
  expect(w.max['slots:DC0_H0'], 'a slot was seen held').to.equal(1);
  expect(w.reasons.some((r) => /limits\.per_(esxi_host|datastore|plan)/.test(r)), w.reasons.join(' | ')).to.equal(true);
  expect(w.plan.status).to.equal('failed');
  const byVm = Object.fromEntries(w.plan.vms.map((x) => [x.vm_path.split('/').pop()!, x]));
  expect(byVm.u0).to.include({ status: 'blocked', job_id: null });
  for (const n of Object.keys(HOSTS)) {
    expect(byVm[n].status, `${n}: ${byVm[n].error}`).to.equal('rolled_back');
    expect(w.jobs[byVm[n].vm_path], `${n}'s job`).to.equal('failed');
  }
  expect(vms.a0).to.equal(byVm.a0.vm_path);
  // b2 was running; its export powered it off; the rollback powered it back on.
  expect(byVm.b2.rollback!.detail).to.match(/powered back on/);
  expect(w.b2Power).to.equal('poweredOn');
  for (const n of Object.keys(HOSTS)) expect(w.domains).to.not.include(n);
  expect(w.volumes.filter((x) => /^[ab]\d/.test(x))).to.deep.equal([]);
  const count = (e: string) => w.events.filter((x) => x === e).length;
  expect([count('plan.started'), count('plan.vm_failed'), count('plan.vm_rolled_back'), count('plan.completed')]).to.deep.equal([1, 4, 4, 1]);
}

function checkNight({ night: n }: Evidence) {
  expect(n.created.status, n.created.text).to.equal(201);
  const others = n.plan.vms.filter((x) => x.vm_path !== n.first);
  expect(others).to.have.length(2);
  for (const o of others) {
    expect(o.status).to.equal('pending');
    expect(o.jobs).to.deep.equal([]);
    expect(o.waiting_reason).to.match(/every window of the plan has closed/);
  }
  expect(n.plan.vms.find((x) => x.vm_path === n.first)!.status).to.be.oneOf(['rolled_back', 'failed', 'completed']);
  expect(n.cancel.status, n.cancel.text).to.equal(200);
  expect(n.end.status).to.equal('cancelled');
}

function checkStop({ stop: x }: Evidence) {
  expect(x.created.status, x.created.text).to.equal(201);
  expect(x.cancel.status, x.cancel.text).to.equal(200);
  expect(x.plan.status).to.equal('cancelled');
  for (const v of x.plan.vms) {
    expect(v.status, v.vm_path).to.be.oneOf(['cancelled', 'rolled_back', 'failed']);
    if (v.job_id) expect(x.jobs[v.vm_path], v.vm_path).to.be.oneOf(['cancelled', 'failed']);
  }
  expect(x.plan.vms.filter((v) => v.status === 'cancelled').length).to.be.greaterThan(0);
  for (const n of ['a0', 'a1', 'b0']) expect(x.domains).to.not.include(n);
  expect(x.volumes.filter((v) => /^[ab]\d/.test(v))).to.deep.equal([]);
}

function checkRollbackAgain({ again: a }: Evidence) {
  expect(a.before.status).to.equal('rolled_back');
  expect(a.rollbacks).to.have.length(2);
  for (const r of a.rollbacks) {
    expect(r.status, r.text).to.equal(200);
    expect(r.a0!.status).to.equal('rolled_back');
    expect(r.a0!.rollback!.detail).to.match(/nothing of Ferry's was on the target/);
  }
  expect(a.domains).to.include('a0');
  expect(a.volumes).to.include.members(['a0.qcow2', 'a0-disk1.qcow2', 'keep-me.qcow2']);
  expect(a.never, 'a VM that never ran').to.equal(409);
}

function checkBootFail({ bootfail: b, poolDir }: Evidence) {
  expect(b.created.status, b.created.text).to.equal(201);
  expect(b.started).to.equal(200);
  expect(b.vm.status, b.vm.error!).to.equal('rolled_back');
  expect(b.vm.error).to.match(/did not boot \(failed\)/);
  expect(b.job).to.equal('failed');
  // ... and the rollback took them away and powered the source back on.
  // By the identities its job's ledger recorded: the domain's UUID, the volume's key (its path here).
  expect(b.vm.rollback!.detail).to.match(/domain bc0 \([0-9a-f-]{36}\) with its NVRAM removed/).and.include(`volume ${path.join(poolDir, 'bc0.qcow2')} removed`).and.match(/powered back on/);
  expect(b.domains).to.not.include('bc0');
  expect(b.volumes.filter((v) => v.startsWith('bc0'))).to.deep.equal([]);
  expect(b.power).to.equal('poweredOn');
}

describe('plans: paced execution against vcsim and libvirtd @vm', function () {
  this.timeout(2_400_000);
  let disk = '';

  proofTests<Evidence>({
    spec: async () => { disk = await ensureTinyGuest(); return { name: 'plans-run', entries: [__filename], extra: fixtureInputs(disk) }; },
    produce: () => produce(disk),
    runTitle: 'runs the five plans in order on one stack (or reuses the record of the same inputs)',
    checks: [
      ['runs every VM as a shape B job (webhook events queued), never more than 1 per ESXi host and per datastore (sampled), a blocked VM never; failures are rolled back', checkWave],
      ['a window that closes stops new VMs; what started finishes', checkNight],
      ['cancel mid-plan: the running jobs are cancelled, the waiting VMs never start, nothing is left on the target', checkStop],
      ['rollback of one VM (admin route) acts on its job\'s ledger alone: a domain and volumes of its name that Ferry did not make stay; twice is the same', checkRollbackAgain],
      ['a VM whose boot check fails after its source was powered off is rolled back: its domain and volume gone, the source powered on', checkBootFail],
    ],
  });
});
