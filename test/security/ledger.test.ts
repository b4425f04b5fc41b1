// Issue 33, item 1: Ferry acts only on what it recorded it made. The attacks of "Rollback destroys what Ferry never
// made", each as a submit key's requests against the real daemon and shape B workers, the simulator and the tests'
// libvirtd, with the victim's state read back with virsh afterwards: a target name virsh reads as a domain ID or
// UUID is refused (400 naming the field) on plans and direct jobs; a plan whose stored target names another
// domain's ID or UUID (one stored before the rule), cancelled while its jobs run, removes nothing of theirs; a
// domain defined under the plan's target name after preflight is neither imported over nor removed (checked again
// before the job is submitted, and by the job itself); the ledger in a job's record lists the domain's UUID
// and the volumes' keys the import made, which rollback removes, and nothing else; and a volume path that a later
// plan made again after the first rollback (a dir pool's key is its path) is the later job's: rolling the first
// VM back again through the API removes nothing of it.
// A reused proof (test/helpers/proof-tests.ts): the five attacks run in order on one stack, what the test read after
// each (the answers, virsh, the ledgers, Redis) is the evidence, and each test is its check on it; with every input
// unchanged the same checks re-assert the last passing run's evidence, and the stack starts only when it runs.
import { expect } from 'chai';
import path from 'node:path';
import { writeFileSync } from 'node:fs';
import { sha256File } from '../../domain/qemu';
import { answer as plainAnswer, req, until, type Answer as PlainAnswer, type DaemonError, type Res } from '../helpers/http';
import type { DaemonJob, PlanView } from '../helpers/api-types';
import { makeDisks } from '../vsphere/fixture';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { tolerate } from '../helpers/teardown';
import { createPlanVm, PlanStack, startPlanStack } from '../plans/fixture';
import { fixtureInputs } from '../helpers/proofs';
import { proofTests } from '../helpers/proof-tests';
import type { MadeEntry } from '../../domain/libvirt/ledger';
import type { Plan } from '../../orchestration/plans';

const K = { read: 'ledger-read-key-0123456789', submit: 'ledger-submit-key-0123456789', admin: 'ledger-admin-key-0123456789' };
const as = (key: string) => ({ 'x-api-key': key });
const FINAL = ['completed', 'failed', 'cancelled'];
const CAS = `if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end return 0`;
type Vm = PlanView['vms'][number];
type Finding = { rule: string; severity: string; overridable: boolean; message?: string; fix?: string };

/** An answer as the checks read it: the status, the text, the fields a 400 names and its message. */
interface Answer extends PlainAnswer { fields?: string[]; error?: string }
const answer = (r: Res<DaemonError & object>): Answer => ({ ...plainAnswer(r), fields: r.body?.fields?.map((f) => f.field), error: r.body?.error });

/** The stack's names the checks compare with: the victims' ID and UUID, the VMs' paths, the pool. */
interface Names { victimId: string; victimUuid: string; vms: Record<string, string>; poolDir: string; pool: string; uri: string }

interface Evidence {
  names: Names;
  a: {
    domainsBefore: string[]; bad: Answer[]; perVm: Answer; okCreated: number; put: Answer;
    validate: Answer & { findings4242: Finding[]; blockersLr0: Finding[] }; withRule: Answer; v1: Answer; v2: Answer; start: number;
    imp: Answer; mig: Answer; direct: Answer; domainsAfter: string[]; victims: string[];
  };
  b: { created: number; started: number; cancel: Answer; plan: PlanView; victims: { a: string; id: string; b: string; uuid: string } };
  c: {
    late: { created: number; started: number; vm: Vm; job: number; state: string };
    race: { created: number; started: number; dbUuid: string; vm: Vm; job: string; made: MadeEntry[]; state: string; uuidAfter: string; volumes: string[] };
  };
  d: {
    created: Answer; started: number; uuid: string; virshUuid: string; vm: Vm; ledger: MadeEntry[];
    domainAfter: string; volumesAfter: Record<string, string>; volumes: string[]; states: string[];
  };
  e: { created: number; started: number; vm: Vm; rollback: Answer; detail: string; dominfo: string; volKey: string; bytes: string; bytesAfter: string };
}

