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
import { expect } from 'chai';
import path from 'node:path';
import { writeFileSync } from 'node:fs';
import { sha256File } from '../../domain/qemu';
import { req, until } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import type { DaemonJob, PlanView } from '../helpers/api-types';
import { makeDisks } from '../vsphere/fixture';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { tolerate } from '../helpers/teardown';
import { createPlanVm, PlanStack, startPlanStack } from '../plans/fixture';
import type { MadeEntry } from '../../domain/libvirt/ledger';
import type { Plan } from '../../orchestration/plans';

const K = { read: 'ledger-read-key-0123456789', submit: 'ledger-submit-key-0123456789', admin: 'ledger-admin-key-0123456789' };
const as = (key: string) => ({ 'x-api-key': key });
const FINAL = ['completed', 'failed', 'cancelled'];
const CAS = `if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end return 0`;

describe('security: rollback, cancel clean-up and retries act only on the ledger of what Ferry made @vm', function () {
  this.timeout(600_000);
  let s: PlanStack;
  let B: string;
  /** Victims: a running domain (its ID), another VM's domain (its UUID). */
  let victimId = '';
  let victimUuid = '';
  const vm = (n: string) => s.vm(n);
  const get = async (id: string) => (await req<PlanView>(B, 'GET', `/plans/${id}`, undefined, as(K.read))).body;
  const done = (id: string, ms = 480_000) => until(async () => { const p = await get(id); return FINAL.includes(p.status) && p; }, ms, `plan ${id} to end`);
  const post = <T = PlanView>(p: string, body?: unknown, key = K.submit) => req<T & DaemonError>(B, 'POST', p, body, as(key));
  const virsh = (args: string[]) => s.lv.virsh(args);
  const state = (d: string) => virsh(['domstate', d]).then((x) => x.trim(), () => 'absent');
  const volumes = () => s.volumes();
  const define = (name: string, disks: string[] = []) => {
    const file = path.join(s.dir, `${name}.xml`);
    writeFileSync(file, `<domain type="qemu"><name>${name}</name><memory unit="MiB">16</memory><os><type arch="x86_64">hvm</type></os><devices>${disks.map((d, i) => `<disk type="file" device="disk"><driver name="qemu" type="qcow2"/><source file="${s.lv.poolDir}/${d}"/><target dev="vd${'ab'[i]}" bus="virtio"/></disk>`).join('')}</devices></domain>`);
    return virsh(['define', file]);
  };
  const ledgerOf = async (jobId: string) => (await req<{ ledger: MadeEntry[] }>(B, 'GET', `/jobs/${jobId}/record`, undefined, as(K.read))).body.ledger;
  const jobRunning = (planId: string, name: string) => until(async () => {
    const x = (await get(planId)).vms.find((v) => v.vm_path === vm(name));
    return x?.job_id && x.job_status === 'running' && x.job_id;
  }, 120_000, `the job of ${name} running`);

  before(async function () {
    this.timeout(300_000);
    s = await startPlanStack({ prefix: 'ledger', workers: { lw: 2 }, env: { FERRY_API_KEYS: `r:read:${K.read},s:submit:${K.submit},a:admin:${K.admin}` } });
    B = s.url;
    const disks = makeDisks(s.dir, 2);
    let mac = 0x20;
    for (const name of ['lr0', 'lr1', 'lr2']) await s.addVm({ name, host: 'DC0_H0', ds: 'LocalDS_0', mac: `00:50:56:04:00:${(mac++).toString(16)}` }, { path: disks.sparse, bytes: disks.bytes });
    const tiny = await ensureTinyGuest();
    for (const name of ['db', 'lg0']) await s.addVm({ name, host: 'DC0_H0', ds: 'LocalDS_0', mac: `00:50:56:04:00:${(mac++).toString(16)}` }, { path: tiny, bytes: TINY_GUEST_BYTES });
    await createPlanVm(s.m, { name: '4242', disks: [{ ds: 'LocalDS_0', file: '4242/4242.vmdk', bytes: 1 << 20 }], mac: `00:50:56:04:00:${mac.toString(16)}` });
    // The victims: victim-a runs (paused, no guest code runs) and so has an ID; victim-b is another VM's domain.
    await define('victim-a');
    await virsh(['start', '--paused', 'victim-a']);
    victimId = (await virsh(['domid', 'victim-a'])).trim();
    await define('victim-b');
    victimUuid = (await virsh(['domuuid', 'victim-b'])).trim();
    expect(victimId).to.match(/^\d+$/);
  });
  after(async () => {
    for (const d of ['victim-a', 'victim-b', 'db', 'late-lr2']) {
      if ((await state(d)) === 'absent') continue;
      await virsh(['destroy', d]).catch(tolerate(`destroy ${d}`));
      await virsh(['undefine', d]).catch(tolerate(`undefine ${d}`));
    }
    for (const v of ['db.qcow2', 'db-disk1.qcow2', 'lg0.qcow2']) await virsh(['vol-delete', '--pool', s.lv.pool, v]).catch(tolerate(`vol-delete ${v}`));
    await s?.stop();
  });

  it('(a) a target name that is all digits or shaped like a UUID is a 400 naming options.target_name at create, update and validate, and on direct jobs; nothing is made', async () => {
    const domainsBefore = await s.domains();
    for (const template of [victimId, victimUuid, '0042']) {
      const r = await post('/plans', s.plan(`bad-${template.length}`, ['lr0'], { options: { power_off: 'force', target_name: { template } } }));
      expect(r.status, r.text).to.equal(400);
      expect(r.body.fields!.map((f) => f.field)).to.deep.equal(['options.target_name']);
      expect(r.body.error).to.match(/virsh could take for another domain/);
    }
    const perVm = await post('/plans', { ...s.plan('bad-vm', []), vms: [{ vm_path: vm('lr0'), options: { target_name: { template: victimUuid.toUpperCase() } } }] });
    expect(perVm.status, perVm.text).to.equal(400);
    expect(perVm.body.fields!.map((f) => f.field)).to.deep.equal(['vms.0.options.target_name']);
    expect((await post('/plans', s.plan('ok-name', ['lr0', '4242'], { options: { power_off: 'force', guest_preflight: false } }))).status).to.equal(201);
    const put = await req<DaemonError>(B, 'PUT', '/plans/ok-name', { options: { target_name: { template: '1' } } }, as(K.submit));
    expect(put.status, put.text).to.equal(400);
    expect(put.body.fields!.map((f) => f.field)).to.deep.equal(['options.target_name']);

    // A VM named 4242 on vSphere keeps its name without a rule: a blocker no override lifts, the others go on.
    const val = await post<{ vms: { vm_path: string; findings: { rule: string; severity: string; overridable: boolean }[] }[] }>('/plans/ok-name/validate');
    expect(val.status, val.text).to.equal(200);
    expect(val.body.vms.find((x) => x.vm_path === vm('4242'))!.findings).to.deep.include({ rule: 'name', severity: 'blocker', overridable: false, message: '"4242" is all digits, which virsh reads as a domain ID: virsh could take it for another domain', fix: 'rename the VM on vSphere, or give options.target_name with a letter in it' });
    expect(val.body.vms.find((x) => x.vm_path === vm('lr0'))!.findings.filter((f) => f.severity === 'blocker')).to.deep.equal([]);
    // A rule that gives a VM such a name, and a plan stored before the rule existed: refused at validate too.
    const withRule = await req<DaemonError>(B, 'PUT', '/plans/ok-name', { options: { power_off: 'force', guest_preflight: false, target_name: { template: '{name}' } } }, as(K.submit));
    expect(withRule.status, withRule.text).to.equal(200);
    const v1 = await post('/plans/ok-name/validate');
    expect(v1.status, v1.text).to.equal(400);
    expect(v1.body.fields!.map((f) => f.field)).to.deep.equal(['options.target_name']);
    expect(v1.body.error).to.include(`gives ${vm('4242')} the domain name "4242"`);
    const key = 'ledger:plan:ok-name';
    const stored = JSON.parse((await s.rc.get(key))!) as Plan;
    stored.options.target_name = { template: victimId };
    stored.vms = stored.vms.filter((x) => x.vm_path === vm('lr0'));
    await s.rc.set(key, JSON.stringify(stored));
    const v2 = await post('/plans/ok-name/validate');
    expect(v2.status, v2.text).to.equal(400);
    expect(v2.body.fields!.map((f) => f.field)).to.deep.equal(['options.target_name']);
    expect((await post('/plans/ok-name/start')).status, 'start runs the same preflight').to.equal(400);

    // Direct jobs: an import_kvm's name, a migrate_vm's domain_name; and the admin's own POST /import/kvm.
    const disk = path.join(s.dir, 'src.raw');
    const imp = await post('/jobs/operation', { operation: 'import_kvm', parameters: { disks: [{ path: disk, format: 'raw' }], name: victimId } });
    expect(imp.status, imp.text).to.equal(400);
    expect(imp.body.fields!.map((f) => f.field)).to.deep.equal(['parameters.name']);
    const mig = await post('/jobs/operation', { operation: 'migrate_vm', parameters: { vm_path: vm('lr0'), source_type: 'vsphere', destination: { type: 'kvm', virt_uri: s.lv.uri }, domain_name: victimUuid } });
    expect(mig.status, mig.text).to.equal(400);
    expect(mig.body.fields!.map((f) => f.field)).to.include('parameters.domain_name');
    const direct = await post('/import/kvm', { image_path: disk, vm_name: victimUuid }, K.admin);
    expect(direct.status, direct.text).to.equal(400);
    expect(direct.body.fields!.map((f) => f.field)).to.deep.equal(['vm_name']);
    expect(await s.domains()).to.deep.equal(domainsBefore);
    expect([await state('victim-a'), await state('victim-b')]).to.deep.equal(['paused', 'shut off']);
  });

  it('(b) a plan whose stored target names a running domain\'s ID and another VM\'s UUID, cancelled while its jobs run: the rollback removes nothing of theirs', async () => {
    expect((await post('/plans', s.plan('ids', ['lr0', 'lr1'], { limits: { per_plan: 2 } }))).status).to.equal(201);
    expect((await post('/plans/ids/start')).status).to.equal(200);
    await jobRunning('ids', 'lr0');
    await jobRunning('ids', 'lr1');
    // As a plan stored before the names were refused would have them: the VMs' target is the victims' ID and UUID.
    const key = 'ledger:plan:ids';
    for (;;) {
      const old = (await s.rc.get(key))!;
      const p = JSON.parse(old) as Plan;
      p.vms.find((x) => x.vm_path === vm('lr0'))!.placement!.domain = victimId;
      p.vms.find((x) => x.vm_path === vm('lr1'))!.placement!.domain = victimUuid;
      if (await s.rc.eval(CAS, 1, key, old, JSON.stringify(p))) break;
    }
    const c = await post('/plans/ids/cancel');
    expect(c.status, c.text).to.equal(200);
    const p = await done('ids', 120_000);
    expect(p.status).to.equal('cancelled');
    for (const x of p.vms) {
      expect(x.status, `${x.vm_path}: ${x.error}`).to.be.oneOf(['cancelled', 'rolled_back', 'failed']);
      expect(x.error, x.vm_path).to.match(/nothing of Ferry's was on the target/);
    }
    expect(await state('victim-a')).to.equal('paused');
    expect((await virsh(['domid', 'victim-a'])).trim()).to.equal(victimId);
    expect(await state('victim-b')).to.equal('shut off');
    expect((await virsh(['domuuid', 'victim-b'])).trim()).to.equal(victimUuid);
  });

  it('(c) a domain defined after preflight under the free target name: not taken over at submission, not imported over by the job, not removed by the rollback', async () => {
    // Before submission: the plan starts in a few seconds; the name is taken meanwhile.
    const startAt = new Date(Date.now() + 6000).toISOString();
    expect((await post('/plans', s.plan('late', ['lr2'], { start_at: startAt, options: { power_off: 'force', target_name: { template: 'late-{name}' } } }))).status).to.equal(201);
    expect((await post('/plans/late/start')).status).to.equal(200);
    await define('late-lr2');
    const late = (await done('late', 60_000)).vms[0];
    expect(late.status).to.equal('failed');
    expect(late.error).to.match(/could not submit its job: .*has had a domain named late-lr2 since the plan's preflight/);
    expect((await req(B, 'GET', `/jobs/${late.jobs[0]}`, undefined, as(K.read))).status, 'no job was submitted').to.equal(404);
    expect(await state('late-lr2')).to.equal('shut off');

    // After submission: the job exports and repairs the guest, then finds the name taken and refuses the import.
    // The plan's VM `db` meets an unrelated domain `db` with its disks db.qcow2 and db-disk1.qcow2.
    expect((await post('/plans', s.plan('race', ['db']))).status).to.equal(201);
    expect((await post('/plans/race/start')).status).to.equal(200);
    const jobId = await jobRunning('race', 'db');
    for (const v of ['db.qcow2', 'db-disk1.qcow2']) await virsh(['vol-create-as', s.lv.pool, v, '1M', '--format', 'qcow2']);
    await define('db', ['db.qcow2', 'db-disk1.qcow2']);
    const dbUuid = (await virsh(['domuuid', 'db'])).trim();
    const x = (await done('race')).vms[0];
    console.log(`      the VM failed with: ${x.error!.slice(0, 240)}`);
    expect(x.status, x.error!).to.equal('rolled_back');
    expect(x.error).to.match(/a domain named db already exists/).and.match(/nothing of Ferry's was on the target/);
    const job = (await req<DaemonJob>(B, 'GET', `/jobs/${jobId}`, undefined, as(K.read))).body;
    expect(job.status).to.equal('failed');
    expect((await ledgerOf(jobId)).filter((e) => e.kind === 'domain'), 'no domain was made').to.deep.equal([]);
    expect(await state('db')).to.equal('shut off');
    expect((await virsh(['domuuid', 'db'])).trim()).to.equal(dbUuid);
    expect(await volumes()).to.include.members(['db.qcow2', 'db-disk1.qcow2']);
  });

  it('(d) the ledger in the job record lists the domain\'s UUID and the volumes\' keys the import made; the rollback removes exactly those', async () => {
    const c = await post('/plans', s.plan('made', ['lg0'], { options: { power_off: 'force', virt_test: { expect: 'FERRY-NEVER-SHOWN', timeout_seconds: 10 } } }));
    expect(c.status, c.text).to.equal(201);
    expect((await post('/plans/made/start')).status).to.equal(200);
    const jobId = await jobRunning('made', 'lg0');
    // While the boot check waits, the ledger names the domain virsh shows, by its UUID.
    const uuid = await until(async () => (await ledgerOf(jobId)).find((e) => e.kind === 'domain')?.id, 480_000, 'the domain in the ledger');
    await until(async () => (await state('lg0')) !== 'absent', 30_000, 'lg0 defined');
    expect((await virsh(['domuuid', 'lg0'])).trim()).to.equal(uuid);
    const x = (await done('made')).vms[0];
    expect(x.status, x.error!).to.equal('rolled_back');
    const ledger = await ledgerOf(jobId);
    const vols = ledger.filter((e) => e.kind === 'volume');
    console.log(`      ledger: ${ledger.map((e) => `${e.kind} ${e.id}`).join(', ')}; rollback: ${x.rollback?.detail}`);
    expect(ledger.filter((e) => e.kind === 'domain').map((e) => [e.id, e.name, e.virt_uri])).to.deep.equal([[uuid, 'lg0', s.lv.uri]]);
    // The volume (its key, the path in a dir pool) and the partial copy it was linked from.
    expect(vols.map((e) => e.id)).to.include(path.join(s.lv.poolDir, 'lg0.qcow2'));
    expect(vols.every((e) => e.pool === s.lv.pool && e.attempt === 1)).to.equal(true);
    expect(x.rollback!.detail).to.include(`domain lg0 (${uuid}) with its NVRAM removed`).and.include(`volume ${path.join(s.lv.poolDir, 'lg0.qcow2')} removed`);
    // Gone, by the identities the ledger names; the victims of the other tests are still there.
    // dominfo looks a UUID up (domuuid takes only IDs and names).
    expect(await virsh(['dominfo', uuid]).then(() => 'there', () => 'gone')).to.equal('gone');
    for (const v of vols) expect(await virsh(['vol-key', v.id]).then(() => 'there', () => 'gone'), v.id).to.equal('gone');
    expect((await volumes()).filter((v) => v.includes('lg0'))).to.deep.equal([]);
    expect([await state('victim-a'), await state('victim-b'), await state('db'), await state('late-lr2')]).to.deep.equal(['paused', 'shut off', 'shut off', 'shut off']);
    expect(await volumes()).to.include.members(['db.qcow2', 'db-disk1.qcow2']);
  });

  it('(e) a volume path the rollback freed and a later plan made again is the later job\'s: rolling the first VM back again through the API (admin) leaves it and its domain, byte for byte', async () => {
    // (d) rolled plan `made` back: its job's ledger still names lg0.qcow2 by its path.
    const vol = path.join(s.lv.poolDir, 'lg0.qcow2');
    expect((await post('/plans', s.plan('again', ['lg0'], { options: { power_off: 'force', virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 } } }))).status).to.equal(201);
    expect((await post('/plans/again/start')).status).to.equal(200);
    const y = (await done('again')).vms[0];
    expect(y.status, y.error!).to.equal('completed');
    const uuid = (await virsh(['domuuid', 'lg0'])).trim();
    const bytes = await sha256File(vol);
    const r = await post(`/plans/made/vms/${encodeURIComponent(vm('lg0'))}/rollback`, undefined, K.admin);
    expect(r.status, r.text).to.equal(200);
    const detail = r.body.vms[0].rollback!.detail;
    console.log(`      the second rollback of made: ${detail}`);
    expect(detail).to.include(`volume ${vol} left: job ${y.job_id} made it since`).and.not.include(`volume ${vol} removed`);
    expect((await virsh(['dominfo', uuid])).includes(uuid), 'the later domain is there').to.equal(true);
    expect((await virsh(['vol-key', vol])).trim()).to.equal(vol);
    expect(await sha256File(vol), 'the later volume\'s bytes').to.equal(bytes);
  });
});
