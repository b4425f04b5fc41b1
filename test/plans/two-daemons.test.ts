// Two daemons, one plan (docs/plans.md "Claims: each side effect once"): two daemon replicas, a worker and a notifier on one
// Redis run a plan of four VMs: two whose jobs fail (their disk is a VMDK descriptor naming a host file, which
// the export refuses right after the download: a failure that costs no appliance) and are rolled back, one
// cancelled while its job waits for the ESXi host's slot (limits.per_esxi_host 1) the fourth holds, and the tiny
// real guest, which completes (repaired, imported, its boot check passed on the guest's marker) and whose source is
// removed (options.remove_source). The daemon leading the plans is SIGKILLed mid-plan, as soon as it has
// claimed a rollback or a source removal and not yet marked it done when the test sees one (else once the first
// VM has settled). The other daemon takes the lease and finishes the plan. Rollbacks and the removal are worker
// jobs (rollback_kvm, remove_source) under ids derived from their claims. Then: every VM final; each job's
// rollback and the source removal claimed and done exactly once in the plan's record; the target and the
// simulator as those effects leave them (no domain or volume of the failed and cancelled VMs, their sources
// powered back on, the completed VM running on the target and gone from vSphere); and each plan webhook
// delivered exactly once to a receiver on 127.0.0.1.
import { expect } from 'chai';
import type { AuditRecord } from '../../platform/audit';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { req, until } from '../helpers/http';
import { powerOn } from '../vsphere/fixture';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { findVm, vmDetail } from '../../domain/vsphere/inventory';
import { startProcess, type Proc } from '../helpers/procs';
import { vmdkDescriptor } from '../helpers/hostile-images';
import { PlanStack, startPlanStack } from './fixture';
import type { DeliveryLog, PlanView } from '../helpers/api-types';

const PREFIX = 'plan2d';
type Vm = PlanView['vms'][number];
type Action = NonNullable<Vm['actions']>[number];
interface Hook { delivery_id: string; event: string; data: { vm_path?: string; status?: string } }