/** The stack and the reads and requests every attack uses. */
function tools(s: PlanStack) {
  const B = s.url;
  const get = async (id: string) => (await req<PlanView>(B, 'GET', `/plans/${id}`, undefined, as(K.read))).body;
  const virsh = (args: string[]) => s.lv.virsh(args);
  const t = {
    B, get, virsh, vm: (n: string) => s.vm(n),
    done: (id: string, ms = 480_000) => until(async () => { const p = await get(id); return FINAL.includes(p.status) && p; }, ms, `plan ${id} to end`),
    post: <T = PlanView>(p: string, body?: unknown, key = K.submit) => req<T & DaemonError>(B, 'POST', p, body, as(key)),
    state: (d: string) => virsh(['domstate', d]).then((x) => x.trim(), () => 'absent'),
    define: (name: string, disks: string[] = []) => {
      const file = path.join(s.dir, `${name}.xml`);
      writeFileSync(file, `<domain type="qemu"><name>${name}</name><memory unit="MiB">16</memory><os><type arch="x86_64">hvm</type></os><devices>${disks.map((d, i) => `<disk type="file" device="disk"><driver name="qemu" type="qcow2"/><source file="${s.lv.poolDir}/${d}"/><target dev="vd${'ab'[i]}" bus="virtio"/></disk>`).join('')}</devices></domain>`);
      return virsh(['define', file]);
    },
    ledgerOf: async (jobId: string) => (await req<{ ledger: MadeEntry[] }>(B, 'GET', `/jobs/${jobId}/record`, undefined, as(K.read))).body.ledger,
    jobRunning: (planId: string, name: string) => until(async () => {
      const x = (await get(planId)).vms.find((v) => v.vm_path === s.vm(name));
      return x?.job_id && x.job_status === 'running' && x.job_id;
    }, 120_000, `the job of ${name} running`),
  };
  return t;
}
type Tools = ReturnType<typeof tools>;

/** The VMs, and the victims: victim-a runs (paused, no guest code runs) and so has an ID; victim-b is another VM's. */
async function prepare(s: PlanStack, t: Tools, tiny: string): Promise<Names> {
  const disks = makeDisks(s.dir, 2);
  let mac = 0x20;
  for (const name of ['lr0', 'lr1', 'lr2']) await s.addVm({ name, host: 'DC0_H0', ds: 'LocalDS_0', mac: `00:50:56:04:00:${(mac++).toString(16)}` }, { path: disks.sparse, bytes: disks.bytes });
  for (const name of ['db', 'lg0']) await s.addVm({ name, host: 'DC0_H0', ds: 'LocalDS_0', mac: `00:50:56:04:00:${(mac++).toString(16)}` }, { path: tiny, bytes: TINY_GUEST_BYTES });
  await createPlanVm(s.m, { name: '4242', disks: [{ ds: 'LocalDS_0', file: '4242/4242.vmdk', bytes: 1 << 20 }], mac: `00:50:56:04:00:${mac.toString(16)}` });
  await t.define('victim-a');
  await t.virsh(['start', '--paused', 'victim-a']);
  await t.define('victim-b');
  const names = {
    victimId: (await t.virsh(['domid', 'victim-a'])).trim(), victimUuid: (await t.virsh(['domuuid', 'victim-b'])).trim(),
    vms: Object.fromEntries(['lr0', 'lr1', 'lr2', 'db', 'lg0', '4242'].map((n) => [n, s.vm(n)])), poolDir: s.lv.poolDir, pool: s.lv.pool, uri: s.lv.uri,
  };
  if (!/^\d+$/.test(names.victimId)) throw new Error(`victim-a has no domain ID: ${names.victimId}`);
  return names;
}

