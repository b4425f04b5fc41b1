// The daemon's libvirt through workers (FERRY_LIBVIRT_VIA=worker, issue 38 item 2), against a real daemon process
// whose PATH has no virsh, a real worker process with it, and the run's private libvirtd: the /virt routes answer
// through virsh_call jobs and change the host as virsh then shows; libvirt's refusals keep their status and text,
// exactly as a daemon running virsh itself (direct mode, started beside it on the same libvirtd) answers them;
// with no worker able to take the call the answer is a 503 that says so and no job is made; a caller cannot
// submit virsh_call with a key of any role; a plan's target inventory (GET /virt/targets) goes the same way; clones
// and templates run whole on the worker (virt_clone); a volume upload and sealing without a worker that has
// qemu-img or libguestfs are a clear 503. The latency of GET /virt/domains both ways is printed (docs/performance.md). The calls are the
// daemon's plumbing: job lists on both APIs leave them out unless an admin asks (?internal=true), and Redis keeps a
// completed one FERRY_CALL_RETENTION, a failed one FERRY_CALL_FAILED_RETENTION (short here), then holds none.
import { expect } from 'chai';
import IORedis from 'ioredis';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { req, until } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import { defineGuest, domState, guestXml, virshNames } from '../helpers/libvirt';
import { awaitWorkers, startGatewayProc, startWorkerProc, type Proc } from '../helpers/procs';
import { openWs } from '../helpers/ws';
import { startWorkerModeStack, type VirtStack } from './stack';

const K = { read: 'vjob-reader-0123456789abcdef', submit: 'vjob-submitter-0123456789ab', worker: 'vjob-worker-0123456789abcdef', admin: 'vjob-admin-0123456789abcdef' };
const KEYS = Object.entries(K).map(([role, key]) => `${role}-key:${role}:${key}`).join(',');
const admin = { 'X-API-Key': K.admin };
/** The call lane's retention here: short enough to see both ages pass (the last test waits both out), far enough
 *  apart to tell them apart (the sweep runs every quarter of the shorter: 2.5 s), and longer than a test takes to
 *  read the calls it made (the first worker test counts its own). */
const CALL_RETENTION_S = 10;
const CALL_FAILED_RETENTION_S = 20;

