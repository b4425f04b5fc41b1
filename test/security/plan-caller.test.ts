// The caller travels with the plan (issue 33, item 2), as an attacker with a submit key tries it against the real
// daemon, the simulator and the tests' libvirtd: a plan with source.insecure is refused at create, change,
// validate and start (403 naming source.insecure, as on /jobs/submit) and allowed for an admin, whose start makes
// the job carry insecure; options.remove_source (for the plan or one VM) needs admin, and a submit key cannot start
// an admin's plan with it: the source VM stays in the simulator's inventory. The plan's jobs carry its starter:
// a plan running in Redis as a submit key's gets no job that asks for more. A caller's parameters.plan naming a
// VM's source guard is refused, so an admin's power-off of that VM is not blocked; a host bridge is a network_map
// target only when the operator listed it (FERRY_LIBVIRT_BRIDGES). The plan's own side-effect operations
// (rollback_kvm, remove_source) cannot be submitted by any key.
import { expect } from 'chai';
import { keys } from '../../platform/redis';
import { planKeys } from '../../orchestration/plans';
import type { Plan } from '../../orchestration/plans';
import { vmDetail } from '../../domain/vsphere/inventory';
import { req, until } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import type { PlanView, Validation } from '../helpers/api-types';
import { powerOn } from '../vsphere/fixture';
import { createPlanVm, startPlanStack, type PlanStack } from '../plans/fixture';
import { awaitWorkers, startWorkerProc, type Proc } from '../helpers/procs';

const K = { submit: 'pc-submit-key-0123456789ab', admin: 'pc-admin-key-0123456789abc' };
const PREFIX = 'plancaller';
const BRIDGE = 'br-pc-listed';