/** (a) names virsh could take for another domain, on plans (create, update, validate, start) and direct jobs. */
async function badNames(s: PlanStack, t: Tools, n: Names): Promise<Evidence['a']> {
  const domainsBefore = await s.domains();
  const bad: Answer[] = [];
  for (const template of [n.victimId, n.victimUuid, '0042']) bad.push(answer(await t.post('/plans', s.plan(`bad-${template.length}`, ['lr0'], { options: { power_off: 'force', target_name: { template } } }))));
  const perVm = answer(await t.post('/plans', { ...s.plan('bad-vm', []), vms: [{ vm_path: t.vm('lr0'), options: { target_name: { template: n.victimUuid.toUpperCase() } } }] }));
  const okCreated = (await t.post('/plans', s.plan('ok-name', ['lr0', '4242'], { options: { power_off: 'force', guest_preflight: false } }))).status;
  const put = answer(await req<DaemonError>(t.B, 'PUT', '/plans/ok-name', { options: { target_name: { template: '1' } } }, as(K.submit)));
  // A VM named 4242 on vSphere keeps its name without a rule: a blocker no override lifts, the others go on.
  const val = await t.post<{ vms: { vm_path: string; findings: Finding[] }[] }>('/plans/ok-name/validate');
  const findings = (name: string) => val.body.vms?.find((x) => x.vm_path === t.vm(name))?.findings ?? [];
  const validate = { ...answer(val), findings4242: findings('4242'), blockersLr0: findings('lr0').filter((f) => f.severity === 'blocker') };
  // A rule that gives a VM such a name, and a plan stored before the rule existed: refused at validate too.
  const withRule = answer(await req<DaemonError>(t.B, 'PUT', '/plans/ok-name', { options: { power_off: 'force', guest_preflight: false, target_name: { template: '{name}' } } }, as(K.submit)));
  const v1 = answer(await t.post('/plans/ok-name/validate'));
  const key = 'ledger:plan:ok-name';
  const stored = JSON.parse((await s.rc.get(key))!) as Plan;
  stored.options.target_name = { template: n.victimId };
  stored.vms = stored.vms.filter((x) => x.vm_path === t.vm('lr0'));
  await s.rc.set(key, JSON.stringify(stored));
  const v2 = answer(await t.post('/plans/ok-name/validate'));
  const start = (await t.post('/plans/ok-name/start')).status;
  // Direct jobs: an import_kvm's name, a migrate_vm's domain_name; and the admin's own POST /import/kvm.
  const disk = path.join(s.dir, 'src.raw');
  const imp = answer(await t.post('/jobs/operation', { operation: 'import_kvm', parameters: { disks: [{ path: disk, format: 'raw' }], name: n.victimId } }));
  const mig = answer(await t.post('/jobs/operation', { operation: 'migrate_vm', parameters: { vm_path: t.vm('lr0'), source_type: 'vsphere', destination: { type: 'kvm', virt_uri: s.lv.uri }, domain_name: n.victimUuid } }));
  const direct = answer(await t.post('/import/kvm', { image_path: disk, vm_name: n.victimUuid }, K.admin));
  return { domainsBefore, bad, perVm, okCreated, put, validate, withRule, v1, v2, start, imp, mig, direct, domainsAfter: await s.domains(), victims: [await t.state('victim-a'), await t.state('victim-b')] };
}

