// Plans running, as an operator watches them: real shape B jobs on two workers against the simulator and the
// tests' libvirtd. The VMs' disks hold random data (small, made by qemu-img from random blocks), so each job
// exports for real and then fails at the guest inspection: enough to see the limits (sampled in Redis and from
// the jobs' states), the rollback that follows a failure (a source Ferry powered off is powered back on), a
// window that closes, and a cancel mid-plan leaving nothing on the target. One VM is the tiny real guest, which
// gets all the way to the target's boot check and fails it there: its rollback removes a real domain and volume,
// those its job's ledger lists (test/security/ledger.test.ts has the attacks on rollback).
// Not a reused proof (test/helpers/proofs.ts), on purpose: it proves the live orchestration itself. The test acts on
// what it observes while the plans run (a cancel mid-plan, a window that closes, a rollback after a failure it waits
// for), so there is no output separate from the run to store and check again; limits sampled during a past run say
// nothing about this one's interleaving. It runs every time.
import { expect } from 'chai';
import path from 'node:path';
import { writeFileSync } from 'node:fs';
import { req, until } from '../helpers/http';
import { vmDetail } from '../../domain/vsphere/inventory';
import { makeDisks, powerOn } from '../vsphere/fixture';
import { ensureTinyGuest, TINY_GUEST_BYTES } from '../fixtures/tiny-guest';
import { PlanStack, startPlanStack } from './fixture';
import type { DaemonJob, DeliveryLog, PlanView } from '../helpers/api-types';

const FINAL = ['completed', 'failed', 'cancelled'];

