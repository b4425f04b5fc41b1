// A plan's choices, as an operator makes them, against the simulator and two libvirtd hosts: VMs chosen by
// selectors, spread over two destinations by the placement rule, named by a target-name rule (with the collisions
// preflight must flag), the source guarded while it is exported (a power-off gets 409, a snapshot fails the VM),
// and the source removed only after success: two guests migrated end to end (the tiny real guest: exported,
// repaired, imported, its boot seen on the console), one onto each host, the one with remove_source gone from
// vSphere afterwards, the other still there. The real Debian guest's own migration is test/guest/'s.
import { expect } from 'chai';
import IORedis from 'ioredis';
import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis } from '../helpers/redis';
import { awaitWorkers, Proc, startDaemonProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import type { DaemonJob, PlanView, Validation } from '../helpers/api-types';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { releaseLibvirt, startOwnLibvirt, TestLibvirt, useLibvirt, virshNames } from '../helpers/libvirt';
import { managerFor } from '../../domain/vsphere/client';
import { vmDetail } from '../../domain/vsphere/inventory';
import { VsphereError } from '../../domain/vsphere/errors';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { powerOn } from '../vsphere/fixture';
import { createPlanVm, snapshot } from './fixture';
import { tolerate } from '../helpers/teardown';

const NET = 'ferry-plans-opt';
const CAPS = ['vsphere_access', 'img_tool', 'mount_operations', 'libvirt_access'];
const FINAL = ['completed', 'failed', 'cancelled'];

describe('plans: selectors, destinations, names, the source guard and remove_source @vm', function () {
  this.timeout(600_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-plans-opt-'));
  const procs: Proc[] = [];
  let v: Vcsim;
  let lv: TestLibvirt;
  let lv2: TestLibvirt;
  let stopLv2: (() => Promise<void>) | undefined;
  let B: string;
  let rc: IORedis;
  let m: ReturnType<typeof managerFor>;
  const vm = (n: string) => `/DC0/vm/${n}`;
  const base = (id: string, extra: Record<string, unknown>) => ({
    id, name: id, destination: { type: 'kvm', virt_uris: [lv.uri, lv2.uri] },
    network_map: { 'VM Network': NET }, storage_map: { LocalDS_0: lv.pool, LocalDS_1: lv.pool }, options: { power_off: 'force' }, ...extra,
  });
  const create = async (body: Record<string, unknown>) => { const r = await req<PlanView>(B, 'POST', '/plans', body); expect(r.status, r.text).to.equal(201); return r.body; };
  const validate = async (id: string) => { const r = await req<Validation>(B, 'POST', `/plans/${id}/validate`); expect(r.status, r.text).to.equal(200); return r.body; };
  const get = async (id: string) => (await req<PlanView>(B, 'GET', `/plans/${id}`)).body;
  const done = (id: string, ms: number) => until(async () => { const p = await get(id); return FINAL.includes(p.status) && p; }, ms, `plan ${id} to end`);
  const byName = (p: PlanView) => Object.fromEntries(p.vms.map((x) => [x.vm_path.split('/').pop()!, x]));
  const gone = async (p: string) => vmDetail(m, p).then(() => false, (e) => { if (e instanceof VsphereError && e.kind === 'not_found') return true; throw e; });
  const tiny = (name: string, i: number, extra: Record<string, unknown> = {}) =>
    createPlanVm(m, { name, disks: [{ ds: 'LocalDS_0', file: `${name}/${name}.vmdk`, bytes: 1 << 20 }], mac: `00:50:56:03:00:${(0x10 + i).toString(16)}`, ...extra });

  before(async function () {
    this.timeout(300_000);
    let own: Awaited<ReturnType<typeof startOwnLibvirt>>;
    [v, lv, own] = await Promise.all([startVcsim({ args: ['-ds', '2', '-vm', '0'] }), useLibvirt(), startOwnLibvirt(), redis.start()]);
    lv2 = own.lv; stopLv2 = own.stop;
    m = managerFor({ url: v.url, username: v.username, password: v.password, ca: readFileSync(v.caFile, 'utf8') });
    // Inventory for the selectors: a folder "web" with two web VMs and a database, two at the top.
    await tiny('web-01', 1, { folder: 'web' });
    await tiny('web-02', 2, { folder: 'web' });
    await tiny('db-01', 3, { folder: 'web' });
    await tiny('app-01', 4);
    await tiny('Big Guy', 5, { memoryMB: 16384 });
    await powerOn(m, vm('web/web-02'));
    await powerOn(m, vm('app-01'));
    for (const l of [lv, lv2]) {
      const netXml = path.join(dir, 'net.xml');
      writeFileSync(netXml, `<network><name>${NET}</name><bridge name="virbrpo0"/></network>`);
      await l.virsh(['net-define', netXml]);
      await l.virsh(['net-start', NET]);
    }
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 2h\n');
    const env = {
      ...testEnv(redis.url, 'plansopt'), FERRY_HOST: '127.0.0.1', FERRY_LEASE_SECONDS: '10', FERRY_SOURCE_CHECK_SECONDS: '0.5',
      GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: v.password, FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1',
      FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_URIS: lv2.uri, FERRY_LIBVIRT_POOL: lv.pool, FERRY_LIBVIRT_POOL_DIR: lv.poolDir, FERRY_EXPORT_DIR: path.join(dir, 'exports'),
    };
    const daemon = await startDaemonProc(env, cfg);
    const worker = await startWorkerProc(env, 'w1', CAPS, ['--concurrency', '2']);
    procs.push(daemon, worker);
    B = daemon.url;
    // Registered before the first test: /vms/poweroff runs as a vm_power job, answered 503 while no worker can take it.
    await awaitWorkers(B, [worker]);
    rc = new IORedis(redis.url);
  });
  after(async () => {
    rc?.disconnect();
    await Promise.all(procs.map((p) => p.kill()));
    await v?.stop();
    await redis.stop();
    for (const l of [lv, lv2].filter(Boolean)) {
      const left = await virshNames(l, ['list', '--all', '--name']);
      for (const d of ['kvm-deb-keep', 'kvm-deb-remove'].filter((x) => left.includes(x))) {
        if ((await l.virsh(['domstate', d])).trim() !== 'shut off') await l.virsh(['destroy', d]);
        await l.virsh(['undefine', d, '--nvram', '--remove-all-storage']);
      }
      await l.virsh(['net-destroy', NET]).catch(tolerate(`net-destroy ${NET}`));
      await l.virsh(['net-undefine', NET]).catch(tolerate(`net-undefine ${NET}`));
    }
    await stopLv2?.();
    if (lv) await releaseLibvirt();
    rmSync(dir, { recursive: true, force: true });
  });

  it('selectors resolve to exactly the VMs they match, on validate and again on start; a listed VM stays', async () => {
    await create(base('sel', { selectors: [{ folder: '/DC0/vm/web', name: 'web-*' }, { power_state: 'poweredOn' }] }));
    const r = await validate('sel');
    expect(r.vms.map((x) => x.vm_path).sort()).to.deep.equal([vm('app-01'), vm('web/web-01'), vm('web/web-02')]);
    const p = byName(await get('sel'));
    expect([p['web-01'].selected_by, p['web-02'].selected_by, p['app-01'].selected_by]).to.deep.equal([[0], [0, 1], [1]]);

    // A name pattern that would backtrack on V8's usual engine, and a listed VM beside a selector.
    await create(base('sel2', { vms: [vm('Big Guy')], selectors: [{ name: '*-0?' }, { name: 'a*a*a*a*a*a*a*a*a*b' }] }));
    const r2 = await validate('sel2');
    expect(r2.vms.map((x) => x.vm_path).sort()).to.deep.equal([vm('Big Guy'), vm('app-01'), vm('web/db-01'), vm('web/web-01'), vm('web/web-02')]);
    expect(byName(await get('sel2'))['Big Guy'].selected_by).to.equal(undefined);

    // Re-resolved while the plan has not started: app-01 powered off leaves it.
    const off = await req(B, 'POST', '/vms/poweroff', { vm_path: vm('app-01') });
    expect(off.status, off.text).to.equal(200);
    expect((await validate('sel')).vms.map((x) => x.vm_path).sort()).to.deep.equal([vm('web/web-01'), vm('web/web-02')]);

    const bad = await req(B, 'POST', '/plans', base('bad', { selectors: [{ power_state: 'on' }] }));
    expect(bad.status).to.equal(400);
    expect(bad.text).to.match(/selectors\[0\]\.power_state/);
    const none = await req(B, 'POST', '/plans', base('none', {}));
    expect(none.status).to.equal(400);
    expect(none.text).to.match(/vms|selectors/);
  });

  it('two destinations: round robin takes them in turn, most_free_memory the host with the most room after the VMs placed; only allowed URIs', async () => {
    await create(base('rr', { vms: [vm('Big Guy'), vm('web/web-01'), vm('web/db-01')] }));
    const rr = await validate('rr');
    expect(rr.vms.map((x) => x.vm_path)).to.deep.equal([vm('Big Guy'), vm('web/web-01'), vm('web/db-01')]);
    expect(byName(await get('rr'))['Big Guy'].placement!.virt_uri).to.equal(lv.uri);
    expect(Object.values(byName(await get('rr'))).map((x) => x.placement!.virt_uri)).to.deep.equal([lv.uri, lv2.uri, lv.uri]);

    // Both hosts are this machine (the same free memory within far less than 16 GiB): Big Guy (16 GiB) takes one,
    // then the other has more room for both small VMs.
    await create(base('mem', { vms: [vm('Big Guy'), vm('web/web-01'), vm('web/db-01')], destination: { virt_uris: [lv.uri, lv2.uri], placement: 'most_free_memory' } }));
    await validate('mem');
    const [big, w1, d1] = Object.values(byName(await get('mem'))).map((x) => x.placement!.virt_uri);
    expect(w1).to.not.equal(big);
    expect(d1).to.equal(w1);

    const refused = await req(B, 'POST', '/plans', base('far', { vms: [vm('app-01')], destination: { virt_uris: [lv.uri, 'qemu+ssh://elsewhere/system'] } }));
    expect(refused.status).to.equal(400);
    expect(refused.text).to.match(/destination\.virt_uris\[1\].*FERRY_LIBVIRT_URIS/);
  });

  it('target_name rules give the expected names; preflight flags a name that exists on its host and two VMs with the same name', async () => {
    await lv.virsh(['vol-create-as', lv.pool, 'kvm-app-01.qcow2', '1M', '--format', 'qcow2']);
    const xml = path.join(dir, 'dom.xml');
    writeFileSync(xml, `<domain type="qemu"><name>kvm-app-01</name><memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os></domain>`);
    await lv.virsh(['define', xml]);
    await create(base('names', {
      vms: [vm('app-01'), vm('Big Guy'), { vm_path: vm('web/web-01'), options: { target_name: { template: '{folder}_{name}' } } },
        { vm_path: vm('web/web-02'), options: { target_name: { template: 'KVM-big guy', lowercase: true } } }],
      options: { power_off: 'force', target_name: { prefix: 'kvm-', lowercase: true } },
    }));
    const r = await validate('names');
    const p = byName(await get('names'));
    expect(['app-01', 'Big Guy', 'web-01', 'web-02'].map((n) => p[n].placement!.domain)).to.deep.equal(['kvm-app-01', 'kvm-big-guy', 'web_web-01', 'kvm-big-guy']);
    const rules = (n: string) => r.vms.find((x) => x.vm_path.endsWith(`/${n}`))!.findings.filter((f) => f.severity === 'blocker').map((f) => f.rule).sort();
    expect(rules('app-01')).to.deep.equal(['name_exists']); // placed on lv (round robin: first), where kvm-app-01 exists
    expect(rules('Big Guy')).to.deep.equal(['name_collision']);
    expect(rules('web-02')).to.deep.equal(['name_collision']);
    expect(rules('web-01')).to.deep.equal([]);
    const o = await req(B, 'POST', '/plans/names/overrides', { vm_path: vm('Big Guy'), rule: 'name_collision' });
    expect(o.status).to.equal(400);
    await lv.virsh(['undefine', 'kvm-app-01']);
    await lv.virsh(['vol-delete', '--pool', lv.pool, 'kvm-app-01.qcow2']);
  });

  it('guards the source: a power-off while it is exported gets 409 naming the job; a snapshot taken mid-export fails the VM with the reason; remove_source leaves a failed VM\'s source', async () => {
    // A VM whose disk takes seconds to copy on one stream: a 6 GiB flat extent, sparse in the simulator's datastore.
    const p0 = await createPlanVm(m, { name: 'slow', disks: [{ ds: 'LocalDS_0', file: 'slow/slow.vmdk', bytes: 6 * 2 ** 30 }], mac: '00:50:56:03:00:99' });
    mkdirSync(path.join(v.datastores.LocalDS_0, 'slow'), { recursive: true });
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', '-o', 'subformat=monolithicFlat', path.join(v.datastores.LocalDS_0, 'slow', 'slow.vmdk'), '6G']);
    await create(base('guard', { vms: [p0], options: { power_off: 'force', remove_source: true, parallel_downloads: 1 } }));
    expect((await req(B, 'POST', '/plans/guard/start')).status).to.equal(200);
    const running = await until(async () => { const x = (await get('guard')).vms[0]; return x.bytes_done > 0 && x; }, 120_000, 'the export to copy bytes');
    const r = await req<DaemonError & { message?: string }>(B, 'POST', '/vms/poweroff', { vm_path: p0 });
    expect(r.status, r.text).to.equal(409);
    expect(r.body.error ?? r.body.message ?? r.text).to.match(new RegExp(`being exported by job ${running.job_id}`));
    await snapshot(m, p0, 'mid-export');
    const p = await done('guard', 300_000);
    const x = p.vms[0];
    console.log(`      snapshot taken at ${running.bytes_done} of ${running.total_bytes} bytes copied; the VM failed with: ${x.error}`);
    expect(x.status).to.be.oneOf(['failed', 'rolled_back']);
    expect(x.error).to.match(/the source \/DC0\/vm\/slow changed while its disks were copied: 1 new snapshot\(s\) were taken/);
    expect((await req<DaemonJob>(B, 'GET', `/jobs/${x.job_id}`)).body.status).to.equal('failed');
    expect(await gone(p0), 'a failed VM keeps its source').to.equal(false);
    // The job ended: the guard is gone and the route acts again (the VM is off: vSphere's own 409, not the guard's).
    const after = await req(B, 'POST', '/vms/poweroff', { vm_path: p0 });
    expect(after.text).to.not.match(/being exported/);
  });

  it('guards the source: the VM powered on in vSphere (not through Ferry) mid-export fails the VM with the reason', async () => {
    const p1 = await createPlanVm(m, { name: 'slow-on', disks: [{ ds: 'LocalDS_0', file: 'slow-on/slow-on.vmdk', bytes: 6 * 2 ** 30 }], mac: '00:50:56:03:00:98' });
    mkdirSync(path.join(v.datastores.LocalDS_0, 'slow-on'), { recursive: true });
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', '-o', 'subformat=monolithicFlat', path.join(v.datastores.LocalDS_0, 'slow-on', 'slow-on.vmdk'), '6G']);
    await create(base('guard-on', { vms: [p1], options: { power_off: 'force', parallel_downloads: 1 } }));
    expect((await req(B, 'POST', '/plans/guard-on/start')).status).to.equal(200);
    const running = await until(async () => { const x = (await get('guard-on')).vms[0]; return x.bytes_done > 0 && x; }, 120_000, 'the export to copy bytes');
    await powerOn(m, p1); // as an operator in the vSphere client would: Ferry's own guard is not asked
    const x = (await done('guard-on', 300_000)).vms[0];
    console.log(`      powered on at ${running.bytes_done} of ${running.total_bytes} bytes copied; the VM failed with: ${x.error}`);
    expect(x.status).to.be.oneOf(['failed', 'rolled_back']);
    expect(x.error).to.match(/the source \/DC0\/vm\/slow-on changed while its disks were copied: it was powered on \(poweredOff -> poweredOn\)/);
    expect((await req<DaemonJob>(B, 'GET', `/jobs/${x.job_id}`)).body.status).to.equal('failed');
  });

  it('two guests, one onto each host: names from the rule, remove_source deletes only its source after the boot check, keep leaves the other', async function () {
    this.timeout(1_200_000);
    const disk = await ensureTinyGuest();
    for (const [name, mac] of [['Deb-Keep', '00:50:56:03:01:01'], ['Deb-Remove', '00:50:56:03:01:02']]) {
      await createPlanVm(m, { name, guestId: 'debian11_64Guest', mac, disks: [{ ds: 'LocalDS_1', file: `${name}/${name}.vmdk`, bytes: TINY_GUEST_BYTES }] });
      mkdirSync(path.join(v.datastores.LocalDS_1, name), { recursive: true });
      copyFileSync(disk, path.join(v.datastores.LocalDS_1, name, `${name}.vmdk`));
    }
    await create(base('deb', {
      vms: [vm('Deb-Keep'), { vm_path: vm('Deb-Remove'), options: { remove_source: true } }],
      options: { power_off: 'force', target_name: { prefix: 'kvm-', lowercase: true }, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 } }, limits: { per_plan: 2 },
    }));
    expect((await req(B, 'POST', '/plans/deb/start')).status).to.equal(200);
    const p = await done('deb', 1_100_000);
    const x = byName(p);
    expect([x['Deb-Keep'].status, x['Deb-Remove'].status], `${x['Deb-Keep'].error} | ${x['Deb-Remove'].error}`).to.deep.equal(['completed', 'completed']);
    const names = (l: TestLibvirt) => virshNames(l, ['list', '--all', '--name']);
    expect(await names(lv)).to.include('kvm-deb-keep').and.not.include('kvm-deb-remove');
    expect(await names(lv2)).to.include('kvm-deb-remove').and.not.include('kvm-deb-keep');
    expect(x['Deb-Remove'].source!.action).to.equal('removed');
    expect(x['Deb-Keep'].source!.action).to.equal('kept');
    expect(await gone(vm('Deb-Remove')), 'removed after success').to.equal(true);
    expect(await gone(vm('Deb-Keep')), 'kept').to.equal(false);
  });
});
