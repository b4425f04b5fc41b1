// Clients that just work: each item of issue 9 as a third-party client written against the seeds would meet it,
// against the real processes (redis, gateway, daemon, a noop worker, a notifier, a webhook receiver on
// loopback with the documented opt-in FERRY_WEBHOOK_ALLOW_LOOPBACK). `npm start`'s signals and static-file
// disconnects are in test/spine/cluster.test.ts.
import { expect } from 'chai';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { EventSource } from 'eventsource';
import WebSocket from 'ws';
import { TestRedis } from '../helpers/redis';
import { startDaemonProc, startGatewayProc, startProcess, startWorkerProc, testEnv, Proc } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DaemonError, JobApiError } from '../helpers/http';
import type { BatchSubmitted, DaemonJob, DaemonJobList, JobStatus, Schedule, ScheduleCreated, ScheduleStats, StoredEvent, Submitted, WebhookAdded, WebhookBody, WebhookList, WebhookTested, WsMessage } from '../helpers/api-types';

/** The daemon's answers carry the unknown fields it ignored (platform/http.ts unknownFields: 'warn'). */
interface Warnings { warnings?: string[] }

const APP = 'https://app.example.test';

describe('compat: clients that just work', function () {
  this.timeout(60000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-compat-'));
  const procs: Proc[] = [];
  let G: string;
  let D: string;
  let R: string;
  const received: { path: string; body: WebhookBody }[] = [];

  before(async function () {
    this.timeout(120000);
    await redis.start();
    const rx = http.createServer((rq, rs) => {
      let b = '';
      rq.on('data', (c) => (b += c));
      rq.on('end', () => { received.push({ path: rq.url!, body: JSON.parse(b || 'null') as WebhookBody }); rs.writeHead(200); rs.end('ok'); });
    });
    await new Promise<void>((r) => rx.listen(0, '127.0.0.1', r));
    procs.push({ stop: () => { rx.close(); return Promise.resolve(); } } as Proc);
    R = `http://127.0.0.1:${(rx.address() as AddressInfo).port}`;
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'webhooks:\n  backoff_ms: 100\nwebsocket:\n  status_interval_seconds: 5\n');
    const env = { ...testEnv(redis.url), FERRY_CONFIG: cfg, FERRY_HOST: '127.0.0.1', FERRY_WEBHOOK_ALLOW_LOOPBACK: '1' };
    // CORS: the daemon allows one origin; the gateway keeps the default (none).
    const [gw, daemon] = await Promise.all([startGatewayProc(env), startDaemonProc({ ...env, FERRY_CORS_ORIGINS: APP }, cfg)]);
    procs.push(gw, daemon, await startWorkerProc(env, 'compat-worker', [], ['--concurrency', '2']), startProcess('services/notifier/main.ts', [], env));
    G = gw.url;
    D = daemon.url;
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()));
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('the daemon API accepts unknown fields, ignores them and lists them in warnings; the job API refuses them naming the field', async () => {
    const sub = await req<BatchSubmitted>(D, 'POST', '/jobs/submit', { vm_path: '/dc1/vm/web-01', output_path: '/tmp/ferry-compat-export', client_version: '2.3', options: { remove_cdrom: true, turbo: 'yes' } });
    expect(sub.status, sub.text).to.equal(200);
    expect(sub.body.accepted).to.equal(1);
    expect(sub.body.warnings).to.have.length(2);
    expect(sub.body.warnings!.join(' ')).to.include('client_version').and.include('options.turbo');
    const job = (await req<DaemonJob>(D, 'GET', `/jobs/${sub.body.job_ids[0]}`)).body;
    expect(job.definition.vm_path).to.equal('/dc1/vm/web-01');
    expect(JSON.stringify((await req<JobStatus>(G, 'GET', `/jobs/${sub.body.job_ids[0]}`)).body.spec)).to.not.include('turbo');
    const batch = await req<BatchSubmitted>(D, 'POST', '/api/v1/jobs/submit', { jobs: [{ vm_path: '/dc1/vm/a', output_path: '/tmp/a', colour: 'red' }, { vm_path: 'bad', output_path: '/tmp/b' }] });
    expect(batch.body).to.include({ accepted: 1, rejected: 1 });
    expect(batch.body.warnings).to.deep.equal(['jobs[0].colour: unknown field, ignored']);
    const list = await req<DaemonJobList & Warnings>(D, 'GET', '/jobs?limit=5&sort=desc');
    expect(list.status).to.equal(200);
    expect(list.body.warnings).to.deep.equal(['sort: unknown field, ignored']);
    // A real error still wins over a warning.
    const bad = await req<DaemonError>(D, 'POST', '/webhooks', { url: 'not a url', colour: 'red' });
    expect(bad.status).to.equal(400);
    expect(bad.body.error).to.include('url').and.not.include('colour');
    const gw = await req<JobApiError>(G, 'POST', '/jobs', { operation: 'noop', client_version: '2.3' });
    expect(gw.status).to.equal(400);
    expect(gw.body.error.message).to.include('client_version');
    expect(gw.body.error.fields!.map((f) => f.field)).to.deep.equal(['client_version']);
  });

  it("POST /webhooks/test takes the seed's {url, event: test} as well as an index", async () => {
    const add = await req<WebhookAdded>(D, 'POST', '/webhooks', { url: `${R}/seed-test`, events: ['job.failed'] });
    expect(add.status, add.text).to.equal(201);
    const t = await req<WebhookTested>(D, 'POST', '/webhooks/test', { url: `${R}/seed-test`, event: 'test' });
    expect(t.status, t.text).to.equal(200);
    expect(t.body.message).to.be.a('string');
    await until(() => received.some((x) => x.path === '/seed-test' && x.body.event === 'webhook.test'), 15000, 'the test delivery');
    const byIndex = await req(D, 'POST', '/webhooks/test', { index: add.body.webhook.index });
    expect(byIndex.status).to.equal(200);
    await until(() => received.filter((x) => x.path === '/seed-test').length === 2, 15000, 'the second test delivery');
    const unknown = await req<DaemonError>(D, 'POST', '/webhooks/test', { url: `${R}/never-added`, event: 'test' });
    expect(unknown.status).to.equal(404);
    expect(unknown.body.error).to.include('url');
    expect((await req<DaemonError>(D, 'POST', '/webhooks/test', { url: `${R}/seed-test`, event: 'job.exploded' })).body.error).to.include('event');
  });

  it('GET /schedules/stats has disabled_schedules; GET /webhooks items leave headers out and the list has timestamp', async () => {
    for (const [name, enabled] of [['on', true], ['off', false]] as const) {
      expect((await req(D, 'POST', '/schedules', { name, schedule: '0 3 * * *', enabled, job_template: { operation: 'noop' } })).status).to.equal(201);
    }
    const st = (await req<ScheduleStats>(D, 'GET', '/schedules/stats')).body;
    expect(st).to.include({ total_schedules: 2, enabled_schedules: 1, disabled_schedules: 1 });
    for (const k of ['total_runs', 'successful_runs', 'failed_runs'] as const) expect(st[k], k).to.be.a('number');
    expect((await req(D, 'POST', '/webhooks', { url: `${R}/with-headers`, events: ['job.completed'], headers: { 'X-Tenant': 'blue' } })).status).to.equal(201);
    const hooks = (await req<WebhookList>(D, 'GET', '/webhooks')).body;
    expect(Number.isNaN(Date.parse(hooks.timestamp)), 'a parseable timestamp').to.equal(false);
    expect(hooks.total).to.equal(hooks.webhooks.length);
    for (const w of hooks.webhooks) expect(w).to.not.have.property('headers');
    expect(hooks.webhooks.find((w) => w.url.endsWith('/with-headers'))!.header_names).to.deep.equal(['X-Tenant']);
  });

  it('a schedule job_template without source.type or destination.type gets vsphere and kvm', async () => {
    const r = await req<ScheduleCreated>(D, 'POST', '/schedules', { name: 'nightly-migration', schedule: '0 2 * * *', job_template: { vm_path: '/dc1/vm/db-01', source: { datacenter: 'dc1' }, destination: {} } });
    expect(r.status, r.text).to.equal(201);
    const s = (await req<Schedule>(D, 'GET', `/schedules/${r.body.schedule.id}`)).body;
    expect(s.job_template!.source).to.include({ type: 'vsphere', datacenter: 'dc1' });
    expect(s.job_template!.destination).to.include({ type: 'kvm' });
  });

  it('webhook events accept the underscore spelling (job_completed) and deliver the dotted event', async () => {
    const add = await req<WebhookAdded>(D, 'POST', '/webhooks', { url: `${R}/alias`, events: ['job_completed', 'job_started'] });
    expect(add.status, add.text).to.equal(201);
    expect(add.body.webhook.events).to.deep.equal(['job.completed', 'job.started']);
    expect((await req<DaemonError>(D, 'POST', '/webhooks', { url: `${R}/x`, events: ['job_exploded'] })).body.error).to.include('events');
    await until(async () => (await req<WebhookList>(D, 'GET', '/webhooks')).body.webhooks.some((w) => w.url.endsWith('/alias')), 5000, 'listed');
    await new Promise((r) => setTimeout(r, 1100)); // the notifier re-reads the webhook list at most once a second
    expect((await req(G, 'POST', '/jobs?queue=true', { job_id: 'alias-job', operation: 'noop' })).status).to.equal(201);
    await until(() => received.some((x) => x.path === '/alias' && x.body.event === 'job.completed' && x.body.data.job_id === 'alias-job'), 20000, 'the job.completed delivery');
  });

  it('a wrong method on a known path is 405 with Allow, on both APIs', async () => {
    for (const [base, method, p, allow] of [
      [D, 'GET', '/jobs/submit', 'POST'], [D, 'GET', '/api/v1/jobs/submit', 'POST'], [D, 'GET', '/jobs/cancel', 'POST'], [D, 'DELETE', '/health', 'GET, HEAD'],
      [D, 'PUT', '/jobs/query', 'GET, HEAD, POST'], [G, 'GET', '/queue/dequeue', 'POST'], [G, 'PUT', '/jobs', 'GET, HEAD, POST'], [G, 'PATCH', '/jobs/x', 'DELETE, GET, HEAD'],
    ] as const) {
      const r = await req(base, method, p);
      expect(r.status, `${method} ${p}: ${r.text}`).to.equal(405);
      expect(r.headers.get('allow'), `${method} ${p}`).to.equal(allow);
      expect(r.text).to.include(method);
    }
    expect((await req(D, 'GET', '/jobs/no-such-job')).status).to.equal(404);
  });

  it('POST /jobs answers the state the job really has and a true position', async () => {
    // A worker is idle and takes jobs at once: an answer may come after its claim.
    const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => req<Submitted>(G, 'POST', '/jobs?queue=true', { job_id: `pos-${i}`, operation: 'noop', parameters: { sleep_ms: 300 } })));
    for (const a of answers) {
      expect(a.status).to.equal(201);
      const { state, queue_position } = a.body;
      const history = (await req<JobStatus>(G, 'GET', `/jobs/${a.body.job_id}`)).body.state_history.map((h) => h.state);
      expect(history, a.text).to.include(state);
      if (state === 'QUEUED') expect(queue_position, a.text).to.be.at.least(1);
      else expect(queue_position, a.text).to.equal(0);
    }
    expect(answers.some((a) => a.body.queue_position > 1), 'some waited behind others').to.equal(true);
    // Nobody can run this one: it waits, first of its queue.
    const waiting = await req(G, 'POST', '/jobs?queue=true', { job_id: 'pos-waiting', operation: 'noop', requirements: { capabilities: ['lvm_tools'] } });
    expect(waiting.body).to.include({ state: 'QUEUED', queue_position: 1 });
  });

  it('SSE: complete carries an id, and a client reconnecting after it gets 204 and stops', async () => {
    expect((await req(G, 'POST', '/jobs?queue=true', { job_id: 'sse-done', operation: 'noop', parameters: { steps: 2 } })).status).to.equal(201);
    await until(async () => (await req<JobStatus>(G, 'GET', '/jobs/sse-done')).body.state === 'COMPLETED', 20000, 'sse-done to finish');
    for (const base of [G, D]) {
      const es = new EventSource(`${base}/jobs/sse-done/events/stream`);
      const seen: string[] = [];
      let completeId = '';
      es.addEventListener('progress', (e) => seen.push(e.lastEventId));
      es.addEventListener('complete', (e) => { completeId = e.lastEventId; });
      // EventSource reconnects after the stream ends (retry: 2000) with Last-Event-ID = the complete's id; the
      // 204 it gets makes it stop for good (readyState CLOSED).
      await until(() => es.readyState === EventSource.CLOSED, 15000, `${base}: the EventSource to stop`);
      expect(completeId, base).to.match(/^\d+-\d+$/);
      expect(seen.length, base).to.equal(4);
      expect(seen.every((id) => id < completeId || id.length < completeId.length), base).to.equal(true);
      const again = await fetch(`${base}/jobs/sse-done/events/stream`, { headers: { 'Last-Event-ID': completeId } });
      expect(again.status, base).to.equal(204);
      // One that missed `complete` (it had only the last progress event) gets it.
      const missed = await fetch(`${base}/jobs/sse-done/events/stream`, { headers: { 'Last-Event-ID': seen[seen.length - 1] } });
      expect(missed.status).to.equal(200);
      expect(await missed.text()).to.include(`event: complete\nid: ${completeId}`);
    }
  });

  it('WebSocket job_update: one message per real change, in order, none lost (a fast job shows running), none doubled', async () => {
    const ws = new WebSocket(`${D.replace('http', 'ws')}/ws`);
    const updates: DaemonJob[] = [];
    ws.on('message', (d: Buffer) => { const m = JSON.parse(d.toString()) as WsMessage; if (m.type === 'job_update' && String((m.data as DaemonJob).id).startsWith('ws-fast')) updates.push(m.data as DaemonJob); });
    await new Promise((r) => ws.once('open', r));
    for (let i = 0; i < 3; i++) expect((await req(G, 'POST', '/jobs?queue=true', { job_id: `ws-fast-${i}`, operation: 'noop', parameters: { steps: 2 } })).status).to.equal(201);
    await until(() => ['ws-fast-0', 'ws-fast-1', 'ws-fast-2'].every((id) => updates.some((u) => u.id === id && u.status === 'completed')), 20000, 'the jobs to complete on the WebSocket');
    await new Promise((r) => setTimeout(r, 300)); // nothing more may follow
    ws.close();
    for (let i = 0; i < 3; i++) {
      const mine = updates.filter((u) => u.id === `ws-fast-${i}`);
      const states = mine.map((u) => u.state).filter((s, j, a) => j === 0 || s !== a[j - 1]);
      expect(states, `ws-fast-${i}`).to.deep.equal(['QUEUED', 'ASSIGNED', 'RUNNING', 'COMPLETED']);
      // Progress events: initialization 0, work 50, work 100, completed 100, each once.
      const running = mine.filter((u) => u.status === 'running').map((u) => `${u.progress.phase}:${u.progress.percent_complete}`);
      expect(running, `ws-fast-${i}`).to.include.members(['initialization:0', 'work:50', 'work:100', 'completed:100']);
      for (let j = 1; j < mine.length; j++) {
        const { updated_at: _a, ...x } = mine[j] as Record<string, unknown>;
        const { updated_at: _b, ...y } = mine[j - 1] as Record<string, unknown>;
        expect(x, `ws-fast-${i} message ${j} repeats the one before`).to.not.deep.equal(y);
      }
      const history = (await req<JobStatus>(G, 'GET', `/jobs/ws-fast-${i}`)).body.state_history.length;
      const events = (await req<StoredEvent[]>(G, 'GET', `/jobs/ws-fast-${i}/events`)).body.length;
      // CREATED and VALIDATED are passed inside the submission (one change, QUEUED, is published for them).
      expect(mine.length, `ws-fast-${i}: one message per change: ${mine.map((u) => `${u.state}/${u.progress.phase}:${u.progress.percent_complete}`).join(" ")}`).to.equal(history - 2 + events);
    }
  });

  it('CORS: allowed origins from FERRY_CORS_ORIGINS, none by default, preflight answered', async () => {
    const pre = await fetch(`${D}/jobs/submit`, { method: 'OPTIONS', headers: { Origin: APP, 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'content-type, x-api-key' } });
    expect(pre.status).to.equal(204);
    expect(pre.headers.get('access-control-allow-origin')).to.equal(APP);
    expect(pre.headers.get('access-control-allow-methods')).to.include('POST');
    expect(pre.headers.get('access-control-allow-headers')!.toLowerCase()).to.include('x-api-key').and.include('content-type');
    const get = await fetch(`${D}/status`, { headers: { Origin: APP } });
    expect(get.headers.get('access-control-allow-origin')).to.equal(APP);
    expect(get.headers.get('vary')).to.include('Origin');
    const other = await fetch(`${D}/jobs/submit`, { method: 'OPTIONS', headers: { Origin: 'https://evil.example', 'Access-Control-Request-Method': 'POST' } });
    expect(other.status).to.equal(403);
    expect(other.headers.get('access-control-allow-origin')).to.equal(null);
    expect(((await other.json()) as DaemonError).error).to.include('Origin');
    // The gateway has no FERRY_CORS_ORIGINS: no origin is allowed.
    const gw = await fetch(`${G}/jobs`, { method: 'OPTIONS', headers: { Origin: APP, 'Access-Control-Request-Method': 'POST' } });
    expect(gw.status).to.equal(403);
    expect((await fetch(`${G}/jobs`, { headers: { Origin: APP } })).headers.get('access-control-allow-origin')).to.equal(null);
  });
});