/** (b) a plan whose stored targets are the victims' ID and UUID (as one stored before the rule), cancelled mid-run. */
async function storedVictims(s: PlanStack, t: Tools, n: Names): Promise<Evidence['b']> {
  const created = (await t.post('/plans', s.plan('ids', ['lr0', 'lr1'], { limits: { per_plan: 2 } }))).status;
  const started = (await t.post('/plans/ids/start')).status;
  await t.jobRunning('ids', 'lr0');
  await t.jobRunning('ids', 'lr1');
  const key = 'ledger:plan:ids';
  for (;;) {
    const old = (await s.rc.get(key))!;
    const p = JSON.parse(old) as Plan;
    p.vms.find((x) => x.vm_path === t.vm('lr0'))!.placement!.domain = n.victimId;
    p.vms.find((x) => x.vm_path === t.vm('lr1'))!.placement!.domain = n.victimUuid;
    if (await s.rc.eval(CAS, 1, key, old, JSON.stringify(p))) break;
  }
  const cancel = answer(await t.post('/plans/ids/cancel'));
  const plan = await t.done('ids', 120_000);
  const victims = { a: await t.state('victim-a'), id: (await t.virsh(['domid', 'victim-a'])).trim(), b: await t.state('victim-b'), uuid: (await t.virsh(['domuuid', 'victim-b'])).trim() };
  return { created, started, cancel, plan, victims };
}

/** (c) the target name taken after the preflight: before the job is submitted, and while the job runs. */
async function nameTaken(s: PlanStack, t: Tools): Promise<Evidence['c']> {
  // Before submission: the plan starts in a few seconds; the name is taken meanwhile.
  const startAt = new Date(Date.now() + 6000).toISOString();
  const lateCreated = (await t.post('/plans', s.plan('late', ['lr2'], { start_at: startAt, options: { power_off: 'force', target_name: { template: 'late-{name}' } } }))).status;
  const lateStarted = (await t.post('/plans/late/start')).status;
  await t.define('late-lr2');
  const lateVm = (await t.done('late', 60_000)).vms[0];
  const late = { created: lateCreated, started: lateStarted, vm: lateVm, job: (await req(t.B, 'GET', `/jobs/${lateVm.jobs[0]}`, undefined, as(K.read))).status, state: await t.state('late-lr2') };

  // After submission: the job exports and repairs the guest, then finds the name taken and refuses the import.
  // The plan's VM `db` meets an unrelated domain `db` with its disks db.qcow2 and db-disk1.qcow2.
  const created = (await t.post('/plans', s.plan('race', ['db']))).status;
  const started = (await t.post('/plans/race/start')).status;
  const jobId = await t.jobRunning('race', 'db');
  for (const v of ['db.qcow2', 'db-disk1.qcow2']) await t.virsh(['vol-create-as', s.lv.pool, v, '1M', '--format', 'qcow2']);
  await t.define('db', ['db.qcow2', 'db-disk1.qcow2']);
  const dbUuid = (await t.virsh(['domuuid', 'db'])).trim();
  const vm = (await t.done('race')).vms[0];
  console.log(`      the VM failed with: ${vm.error?.slice(0, 240)}`);
  const race = {
    created, started, dbUuid, vm, job: (await req<DaemonJob>(t.B, 'GET', `/jobs/${jobId}`, undefined, as(K.read))).body.status, made: await t.ledgerOf(jobId),
    state: await t.state('db'), uuidAfter: (await t.virsh(['domuuid', 'db'])).trim(), volumes: await s.volumes(),
  };
  return { late, race };
}