describe('plans: paced execution against vcsim and libvirtd @vm', function () {
  this.timeout(600_000);
  let s: PlanStack;
  let B: string;
  const HOSTS: Record<string, string> = { a0: 'DC0_H0', a1: 'DC0_H0', b0: 'DC0_C0_H0', b2: 'DC0_C0_H0' };
  const vm = (n: string) => s.vm(n);
  const plan = (id: string, vms: string[], extra: Record<string, unknown> = {}) => s.plan(id, vms, extra);
  const get = (id: string) => s.get(id);
  const done = (id: string, ms = 480_000) => until(async () => { const p = await get(id); return FINAL.includes(p.status) && p; }, ms, `plan ${id} to end`);

  before(async function () {
    this.timeout(300_000);
    s = await startPlanStack({ prefix: 'plansrun', workers: { w1: 2, w2: 2 }, config: 'webhooks:\n  allow_loopback: true\n' });
    B = s.url;
    const disks = makeDisks(s.dir, 2);
    let mac = 0x10;
    for (const [name, host] of Object.entries(HOSTS)) {
      await s.addVm({ name, host, ds: host === 'DC0_H0' ? 'LocalDS_0' : 'LocalDS_1', mac: `00:50:56:02:00:${(mac++).toString(16)}` }, { path: disks.sparse, bytes: disks.bytes });
    }
    await s.addVm({ name: 'u0', host: 'DC0_H0', ds: 'LocalDS_0', network: 'DC0_DVPG0', mac: '00:50:56:02:00:99' }, { path: disks.sparse, bytes: disks.bytes });
    await powerOn(s.m, vm('b2'));
  });
  after(async () => { await s?.stop(); });

  it('runs every VM as a shape B job (webhook events queued), never more than 1 per ESXi host and per datastore (sampled), a blocked VM never; failures are rolled back', async () => {
    const hook = await req(B, 'POST', '/webhooks', { url: 'http://127.0.0.1:9/plans', events: ['plan.started', 'plan.vm_failed', 'plan.vm_rolled_back', 'plan.completed'] });
    expect(hook.status, hook.text).to.be.oneOf([200, 201]);
    const c = await req(B, 'POST', '/plans', plan('wave', [...Object.keys(HOSTS), 'u0'], { limits: { per_plan: 4, per_esxi_host: 1, per_datastore: 1 } }));
    expect(c.status, c.text).to.equal(201);
    const st = await req<PlanView>(B, 'POST', '/plans/wave/start');
    expect(st.status, st.text).to.equal(200);
    expect(st.body.vms.find((x) => x.vm_path === vm('u0'))).to.include({ status: 'blocked' });

    const max: Record<string, number> = {};
    const reasons = new Set<string>();
    let samples = 0;
    let p: PlanView;
    for (;;) {
      p = await get('wave');
      for (const x of p.vms) if (x.waiting_reason) reasons.add(x.waiting_reason);
      // The truth from both sides: live slot leases in Redis, and jobs RUNNING per host.
      const running: Record<string, number> = {};
      for (const x of p.vms) if (x.job_status === 'running') running[HOSTS[x.vm_path.split('/').pop()!]] = (running[HOSTS[x.vm_path.split('/').pop()!]] ?? 0) + 1;
      for (const [k, n] of Object.entries({
        ...running,
        'slots:DC0_H0': (await s.holders(`esxi:${s.manager}:DC0_H0`)).length,
        'slots:DC0_C0_H0': (await s.holders(`esxi:${s.manager}:DC0_C0_H0`)).length,
        'slots:LocalDS_0': (await s.holders(`datastore:${s.manager}:LocalDS_0`)).length,
        'slots:LocalDS_1': (await s.holders(`datastore:${s.manager}:LocalDS_1`)).length,
      })) max[k] = Math.max(max[k] ?? 0, n);
      samples++;
      if (FINAL.includes(p.status)) break;
      await new Promise((r) => setTimeout(r, 150));
    }
    expect(samples).to.be.greaterThan(5);
    for (const [k, n] of Object.entries(max)) expect(n, `${k} (max over ${samples} samples)`).to.be.at.most(1);
    expect(max['slots:DC0_H0'], 'a slot was seen held').to.equal(1);
    expect([...reasons].some((r) => /limits\.per_(esxi_host|datastore|plan)/.test(r)), [...reasons].join(' | ')).to.equal(true);

    expect(p.status).to.equal('failed');
    const byVm = Object.fromEntries(p.vms.map((x) => [x.vm_path.split('/').pop()!, x]));
    expect(byVm.u0).to.include({ status: 'blocked', job_id: null });
    for (const n of Object.keys(HOSTS)) {
      expect(byVm[n].status, `${n}: ${byVm[n].error}`).to.equal('rolled_back');
      const job = (await req<DaemonJob>(B, 'GET', `/jobs/${byVm[n].job_id}`)).body;
      expect(job.status).to.equal('failed');
    }
    // b2 was running; its export powered it off; the rollback powered it back on.
    console.log(`      a VM's job failed with: ${byVm.a0.error}`);
    expect(byVm.b2.rollback!.detail).to.match(/powered back on/);
    expect((await vmDetail(s.m, vm('b2'))).power_state).to.equal('poweredOn');
    for (const n of Object.keys(HOSTS)) expect(await s.domains()).to.not.include(n);
    expect((await s.volumes()).filter((x) => /^[ab]\d/.test(x))).to.deep.equal([]);

    // The plan's events went into the webhook machinery (no notifier runs here: the deliveries wait, pending).
    const events = (await req<DeliveryLog>(B, 'GET', '/webhooks/0/deliveries')).body.deliveries.map((d) => d.event);
    const count = (e: string) => events.filter((x: string) => x === e).length;
    expect([count('plan.started'), count('plan.vm_failed'), count('plan.vm_rolled_back'), count('plan.completed')]).to.deep.equal([1, 4, 4, 1]);
  });

  it('a window that closes stops new VMs; what started finishes', async () => {
    const end = new Date(Date.now() + 3000).toISOString();
    const c = await req(B, 'POST', '/plans', plan('night', ['a0', 'a1', 'b0'], { limits: { per_plan: 1 }, windows: [{ start: new Date(Date.now() - 60_000).toISOString(), end }] }));
    expect(c.status, c.text).to.equal(201);
    await req(B, 'POST', '/plans/night/start');
    const first = await until(async () => { const p = await get('night'); return p.vms.find((x) => x.job_id); }, 20_000, 'a first job');
    await until(() => Date.now() > Date.parse(end) + 2500, 10_000, 'the window to close');
    const p = await until(async () => { const x = await get('night'); return x.vms.every((y) => y.status !== 'running') && x; }, 300_000, 'the started VM to end');
    const others = p.vms.filter((x) => x.vm_path !== first.vm_path);
    for (const o of others) {
      expect(o.status).to.equal('pending');
      expect(o.jobs).to.deep.equal([]);
      expect(o.waiting_reason).to.match(/every window of the plan has closed/);
    }
    expect(p.vms.find((x) => x.vm_path === first.vm_path)!.status).to.be.oneOf(['rolled_back', 'failed', 'completed']);
    const c2 = await req(B, 'POST', '/plans/night/cancel');
    expect(c2.status, c2.text).to.equal(200);
    const q = await done('night', 20_000);
    expect(q.status).to.equal('cancelled');
  });

  it('cancel mid-plan: the running jobs are cancelled, the waiting VMs never start, nothing is left on the target', async () => {
    const c = await req(B, 'POST', '/plans', plan('stop', ['a0', 'a1', 'b0'], { limits: { per_plan: 2 } }));
    expect(c.status, c.text).to.equal(201);
    await req(B, 'POST', '/plans/stop/start');
    await until(async () => (await get('stop')).vms.some((x) => x.job_status === 'running'), 60_000, 'a job running');
    const r = await req(B, 'POST', '/plans/stop/cancel');
    expect(r.status, r.text).to.equal(200);
    const p = await done('stop', 120_000);
    expect(p.status).to.equal('cancelled');
    for (const x of p.vms) {
      expect(x.status, x.vm_path).to.be.oneOf(['cancelled', 'rolled_back', 'failed']);
      if (x.job_id) expect((await req<DaemonJob>(B, 'GET', `/jobs/${x.job_id}`)).body.status).to.be.oneOf(['cancelled', 'failed']);
    }
    expect(p.vms.filter((x) => x.status === 'cancelled').length).to.be.greaterThan(0);
    for (const n of ['a0', 'a1', 'b0']) expect(await s.domains()).to.not.include(n);
    expect((await s.volumes()).filter((x) => /^[ab]\d/.test(x))).to.deep.equal([]);
  });

  it('rollback of one VM (admin route) acts on its job\'s ledger alone: a domain and volumes of its name that Ferry did not make stay; twice is the same', async () => {
    // What someone else made under a0's name after its job failed (at the guest inspection, so it made nothing):
    // a domain a0 with its disk a0.qcow2, a second disk a0-disk1.qcow2, beside a volume of another name.
    for (const vol of ['a0.qcow2', 'a0-disk1.qcow2', 'keep-me.qcow2']) await s.lv.virsh(['vol-create-as', s.lv.pool, vol, '1M', '--format', 'qcow2']);
    const xml = path.join(s.dir, 'a0.xml');
    writeFileSync(xml, `<domain type="qemu"><name>a0</name><memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os><devices><disk type="file" device="disk"><driver name="qemu" type="qcow2"/><source file="${s.lv.poolDir}/a0.qcow2"/><target dev="vda" bus="virtio"/></disk></devices></domain>`);
    await s.lv.virsh(['define', xml]);
    const before = (await get('wave')).vms.find((x) => x.vm_path === vm('a0'))!;
    expect(before.status).to.equal('rolled_back');
    for (let i = 0; i < 2; i++) {
      const r = await req<PlanView>(B, 'POST', `/plans/wave/vms/${encodeURIComponent(vm('a0'))}/rollback`);
      expect(r.status, r.text).to.equal(200);
      const a0 = r.body.vms.find((x) => x.vm_path === vm('a0'))!;
      expect(a0.status).to.equal('rolled_back');
      expect(a0.rollback!.detail).to.match(/nothing of Ferry's was on the target/);
    }
    expect(await s.domains()).to.include('a0');
    expect(await s.volumes()).to.include.members(['a0.qcow2', 'a0-disk1.qcow2', 'keep-me.qcow2']);
    await s.lv.virsh(['undefine', 'a0']);
    for (const vol of ['a0.qcow2', 'a0-disk1.qcow2', 'keep-me.qcow2']) await s.lv.virsh(['vol-delete', '--pool', s.lv.pool, vol]);
    expect((await req(B, 'POST', '/plans/wave/vms/u0/rollback')).status, 'a VM that never ran').to.equal(409);
  });

  it('a VM whose boot check fails after its source was powered off is rolled back: its domain and volume gone, the source powered on', async () => {
    // The tiny real guest goes all the way to the target, but the boot check waits for text its console never shows.
    const disk = await ensureTinyGuest();
    await s.addVm({ name: 'bc0', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:02:00:b0' }, { path: disk, bytes: TINY_GUEST_BYTES });
    await powerOn(s.m, vm('bc0'));
    const c = await req(B, 'POST', '/plans', plan('bootfail', ['bc0'], { options: { power_off: 'force', virt_test: { expect: 'FERRY-NEVER-SHOWN', timeout_seconds: 15 } } }));
    expect(c.status, c.text).to.equal(201);
    expect((await req(B, 'POST', '/plans/bootfail/start')).status).to.equal(200);
    // The domain and its volume were made on the target (the job got as far as the boot check) ...
    await until(async () => (await s.domains()).includes('bc0'), 480_000, 'the domain bc0 defined on the target');
    const p = await done('bootfail');
    const x = p.vms[0];
    console.log(`      the VM failed with: ${x.error!.slice(0, 200)}; rollback: ${x.rollback?.detail}`);
    expect(x.status, x.error!).to.equal('rolled_back');
    expect(x.error).to.match(/did not boot \(failed\)/);
    expect((await req<DaemonJob>(B, 'GET', `/jobs/${x.job_id}`)).body.status).to.equal('failed');
    // ... and the rollback took them away and powered the source back on.
    // By the identities its job's ledger recorded: the domain's UUID, the volume's key (its path here).
    expect(x.rollback!.detail).to.match(/domain bc0 \([0-9a-f-]{36}\) with its NVRAM removed/).and.include(`volume ${path.join(s.lv.poolDir, 'bc0.qcow2')} removed`).and.match(/powered back on/);
    expect(await s.domains()).to.not.include('bc0');
    expect((await s.volumes()).filter((v) => v.startsWith('bc0'))).to.deep.equal([]);
    expect((await vmDetail(s.m, vm('bc0'))).power_state).to.equal('poweredOn');
  });
});

