// Plans on the daemon as an operator uses them, against the simulator (two datastores, a standalone host and a
// cluster of three, VMs shaped as trouble comes in a datacenter) and the tests' libvirtd with two pools: the
// resource (both path forms, JSON and YAML, 4xx naming the field), then preflight findings exactly as expected
// per VM, overrides recorded with who made them, and what a plan may no longer do once it has started.
import { expect } from 'chai';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import IORedis from 'ioredis';
import { TestRedis } from '../helpers/redis';
import { Proc, startDaemonProc, testEnv } from '../helpers/procs';
import { req } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import type { PlanList, PlanView, Validation } from '../helpers/api-types';
import type { Plan } from '../../orchestration/plans';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { releaseLibvirt, TestLibvirt, useLibvirt } from '../helpers/libvirt';
import { managerFor } from '../../domain/vsphere/client';
import { powerOn } from '../vsphere/fixture';
import { createPlanVm, snapshot } from './fixture';
import { vmDetail } from '../../domain/vsphere/inventory';
import { cbtEnabled, enableCbt } from '../../domain/vsphere/cbt';
import { tolerate } from '../helpers/teardown';

const NET = 'ferry-plans';
const POOL2 = 'ferry-plans-2';
const MiB = 1 << 20;

describe('plans: the resource and its preflight against vcsim and libvirtd', function () {
  this.timeout(120_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-plans-'));
  let v: Vcsim;
  let lv: TestLibvirt;
  let daemon: Proc & { url: string };
  let B: string;
  let rc: IORedis;
  let m: ReturnType<typeof managerFor>;
  const keys = 'alice:submit:alice-key-0123456789abcdef,reader:read:reader-key-0123456789abcdef,root:admin:root-key-0123456789abcdef';
  const as = (key: string) => ({ 'x-api-key': key });
  const alice = as('alice-key-0123456789abcdef');
  const vm = (n: string) => `/DC0/vm/${n}`;
  const base = () => ({
    name: 'wave 1', destination: { type: 'kvm', virt_uri: lv.uri },
    network_map: { 'VM Network': NET }, storage_map: { LocalDS_0: lv.pool, LocalDS_1: POOL2 },
  });

  before(async function () {
    this.timeout(300_000);
    [v, lv] = await Promise.all([startVcsim({ args: ['-ds', '2', '-vm', '0'] }), useLibvirt(), redis.start()]);
    m = managerFor({ url: v.url, username: v.username, password: v.password, ca: readFileSync(v.caFile, 'utf8') });
    const d = (ds: string, n: string, bytes = 4 * MiB) => [{ ds, file: `${n}/${n}.vmdk`, bytes }];
    await createPlanVm(m, { name: 'ok1', disks: d('LocalDS_0', 'ok1'), mac: '00:50:56:01:00:01' });
    await createPlanVm(m, { name: 'ds1', host: 'DC0_C0_H1', disks: d('LocalDS_1', 'ds1'), mac: '00:50:56:01:00:02', firmware: 'efi' });
    await createPlanVm(m, { name: 'snap', disks: d('LocalDS_0', 'snap'), mac: '00:50:56:01:00:03' });
    await snapshot(m, vm('snap'), 'before-upgrade');
    await createPlanVm(m, { name: 'shared', disks: [{ ds: 'LocalDS_0', file: 'shared/s.vmdk', bytes: 4 * MiB, sharing: 'sharingMultiWriter', mode: 'independent_persistent' }], mac: '00:50:56:01:00:04' });
    await createPlanVm(m, { name: 'usb', usb: true, cpuHotAdd: true, network: 'DC0_DVPG0', disks: d('LocalDS_0', 'usb'), mac: '00:50:56:01:00:05' });
    await createPlanVm(m, { name: 'running', host: 'DC0_C0_H2', disks: d('LocalDS_1', 'running'), mac: '00:50:56:01:00:06' });
    await powerOn(m, vm('running'));
    await createPlanVm(m, { name: 'oddos', guestId: 'otherGuest', disks: d('LocalDS_0', 'oddos'), mac: '00:50:56:01:00:07' });
    await createPlanVm(m, { name: 'huge', disks: d('LocalDS_1', 'huge', 64 * 2 ** 40), mac: '00:50:56:01:00:08' });
    await createPlanVm(m, { name: 'taken', disks: d('LocalDS_0', 'taken'), mac: '00:50:56:01:00:09' });
    await createPlanVm(m, { name: 'twin', disks: d('LocalDS_0', 'twin'), mac: '00:50:56:01:00:01' });
    await createPlanVm(m, { name: 'bad name', disks: d('LocalDS_0', 'bad name'), mac: '00:50:56:01:00:0a' });

    // The target: a second pool, the mapped network, and a domain already named "taken" using MAC ...:09.
    const p2 = path.join(lv.dir, 'pool2');
    mkdirSync(p2, { recursive: true });
    await lv.virsh(['pool-define-as', POOL2, 'dir', '--target', p2]).catch(tolerate(`pool-define-as ${POOL2}`));
    await lv.virsh(['pool-start', POOL2]).catch(tolerate(`pool-start ${POOL2}`));
    const netXml = path.join(dir, 'net.xml');
    writeFileSync(netXml, `<network><name>${NET}</name><bridge name="virbrpl0"/></network>`);
    await lv.virsh(['net-define', netXml]).catch(tolerate(`net-define ${NET}`));
    await lv.virsh(['net-start', NET]).catch(tolerate(`net-start ${NET}`));
    const domXml = path.join(dir, 'taken.xml');
    writeFileSync(domXml, `<domain type="qemu"><name>taken</name><memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os><devices><interface type="network"><mac address="00:50:56:01:00:09"/><source network="${NET}"/></interface></devices></domain>`);
    await lv.virsh(['define', domXml]);

    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 1h\n');
    daemon = await startDaemonProc({
      ...testEnv(redis.url, 'plans'), FERRY_HOST: '127.0.0.1', FERRY_API_KEYS: keys,
      GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: v.password, FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1',
      FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_URIS: `qemu+unix:///system?socket=${dir}/none.sock`, FERRY_LIBVIRT_POOL: lv.pool,
    }, cfg);
    B = daemon.url;
    rc = new IORedis(redis.url);
  });
  after(async () => {
    rc?.disconnect();
    await daemon?.stop();
    await lv?.virsh(['undefine', 'taken']).catch(tolerate('undefine taken'));
    await lv?.virsh(['net-destroy', NET]).catch(tolerate(`net-destroy ${NET}`));
    await lv?.virsh(['net-undefine', NET]).catch(tolerate(`net-undefine ${NET}`));
    await lv?.virsh(['pool-destroy', POOL2]).catch(tolerate(`pool-destroy ${POOL2}`));
    await lv?.virsh(['pool-undefine', POOL2]).catch(tolerate(`pool-undefine ${POOL2}`));
    await v?.stop();
    await redis.stop();
    if (lv) await releaseLibvirt();
    rmSync(dir, { recursive: true, force: true });
  });

  it('creates a plan (201, JSON and YAML, both path forms), lists, gets and changes it; bad input is a 400 naming the field', async () => {
    const a = await req<PlanView>(B, 'POST', '/plans', { ...base(), id: 'p-json', vms: [vm('ok1'), { vm_path: vm('ds1'), options: { power_off: 'force', rollback: false } }] }, alice);
    expect(a.status, a.text).to.equal(201);
    expect(a.body).to.include({ id: 'p-json', status: 'pending', started_by: null });
    expect(a.body.created_by).to.deep.equal({ name: 'alice', role: 'submit' });
    expect(a.body.vms.map((x) => [x.vm_path, x.status, x.job_id])).to.deep.equal([[vm('ok1'), 'pending', null], [vm('ds1'), 'pending', null]]);
    expect(a.body.limits).to.deep.equal({ per_plan: 4, per_esxi_host: 2, per_datastore: 3, per_target_host: 4 });
    // A VM's own options override only what they give: no defaults that would undo the plan's options.
    expect((JSON.parse((await rc.get('plans:plan:p-json'))!) as Plan).vms[1].options).to.deep.equal({ power_off: 'force', rollback: false });

    const yamlBody = `name: from yaml\nid: p-yaml\nvms: [${vm('ok1')}]\ndestination: {type: kvm, virt_uri: "${lv.uri}"}\nnetwork_map: {VM Network: ${NET}}\nstorage_map: {LocalDS_0: ${lv.pool}}\nlimits: {per_esxi_host: 1}\n`;
    const y = await fetch(`${B}/api/v1/plans`, { method: 'POST', headers: { ...alice, 'content-type': 'application/x-yaml' }, body: yamlBody });
    const yb = await y.json() as PlanView;
    expect(y.status, JSON.stringify(yb)).to.equal(201);
    expect(yb.limits.per_esxi_host).to.equal(1);
    expect(yb.storage_map).to.deep.equal({ LocalDS_0: lv.pool });

    const list = await req<PlanList>(B, 'GET', '/api/v1/plans', undefined, as('reader-key-0123456789abcdef'));
    expect(list.body.plans.map((p) => p.id)).to.deep.equal(['p-json', 'p-yaml']);
    const readerCreate = await req(B, 'POST', '/plans', { ...base(), vms: [vm('ok1')] }, as('reader-key-0123456789abcdef'));
    expect(readerCreate.status).to.equal(403);

    const noMap = await req<DaemonError>(B, 'POST', '/plans', { name: 'x', vms: [vm('ok1')], network_map: {} }, alice);
    expect(noMap.status).to.equal(400);
    expect(noMap.body.fields!.map((f) => f.field)).to.include('storage_map');
    const badPath = await req<DaemonError>(B, 'POST', '/plans', { ...base(), vms: ['ok1'] }, alice);
    expect(badPath.status).to.equal(400);
    expect(badPath.body.error).to.match(/vms\[0\]/);
    // A target name libvirt would take but Ferry's import could not use (a space) is refused at once, not at import.
    const spaced = await req<DaemonError>(B, 'POST', '/plans', { ...base(), vms: [vm('ok1')], network_map: { 'VM Network': 'VM Network' } }, alice);
    expect(spaced.status, spaced.text).to.equal(400);
    expect(spaced.body.fields!.map((f) => f.field)).to.include('network_map.VM Network');
    const twice = await req<DaemonError>(B, 'POST', '/plans', { ...base(), vms: [vm('ok1'), vm('ok1')] }, alice);
    expect(twice.status).to.equal(400);
    expect(twice.body.error).to.match(/listed twice/);
    const otherManager = await req<DaemonError>(B, 'POST', '/plans', { ...base(), vms: [vm('ok1')], source: { manager_url: 'https://vc.elsewhere.example/sdk' } }, alice);
    expect(otherManager.status).to.equal(400);
    expect(otherManager.body.fields![0].field).to.equal('source.manager_url');
    expect((await req(B, 'GET', '/plans/nope', undefined, alice)).status).to.equal(404);
    expect((await req(B, 'POST', '/plans', { ...base(), id: 'p-json', vms: [vm('ok1')] }, alice)).status).to.equal(409);

    const put = await req<PlanView>(B, 'PUT', '/plans/p-yaml', { name: 'renamed', windows: [{ start: '2030-01-01T20:00:00Z', end: '2030-01-02T06:00:00Z' }] }, alice);
    expect(put.status, put.text).to.equal(200);
    expect(put.body).to.include({ name: 'renamed' });
    expect(put.body.windows).to.deep.equal([{ start: '2030-01-01T20:00:00.000Z', end: '2030-01-02T06:00:00.000Z' }]);
    const badWindow = await req<DaemonError>(B, 'PUT', '/plans/p-yaml', { windows: [{ start: '2030-01-02T00:00:00Z', end: '2030-01-01T00:00:00Z' }] }, alice);
    expect(badWindow.status).to.equal(400);
    expect(badWindow.body.error).to.match(/windows\[0\]\.end/);
    const stored = JSON.parse((await rc.get('plans:plan:p-yaml'))!) as Plan;
    expect(stored.name).to.equal('renamed');
  });

  it('validate: per VM exactly the findings its vSphere properties and the target call for', async () => {
    const names = ['ok1', 'ds1', 'snap', 'shared', 'usb', 'running', 'oddos', 'huge', 'taken', 'twin', 'bad name', 'ghost'];
    const c = await req(B, 'POST', '/plans', { ...base(), id: 'p-check', vms: names.map(vm) }, alice);
    expect(c.status, c.text).to.equal(201);
    const r = await req<Validation>(B, 'POST', '/plans/p-check/validate', undefined, alice);
    expect(r.status, r.text).to.equal(200);
    const got = Object.fromEntries(r.body.vms.map((x) => [x.vm_path.split('/').pop()!, x.findings.map((f) => `${f.rule}:${f.severity}`).sort()]));
    expect(got).to.deep.equal({
      ok1: [],
      ds1: [],
      snap: ['snapshot:warning'],
      shared: ['disk_mode:warning', 'shared_disk:blocker'],
      usb: ['cpu_memory_hotplug:warning', 'network_unmapped:blocker', 'usb_controller:warning'],
      running: ['vm_running:blocker'],
      oddos: ['vm_os:blocker'],
      huge: ['pool_space:blocker'],
      taken: ['duplicate_mac:blocker', 'name_exists:blocker'],
      twin: ['duplicate_mac:blocker'],
      'bad name': ['name:blocker'],
      ghost: ['vm_not_found:blocker'],
    });
    for (const x of r.body.vms) for (const f of x.findings) expect(f.message, f.rule).to.be.a('string').and.not.equal('');
    const usb = r.body.vms.find((x) => x.vm_path === vm('usb'))!.findings.find((f) => f.rule === 'network_unmapped')!;
    expect(usb.message).to.include('DC0_DVPG0');
    expect(usb.fix).to.include('network_map');
    // A pool too small: blocked with the job's own arithmetic (domain/libvirt/space.ts), naming both sizes.
    const huge = r.body.vms.find((x) => x.vm_path === vm('huge'))!.findings[0];
    const free = Number(/<available unit='bytes'>(\d+)</.exec(await lv.virsh(['pool-dumpxml', POOL2]))![1]);
    expect(huge.message).to.include(`the disks need 65536.00 GiB (${64 * 2 ** 40} bytes) in pool ${POOL2}`).and.match(/which has \d+\.\d\d GiB \((\d+) bytes\) free$/);
    // The pool's free space as libvirt reports it, read at the same time give or take this test's own writes.
    expect(Math.abs(Number(/\((\d+) bytes\) free$/.exec(huge.message)![1]) - free)).to.be.below(2 ** 30);
    expect(r.body.vms.find((x) => x.vm_path === vm('snap'))!.findings[0].message, 'the snapshots named').to.include('"before-upgrade"');
    const twin = r.body.vms.find((x) => x.vm_path === vm('twin'))!.findings[0];
    expect(twin.message).to.include(vm('ok1'));
    expect(r.body.blockers).to.equal(10);
    expect(r.body.warnings).to.equal(4);

    // The placement the limits will use comes from the same read: ESXi host and datastore per VM.
    const p = (await req<PlanView>(B, 'GET', '/plans/p-check', undefined, alice)).body;
    const ds1 = p.vms.find((x) => x.vm_path === vm('ds1'))!;
    expect(ds1.placement).to.include({ esxi_host: 'DC0_C0_H1', pool: POOL2, domain: 'ds1', target_existed: false });
    expect(ds1.placement!.datastores).to.deep.equal(['LocalDS_1']);
  });

  it('overrides: a blocker accepted per VM per rule is recorded with who did it; rules that make the job impossible refuse', async () => {
    const o = await req(B, 'POST', '/plans/p-check/overrides', { vm_path: vm('shared'), rule: 'shared_disk', reason: 'cluster stopped for the weekend' }, alice);
    expect(o.status, o.text).to.equal(200);
    const no = await req<DaemonError>(B, 'POST', '/plans/p-check/overrides', { vm_path: vm('running'), rule: 'vm_running' }, alice);
    expect(no.status).to.equal(400);
    expect(no.body.fields![0].field).to.equal('rule');
    const r = await req<Validation>(B, 'POST', '/api/v1/plans/p-check/validate', undefined, alice);
    const shared = r.body.vms.find((x) => x.vm_path === vm('shared'))!.findings.find((f) => f.rule === 'shared_disk')!;
    expect(shared.overridden).to.include({ by: 'alice', reason: 'cluster stopped for the weekend' });
    expect(r.body.blockers).to.equal(9);
  });

  it('a plan whose target cannot be reached gets a blocker on every VM, not a 500', async () => {
    // An allowed URI (FERRY_LIBVIRT_URIS) with no libvirtd behind it; one not allowed is a 400 at create.
    const far = await req(B, 'POST', '/plans', { ...base(), id: 'p-far', destination: { type: 'kvm', virt_uri: 'qemu+ssh://elsewhere/system' }, vms: [vm('ok1')] }, alice);
    expect(far.status).to.equal(400);
    expect(far.text).to.match(/destination\.virt_uri\b.*FERRY_LIBVIRT_URIS/);
    const c = await req(B, 'POST', '/plans', { ...base(), id: 'p-away', destination: { type: 'kvm', virt_uri: `qemu+unix:///system?socket=${dir}/none.sock` }, vms: [vm('ok1')] }, alice);
    expect(c.status, c.text).to.equal(201);
    const r = await req<Validation>(B, 'POST', '/plans/p-away/validate', undefined, alice);
    expect(r.status, r.text).to.equal(200);
    expect(r.body.vms[0].findings.map((f) => f.rule)).to.deep.equal(['target_unreachable']);
  });

  it('archive and delete: a pending plan goes; deleting never touches the target', async () => {
    const a = await req<PlanView>(B, 'POST', '/plans/p-away/archive', undefined, alice);
    expect(a.status, a.text).to.equal(200);
    expect(a.body.archived).to.equal(true);
    expect((await req<PlanList>(B, 'GET', '/plans', undefined, alice)).body.plans.map((p) => p.id)).to.not.include('p-away');
    expect((await req<PlanList>(B, 'GET', '/plans?archived=true', undefined, alice)).body.plans.map((p) => p.id)).to.deep.equal(['p-away']);
    const d = await req(B, 'DELETE', '/plans/p-away', undefined, alice);
    expect(d.status, d.text).to.equal(200);
    expect(await rc.exists('plans:plan:p-away')).to.equal(0);
    expect((await lv.virsh(['domstate', 'taken'])).trim()).to.equal('shut off');
  });

  it('warm plans: snapshots named and blocking, CBT off blocking without enable_cbt and announced with it, as the simulator says', async () => {
    const mk = async (id: string, vms: unknown[], warm: Record<string, unknown>) => {
      const c = await req(B, 'POST', '/plans', { ...base(), id, vms, options: { warm } }, alice);
      expect(c.status, c.text).to.equal(201);
      const r = await req<Validation>(B, 'POST', `/plans/${id}/validate`, undefined, alice);
      expect(r.status, r.text).to.equal(200);
      return (name: string) => r.body.vms.find((x) => x.vm_path === vm(name))!.findings;
    };
    const running = await vmDetail(m, vm('running'));
    expect(await cbtEnabled(m, running.moref), 'the simulator: CBT off on "running"').to.equal(false);
    const bad = await mk('p-warm', [{ vm_path: vm('running'), options: { warm: { enable_cbt: false } } }, vm('snap')], {});
    const off = bad('running');
    expect(off.map((f) => `${f.rule}:${f.severity}`)).to.deep.equal(['warm_cbt_off:blocker']);
    expect(off[0].message).to.include('running').and.include('options.warm.enable_cbt').and.include('changeTrackingEnabled false');
    // "snap": powered off, a snapshot someone made (its name said), CBT off with enable_cbt defaulting to true.
    const snap = bad('snap');
    expect(snap.map((f) => `${f.rule}:${f.severity}`).sort()).to.deep.equal(['warm_cbt_enable:info', 'warm_snapshots:blocker', 'warm_vm_off:blocker']);
    expect(snap.find((f) => f.rule === 'warm_snapshots')!.message).to.include('"before-upgrade"');
    expect(snap.find((f) => f.rule === 'warm_cbt_enable')!.message).to.include('Ferry will enable CBT');
    expect((await req<PlanView>(B, 'GET', '/plans/p-warm', undefined, alice)).body.vms.find((x) => x.vm_path === vm('snap'))!.findings.map((f) => f.rule), 'stored on the plan').to.include('warm_snapshots');
    // What the warm job would refuse cannot be accepted by an override.
    for (const [name, rule] of [['running', 'warm_cbt_off'], ['snap', 'warm_snapshots'], ['snap', 'warm_vm_off']]) {
      const o = await req<DaemonError>(B, 'POST', '/plans/p-warm/overrides', { vm_path: vm(name), rule, reason: 'try' }, alice);
      expect(o.status, `${rule}: ${o.text}`).to.equal(400);
      expect(o.body.fields![0].field).to.equal('rule');
    }

    // With enable_cbt true (the default) the same VM is told, not blocked; once CBT is on in vSphere, nothing is said.
    expect((await mk('p-warm2', [vm('running')], {}))('running').map((f) => `${f.rule}:${f.severity}`)).to.deep.equal(['warm_cbt_enable:info']);
    await enableCbt(m, running.moref);
    expect((await mk('p-warm3', [vm('running')], { enable_cbt: false }))('running'), 'CBT on: no finding').to.deep.equal([]);
  });

  it('is in the daemon\'s OpenAPI document with its roles', async () => {
    const doc = (await req(B, 'GET', '/openapi.yaml')).text;
    for (const p of ['/plans:', '/plans/{id}:', '/plans/{id}/validate:', '/plans/{id}/start:', '/plans/{id}/cancel:', '/plans/{id}/retry:', '/plans/{id}/archive:', '/plans/{id}/overrides:', '/plans/{id}/vms/{vm}/rollback:']) expect(doc).to.include(p);
    expect(doc).to.match(/\/plans\/\{id\}\/vms\/\{vm\}\/rollback:\n\s+post:[\s\S]*?x-ferry-role: admin/);
  });
});
