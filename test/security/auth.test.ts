// One authentication layer, tried as an attacker and as each legitimate caller would, against real processes
// (redis-server, gateway, daemon, a worker with its metrics port): every route family of both APIs, SSE, /ws and
// the metrics ports answer 401 without a key and 403 with a key of the wrong role, in each API's envelope; keys
// come from the keys file (gateway, worker) and FERRY_API_KEYS (daemon); a key never works from a URL; without
// keys a wider listen address is refused, naming the setting; and the legitimate flows pass with auth on.
import { expect } from 'chai';
import { writeFileSync, existsSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { freePort, waitForPort, type TestRedis } from '../helpers/redis';
import { useStack, type Stack } from '../helpers/stack';
import { awaitWorkers, exitCode, Proc, startProcess, startWorkerWithMetrics, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DaemonError, JobApiError, Res } from '../helpers/http';
import { openWs } from '../helpers/ws';
import { makeImage } from '../helpers/images';
import type { DaemonJob, DequeueAnswer, JobStatus, WorkerList, WsTicket } from '../helpers/api-types';

/** The parts of GET /openapi.json read here. */
interface OpenApiDoc { paths: Record<string, Record<string, { 'x-ferry-role'?: string }>>; components: { securitySchemes: Record<string, unknown> } }

const K = {
  read: 'reader-key-0123456789abcdef',
  submit: 'submitter-key-0123456789abcdef',
  worker: 'worker-key-0123456789abcdef',
  admin: 'admin-key-0123456789abcdef',
  unknown: 'nobody-knows-this-key-0123',
};
type Role = 'read' | 'submit' | 'worker' | 'admin';
const ROLES: Role[] = ['read', 'submit', 'worker', 'admin'];
const GRANTS: Record<Role, Role[]> = { read: ['read'], submit: ['read', 'submit'], worker: ['read', 'worker'], admin: ROLES };
const key = (r: Role | 'unknown') => ({ 'X-API-Key': K[r] });

describe('security: one authentication layer for both APIs, SSE, WebSocket and metrics ports', function () {
  this.timeout(120_000);
  let dmMetrics = 0;
  before(async () => { dmMetrics = await freePort(); });
  const keysFile = (st: Stack) => path.join(st.dir, 'keys');
  // The gateway and the worker read the keys file; the daemon FERRY_API_KEYS.
  const s = useStack({
    name: 'sec-auth', prefix: 'sec', daemonYaml: () => `metrics:\n  enabled: true\n  port: ${dmMetrics}\n`,
    prepare: (st) => writeFileSync(keysFile(st), [
      '# name role key [capabilities]',
      `reader   read   ${K.read}`,
      `ci       submit ${K.submit}`,
      `workers  worker ${K.worker}   img_tool   # conversion workers only`,
      '',
      `ops      admin  ${K.admin}`,
    ].join('\n')),
    env: (st) => ({ FERRY_API_KEYS_FILE: keysFile(st) }),
    daemon: { FERRY_API_KEYS_FILE: '', FERRY_API_KEYS: `reader:read:${K.read},ci:submit:${K.submit},workers:worker:${K.worker},ops:admin:${K.admin}` },
  });
  let gw: Stack['gw'];
  let dm: Stack['dm'];
  let worker: Awaited<ReturnType<typeof startWorkerWithMetrics>>;
  let env: Record<string, string>;
  let redis: TestRedis;
  let dir: string;
  let procs: Proc[];

  before(async () => {
    ({ gw, dm, env, redis, dir, procs } = s);
    worker = await s.add(startWorkerWithMetrics(env, 'sec-native', ['img_tool']));
    await awaitWorkers(gw.url, [worker], key('read'));
  });

  /** 401 without a key, 403 with an unknown key and with each role that lacks `need`, and never 401/403 with
   *  a role that has it; in the API's own envelope. */
  async function routeNeeds(base: string, api: 'gateway' | 'daemon', method: string, p: string, need: Role, body?: unknown) {
    const code = (r: Res<JobApiError | DaemonError>) => (api === 'gateway' ? (r.body as JobApiError | undefined)?.error?.code : (r.body as DaemonError | undefined)?.status);
    const none = await req<JobApiError | DaemonError>(base, method, p, body);
    expect(none.status, `${method} ${p} without a key`).to.equal(401);
    expect(code(none), `${method} ${p} envelope`).to.equal(401);
    if (api === 'gateway') expect((none.body as JobApiError).error).to.include.keys('message', 'path', 'timestamp');
    else expect(none.body).to.include.keys('error', 'timestamp');
    expect(none.headers.get('www-authenticate')).to.equal('Bearer');
    const unknown = await req(base, method, p, body, key('unknown'));
    expect(unknown.status, `${method} ${p} unknown key`).to.equal(403);
    for (const role of ROLES) {
      const r = await req<JobApiError | DaemonError>(base, method, p, body, role === 'admin' ? { Authorization: `Bearer ${K.admin}` } : key(role));
      if (GRANTS[role].includes(need)) expect(r.status, `${method} ${p} as ${role}`).to.not.be.oneOf([401, 403]);
      else {
        expect(r.status, `${method} ${p} as ${role}`).to.equal(403);
        expect(code(r)).to.equal(403);
      }
    }
  }

  it('job API (8000): each route family needs its role', async () => {
    const job = { operation: 'noop', parameters: {} };
    const report = { worker_id: 'nobody', lease_token: 'x' };
    const table: [string, string, Role, unknown?][] = [
      ['GET', '/jobs', 'read'], ['GET', '/jobs/nope', 'read'], ['GET', '/jobs/nope/events', 'read'], ['GET', '/jobs/nope/events/stream', 'read'],
      ['POST', '/jobs', 'submit', job], ['DELETE', '/jobs/nope', 'submit'], ['POST', '/jobs/nope/queue', 'submit'],
      ['POST', '/migrationjobs', 'submit', { apiVersion: 'ferry.io/v1' }],
      ['POST', '/jobs/nope/start', 'worker', report], ['POST', '/jobs/nope/events', 'worker', { ...report, phase: 'x', percentage: 1 }],
      ['POST', '/jobs/nope/complete', 'worker', report], ['POST', '/jobs/nope/fail', 'worker', { ...report, error: 'e' }], ['POST', '/jobs/nope/lease', 'worker', report],
      ['POST', '/workers/register', 'worker', { worker_id: 'w-reg', capabilities: ['img_tool'] }], ['POST', '/workers/w-reg/heartbeat', 'worker'],
      ['POST', '/queue/dequeue', 'worker', { worker_id: 'w-none', capabilities: [] }],
      ['GET', '/workers', 'read'], ['DELETE', '/workers/nope', 'admin'], ['GET', '/queue', 'read'], ['GET', '/metrics', 'read'],
    ];
    for (const [m, p, need, body] of table) await routeNeeds(gw.url, 'gateway', m, p, need, body);
    // Public: health and the API description.
    for (const p of ['/health', '/openapi.json']) expect((await req(gw.url, 'GET', p)).status, p).to.equal(200);
    const doc = (await req<OpenApiDoc>(gw.url, 'GET', '/openapi.json')).body;
    expect(doc.paths['/workers/{worker_id}'].delete['x-ferry-role']).to.equal('admin');
    expect(doc.components.securitySchemes).to.include.keys('apiKey', 'bearer');
  });

  it('daemon API (8080): each route family needs its role, under / and /api/v1', async () => {
    const table: [string, string, Role, unknown?][] = [
      ['GET', '/jobs', 'read'], ['GET', '/status', 'read'], ['POST', '/jobs/query', 'read', {}], ['GET', '/jobs/nope/events/stream', 'read'],
      ['POST', '/jobs/submit', 'submit', { vm_path: '/dc/vm/a', output_path: '/srv/x' }], ['POST', '/jobs/cancel', 'submit', { job_ids: ['nope'] }],
      ['POST', '/schedules', 'submit', {}], ['GET', '/schedules', 'read'], ['POST', '/webhooks', 'submit', {}], ['GET', '/webhooks', 'read'],
      ['POST', '/ws/ticket', 'read'], ['GET', '/workers', 'read'],
    ];
    for (const prefix of ['', '/api/v1']) for (const [m, p, need, body] of table) await routeNeeds(dm.url, 'daemon', m, prefix + p, need, body);
    for (const p of ['/health', '/api/v1/health', '/openapi.yaml', '/web/dashboard/', '/swagger-ui/']) expect((await req(dm.url, 'GET', p)).status, p).to.equal(200);
  });

  it('SSE streams need a read key on both APIs', async () => {
    await req(gw.url, 'POST', '/jobs', { job_id: 'sse-auth', operation: 'noop' }, key('submit'));
    for (const base of [gw.url, dm.url]) {
      expect((await req(base, 'GET', '/jobs/sse-auth/events/stream')).status).to.equal(401);
      const ctl = new AbortController();
      const res = await fetch(`${base}/jobs/sse-auth/events/stream`, { headers: key('read'), signal: ctl.signal });
      expect(res.status).to.equal(200);
      expect(res.headers.get('content-type')).to.include('text/event-stream');
      ctl.abort();
    }
  });

  it('/ws and /ws/metrics: 401 without a key, 403 with an unknown one, never a key in the URL; a ticket works once', async () => {
    for (const p of ['/ws', '/ws/metrics', '/api/v1/ws']) {
      const url = `${dm.url.replace('http', 'ws')}${p}`;
      expect(await openWs(url).opened.then(() => 'open', (e: Error) => e.message)).to.equal('HTTP 401');
      expect(await openWs(url, key('unknown')).opened.then(() => 'open', (e: Error) => e.message)).to.equal('HTTP 403');
      expect(await openWs(`${url}?api_key=${K.admin}`).opened.then(() => 'open', (e: Error) => e.message)).to.equal('HTTP 401');
      const ok = openWs(url, key('read'));
      await ok.opened;
      await until(() => ok.msgs.length > 0, 10000, 'a first message');
      ok.ws.close();
      const t = await req<WsTicket>(dm.url, 'POST', '/ws/ticket', undefined, key('read'));
      expect(t.body.expires_in).to.be.at.most(60);
      const viaTicket = openWs(`${url}?ticket=${t.body.ticket}`);
      await viaTicket.opened;
      viaTicket.ws.close();
      expect(await openWs(`${url}?ticket=${t.body.ticket}`).opened.then(() => 'open', (e: Error) => e.message), 'replayed ticket').to.equal('HTTP 401');
      expect(await openWs(`${url}?ticket=made-up-ticket-0123456789`).opened.then(() => 'open', (e: Error) => e.message)).to.equal('HTTP 401');
    }
  });

  it('/ws?internal=true (the daemon\'s calls in job_update, as GET /jobs?internal=true): 403 naming internal for every role but admin', async () => {
    const url = `${dm.url.replace('http', 'ws')}/ws?internal=true`;
    for (const r of ['read', 'submit', 'worker'] as const) expect(await openWs(url, key(r)).opened.then(() => 'open', (e: Error) => e.message), r).to.equal('HTTP 403');
    // The refusal's body, in the daemon's envelope, names the field and the role it needs.
    const refused = await new Promise<{ status?: number; body: string }>((resolve, reject) => {
      const r = http.get(url.replace('ws', 'http'), { headers: { ...key('read'), Connection: 'Upgrade', Upgrade: 'websocket', 'Sec-WebSocket-Version': '13', 'Sec-WebSocket-Key': 'dGhlIHNhbXBsZSBub25jZQ==' } }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => { body += c.toString(); }).on('end', () => resolve({ status: res.statusCode, body }));
      });
      r.on('error', reject);
    });
    expect(refused.status).to.equal(403);
    expect((JSON.parse(refused.body) as DaemonError).error).to.include('internal').and.include('admin');
    const ok = openWs(url, key('admin'));
    await ok.opened;
    await until(() => ok.msgs.some((m) => m.type === 'jobs'), 10000, 'the first page');
    ok.ws.close();
  });

  it('metrics ports (daemon, worker) need a read key; the worker\'s /health stays public', async () => {
    for (const [port, envelope] of [[dmMetrics, 'daemon'], [worker.metricsPort, 'gateway']] as const) {
      const base = `http://127.0.0.1:${port}`;
      const none = await req<DaemonError | JobApiError>(base, 'GET', '/metrics');
      expect(none.status).to.equal(401);
      expect(envelope === 'daemon' ? (none.body as DaemonError).status : (none.body as JobApiError).error.code).to.equal(401);
      expect((await req(base, 'GET', '/metrics', undefined, key('unknown'))).status).to.equal(403);
      const ok = await req(base, 'GET', '/metrics', undefined, key('read'));
      expect(ok.status).to.equal(200);
      expect(ok.text).to.include('# HELP');
    }
    expect((await req(`http://127.0.0.1:${worker.metricsPort}`, 'GET', '/health')).status).to.equal(200);
  });

  it('a worker key limited to img_tool cannot register or dequeue with more', async () => {
    const reg = await req<JobApiError>(gw.url, 'POST', '/workers/register', { worker_id: 'greedy', capabilities: ['img_tool', 'nbd_access'] }, key('worker'));
    expect(reg.status).to.equal(403);
    expect(reg.body.error.message).to.include('nbd_access');
    const dq = await req(gw.url, 'POST', '/queue/dequeue', { worker_id: 'greedy', capabilities: ['mount_operations'] }, key('worker'));
    expect(dq.status).to.equal(403);
    expect((await req<WorkerList>(gw.url, 'GET', '/workers', undefined, key('read'))).body.workers.map((w) => w.worker_id)).to.not.include('greedy');
    expect((await req(gw.url, 'POST', '/workers/register', { worker_id: 'modest', capabilities: ['img_tool'] }, key('worker'))).status).to.equal(201);
    expect((await req(gw.url, 'POST', '/workers/register', { worker_id: 'ops-any', capabilities: ['nbd_access'] }, key('admin'))).status).to.equal(201);
  });

  it('the privileged execution mode: only for operations that need device access, or an admin key', async () => {
    const priv = { operation: 'noop', requirements: { execution_mode: 'PRIVILEGED_CONTAINER' } };
    const r = await req<JobApiError>(gw.url, 'POST', '/jobs', { job_id: 'priv-1', ...priv }, key('submit'));
    expect(r.status).to.equal(403);
    expect(r.body.error.message).to.include('execution_mode');
    expect((await req(gw.url, 'GET', '/jobs/priv-1', undefined, key('read'))).status).to.equal(404);
    expect((await req(gw.url, 'POST', '/jobs', { job_id: 'priv-2', ...priv }, key('admin'))).status).to.equal(201);
    // Listing a device capability does not make a noop need device access (test/security/roles.test.ts).
    const listed = { job_id: 'priv-3', operation: 'noop', requirements: { capabilities: ['nbd_access'], execution_mode: 'PRIVILEGED_CONTAINER' } };
    expect((await req(gw.url, 'POST', '/jobs', listed, key('submit'))).status).to.equal(403);
    // A migrate with guest repair needs mount_operations by its own table: a submit key may ask for the mode.
    const src = makeImage(dir, 'priv-src', 'vmdk', 8);
    const manifest = { manifest_version: '1.0', source: { provider: 'test', vm_name: 'priv-vm' }, disks: [{ id: 'root', source_format: 'vmdk', bytes: 8 * 1024 * 1024, local_path: src }],
      pipeline: { inspect: { enabled: true }, convert: { enabled: true }, fix: { enabled: true }, validate: { enabled: true } }, output: { directory: path.join(dir, 'priv-out'), format: 'qcow2', filename: 'root.qcow2' } };
    const dev = await req(gw.url, 'POST', '/jobs', { job_id: 'priv-4', operation: 'migrate', parameters: { manifest }, requirements: { execution_mode: 'PRIVILEGED_CONTAINER' } }, key('submit'));
    expect(dev.status, dev.text).to.equal(201);
  });

  it('legitimate flows pass with auth on: submit, a native worker converts, a pull worker reports, the daemon shows it', async () => {
    const src = makeImage(dir, 'legit', 'vmdk', 8);
    const out = path.join(dir, 'out');
    const sub = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'legit-1', operation: 'convert', image: { path: src, format: 'vmdk' }, parameters: { output_dir: out } }, { Authorization: `Bearer ${K.submit}` });
    expect(sub.status).to.equal(201);
    const done = await until(async () => { const j = (await req<JobStatus>(gw.url, 'GET', '/jobs/legit-1', undefined, key('read'))).body; return j.is_terminal && j; }, 60000, 'legit-1 to finish');
    expect(done.state, done.error as string | undefined).to.equal('COMPLETED'); // chai reads a null message as none
    expect(existsSync(path.join(out, 'legit-1.qcow2'))).to.equal(true);
    // An HTTP pull worker with its worker key.
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'pull-1', operation: 'noop', requirements: { capabilities: ['lvm_tools'] } }, key('submit'));
    const w = { worker_id: 'puller', capabilities: ['lvm_tools'] };
    const got = await req<DequeueAnswer>(gw.url, 'POST', '/queue/dequeue', w, key('admin'));
    expect(got.body!.job_id).to.equal('pull-1');
    const lease = { worker_id: 'puller', lease_token: got.body!.lease_token };
    expect((await req(gw.url, 'POST', '/jobs/pull-1/events', { ...lease, phase: 'work', percentage: 50 }, key('admin'))).status).to.equal(201);
    expect((await req(gw.url, 'POST', '/jobs/pull-1/complete', { ...lease, result: { ok: true } }, key('admin'))).status).to.equal(200);
    const dj = await req<DaemonJob>(dm.url, 'GET', '/api/v1/jobs/pull-1', undefined, key('read'));
    expect(dj.body.status).to.equal('completed');
    // The daemon's own submission with a submit key.
    const ex = await req(dm.url, 'POST', '/jobs/submit', { vm_path: '/dc/vm/x/web', output_path: path.join(dir, 'export') }, key('submit'));
    expect(ex.status).to.equal(200);
  });

  describe('safe by default', () => {
    const bare = () => testEnv(redis.url, 'sec-bare');
    it('without keys: a wider listen address refuses to start, naming the setting; loopback is the default', async () => {
      const port = await freePort();
      const g = startProcess('services/gateway/main.ts', [], { ...bare(), GATEWAY_PORT: String(port), FERRY_HOST: '0.0.0.0' });
      procs.push(g);
      expect(await exitCode(g)).to.not.equal(0);
      expect(g.logs.join('')).to.include('FERRY_HOST=0.0.0.0').and.include('FERRY_INSECURE_NO_AUTH');
      const cfg = path.join(dir, 'bare.yaml');
      writeFileSync(cfg, '{}\n');
      const d = startProcess('services/daemon/main.ts', ['-addr', `0.0.0.0:${await freePort()}`, '--config', cfg], bare());
      procs.push(d);
      expect(await exitCode(d)).to.not.equal(0);
      expect(d.logs.join('')).to.include('-addr=0.0.0.0');
      const w = startProcess('services/worker/main.ts', ['--id', 'bare-w', '--metrics-port', String(await freePort())], { ...bare(), FERRY_HOST: '::' });
      procs.push(w);
      expect(await exitCode(w)).to.not.equal(0);
      expect(w.logs.join('')).to.include('FERRY_HOST=::');
      // Unset: 127.0.0.1, and it starts.
      const lp = await freePort();
      const { FERRY_HOST: _, ...noHost } = { ...bare(), GATEWAY_PORT: String(lp), LOG_LEVEL: 'info' } as Record<string, string>;
      const ok = startProcess('services/gateway/main.ts', [], noHost);
      procs.push(ok);
      await waitForPort(lp, 30000);
      await until(() => ok.logs.join('').includes('"host":"127.0.0.1"'), 10000, 'listening on loopback');
      expect((await req(`http://127.0.0.1:${lp}`, 'GET', '/jobs')).status).to.equal(200);
      await ok.stop();
    });
    it('FERRY_INSECURE_NO_AUTH=1 lets an operator listen widely without keys on purpose', async () => {
      const port = await freePort();
      const g = startProcess('services/gateway/main.ts', [], { ...bare(), GATEWAY_PORT: String(port), FERRY_HOST: '0.0.0.0', FERRY_INSECURE_NO_AUTH: '1' });
      procs.push(g);
      await waitForPort(port, 30000);
      expect((await req(`http://127.0.0.1:${port}`, 'GET', '/health')).status).to.equal(200);
      await g.stop();
    });
    it('a malformed keys file stops the start with the file and line', async () => {
      const bad = path.join(dir, 'bad-keys');
      writeFileSync(bad, `ok read ${K.read}\nbroken superuser ${K.admin}\n`);
      const g = startProcess('services/gateway/main.ts', [], { ...bare(), GATEWAY_PORT: String(await freePort()), FERRY_API_KEYS_FILE: bad });
      procs.push(g);
      expect(await exitCode(g)).to.not.equal(0);
      expect(g.logs.join('')).to.include('line 2').and.include('superuser');
    });
  });
});