describe('plans: two daemons, one plan, the leader killed mid-plan @vm', function () {
  this.timeout(2_400_000);
  let s: PlanStack;
  let notifier: Proc;
  let receiver: http.Server;
  const received: Hook[] = [];

  before(async function () {
    // the simulator and the tiny guest are built on first use (cached afterwards)
    this.timeout(900_000);
    const tiny = await ensureTinyGuest();
    s = await startPlanStack({ prefix: PREFIX, daemons: 2, workers: { w1: 3 }, config: 'webhooks:\n  allow_loopback: true\n  backoff_ms: 200\n' });
    notifier = startProcess('services/notifier/main.ts', [], { ...s.env, FERRY_CONFIG: path.join(s.dir, 'daemon.yaml') });
    receiver = http.createServer((rq, rs) => {
      let body = '';
      rq.on('data', (c: Buffer) => (body += c.toString()));
      rq.on('end', () => { received.push(JSON.parse(body) as Hook); rs.writeHead(200); rs.end('ok'); });
    });
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
    const bad = { path: vmdkDescriptor(path.join(s.dir, 'bad.vmdk'), '/etc/hostname'), bytes: 1024 * 1024 };
    await s.addVm({ name: 's0', host: 'DC0_C0_H2', ds: 'LocalDS_0', mac: '00:50:56:05:00:13' }, { path: tiny, bytes: TINY_GUEST_BYTES });
    await s.addVm({ name: 'f0', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:05:00:10' }, bad);
    await s.addVm({ name: 'f1', host: 'DC0_C0_H0', ds: 'LocalDS_1', mac: '00:50:56:05:00:11' }, bad);
    await s.addVm({ name: 'c0', host: 'DC0_C0_H2', ds: 'LocalDS_1', mac: '00:50:56:05:00:12' }, bad);
    for (const n of ['f0', 'c0']) await powerOn(s.m, s.vm(n));
  });
  after(async () => {
    await notifier?.kill();
    receiver?.close();
    await s?.stop();
  });

  it('every VM ends final; each rollback and the source removal happen once; each webhook is delivered once', async () => {
    const url = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;
    const hook = await req(s.url, 'POST', '/webhooks', { url, events: ['plan.started', 'plan.vm_completed', 'plan.vm_failed', 'plan.vm_cancelled', 'plan.vm_rolled_back', 'plan.completed'] });
    expect(hook.status, hook.text).to.be.oneOf([200, 201]);
    // s0 first: its job is queued first and takes its ESXi host's one slot before c0's job asks for it.
    const body = s.plan('two', [], { limits: { per_plan: 4, per_esxi_host: 1 }, options: { power_off: 'force' } });
    // The imported domain's first start is always watched; the tiny guest prints its marker (not Linux's milestones).
    body.vms = [{ vm_path: s.vm('s0'), options: { remove_source: true, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 180 } } }, s.vm('f0'), s.vm('f1'), s.vm('c0')];
    const c = await req(s.url, 'POST', '/plans', body);
    expect(c.status, c.text).to.equal(201);
    const st = await req<PlanView>(s.url, 'POST', '/plans/two/start');
    expect(st.status, st.text).to.equal(200);

    // c0 is cancelled while its job waits for the slot s0 holds.
    const waiting = await until(async () => { const p = await s.get('two'); return p.vms.find((x) => x.vm_path === s.vm('c0') && /limits\.per_esxi_host/.test(x.waiting_reason ?? '')); }, 300_000, 'c0 waiting for its ESXi host\'s slot');
    expect(waiting.status).to.equal('running');
    expect((await req(s.url, 'POST', '/plans/two/cancel', { vm_path: s.vm('c0') })).status).to.equal(200);

    // The leader: its lease names its pid.
    const lease = await until(() => s.rc.get(`${PREFIX}:leader:plans`), 10_000, 'a plans leader');
    const leader = s.daemons.find((d) => lease.startsWith(`${d.proc.pid}:`))!;
    expect(leader, `the lease ${lease} names one of the daemons`).to.not.equal(undefined);
    const other = s.daemons.find((d) => d !== leader)!;
    const plan = async () => (await req<PlanView>(other.url, 'GET', '/plans/two')).body;

    // Kill it while it holds an undone rollback or removal claim if the test sees one, else once a VM settled.
    const moment = await until(async () => {
      const p = await plan();
      const open = p.vms.flatMap((x) => (x.actions ?? []).filter((a) => a.action !== 'submit' && !a.done_at));
      if (open.length) return `holding an undone ${open[0].action} claim`;
      return p.vms.some((x) => ['failed', 'rolled_back', 'cancelled', 'completed'].includes(x.status)) && 'after a VM settled';
    }, 480_000, 'a claim or a settled VM');
    await leader.kill();
    // What the dead leader left undone, read from the record once it is dead: each must be taken over (resumed).
    const dead = JSON.parse((await s.rc.get(`${PREFIX}:plan:two`))!) as PlanView;
    const undone = dead.vms.flatMap((x) => (x.actions ?? []).filter((a) => !a.done_at).map((a) => ({ vm: x.vm_path, action: a.action, key: a.key })));
    console.log(`      leader (pid ${leader.proc.pid}) SIGKILLed ${moment}; undone at its death: ${undone.map((u) => `${u.vm.split('/').pop()} ${u.action}`).join(', ') || 'none'}`);
    await until(async () => { const v = await s.rc.get(`${PREFIX}:leader:plans`); return v?.startsWith(`${other.proc.pid}:`); }, 20_000, 'the other daemon to take the plans lease');

    const p = await until(async () => { const x = await plan(); return ['completed', 'failed', 'cancelled'].includes(x.status) && x; }, 1_200_000, 'the plan to end');
    const by = Object.fromEntries(p.vms.map((x) => [x.vm_path.split('/').pop()!, x]));
    console.log(`      ${JSON.stringify(Object.fromEntries(Object.entries(by).map(([n, x]) => [n, x.status])))}; resumed claims: ${p.vms.flatMap((x) => x.actions ?? []).filter((a) => a.resumed).map((a) => a.action).join(', ') || 'none'}`);
    expect(p.status).to.equal('failed');
    expect(by.f0.status, by.f0.error!).to.equal('rolled_back');
    expect(by.f1.status, by.f1.error!).to.equal('rolled_back');
    expect(by.c0.status, by.c0.error!).to.equal('cancelled');
    expect(by.s0.status, by.s0.error!).to.equal('completed');

    // The record: each VM's job submitted once, each ended job rolled back once (s0's source removed once), all done.
    const once = (x: Vm, action: Action['action']) => (x.actions ?? []).filter((a) => a.action === action);
    for (const [n, x] of Object.entries(by)) {
      expect(x.jobs, n).to.have.length(1);
      expect(once(x, 'submit').map((a) => a.key), `${n} submit`).to.deep.equal([x.job_id]);
      for (const a of x.actions ?? []) expect(a.done_at, `${n} ${a.action} done`).to.be.a('string');
    }
    for (const u of undone) {
      const a = p.vms.find((x) => x.vm_path === u.vm)!.actions!.find((x) => x.action === u.action && x.key === u.key)!;
      expect(a.done_at, `${u.vm} ${u.action} left undone by the dead leader`).to.be.a('string');
      // A submit found created needs no take-over (its job exists); a rollback or removal is resumed once.
      if (u.action !== 'submit') expect(a.resumed, `${u.vm} ${u.action} resumed by the next leader`).to.equal(1);
    }
    for (const n of ['f0', 'f1', 'c0']) expect(once(by[n], 'rollback').map((a) => a.key), `${n} rollback`).to.deep.equal([by[n].job_id]);
    expect(once(by.s0, 'rollback')).to.deep.equal([]);
    expect(once(by.s0, 'remove_source').map((a) => a.key)).to.deep.equal([by.s0.job_id]);
    expect(by.s0.source).to.include({ action: 'removed' });
    // Each rollback and the removal done by one worker job, its id derived from the claim, which ended completed.
    for (const [n, x] of Object.entries(by)) {
      for (const a of (x.actions ?? []).filter((y) => y.action !== 'submit')) {
        expect(a.job_id, `${n} ${a.action} job`).to.equal(`${x.job_id}.${a.action}`);
        expect(await s.rc.hget(`${PREFIX}:job:${a.job_id}`, 'state'), `${n} ${a.action} job`).to.equal('COMPLETED');
      }
    }

    // The audit log: one record of each effect, by the worker that did it, acting as the plan's starter.
    const effects = (await s.rc.zrange(`${PREFIX}:audit`, 0, -1)).map((r) => JSON.parse(r) as AuditRecord).filter((r) => r.method === 'EFFECT');
    const audited = effects.map((r) => `${r.route} ${String(r.targets.of_job)}`).sort();
    expect(audited).to.deep.equal([...['f0', 'f1', 'c0'].map((n) => `rollback_kvm ${by[n].job_id}`), `remove_source ${by.s0.job_id}`].sort());
    // Authentication is off in this stack: the starter is no key, so key_name is null, as in every request's record.
    for (const r of effects) expect({ service: r.service, key_name: r.key_name, outcome: r.outcome }).to.deep.equal({ service: 'worker', key_name: null, outcome: 'ok' });

    // The target and the simulator as the effects leave them.
    const domains = await s.domains();
    for (const n of ['f0', 'f1', 'c0']) expect(domains, n).to.not.include(n);
    expect((await s.volumes()).filter((x) => /^(f[01]|c0)/.test(x))).to.deep.equal([]);
    expect(domains, 's0 imported').to.include('s0');
    for (const n of ['f0', 'c0']) expect((await vmDetail(s.m, s.vm(n))).power_state, `${n} powered back on`).to.equal('poweredOn');
    expect(await findVm(s.m, s.vm('s0')).then(() => 'still there', (e: Error) => e.message)).to.match(/no VM at/);

    // Each plan webhook delivered once: one per event and VM, no delivery id twice.
    const want = { 'plan.started': 1, 'plan.vm_failed': 2, 'plan.vm_rolled_back': 2, 'plan.vm_cancelled': 1, 'plan.vm_completed': 1, 'plan.completed': 1 };
    const total = Object.values(want).reduce((a, b) => a + b, 0);
    // Every delivery the webhook store queued has been made (its log: each delivered), and each reached the receiver.
    const log = await until(async () => {
      const d = (await req<DeliveryLog>(other.url, 'GET', '/webhooks/0/deliveries')).body.deliveries;
      return d.length >= total && d.every((x) => x.status === 'delivered') && received.length >= d.length && d;
    }, 60_000, `${total} deliveries made (received ${received.length})`);
    expect(log.length, log.map((d) => d.delivery_id).join(' ')).to.equal(total);
    const ids = received.map((r) => r.delivery_id);
    expect(new Set(ids).size, ids.join(' ')).to.equal(ids.length);
    const count: Record<string, number> = {};
    for (const r of received) count[r.event] = (count[r.event] ?? 0) + 1;
    expect(count).to.deep.equal(want);
    const vmsOf = (e: string) => received.filter((r) => r.event === e).map((r) => r.data.vm_path!.split('/').pop()).sort();
    expect(vmsOf('plan.vm_rolled_back')).to.deep.equal(['f0', 'f1']);
    expect(vmsOf('plan.vm_cancelled')).to.deep.equal(['c0']);
    expect(vmsOf('plan.vm_completed')).to.deep.equal(['s0']);
  });
});