describe('virt routes through a worker (FERRY_LIBVIRT_VIA=worker) @vm', function () {
  this.timeout(600_000);
  let s: VirtStack;
  let B: string;
  let direct: Proc & { url: string };
  let daemon: Proc & { url: string };
  let gw: Proc & { url: string };
  let rc: IORedis;
  let ws: Awaited<ReturnType<typeof startWorkerModeStack>>;
  const workers: Proc[] = [];
  type DaemonJobs = { jobs: { id: string; status: string; definition: { operation: string } }[]; total: number };
  /** The daemon's job list as an admin asking for the internal calls too. */
  const jobsOf = async (op: string) => ((await req<DaemonJobs>(B, 'GET', '/jobs?limit=1000&internal=true', undefined, admin)).body.jobs || []).filter((j) => j.definition.operation === op);
  /** Every virsh_call record Redis holds (scanned, not listed: what is really there). */
  const callRecords = async () => {
    const out: Record<string, string>[] = [];
    for (const key of await rc.keys('ferry:job:*')) {
      if (key.split(':').length !== 3) continue; // a record's events or history, not the record
      const h = await rc.hgetall(key);
      if ((JSON.parse(h.spec || '{}') as { operation?: string }).operation === 'virsh_call') out.push({ id: key.split(':')[2], ...h });
    }
    return out;
  };

  type Targets = { data: { targets: { virt_uri: string; reachable: boolean; error: string | null; networks: string[]; pools: { name: string }[] }[] } };

  before(async function () {
    this.timeout(300_000);
    // startVirtStack's daemon has virsh: it is restarted with a PATH without virsh on the same Redis.
    ws = await startWorkerModeStack({ FERRY_API_KEYS: KEYS, FERRY_API_KEYS_FILE: '', FERRY_REFUSAL_LIMIT: '0', FERRY_CALL_RETENTION: `${CALL_RETENTION_S}s`, FERRY_CALL_FAILED_RETENTION: `${CALL_FAILED_RETENTION_S}s` }, 'vjob-direct');
    ({ s, rc, daemon, direct } = ws);
    B = daemon.url;
    gw = await startGatewayProc(s.env);
    await defineGuest(s.lv, 'vj-off', { withDisk: true });
    // A raw disk: libvirt refuses an internal snapshot of it ("unsupported configuration", a 400).
    await s.lv.virsh(['vol-create-as', s.lv.pool, 'vj-raw.img', '8M', '--format', 'raw']);
    const xml = path.join(s.dir, 'vj-raw.xml');
    writeFileSync(xml, guestXml('vj-raw', { disk: path.join(s.lv.poolDir, 'vj-raw.img'), diskFormat: 'raw' }));
    await s.lv.virsh(['define', xml]);
  });
  after(async () => {
    await Promise.all(workers.map((w) => w.kill()));
    await gw?.kill();
    await ws?.stop();
  });

  it('with no worker able to take it: 503 naming libvirt_access, nothing changed on the host, no job made', async () => {
    const r = await req<DaemonError>(B, 'GET', '/virt/domains', undefined, admin);
    expect(r.status, r.text).to.equal(503);
    expect(r.body.error).to.include('libvirt_access').and.include('FERRY_LIBVIRT_VIA=worker');
    const n = await req<DaemonError>(B, 'POST', '/virt/network/create', { name: 'vj-none' }, admin);
    expect(n.status, n.text).to.equal(503);
    expect(await virshNames(s.lv, ['net-list', '--all', '--name'])).to.not.include('vj-none');
    // a plan's target inventory goes the same way: the target is unreachable, saying why
    const t = await req<Targets>(B, 'GET', '/virt/targets', undefined, admin);
    expect(t.status, t.text).to.equal(200);
    expect(t.body.data.targets[0]).to.include({ virt_uri: s.lv.uri, reachable: false });
    expect(t.body.data.targets[0].error).to.include('libvirt_access');
    expect(await jobsOf('virsh_call')).to.deep.equal([]);
  });

  it('a caller cannot submit virsh_call with a key of any role: 400 naming operation (403 where the role cannot submit at all), no job', async () => {
    for (const [role, key] of Object.entries(K)) {
      const r = await req<DaemonError>(B, 'POST', '/jobs/operation', { operation: 'virsh_call', parameters: { uri: s.lv.uri, args: ['net-define', '/etc/passwd'] } }, { 'X-API-Key': key });
      if (role === 'submit' || role === 'admin') {
        expect(r.status, `${role}: ${r.text}`).to.equal(400);
        expect(r.body.error).to.include('operation').and.include('submitted only by the daemon');
      } else expect(r.status, `${role}: ${r.text}`).to.equal(403);
    }
    expect(await jobsOf('virsh_call')).to.deep.equal([]);
  });

  it('through a worker with virsh: lists, creates and starts as virsh then shows, each call a virsh_call job', async () => {
    workers.push(await startWorkerProc({ ...s.env }, 'vj-libvirt', ['libvirt_access'], ['--concurrency', '4']));
    await awaitWorkers(B, workers, admin);
    const d = await req<{ data: { domains: { name: string; state: string }[] } }>(B, 'GET', '/virt/domains', undefined, admin);
    expect(d.status, d.text).to.equal(200);
    expect(d.body.data.domains.find((x) => x.name === 'vj-off')?.state).to.equal('shut off');
    const made = await req(B, 'POST', '/virt/network/create', { name: 'vj-net', subnet: '10.79.0.0/24', ip_start: '10.79.0.10', ip_end: '10.79.0.20' }, admin);
    expect(made.status, made.text).to.equal(201);
    expect(await s.lv.virsh(['net-dumpxml', 'vj-net'])).to.include("<ip address='10.79.0.1'");
    const t = await req<Targets>(B, 'GET', '/virt/targets', undefined, admin);
    expect(t.status, t.text).to.equal(200);
    expect(t.body.data.targets[0]).to.include({ virt_uri: s.lv.uri, reachable: true, error: null });
    expect(t.body.data.targets[0].networks).to.include('vj-net');
    expect(t.body.data.targets[0].pools.map((x) => x.name)).to.include(s.lv.pool);
    const st = await req(B, 'POST', '/virt/domain/start', { name: 'vj-off', paused: true }, admin);
    expect(st.status, st.text).to.equal(200);
    expect(await domState(s.lv, 'vj-off')).to.equal('paused');
    await s.lv.virsh(['destroy', 'vj-off']);
    expect((await jobsOf('virsh_call')).length).to.be.greaterThan(2);
  });

  it('job lists leave the calls out on both APIs; an admin lists them with ?internal=true, another role gets 403 naming internal', async () => {
    // An operator's job beside the calls, so that what the lists keep is seen as well as what they leave out.
    const sub = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'vj-noop', operation: 'noop', parameters: {} }, { 'X-API-Key': K.submit });
    expect(sub.status, sub.text).to.equal(201);
    await until(async () => (await req<{ state: string }>(gw.url, 'GET', '/jobs/vj-noop', undefined, admin)).body.state === 'COMPLETED', 30_000, 'the noop job done');
    const known = new Set((await callRecords()).map((c) => c.id));
    expect((await req(B, 'GET', '/virt/domains', undefined, admin)).status).to.equal(200);
    const fresh = (await callRecords()).filter((c) => !known.has(c.id)).map((c) => c.id);
    expect(fresh.length, 'GET /virt/domains made a virsh_call').to.be.greaterThan(0);
    for (const id of fresh) expect(await rc.zscore('ferry:jobs:calls', id), id).to.not.equal(null);
    // The daemon's lists (GET /jobs, GET and POST /jobs/query) and the gateway's GET /jobs: the noop job only.
    const lists = [
      await req<DaemonJobs>(B, 'GET', '/jobs?limit=1000', undefined, admin),
      await req<DaemonJobs>(B, 'GET', '/jobs/query?status=completed,failed&limit=1000', undefined, admin),
      await req<DaemonJobs>(B, 'POST', '/jobs/query', { limit: 1000 }, admin),
    ];
    for (const l of lists) {
      expect(l.status, l.text).to.equal(200);
      expect(l.body.jobs.map((j) => j.id), l.text).to.deep.equal(['vj-noop']);
      expect(l.body.total, l.text).to.equal(1);
    }
    const g = await req<{ jobs: { job_id: string }[]; total: number }>(gw.url, 'GET', '/jobs?limit=1000', undefined, admin);
    expect(g.status, g.text).to.equal(200);
    expect(g.body.jobs.map((j) => j.job_id)).to.deep.equal(['vj-noop']);
    expect(g.body.total).to.equal(1);
    // An admin asking for them sees them on both APIs.
    const di = await req<DaemonJobs>(B, 'GET', '/jobs?limit=1000&internal=true', undefined, admin);
    expect(di.body.jobs.map((j) => j.id)).to.include.members([...fresh, 'vj-noop']);
    const gi = await req<{ jobs: { job_id: string }[] }>(gw.url, 'GET', '/jobs?limit=1000&internal=true', undefined, admin);
    expect(gi.body.jobs.map((j) => j.job_id)).to.include.members([...fresh, 'vj-noop']);
    // Other roles: 403 naming the field, on both APIs.
    const dr = await req<DaemonError>(B, 'GET', '/jobs?internal=true', undefined, { 'X-API-Key': K.read });
    expect(dr.status, dr.text).to.equal(403);
    expect(dr.body.error).to.include('internal').and.include('admin');
    const gr = await req(gw.url, 'GET', '/jobs?internal=true', undefined, { 'X-API-Key': K.submit });
    expect(gr.status, gr.text).to.equal(403);
    expect(gr.text).to.include('internal');
  });

  it('libvirt\'s refusals keep the status and text a daemon running virsh itself answers (404, 400, 409)', async () => {
    await s.lv.virsh(['start', 'vj-off', '--paused']);
    const cases: [string, string, unknown, number][] = [
      ['GET', '/virt/stats?name=vj-nope', undefined, 404],
      ['GET', `/virt/volume/info?pool=${s.lv.pool}&volume=nope.qcow2`, undefined, 404],
      ['POST', '/virt/snapshot/create', { domain_name: 'vj-raw', snapshot_name: 's1' }, 400],
      ['POST', '/virt/network/create', { name: 'vj-net' }, 409],
      ['POST', '/virt/domain/start', { name: 'vj-off' }, 409],
    ];
    for (const [method, p, body, status] of cases) {
      const viaWorker = await req<DaemonError>(B, method, p, body, admin);
      const viaVirsh = await req<DaemonError>(direct.url, method, p, body, admin);
      expect(viaWorker.status, `${method} ${p}: ${viaWorker.text}`).to.equal(status);
      expect(viaVirsh.status, `direct ${method} ${p}: ${viaVirsh.text}`).to.equal(status);
      expect(viaWorker.body.error, `${method} ${p}`).to.equal(viaVirsh.body.error);
    }
    expect(await virshNames(s.lv, ['snapshot-list', 'vj-raw', '--name'])).to.deep.equal([]);
    await s.lv.virsh(['destroy', 'vj-off']);
  });

  it('clones and templates run whole on a worker (virt_clone): the host has them as virsh shows, refusals as a daemon running virt-clone answers', async () => {
    const srcDisk = (await s.lv.virsh(['domblklist', 'vj-off', '--details'])).split('\n').find((l) => /\sdisk\s/.test(l))!.trim().split(/\s+/).pop()!;
    const cl = await req<{ data: { target: string; uuid: string; disks: { source: string }[] } }>(B, 'POST', '/virt/clone', { source: 'vj-off', target: 'vj-clone' }, admin);
    expect(cl.status, cl.text).to.equal(201);
    expect(await domState(s.lv, 'vj-clone')).to.equal('shut off');
    expect((await s.lv.virsh(['domuuid', 'vj-clone'])).trim()).to.equal(cl.body.data.uuid);
    const cloneDisk = (await s.lv.virsh(['domblklist', 'vj-clone', '--details'])).split('\n').find((l) => /\sdisk\s/.test(l))!.trim().split(/\s+/).pop()!;
    expect(cloneDisk).to.not.equal(srcDisk); // a copy of its own, not the source's disk
    expect(cl.body.data.disks.map((d) => d.source)).to.deep.equal([cloneDisk]);
    // The same refusals as a daemon running virt-clone itself: an existing target (409), an unknown source (404).
    for (const body of [{ source: 'vj-off', target: 'vj-clone' }, { source: 'vj-nope', target: 'vj-clone2' }]) {
      const viaWorker = await req<DaemonError>(B, 'POST', '/virt/clone', body, admin);
      const viaVirsh = await req<DaemonError>(direct.url, 'POST', '/virt/clone', body, admin);
      expect(viaWorker.status, viaWorker.text).to.equal(viaVirsh.status);
      expect(viaWorker.body.error).to.equal(viaVirsh.body.error);
    }
    expect(await domState(s.lv, 'vj-clone2')).to.equal('absent');
    // A template (a marked clone), then a domain deployed from it with its own memory.
    const t = await req(B, 'POST', '/virt/template/create', { domain: 'vj-off', name: 'vj-tpl', description: 'through a worker' }, admin);
    expect(t.status, t.text).to.equal(201);
    expect(await s.lv.virsh(['metadata', 'vj-tpl', '--uri', 'https://ferry.dev/xmlns/libvirt/template/1', '--config'])).to.include('through a worker');
    const d = await req(B, 'POST', '/virt/template/deploy', { template: 'vj-tpl', name: 'vj-dep', memory: 96 }, admin);
    expect(d.status, d.text).to.equal(201);
    expect(await s.lv.virsh(['dominfo', 'vj-dep'])).to.match(/Max memory:\s+98304 KiB/);
    const listed = await req<{ data: { templates: { name: string; marked: boolean }[] } }>(B, 'GET', '/virt/template/list', undefined, admin);
    expect(listed.body.data.templates.find((x) => x.name === 'vj-tpl')?.marked).to.equal(true);
    // Each ran as a virt_clone job on the worker (not on the call lane: an operator's job, listed).
    const jobs = (await jobsOf('virt_clone')).filter((j) => j.status === 'completed');
    expect(jobs.length).to.be.at.least(3);
    for (const j of jobs) expect(await rc.hget(`ferry:job:${j.id}`, 'queue')).to.equal('jobs.libvirt_access');
    for (const n of ['vj-clone', 'vj-tpl', 'vj-dep']) await s.lv.virsh(['undefine', n, '--remove-all-storage']);
  });

  it('a volume upload without a worker with qemu-img, sealing or customizing without one with libguestfs, are a clear 503, the host unchanged; a shut-off domain\'s console is refused as direct mode refuses it', async () => {
    // An upload runs whole on a worker with img_tool too (virt_files, test/virt/files-through-worker.test.ts): the one here has only libvirt_access.
    const up = await req<DaemonError>(B, 'POST', '/virt/volume/upload', { pool: s.lv.pool, volume: 'vj-up.qcow2', source_path: path.join(s.dir, 'vj-up.qcow2') }, admin);
    expect(up.status, up.text).to.equal(503);
    expect(up.body.error).to.include('volume upload').and.include('img_tool, libvirt_access').and.include('FERRY_LIBVIRT_VIA=worker');
    expect(await s.lv.virsh(['vol-list', s.lv.pool])).to.not.include('vj-up.qcow2');
    // Sealing and customizing need libguestfs on the worker (mount_operations): the one here has only libvirt_access.
    const seal = await req<DaemonError>(B, 'POST', '/virt/template/create', { domain: 'vj-off', name: 'vj-sealed', seal: true }, admin);
    expect(seal.status, seal.text).to.equal(503);
    expect(seal.body.error).to.include('template create').and.include('libvirt_access, mount_operations');
    expect(await domState(s.lv, 'vj-sealed')).to.equal('absent');
    const cust = await req<DaemonError>(B, 'POST', '/virt/template/deploy', { template: 'vj-off', name: 'vj-cust', customize: { hostname: 'vj-cust' } }, admin);
    expect(cust.status, cust.text).to.equal(503);
    expect(cust.body.error).to.include('template deploy').and.include('mount_operations');
    expect(await domState(s.lv, 'vj-cust')).to.equal('absent');
    // The console runs on a worker (virt_console, test/virt/files-through-worker.test.ts): a shut-off domain's is
    // refused as a daemon running virsh refuses it.
    for (const base of [B, direct.url]) {
      const con = openWs<{ type: string; error?: string }>(`${base.replace('http', 'ws')}/virt/console?name=vj-off`, admin);
      await con.opened;
      await until(() => con.msgs.some((m) => m.type === 'error'), 30_000, 'the console refused');
      expect(con.msgs.find((m) => m.type === 'error')?.error).to.equal('domain vj-off is shut off: start it to use its console');
      con.ws.close();
    }
  });

  it('seal runs virt-sysprep on a worker with libvirt_access and mount_operations (virt_clone): its answer is a daemon running it itself\'s', async () => {
    workers.push(await startWorkerProc({ ...s.env }, 'vj-guestfs', ['libvirt_access', 'mount_operations']));
    await awaitWorkers(gw.url, workers, admin);
    // vj-off's disk is blank: virt-sysprep, launched on the worker, finds no operating system in it and fails; the
    // clone it sealed stays, as it does when the daemon runs virt-sysprep itself.
    // Both at once: each is an appliance launch of its own (virt-sysprep), on clones of their own names.
    const [viaWorker, viaVirsh] = await Promise.all([
      req<DaemonError>(B, 'POST', '/virt/template/create', { domain: 'vj-off', name: 'vj-sealw', seal: true }, admin),
      req<DaemonError>(direct.url, 'POST', '/virt/template/create', { domain: 'vj-off', name: 'vj-seald', seal: true }, admin),
    ]);
    expect(viaWorker.status, viaWorker.text).to.equal(viaVirsh.status);
    expect(viaWorker.body.error).to.include('virt-sysprep');
    expect(viaVirsh.body.error).to.include('virt-sysprep');
    const [job] = (await jobsOf('virt_clone')).filter((j) => j.status === 'failed');
    expect(await rc.hmget(`ferry:job:${job.id}`, 'queue', 'worker_id')).to.deep.equal(['jobs.libvirt_access+mount_operations', 'vj-guestfs']);
    expect(await domState(s.lv, 'vj-sealw')).to.equal('shut off');
    for (const n of ['vj-sealw', 'vj-seald']) await s.lv.virsh(['undefine', n, '--remove-all-storage']);
  });

  it('latency of GET /virt/domains: through the worker and with virsh in the daemon (printed for docs/performance.md)', async () => {
    const time = async (base: string) => {
      const ms: number[] = [];
      for (let i = 0; i < 20; i++) {
        const t = process.hrtime.bigint();
        const r = await req(base, 'GET', '/virt/domains', undefined, admin);
        ms.push(Number(process.hrtime.bigint() - t) / 1e6);
        expect(r.status, r.text).to.equal(200);
      }
      ms.sort((a, b) => a - b);
      return { median: ms[10].toFixed(1), p95: ms[18].toFixed(1) };
    };
    const w = await time(B);
    const v = await time(direct.url);
    console.log(`      GET /virt/domains, 20 calls: through a worker median ${w.median} ms p95 ${w.p95} ms; virsh in the daemon median ${v.median} ms p95 ${v.p95} ms`);
  });

  it('Redis keeps a completed call FERRY_CALL_RETENTION and a failed one FERRY_CALL_FAILED_RETENTION after it ended, then holds none', async () => {
    const known = new Set((await callRecords()).map((c) => c.id));
    expect((await req(B, 'GET', '/virt/domains', undefined, admin)).status).to.equal(200);
    expect((await req(B, 'GET', '/virt/stats?name=vj-gone', undefined, admin)).status).to.equal(404);
    const fresh = (await callRecords()).filter((c) => !known.has(c.id));
    const done = fresh.filter((c) => c.state === 'COMPLETED');
    const failed = fresh.filter((c) => c.state === 'FAILED');
    expect(done.length, JSON.stringify(fresh)).to.be.greaterThan(0);
    expect(failed.length, JSON.stringify(fresh)).to.be.greaterThan(0);
    const present = async () => new Set((await callRecords()).map((c) => c.id));
    await until(async () => { const ids = await present(); return done.every((c) => !ids.has(c.id)); }, (CALL_RETENTION_S + 20) * 1000, 'the completed calls removed');
    const goneAt = Date.now();
    for (const c of done) expect(goneAt - Number(c.finished_at), 'not removed before its age').to.be.at.least(CALL_RETENTION_S * 1000);
    // The failed ones, younger than their own age, are still there to be looked at.
    const ids = await present();
    for (const c of failed) {
      expect(ids.has(c.id), `failed call ${c.id} kept`).to.equal(true);
      const one = await req<{ status: string }>(B, 'GET', `/jobs/${c.id}`, undefined, admin);
      expect(one.body.status, one.text).to.equal('failed');
    }
    // Past the failed age Redis holds no call at all: no record, no id in the calls set or any state index.
    await until(async () => (await callRecords()).length === 0 && (await rc.zcard('ferry:jobs:calls')) === 0, (CALL_FAILED_RETENTION_S + 30) * 1000, 'every call removed');
    for (const c of [...done, ...failed]) {
      for (const st of ['COMPLETED', 'FAILED', 'CANCELLED']) expect(await rc.zscore(`ferry:jobs:state:${st}`, c.id), `${c.id} in ${st}`).to.equal(null);
      expect(await rc.zscore('ferry:jobs:finished', c.id)).to.equal(null);
    }
    // The operator's job is kept as every job is (FERRY_JOB_RETENTION).
    expect(await rc.hget('ferry:job:vj-noop', 'state')).to.equal('COMPLETED');
  });
});