describe('security: a plan acts as its caller (insecure, remove_source, plan slots, bridges)', function () {
  this.timeout(300_000);
  let s: PlanStack;
  let power: Proc;
  const as = (key: string) => ({ 'x-api-key': key });
  const get = async (id: string) => (await req<PlanView>(s.url, 'GET', `/plans/${id}`, undefined, as(K.admin))).body;
  const fields = (e: DaemonError) => (e.fields ?? []).map((f) => f.field);
  const refused = async (method: string, p: string, body: unknown, field: string) => {
    const r = await req<DaemonError>(s.url, method, p, body, as(K.submit));
    expect(r.status, `${method} ${p}: ${r.text}`).to.equal(403);
    expect(fields(r.body), r.text).to.include(field);
    expect(r.body.error).to.include('role submit');
  };

  before(async function () {
    this.timeout(240_000);
    s = await startPlanStack({ prefix: PREFIX, workers: {}, env: { FERRY_API_KEYS: `ci:submit:${K.submit},ops:admin:${K.admin}`, FERRY_LIBVIRT_BRIDGES: BRIDGE } });
    for (const [i, name] of ['pc-a', 'pc-b', 'pc-victim'].entries()) {
      await createPlanVm(s.m, { name, disks: [{ ds: 'LocalDS_0', file: `${name}/${name}.vmdk`, bytes: 1 << 20 }], mac: `00:50:56:07:00:${(0x10 + i).toString(16)}` });
    }
    // The power actions are vm_power jobs: a worker with vsphere_access alone (it takes no plan VM's shape B job).
    power = await startWorkerProc(s.env, 'pc-power', ['vsphere_access']);
    await awaitWorkers(s.url, [power], as(K.admin));
  });
  after(async () => { await power?.kill(); await s?.stop(); });

  it('the reported attack: source.insecure through a plan is a 403 naming source.insecure for a submit key (create, change, validate, start); an admin\'s plan runs its job with it', async () => {
    const insecure = s.plan('pc-insecure', ['pc-a'], { source: { insecure: true } });
    await refused('POST', '/plans', insecure, 'source.insecure');
    expect((await req(s.url, 'GET', '/plans/pc-insecure', undefined, as(K.admin))).status, 'no plan stored').to.equal(404);
    // A submit key's own plan cannot be changed into one either.
    expect((await req(s.url, 'POST', '/plans', s.plan('pc-mine', ['pc-a']), as(K.submit))).status).to.equal(201);
    await refused('PUT', '/plans/pc-mine', { source: { insecure: true } }, 'source.insecure');

    const made = await req<PlanView>(s.url, 'POST', '/plans', insecure, as(K.admin));
    expect(made.status, made.text).to.equal(201);
    expect(made.body.created_by).to.deep.equal({ name: 'ops', role: 'admin' });
    // An admin's insecure plan: a submit key may neither validate (the read turns TLS checks off), change nor start it.
    await refused('POST', '/plans/pc-insecure/validate', undefined, 'source.insecure');
    await refused('PUT', '/plans/pc-insecure', { description: 'mine now' }, 'source.insecure');
    await refused('POST', '/plans/pc-insecure/start', undefined, 'source.insecure');
    expect((await get('pc-insecure')).status).to.equal('pending');

    const started = await req<PlanView>(s.url, 'POST', '/plans/pc-insecure/start', undefined, as(K.admin));
    expect(started.status, started.text).to.equal(200);
    expect(started.body.started_by).to.deep.equal({ name: 'ops', role: 'admin' });
    const job = await until(async () => (await get('pc-insecure')).vms[0].job_id, 30_000, 'the VM\'s job');
    // The VM's job id is claimed in the plan just before its job is created: wait for the record.
    const spec = JSON.parse(await until(() => s.rc.hget(keys(PREFIX).job(job), 'spec'), 30_000, 'the job\'s record')) as { parameters: { insecure: boolean } };
    expect(spec.parameters.insecure).to.equal(true);
    expect((await req(s.url, 'POST', '/plans/pc-insecure/cancel', undefined, as(K.admin))).status).to.equal(200);
  });

  it('the reported attack: options.remove_source (the plan\'s or one VM\'s) needs admin; a submit key cannot start an admin\'s plan with it, and the source stays', async () => {
    await refused('POST', '/plans', s.plan('pc-rs', ['pc-b'], { options: { power_off: 'force', remove_source: true } }), 'options.remove_source');
    await refused('POST', '/plans', { ...s.plan('pc-rs', []), vms: [s.vm('pc-a'), { vm_path: s.vm('pc-b'), options: { remove_source: true } }] }, 'vms[1].options.remove_source');
    await refused('PUT', '/plans/pc-mine', { options: { remove_source: true } }, 'options.remove_source');

    const made = await req(s.url, 'POST', '/plans', s.plan('pc-rs', ['pc-b'], { options: { power_off: 'force', remove_source: true } }), as(K.admin));
    expect(made.status, made.text).to.equal(201);
    await refused('POST', '/plans/pc-rs/start', undefined, 'options.remove_source');
    const p = await get('pc-rs');
    expect([p.status, p.started_by, p.vms[0].job_id]).to.deep.equal(['pending', null, null]);
    expect((await vmDetail(s.m, s.vm('pc-b'))).name, 'the source VM in the simulator').to.equal('pc-b');
  });

  it('the plan\'s jobs carry its starter: a plan running in Redis as a submit key\'s (or with no starter recorded) gets no insecure job', async () => {
    const k = planKeys(keys(PREFIX));
    for (const [id, startedBy] of [['pc-run-submit', { name: 'ci', role: 'submit' }], ['pc-run-old', undefined]] as const) {
      expect((await req(s.url, 'POST', '/plans', s.plan(id, ['pc-a'], { source: { insecure: true } }), as(K.admin))).status).to.equal(201);
      // As a plan started before starters were kept, or whose record was changed in Redis: running, never checked at start.
      const stored = JSON.parse((await s.rc.get(k.plan(id)))!) as Plan;
      const running = { ...stored, status: 'running', started_at: new Date().toISOString(), started_by: startedBy };
      if (!startedBy) delete running.started_by;
      await s.rc.set(k.plan(id), JSON.stringify(running));
      // The leader steps the plans of the running set, which every plan write keeps: this raw write adds it there too.
      await s.rc.sadd(k.running, id);
      const vm = await until(async () => { const v = (await get(id)).vms[0]; return v.status === 'failed' && v; }, 30_000, `${id}'s VM to fail`);
      expect(vm.error).to.include('parameters.insecure').and.include('role submit');
      expect(await s.rc.exists(keys(PREFIX).job(vm.job_id ?? vm.jobs[0])), 'no job record').to.equal(0);
    }
  });

  it('the reported attack: a submit key\'s parameters.plan naming a VM\'s source guard is refused, so an admin\'s power-off of that VM goes through', async () => {
    const victim = s.vm('pc-victim');
    await powerOn(s.m, victim);
    const parameters = { vm_path: s.vm('pc-a'), source_type: 'vsphere', destination: { type: 'kvm' }, plan: { id: 'x', slots: [{ name: `vm:${s.manager}:${victim}`, limit: 1 }] } };
    const r = await req<DaemonError>(s.url, 'POST', '/jobs/operation', { operation: 'migrate_vm', parameters }, as(K.submit));
    expect(r.status, r.text).to.equal(400);
    expect(r.body.error).to.include('parameters.plan');
    expect(await s.holders(`vm:${s.manager}:${victim}`)).to.deep.equal([]);
    const off = await req(s.url, 'POST', '/vms/poweroff', { vm_path: victim }, as(K.admin));
    expect(off.status, off.text).to.equal(200);
    expect((await vmDetail(s.m, victim)).power_state).to.equal('poweredOff');
  });

  it('the preflight\'s inspection reaches the VM\'s job only from the plan runner: carried when it is one the schema takes, left out when not; forged by a caller of any role it is a 400 naming parameters.plan', async () => {
    const k = planKeys(keys(PREFIX));
    const hint = {
      os: 'linux', distro: 'debian', version: '12.5', package_format: 'deb', root: '/dev/sda1', mountpoints: { '/': '/dev/sda1' },
      uuids: { '/dev/sda1': '6f0c3c61-7b5c-4f3a-9f55-2b8e1f6d0a11' }, hypervisor_packages: ['open-vm-tools'], evidence: { '/etc/fstab': 'a'.repeat(64), '/etc/crypttab': null },
    };
    const jobOf = async (id: string, inspection: unknown) => {
      expect((await req(s.url, 'POST', '/plans', s.plan(id, ['pc-b']), as(K.admin))).status).to.equal(201);
      // As the preflight stored it: the VM's guest_inspected finding carries the reading.
      const stored = JSON.parse((await s.rc.get(k.plan(id)))!) as Plan;
      stored.vms[0].findings = [{ rule: 'guest_inspected', severity: 'info', message: 'read', fix: 'none needed', guest: { os: 'linux', inspection } }];
      await s.rc.set(k.plan(id), JSON.stringify({ ...stored, status: 'running', started_at: new Date().toISOString(), started_by: { name: 'ops', role: 'admin' } }));
      await s.rc.sadd(k.running, id);
      const job = await until(async () => (await get(id)).vms[0].job_id, 30_000, `${id}'s job`);
      return JSON.parse(await until(() => s.rc.hget(keys(PREFIX).job(job), 'spec'), 30_000, 'the job\'s record')) as { parameters: { plan: { inspection?: unknown } } };
    };
    expect((await jobOf('pc-insp', hint)).parameters.plan.inspection).to.deep.equal(hint);
    const odd = await jobOf('pc-insp-odd', { ...hint, root: 'sda1; rm -rf /' });
    expect(odd.parameters.plan, 'the job is made, without the reading').to.not.have.property('inspection');
    for (const key of [K.submit, K.admin]) {
      const parameters = { vm_path: s.vm('pc-a'), source_type: 'vsphere', destination: { type: 'kvm' }, plan: { id: 'x', inspection: hint } };
      const r = await req<DaemonError>(s.url, 'POST', '/jobs/operation', { operation: 'migrate_vm', parameters }, as(key));
      expect(r.status, r.text).to.equal(400);
      expect(fields(r.body)).to.include('parameters.plan');
    }
  });

  it('a plan\'s side-effect operations (rollback_kvm, remove_source) are refused from every caller, admin included: no job is made and the source stays', async () => {
    // What an attacker would aim them at: another job's ledger, or any VM's source through a job of its choosing.
    const victim = s.vm('pc-victim');
    const jobKeys = async () => (await s.rc.keys(keys(PREFIX).job('*'))).sort();
    const before = await jobKeys();
    for (const [operation, parameters] of [['rollback_kvm', { of_job: 'someone-elses-job', power_on_source: true }], ['remove_source', { of_job: 'someone-elses-job' }]] as const) {
      for (const [who, key] of [['submit', K.submit], ['admin', K.admin]] as const) {
        const r = await req<DaemonError>(s.url, 'POST', '/jobs/operation', { operation, parameters }, as(key));
        expect(r.status, `${operation} as ${who}: ${r.text}`).to.equal(400);
        expect(fields(r.body), r.text).to.include('operation');
        expect(r.body.error).to.include('plan runner');
      }
    }
    expect(await jobKeys(), 'no job made').to.deep.equal(before);
    expect((await vmDetail(s.m, victim)).name, 'the source VM in the simulator').to.equal('pc-victim');
  });

  it('a host bridge is a network_map target only when listed in FERRY_LIBVIRT_BRIDGES: br-mgmt is a blocker, the listed one is not', async () => {
    const mapRule = async (id: string, target: string) => {
      expect((await req(s.url, 'POST', '/plans', s.plan(id, ['pc-a'], { network_map: { 'VM Network': target } }), as(K.submit))).status).to.equal(201);
      const v = await req<Validation>(s.url, 'POST', `/plans/${id}/validate`, undefined, as(K.submit));
      expect(v.status, v.text).to.equal(200);
      return v.body.vms[0].findings.filter((f) => f.rule === 'network_missing');
    };
    const mgmt = await mapRule('pc-br-mgmt', 'br-mgmt');
    expect(mgmt.map((f) => f.severity)).to.deep.equal(['blocker']);
    expect(mgmt[0].message).to.include('FERRY_LIBVIRT_BRIDGES');
    expect(await mapRule('pc-br-listed', BRIDGE)).to.deep.equal([]);
  });
});