/** (d) a job that imports, then fails its boot check: its ledger, and what the rollback removed. */
async function ledgerRollback(s: PlanStack, t: Tools): Promise<Evidence['d']> {
  const created = answer(await t.post('/plans', s.plan('made', ['lg0'], { options: { power_off: 'force', virt_test: { expect: 'FERRY-NEVER-SHOWN', timeout_seconds: 10 } } })));
  const started = (await t.post('/plans/made/start')).status;
  const jobId = await t.jobRunning('made', 'lg0');
  // While the boot check waits, the ledger names the domain virsh shows, by its UUID.
  const uuid = await until(async () => (await t.ledgerOf(jobId)).find((e) => e.kind === 'domain')?.id, 480_000, 'the domain in the ledger');
  await until(async () => (await t.state('lg0')) !== 'absent', 30_000, 'lg0 defined');
  const virshUuid = (await t.virsh(['domuuid', 'lg0'])).trim();
  const vm = (await t.done('made')).vms[0];
  const ledger = await t.ledgerOf(jobId);
  console.log(`      ledger: ${ledger.map((e) => `${e.kind} ${e.id}`).join(', ')}; rollback: ${vm.rollback?.detail}`);
  // dominfo looks a UUID up (domuuid takes only IDs and names).
  const domainAfter = await t.virsh(['dominfo', uuid]).then(() => 'there', () => 'gone');
  const volumesAfter: Record<string, string> = {};
  for (const v of ledger.filter((e) => e.kind === 'volume')) volumesAfter[v.id] = await t.virsh(['vol-key', v.id]).then(() => 'there', () => 'gone');
  const states = [await t.state('victim-a'), await t.state('victim-b'), await t.state('db'), await t.state('late-lr2')];
  return { created, started, uuid, virshUuid, vm, ledger, domainAfter, volumesAfter, volumes: await s.volumes(), states };
}

/** (e) the first VM rolled back again after a later plan made the same volume path. */
async function pathReused(s: PlanStack, t: Tools): Promise<Evidence['e']> {
  const vol = path.join(s.lv.poolDir, 'lg0.qcow2');
  const created = (await t.post('/plans', s.plan('again', ['lg0'], { options: { power_off: 'force', virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 } } }))).status;
  const started = (await t.post('/plans/again/start')).status;
  const vm = (await t.done('again')).vms[0];
  const uuid = (await t.virsh(['domuuid', 'lg0']).catch((e: Error) => e.message)).trim();
  const bytes = await sha256File(vol).catch((e: Error) => e.message);
  const r = await t.post(`/plans/made/vms/${encodeURIComponent(t.vm('lg0'))}/rollback`, undefined, K.admin);
  const detail = r.body.vms?.[0]?.rollback?.detail ?? '';
  console.log(`      the second rollback of made: ${detail}`);
  return {
    created, started, vm, rollback: answer(r), detail, dominfo: (await t.virsh(['dominfo', uuid]).catch((e: Error) => e.message)).includes(uuid) ? uuid : 'gone',
    volKey: (await t.virsh(['vol-key', vol]).catch((e: Error) => e.message)).trim(), bytes, bytesAfter: await sha256File(vol).catch((e: Error) => e.message),
  };
}

async function produce(tiny: string): Promise<Evidence> {
  const s = await startPlanStack({ prefix: 'ledger', workers: { lw: 2 }, env: { FERRY_API_KEYS: `r:read:${K.read},s:submit:${K.submit},a:admin:${K.admin}` } });
  const t = tools(s);
  try {
    const names = await prepare(s, t, tiny);
    // In order: each attack leaves what the next ones check is still there (the victims, db, late-lr2, made's ledger).
    const e: Evidence = { names, a: await badNames(s, t, names), b: await storedVictims(s, t, names), c: await nameTaken(s, t), d: await ledgerRollback(s, t), e: await pathReused(s, t) };
    return JSON.parse(JSON.stringify(e)) as Evidence;
  } finally {
    for (const d of ['victim-a', 'victim-b', 'db', 'late-lr2']) {
      if ((await t.state(d)) === 'absent') continue;
      await t.virsh(['destroy', d]).catch(tolerate(`destroy ${d}`));
      await t.virsh(['undefine', d]).catch(tolerate(`undefine ${d}`));
    }
    for (const v of ['db.qcow2', 'db-disk1.qcow2', 'lg0.qcow2']) await t.virsh(['vol-delete', '--pool', s.lv.pool, v]).catch(tolerate(`vol-delete ${v}`));
    await s.stop();
  }
}

