// The daemon's libvirt through workers (FERRY_LIBVIRT_VIA=worker, issue 38 item 2), against a real daemon process
// whose PATH has no virsh, a real worker process with it, and the run's private libvirtd: the /virt routes answer
// through virsh_call jobs and change the host as virsh then shows; libvirt's refusals keep their status and text,
// exactly as a daemon running virsh itself (direct mode, started beside it on the same libvirtd) answers them;
// with no worker able to take the call the answer is a 503 that says so and no job is made; a caller cannot
// submit virsh_call with a key of any role; a plan's target inventory (GET /virt/targets) goes the same way; the routes that need local files or tools, and the console, are a
// clear 503. The latency of GET /virt/domains both ways is printed (docs/performance.md).
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readdirSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { req } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import { defineGuest, domState, guestXml, virshNames } from '../helpers/libvirt';
import { awaitWorkers, startDaemonProc, startWorkerProc, type Proc } from '../helpers/procs';
import { openWs } from '../helpers/ws';
import { startVirtStack, type VirtStack } from './stack';

const K = { read: 'vjob-reader-0123456789abcdef', submit: 'vjob-submitter-0123456789ab', worker: 'vjob-worker-0123456789abcdef', admin: 'vjob-admin-0123456789abcdef' };
const KEYS = Object.entries(K).map(([role, key]) => `${role}-key:${role}:${key}`).join(',');
const admin = { 'X-API-Key': K.admin };

/** A PATH of symlinks to every program of this one but virsh: the daemon then has no libvirt client at all. */
function pathWithoutVirsh(dir: string): string {
  const bin = path.join(dir, 'bin-no-virsh');
  mkdirSync(bin);
  for (const d of (process.env.PATH || '').split(':').filter(Boolean).reverse()) {
    let names: string[];
    try { names = readdirSync(d); } catch { continue; } // a PATH entry that does not exist adds nothing
    for (const n of names) {
      if (n.startsWith('virsh')) continue;
      try { symlinkSync(path.join(d, n), path.join(bin, n)); } catch { /* an earlier PATH entry's program wins, as in the shell */ }
    }
  }
  return bin;
}

describe('virt routes through a worker (FERRY_LIBVIRT_VIA=worker) @vm', function () {
  this.timeout(600_000);
  let s: VirtStack;
  let B: string;
  let direct: Proc & { url: string };
  let daemon: Proc & { url: string };
  const workers: Proc[] = [];
  const jobsOf = async (op: string) => ((await req<{ jobs: { id: string; definition: { operation: string } }[] }>(B, 'GET', '/jobs?limit=1000', undefined, admin)).body.jobs || []).filter((j) => j.definition.operation === op);

  type Targets = { data: { targets: { virt_uri: string; reachable: boolean; error: string | null; networks: string[]; pools: { name: string }[] }[] } };

  before(async function () {
    this.timeout(300_000);
    s = await startVirtStack({ FERRY_API_KEYS: KEYS, FERRY_API_KEYS_FILE: '', FERRY_LIBVIRT_VIA: 'worker', FERRY_REFUSAL_LIMIT: '0' }, '{}\n');
    // startVirtStack's daemon has virsh: stop it, start one with a PATH without virsh on the same Redis.
    await s.daemon.stop();
    const noVirsh = pathWithoutVirsh(s.dir);
    expect(() => execFileSync('sh', ['-c', 'command -v virsh'], { env: { PATH: noVirsh } })).to.throw();
    daemon = await startDaemonProc({ ...s.env, PATH: noVirsh }, s.config);
    B = daemon.url;
    direct = await startDaemonProc({ ...s.env, FERRY_LIBVIRT_VIA: 'direct', FERRY_PREFIX: 'vjob-direct' }, s.config);
    await defineGuest(s.lv, 'vj-off', { withDisk: true });
    // A raw disk: libvirt refuses an internal snapshot of it ("unsupported configuration", a 400).
    await s.lv.virsh(['vol-create-as', s.lv.pool, 'vj-raw.img', '8M', '--format', 'raw']);
    const xml = path.join(s.dir, 'vj-raw.xml');
    writeFileSync(xml, guestXml('vj-raw', { disk: path.join(s.lv.poolDir, 'vj-raw.img'), diskFormat: 'raw' }));
    await s.lv.virsh(['define', xml]);
  });
  after(async () => {
    await Promise.all(workers.map((w) => w.kill()));
    await direct?.stop();
    await daemon?.stop();
    await s?.stop();
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

  it('the routes that need local files or tools, and the console, are a clear 503; the host is unchanged', async () => {
    const imp = await req<DaemonError>(B, 'POST', '/import/kvm', { image_path: '/nonexistent.qcow2', vm_name: 'vj-imp' }, admin);
    expect(imp.status, imp.text).to.equal(503);
    expect(imp.body.error).to.include('POST /import/kvm').and.include('FERRY_LIBVIRT_VIA=worker');
    const cl = await req<DaemonError>(B, 'POST', '/virt/clone', { source: 'vj-off', target: 'vj-clone' }, admin);
    expect(cl.status, cl.text).to.equal(503);
    expect(await domState(s.lv, 'vj-clone')).to.equal('absent');
    const con = openWs(`${B.replace('http', 'ws')}/virt/console?name=vj-off`, admin);
    const refused = await con.opened.then(() => 'opened', (e: Error) => e.message);
    expect(refused).to.equal('HTTP 503');
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
});
