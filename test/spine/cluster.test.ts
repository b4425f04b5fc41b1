// `npm start` (scripts/cluster.ts, built first: prestart runs `npm run build`) as a user runs it: the whole
// local cluster, every service as plain `node dist/services/<name>/main.js`, with its private Redis, a real
// conversion submitted to the gateway and taken by one of its two workers, the daemon up, then SIGTERM sent to
// npm's own pid (as a process manager or `kill <pid>` does; Ctrl-C signals the whole group, which is easier)
// stops every process, the private Redis last, and the command exits 0. Ports are free ones, data in a temp dir.
import { expect } from 'chai';
import { execFileSync, spawn, ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { freePort } from '../helpers/redis';
import { req, until } from '../helpers/http';
import { makeImage } from '../helpers/images';
import type { JobStatus } from '../helpers/api-types';

/** Job API: GET /health (services/gateway/routes.ts); workers and active_jobs only while Redis answers. */
interface GatewayHealth { status: string; version: string; timestamp: string; workers?: number; active_jobs?: number; reason?: string }

const ROOT = path.resolve(__dirname, '..', '..');
const listening = (port: number) => new Promise<boolean>((r) => {
  const c = net.connect(port, '127.0.0.1');
  c.once('connect', () => { c.destroy(); r(true); });
  c.once('error', () => r(false));
});

describe('npm start: the whole local cluster (scripts/cluster.ts)', function () {
  this.timeout(240_000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-cluster-'));
  const ports: Record<string, number> = {};
  let proc: ChildProcess;
  let out = '';
  let exit: Promise<number | null>;

  before(async () => {
    for (const k of ['redis', 'gateway', 'daemon', 'w1', 'w2']) ports[k] = await freePort();
    const env: Record<string, string> = {
      PATH: process.env.PATH!, HOME: process.env.HOME || '/root', FERRY_DATA_DIR: path.join(dir, 'data'), FERRY_REDIS_PORT: String(ports.redis),
      GATEWAY_PORT: String(ports.gateway), DAEMON_PORT: String(ports.daemon), WORKER1_METRICS_PORT: String(ports.w1), WORKER2_METRICS_PORT: String(ports.w2),
    };
    proc = spawn('npm', ['start', '--silent'], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    proc.stdout!.setEncoding('utf8').on('data', (s: string) => { out += s; });
    proc.stderr!.setEncoding('utf8').on('data', (s: string) => { out += s; });
    exit = new Promise((r) => proc.once('exit', (code) => r(code)));
  });
  after(() => {
    if (proc.exitCode === null && !proc.signalCode) { proc.kill('SIGKILL'); }
    rmSync(dir, { recursive: true, force: true });
  });

  it('starts its private Redis and every service; both workers register with the gateway', async () => {
    const base = `http://127.0.0.1:${ports.gateway}`;
    const h = await until(async () => { const r = await req<GatewayHealth>(base, 'GET', '/health').catch(() => undefined); /* not listening yet: polled again */ return r?.status === 200 && r.body.workers === 2 && r.body; }, 180_000, `gateway with 2 workers (after the build); output so far:\n${out}`);
    expect(h.status).to.equal('healthy');
    expect(out).to.contain(`[cluster] started a private redis-server on redis://127.0.0.1:${ports.redis} (append-only, data in ${path.join(dir, 'data', 'redis')})`);
    expect(out).to.contain(`[cluster] gateway on http://localhost:${ports.gateway}, daemon on http://localhost:${ports.daemon}`);
    await until(async () => (await req(`http://127.0.0.1:${ports.daemon}`, 'GET', '/health').catch(() => undefined))?.status === 200, 30_000, 'daemon /health 200'); // not listening yet: polled again
    const workers = (await req(base, 'GET', '/workers')).body;
    expect(JSON.stringify(workers)).to.contain('local-worker-1').and.to.contain('local-worker-2');
  });

  it('converts a real image submitted to the gateway; every line of output names its service', async () => {
    const base = `http://127.0.0.1:${ports.gateway}`;
    const src = makeImage(dir, 'cluster-src', 'vmdk', 8);
    const sub = await req(base, 'POST', '/jobs?queue=true', { job_id: 'cluster-1', operation: 'convert', image: { path: src, format: 'vmdk' }, parameters: { output_format: 'qcow2', output_dir: dir } });
    expect(sub.status, JSON.stringify(sub.body)).to.equal(201);
    const j = await until(async () => { const r = await req<JobStatus>(base, 'GET', '/jobs/cluster-1'); return ['COMPLETED', 'FAILED'].includes(r.body.state) && r.body; }, 60_000, 'cluster-1 finished');
    expect(j.state, JSON.stringify(j.result || j.error)).to.equal('COMPLETED');
    const output = path.join(dir, 'cluster-1.qcow2');
    expect(j.result).to.include({ output_path: output, format: 'qcow2' });
    execFileSync('qemu-img', ['compare', '-q', '-f', 'vmdk', '-F', 'qcow2', src, output]);
    for (const line of out.split('\n').filter(Boolean)) expect(line).to.match(/^\[(build|cluster|gateway|daemon|scheduler|notifier|worker-1|worker-2)\] /);
    // Static files: a browser that drops a connection mid-file leaves no stack trace in the log.
    const daemon = `http://127.0.0.1:${ports.daemon}`;
    for (let i = 0; i < 5; i++) {
      await new Promise<void>((resolve) => {
        const rq = http.get(`${daemon}/swagger-ui/swagger-ui-bundle.js`, (res) => { res.once('data', () => { rq.destroy(); resolve(); }); });
        rq.on('error', () => resolve());
      });
    }
    expect((await req(daemon, 'GET', '/health')).status).to.equal(200);
    expect(out).to.not.include('ERR_STREAM_PREMATURE_CLOSE').and.not.include('    at ');
  });

  it("SIGTERM to npm's own pid stops every service, then the private Redis, and exits 0", async () => {
    proc.kill('SIGTERM');
    expect(await exit).to.equal(0);
    expect(out).to.contain('[cluster] stopping: workers finish or hand back their jobs, then the other services');
    expect(out).to.contain('[cluster] redis-server stopped');
    for (const k of ['redis', 'gateway', 'daemon', 'w1', 'w2']) expect(await listening(ports[k]), `port ${k} still open`).to.equal(false);
    expect(existsSync(path.join(dir, 'data', 'redis', 'appendonlydir'))).to.equal(true);
  });
});

describe('npm start: a service that dies stops the cluster, naming it (issue 38)', function () {
  this.timeout(240_000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-cluster-clash-'));
  let blocker: net.Server;
  after(() => { blocker?.close(); rmSync(dir, { recursive: true, force: true }); });

  it("worker-1's metrics port already in use: the worker exits naming the port, npm start exits 1 naming worker-1, nothing keeps running", async () => {
    const ports: Record<string, number> = {};
    for (const k of ['redis', 'gateway', 'daemon', 'w1', 'w2']) ports[k] = await freePort();
    // Another program holds worker-1's metrics port (as under the reported `npm start`, where both workers died).
    blocker = net.createServer();
    await new Promise<void>((r) => blocker.listen(ports.w1, '127.0.0.1', r));
    const env: Record<string, string> = {
      PATH: process.env.PATH!, HOME: process.env.HOME || '/root', FERRY_DATA_DIR: path.join(dir, 'data'), FERRY_REDIS_PORT: String(ports.redis),
      GATEWAY_PORT: String(ports.gateway), DAEMON_PORT: String(ports.daemon), WORKER1_METRICS_PORT: String(ports.w1), WORKER2_METRICS_PORT: String(ports.w2),
    };
    const proc = spawn('npm', ['start', '--silent'], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    for (const s of [proc.stdout, proc.stderr]) s.setEncoding('utf8').on('data', (d: string) => { out += d; });
    const code = await new Promise<number | null>((r) => proc.once('exit', (c) => r(c)));
    expect(code, out).to.equal(1);
    expect(out).to.match(new RegExp(`\\[worker-1\\] worker: failed to start: metrics port ${ports.w1} could not be opened: listen EADDRINUSE`));
    expect(out).to.match(/\[cluster\] worker-1 exited unexpectedly \(exit code 2\): stopping every service; npm start exits 1/);
    expect(out).to.contain('[cluster] redis-server stopped');
    // Everything the cluster started is gone: the gateway, the daemon, worker-2 and the private Redis.
    for (const k of ['redis', 'gateway', 'daemon', 'w2']) expect(await listening(ports[k]), `port ${k} still open`).to.equal(false);
  });
});