function checkBadNames({ names: n, a }: Evidence) {
  for (const r of a.bad) {
    expect(r.status, r.text).to.equal(400);
    expect(r.fields).to.deep.equal(['options.target_name']);
    expect(r.error).to.match(/virsh could take for another domain/);
  }
  expect(a.perVm.status, a.perVm.text).to.equal(400);
  expect(a.perVm.fields).to.deep.equal(['vms.0.options.target_name']);
  expect(a.okCreated).to.equal(201);
  expect(a.put.status, a.put.text).to.equal(400);
  expect(a.put.fields).to.deep.equal(['options.target_name']);
  expect(a.validate.status, a.validate.text).to.equal(200);
  expect(a.validate.findings4242).to.deep.include({ rule: 'name', severity: 'blocker', overridable: false, message: '"4242" is all digits, which virsh reads as a domain ID: virsh could take it for another domain', fix: 'rename the VM on vSphere, or give options.target_name with a letter in it' });
  expect(a.validate.blockersLr0).to.deep.equal([]);
  expect(a.withRule.status, a.withRule.text).to.equal(200);
  expect(a.v1.status, a.v1.text).to.equal(400);
  expect(a.v1.fields).to.deep.equal(['options.target_name']);
  expect(a.v1.error).to.include(`gives ${n.vms['4242']} the domain name "4242"`);
  expect(a.v2.status, a.v2.text).to.equal(400);
  expect(a.v2.fields).to.deep.equal(['options.target_name']);
  expect(a.start, 'start runs the same preflight').to.equal(400);
  expect(a.imp.status, a.imp.text).to.equal(400);
  expect(a.imp.fields).to.deep.equal(['parameters.name']);
  expect(a.mig.status, a.mig.text).to.equal(400);
  expect(a.mig.fields).to.include('parameters.domain_name');
  expect(a.direct.status, a.direct.text).to.equal(400);
  expect(a.direct.fields).to.deep.equal(['vm_name']);
  expect(a.domainsAfter).to.deep.equal(a.domainsBefore);
  expect(a.victims).to.deep.equal(['paused', 'shut off']);
}

function checkStoredVictims({ names: n, b }: Evidence) {
  expect([b.created, b.started]).to.deep.equal([201, 200]);
  expect(b.cancel.status, b.cancel.text).to.equal(200);
  expect(b.plan.status).to.equal('cancelled');
  for (const x of b.plan.vms) {
    expect(x.status, `${x.vm_path}: ${x.error}`).to.be.oneOf(['cancelled', 'rolled_back', 'failed']);
    expect(x.error, x.vm_path).to.match(/nothing of Ferry's was on the target/);
  }
  expect(b.victims).to.deep.equal({ a: 'paused', id: n.victimId, b: 'shut off', uuid: n.victimUuid });
}

function checkNameTaken({ c: { late, race } }: Evidence) {
  expect([late.created, late.started]).to.deep.equal([201, 200]);
  expect(late.vm.status).to.equal('failed');
  expect(late.vm.error).to.match(/could not submit its job: .*has had a domain named late-lr2 since the plan's preflight/);
  expect(late.job, 'no job was submitted').to.equal(404);
  expect(late.state).to.equal('shut off');
  expect([race.created, race.started]).to.deep.equal([201, 200]);
  expect(race.vm.status, race.vm.error!).to.equal('rolled_back');
  expect(race.vm.error).to.match(/a domain named db already exists/).and.match(/nothing of Ferry's was on the target/);
  expect(race.job).to.equal('failed');
  expect(race.made.filter((e) => e.kind === 'domain'), 'no domain was made').to.deep.equal([]);
  expect(race.state).to.equal('shut off');
  expect(race.uuidAfter).to.equal(race.dbUuid);
  expect(race.volumes).to.include.members(['db.qcow2', 'db-disk1.qcow2']);
}

function checkLedgerRollback({ names: n, d }: Evidence) {
  expect(d.created.status, d.created.text).to.equal(201);
  expect(d.started).to.equal(200);
  expect(d.virshUuid).to.equal(d.uuid);
  expect(d.vm.status, d.vm.error!).to.equal('rolled_back');
  const vols = d.ledger.filter((e) => e.kind === 'volume');
  expect(d.ledger.filter((e) => e.kind === 'domain').map((e) => [e.id, e.name, e.virt_uri])).to.deep.equal([[d.uuid, 'lg0', n.uri]]);
  // The volume (its key, the path in a dir pool) and the partial copy it was linked from.
  expect(vols.map((e) => e.id)).to.include(path.join(n.poolDir, 'lg0.qcow2'));
  expect(vols.every((e) => e.pool === n.pool && e.attempt === 1)).to.equal(true);
  expect(d.vm.rollback!.detail).to.include(`domain lg0 (${d.uuid}) with its NVRAM removed`).and.include(`volume ${path.join(n.poolDir, 'lg0.qcow2')} removed`);
  // Gone, by the identities the ledger names; the victims of the other tests are still there.
  expect(d.domainAfter).to.equal('gone');
  expect(Object.keys(d.volumesAfter)).to.deep.equal(vols.map((e) => e.id));
  for (const [id, left] of Object.entries(d.volumesAfter)) expect(left, id).to.equal('gone');
  expect(d.volumes.filter((v) => v.includes('lg0'))).to.deep.equal([]);
  expect(d.states).to.deep.equal(['paused', 'shut off', 'shut off', 'shut off']);
  expect(d.volumes).to.include.members(['db.qcow2', 'db-disk1.qcow2']);
}

function checkPathReused({ names: n, e }: Evidence) {
  // (d) rolled plan `made` back: its job's ledger still names lg0.qcow2 by its path.
  const vol = path.join(n.poolDir, 'lg0.qcow2');
  expect([e.created, e.started]).to.deep.equal([201, 200]);
  expect(e.vm.status, e.vm.error!).to.equal('completed');
  expect(e.rollback.status, e.rollback.text).to.equal(200);
  expect(e.detail).to.include(`volume ${vol} left: job ${e.vm.job_id} made it since`).and.not.include(`volume ${vol} removed`);
  expect(e.dominfo, 'the later domain is there').to.not.equal('gone');
  expect(e.volKey).to.equal(vol);
  expect(e.bytes).to.match(/^[0-9a-f]{64}$/);
  expect(e.bytesAfter, 'the later volume\'s bytes').to.equal(e.bytes);
}

describe('security: rollback, cancel clean-up and retries act only on the ledger of what Ferry made @vm', function () {
  this.timeout(2_400_000);
  let tiny = '';

  proofTests<Evidence>({
    spec: async () => { tiny = await ensureTinyGuest(); return { name: 'security-ledger', entries: [__filename], extra: fixtureInputs(tiny) }; },
    produce: () => produce(tiny),
    runTitle: 'runs the five attacks in order on one stack (or reuses the record of the same inputs)',
    checks: [
      ['(a) a target name that is all digits or shaped like a UUID is a 400 naming options.target_name at create, update and validate, and on direct jobs; nothing is made', checkBadNames],
      ['(b) a plan whose stored target names a running domain\'s ID and another VM\'s UUID, cancelled while its jobs run: the rollback removes nothing of theirs', checkStoredVictims],
      ['(c) a domain defined after preflight under the free target name: not taken over at submission, not imported over by the job, not removed by the rollback', checkNameTaken],
      ['(d) the ledger in the job record lists the domain\'s UUID and the volumes\' keys the import made; the rollback removes exactly those', checkLedgerRollback],
      ['(e) a volume path the rollback freed and a later plan made again is the later job\'s: rolling the first VM back again through the API (admin) leaves it and its domain, byte for byte', checkPathReused],
    ],
  });
});
