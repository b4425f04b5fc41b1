// The daemon API (8080), schedules and webhooks against real processes: a redis-server, the gateway (8000), a
// worker, the daemon, two scheduler processes and a notifier, plus a real HTTP receiver for webhooks.
import { expect } from 'chai';
import http from 'node:http';
import { createHmac } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import IORedis from 'ioredis';
import { TestRedis, freePort } from '../helpers/redis';
import { startDaemonProc, startGatewayProc, startProcess, startWorkerProc, testEnv, Proc } from '../helpers/procs';
import { openWs } from '../helpers/ws';
import { postOversized, req, until } from '../helpers/http';
import type { AddressInfo } from 'node:net';
import type { DaemonError } from '../helpers/http';
import type { BatchSubmitted, CancelEach, DaemonJob, DaemonJobList, DeliveryLog, JobStatus, MigrationSubmitted, ScheduleCreated, ScheduleList, ScheduleStats, ScheduleView, Triggered, WebhookAdded, WebhookBody, WebhookList, WebhookTested, WsMessage, WsTicket } from '../helpers/api-types';
import type { statusReports } from '../../services/daemon/daemon-metrics';
import type { progressView } from '../../orchestration/daemon-views';

/** GET /status. */
type DaemonStatus = Awaited<ReturnType<ReturnType<typeof statusReports>['status']>>;
/** GET /jobs/:id/progress. */
type JobProgress = Awaited<ReturnType<typeof progressView>>;
/** POST /jobs/cancel with a status only. */
interface CancelAll { message: string; count: number; failed: string[]; errors: Record<string, string> }

const SECRET_PASSWORD = 'hunter2-very-secret-pw';
const HOOK_SECRET = 'webhook-signing-secret';
const API_KEY = 'test-api-key-0123456789';
const PREFIXES = ['', '/api/v1'];

describe('daemon API (8080), scheduler and notifier', function () {
  this.timeout(60000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-daemon-'));
  const procs: Proc[] = [];
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let daemon: Awaited<ReturnType<typeof startDaemonProc>>;
  let B: string;
  let rc: IORedis;
  let receiver: http.Server;
  let R: string;
  const received: { path: string; headers: http.IncomingHttpHeaders; body: string; at: number }[] = [];
  let flakyCalls = 0;

  before(async function () {
    this.timeout(120000);
    await redis.start();
    rc = new IORedis(redis.url);
    receiver = http.createServer((rq, rs) => {
      let body = '';
      rq.on('data', (c) => (body += c));
      rq.on('end', () => {
        received.push({ path: rq.url!, headers: rq.headers, body, at: Date.now() });
        if (rq.url === '/flaky' && ++flakyCalls === 1) { rs.writeHead(500); rs.end('boom'); return; }
        if (rq.url === '/slow') { setTimeout(() => { rs.writeHead(200); rs.end('late'); }, 2500); return; }
        rs.writeHead(200); rs.end('ok');
      });
    });
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
    R = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 2h\n  parallel_downloads: 3\nmetrics:\n  enabled: true\nwebhooks:\n  allow_loopback: true\n  backoff_ms: 200\nwebsocket:\n  status_interval_seconds: 2\n');
    const env = { ...testEnv(redis.url), FERRY_SECRET_KEY: 'test-secret-key', FERRY_CONFIG: cfg, FERRY_HOST: '127.0.0.1' };
    gw = await startGatewayProc(env);
    procs.push(gw);
    procs.push(await startWorkerProc(env, 'noop-worker', ['vsphere_access', 'img_tool', 'mount_operations', 'libvirt_access'], ['--concurrency', '4']));
    daemon = await startDaemonProc(env, cfg);
    procs.push(daemon);
    B = daemon.url;
    procs.push(startProcess('services/scheduler/main.ts', [], env), startProcess('services/scheduler/main.ts', [], env), startProcess('services/notifier/main.ts', [], env));
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()));
    rc?.disconnect();
    receiver?.close();
    await redis.stop();
  });

  const gwJob = async (id: string, params: Record<string, unknown>) => {
    const r = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: id, operation: 'noop', parameters: params });
    expect(r.status, r.text).to.equal(201);
    return id;
  };
  const dJob = async (id: string) => (await req<DaemonJob>(B, 'GET', `/jobs/${id}`)).body;

  describe('both path forms, errors, docs', () => {
    for (const p of PREFIXES) {
      it(`answers at "${p || '/'}" for health, status, lists, docs and errors`, async () => {
        // Readiness: Redis answers; the libvirt connection is shown, not judged (this stack has no libvirtd).
        const h = await req<{ status: string; redis: string; libvirt: { uri: string; state: string } }>(B, 'GET', `${p}/health`);
        expect(h.status, h.text).to.equal(200);
        expect(h.body).to.include({ status: 'ok', redis: 'reachable' });
        expect(h.body.libvirt.uri).to.be.a('string');
        expect(h.body.libvirt.state).to.be.oneOf(['unknown', 'reachable', 'unreachable']);
        const st = await req<DaemonStatus>(B, 'GET', `${p}/status`);
        expect(st.body.version).to.match(/^\d+\.\d+\.\d+$/);
        expect(st.body).to.include.keys('uptime', 'total_jobs', 'running_jobs', 'completed_jobs', 'failed_jobs', 'worker_count', 'active_workers', 'timestamp');
        for (const path of ['/jobs', '/jobs/query', '/schedules', '/schedules/stats', '/webhooks']) expect((await req(B, 'GET', p + path)).status, path).to.equal(200);
        const nf = await req<DaemonError>(B, 'GET', `${p}/jobs/no-such-job`);
        expect(nf.status).to.equal(404);
        expect(nf.body).to.have.keys('error', 'status', 'timestamp');
        expect(nf.body.status).to.equal(404);
        const m = await req<DaemonError>(B, 'DELETE', `${p}/jobs/submit`);
        expect(m.status).to.equal(405);
        expect(m.body.status).to.equal(405);
        const bad = await req<DaemonError>(B, 'POST', `${p}/jobs/submit`, '{"vm_path": ', { 'content-type': 'application/json' });
        expect(bad.status).to.equal(400);
        expect(bad.body.error).to.match(/malformed/);
        const yml = await req(B, 'GET', `${p}/openapi.yaml`);
        expect(yml.status).to.equal(200);
        expect(yml.text).to.match(/^openapi: 3/);
        expect(yml.text).to.include('/jobs/submit').and.include('vm_path').and.include('/schedules/{id}/trigger');
        const ui = await req(B, 'GET', `${p}/swagger-ui/`);
        expect(ui.status).to.equal(200);
        expect(ui.text).to.include('swagger-ui-bundle.js');
        expect((await req(B, 'GET', `${p}/swagger-ui/swagger-initializer.js`)).text).to.include('/openapi.yaml');
        expect((await req(B, 'GET', `${p}/swagger-ui/swagger-ui-bundle.js`)).status).to.equal(200);
      });
    }

    it('serves /metrics with request counts by route template and svc_jobs_total', async () => {
      await req(B, 'GET', '/jobs/abc');
      const m = await req(B, 'GET', '/metrics');
      expect(m.text).to.match(/svc_api_requests_total\{method="GET",path="\/jobs\/:id",status="404"/);
      expect(m.text).to.include('svc_api_request_duration_seconds_bucket');
      expect(m.text).to.match(/svc_jobs_total\{status="pending"/);
    });

    it('refuses a config file with a bad duration, naming the key', async () => {
      const bad = path.join(dir, 'bad.yaml');
      writeFileSync(bad, 'daemon:\n  job_timeout: soon\n');
      const p = startProcess('services/daemon/main.ts', ['--config', bad], { ...testEnv(redis.url) });
      const code = await new Promise<number | null>((r) => p.proc.once('exit', (c) => r(c)));
      expect(code).to.equal(2);
      expect(p.logs.join('')).to.include('daemon.job_timeout').and.include('soon');
    });
  });

  describe('jobs', () => {
    let exportId: string;
    it('accepts shape A as JSON; without a manager (no manager_url, no GOVC_URL) it fails with a clear reason; the password is nowhere in Redis, responses or logs', async () => {
      const r = await req<BatchSubmitted>(B, 'POST', '/jobs/submit', { name: 'web', vm_path: '/dc1/vm/prod/web-01', output_path: '/srv/export', password: SECRET_PASSWORD, username: 'admin', options: { remove_cdrom: true } });
      expect(r.status, r.text).to.equal(200);
      expect(r.body).to.include({ accepted: 1, rejected: 0 });
      exportId = r.body.job_ids[0];
      const j = await dJob(exportId);
      expect(j.definition).to.include({ id: exportId, name: 'web', vm_path: '/dc1/vm/prod/web-01', output_path: '/srv/export' });
      const done = await until(async () => { const v = await dJob(exportId); return v.status === 'failed' && v; }, 20000, 'export job to fail');
      expect(done.error).to.include('no vSphere manager given');
      const g = await req<JobStatus>(gw.url, 'GET', `/jobs/${exportId}`);
      expect(g.body.state).to.equal('FAILED');
      expect(g.body.spec.parameters).to.include({ parallel_downloads: 3, credentials: 'job', remove_cdrom: true });
      expect(g.body.spec.execution_policy.timeout_seconds).to.equal(7200);
      expect(JSON.stringify(g.body)).not.to.include(SECRET_PASSWORD);
      // Every string in Redis: keys, strings, hashes, lists, streams.
      for (const key of await rc.keys('*')) {
        const t = await rc.type(key);
        const v = t === 'string' ? await rc.get(key) : t === 'hash' ? JSON.stringify(await rc.hgetall(key)) : t === 'list' ? JSON.stringify(await rc.lrange(key, 0, -1)) : t === 'stream' ? JSON.stringify(await rc.xrange(key, '-', '+')) : t === 'zset' ? JSON.stringify(await rc.zrange(key, 0, -1)) : '';
        expect(String(v), key).not.to.include(SECRET_PASSWORD);
      }
      expect(await rc.get(`ferry:job:${exportId}:credentials`)).to.match(/^v1:/);
      for (const p of procs) expect(p.logs.join('')).not.to.include(SECRET_PASSWORD);
    });

    it('accepts shape B as YAML and answers {job_id, message}', async () => {
      const y = 'vm_path: /dc1/vm/db/pg-01\nsource:\n  type: vsphere\n  datacenter: dc1\ndestination:\n  type: kvm\n  virt_uri: qemu:///system\noptions:\n  network_mapping:\n    VM Network: br0\n';
      for (const ct of ['application/x-yaml', 'text/yaml']) {
        const r = await req<MigrationSubmitted>(B, 'POST', '/api/v1/jobs/submit', y, { 'content-type': ct });
        expect(r.status, r.text).to.equal(200);
        expect(r.body.job_id).to.be.a('string');
        expect(r.body.message).to.include('pg-01');
        expect((await dJob(r.body.job_id)).definition).to.include({ kind: 'migration', vm_path: '/dc1/vm/db/pg-01' });
      }
      const bad = await req<DaemonError>(B, 'POST', '/jobs/submit', 'vm_path: [unclosed', { 'content-type': 'application/x-yaml' });
      expect(bad.status).to.equal(400);
      expect(bad.body.error).to.match(/^body: malformed YAML/);
      expect(bad.body.fields![0].field).to.equal('body');
      // The same reader and limit as JSON bodies and the gateway's: 413 naming body, whether declared or streamed.
      for (const [type, how] of [['application/x-yaml', 'streamed'], ['application/json', 'declared'], ['application/json', 'streamed']] as const) {
        const big = await postOversized<DaemonError>(B, '/api/v1/jobs/submit', type, how);
        expect(big.status, `${type} ${how}`).to.equal(413);
        expect(big.body).to.include({ error: 'body: larger than 2 MiB', status: 413 });
        expect(big.body.fields).to.deep.equal([{ field: 'body', message: 'larger than 2 MiB' }]);
      }
    });

    it('takes a batch (JSON and YAML) with a bad entry: the good ones are accepted, the bad one named', async () => {
      const r = await req<BatchSubmitted>(B, 'POST', '/jobs/submit', { jobs: [{ vm_path: '/dc/vm/a/one', output_path: '/srv/o' }, { vm_path: '/dc/vm/a/two' }, { vm_path: '/dc/vm/a/three', source: { type: 'vsphere' }, destination: { type: 'kvm' } }] });
      expect(r.status).to.equal(200);
      expect(r.body).to.include({ accepted: 2, rejected: 1 });
      expect(r.body.job_ids).to.have.length(2);
      expect(r.body.errors[0].index).to.equal(1);
      expect(r.body.errors[0].error).to.include('output_path');
      const y = await req<BatchSubmitted>(B, 'POST', '/jobs/submit', 'jobs:\n  - vm_path: /dc/vm/y/one\n    output_path: /srv/o\n  - output_path: /srv/o\n', { 'content-type': 'application/x-yaml' });
      expect(y.body).to.include({ accepted: 1, rejected: 1 });
      expect(y.body.errors[0].error).to.include('vm_path');
    });

    it('answers 400 naming the field for a bad single job, never 500', async () => {
      const r = await req<DaemonError>(B, 'POST', '/jobs/submit', { vm_path: '/dc/vm/x', output_path: 'relative' });
      expect(r.status).to.equal(400);
      expect(r.body.error).to.include('output_path');
      const e = await req(B, 'POST', '/jobs/submit', {});
      expect(e.status).to.equal(400);
      const n = await req<DaemonError>(B, 'POST', '/jobs/submit', { vm_path: '/dc/vm/x', output_path: '/o', options: { parallel_downloads: 0 } });
      expect(n.status).to.equal(400);
      expect(n.body.error).to.include('parallel_downloads');
    });

    it('queries by status, ids and pages; GET /jobs/query?status=', async () => {
      for (const p of PREFIXES) {
        const q = await req<DaemonJobList>(B, 'POST', `${p}/jobs/query`, { status: 'failed' });
        expect(q.body.jobs.map((j) => j.id)).to.include(exportId);
        expect(q.body.jobs.every((j) => j.status === 'failed')).to.equal(true);
        const g = await req<DaemonJobList>(B, 'GET', `${p}/jobs/query?status=failed,pending`);
        expect(g.body.jobs.map((j) => j.id)).to.include(exportId);
        const ids = await req<DaemonJobList>(B, 'POST', `${p}/jobs/query`, { job_ids: [exportId, 'missing-one'] });
        expect(ids.body.jobs).to.have.length(1);
        expect(ids.body.not_found).to.deep.equal(['missing-one']);
        const page = await req<DaemonJobList>(B, 'GET', `${p}/jobs?limit=2&offset=1`);
        expect(page.body.jobs).to.have.length(2);
        expect(page.body).to.include({ limit: 2, offset: 1 });
        expect(page.body.total).to.be.greaterThan(3);
      }
      const bad = await req<DaemonError>(B, 'POST', '/jobs/query', { status: 'sleeping' });
      expect(bad.status).to.equal(400);
      expect(bad.body.error).to.include('status');
      expect((await req(B, 'GET', '/jobs/query?status=nope')).status).to.equal(400);
    });

    it('cancels by id with per-id results, and every pending job by status', async () => {
      const id = await gwJob('d-cancel-1', { sleep_ms: 20000, steps: 20 });
      await until(async () => (await dJob(id)).status === 'running', 15000, 'running');
      const r = await req<CancelEach>(B, 'POST', '/jobs/cancel', { job_ids: [id, 'no-such-id'] });
      expect(r.body.cancelled).to.deep.equal([id]);
      expect(r.body.failed).to.deep.equal(['no-such-id']);
      expect(r.body.errors['no-such-id']).to.equal('job not found');
      expect((await dJob(id)).status).to.equal('cancelled');
      const again = await req<CancelEach>(B, 'POST', '/api/v1/jobs/cancel', { job_ids: [id] });
      expect(again.body.errors[id]).to.include('already');
      await req(gw.url, 'POST', '/jobs', { job_id: 'd-validated', operation: 'noop' });
      const all = await req<CancelAll>(B, 'POST', '/jobs/cancel', { status: 'pending' });
      expect(all.body.count).to.be.greaterThan(0);
      expect((await dJob('d-validated')).status).to.equal('cancelled');
      expect((await req(B, 'POST', '/jobs/cancel', {})).status).to.equal(400);
    });

    it('reports progress with a smoothed rate and a finite ETA, and no ETA without samples', async () => {
      const id = await gwJob('d-progress', { sleep_ms: 5000, steps: 20 });
      const p = await until(async () => { const r = await req<JobProgress>(B, 'GET', `/jobs/${id}/progress`); return r.body.percent_complete >= 30 && r.body; }, 15000, 'progress');
      expect(p.rate_percent_per_second).to.be.greaterThan(5).and.lessThan(50);
      expect(p.eta_seconds).to.be.a('number').and.greaterThan(0).and.lessThan(10);
      expect(p.eta).to.be.a('string');
      expect(p.samples).to.be.greaterThan(2);
      await until(async () => (await dJob(id)).status === 'completed', 15000, 'completed');
      const done = (await req<JobProgress>(B, 'GET', `/api/v1/jobs/${id}/progress`)).body;
      expect(done).to.include({ percent_complete: 100, eta_seconds: 0 });
      await req(gw.url, 'POST', '/jobs', { job_id: 'd-idle', operation: 'noop' });
      const idle = (await req<JobProgress>(B, 'GET', '/jobs/d-idle/progress')).body;
      expect(idle.eta_seconds).to.equal(null);
      expect(idle.rate_percent_per_second).to.equal(null);
      expect((await req(B, 'GET', '/jobs/nope/progress')).status).to.equal(404);
    });
  });

  describe('schedules', () => {
    it('creates in all three forms, validates cron and time zone, and supports get/put/delete/enable/disable', async () => {
      const a = await req<ScheduleCreated>(B, 'POST', '/schedules', { id: 'nightly', name: 'nightly', description: 'd', schedule: '0 2 * * *', timezone: 'Europe/Paris', job_template: { vm_path: '/dc/vm/f/a', source: { type: 'vsphere' }, destination: { type: 'kvm' } } });
      expect(a.status, a.text).to.equal(201);
      expect(a.body.schedule).to.include({ id: 'nightly', enabled: true, run_count: 0 });
      expect(a.body.schedule.next_run).to.match(/T0[01]:00:00/);
      const b = await req(B, 'POST', '/api/v1/schedules', { name: 'form2', cron: '*/5 * * * *', job_definition: { vm_path: '/dc/vm/f/b', output_path: '/o' } });
      expect(b.status, b.text).to.equal(201);
      const c = await req<ScheduleCreated>(B, 'POST', '/schedules/create', { name: 'form3', cron_expr: '30 * * * *' });
      expect(c.status, c.text).to.equal(201);
      for (const [body, word] of [[{ name: 'x', schedule: '61 * * * *' }, 'cron'], [{ name: 'x', schedule: '* * * * * * *' }, 'fields'], [{ name: 'x', schedule: '* * * * *', timezone: 'Mars/Base' }, 'time zone'], [{ name: 'x' }, 'schedule'], [{ name: 'x', schedule: '* * * * *', job_template: { vm_path: '/dc/vm/a', output_path: '/o', password: 'p' } }, 'password']] as const) {
        const r = await req<DaemonError>(B, 'POST', '/schedules', body);
        expect(r.status, JSON.stringify(body)).to.equal(400);
        expect(r.body.error).to.include(word);
      }
      for (const p of PREFIXES) {
        expect((await req<ScheduleView>(B, 'GET', `${p}/schedules/nightly`)).body.id).to.equal('nightly');
        expect((await req<ScheduleCreated>(B, 'PUT', `${p}/schedules/nightly`, { name: 'renamed' + p.length })).body.message).to.be.a('string');
        expect((await req<ScheduleCreated>(B, 'POST', `${p}/schedules/nightly/disable`)).body.schedule.enabled).to.equal(false);
        expect((await req<ScheduleView>(B, 'GET', `${p}/schedules/nightly`)).body.next_run).to.equal(null);
        expect((await req<ScheduleCreated>(B, 'POST', `${p}/schedules/nightly/enable`)).body.schedule.enabled).to.equal(true);
      }
      expect((await req(B, 'PUT', '/schedules/nightly', { schedule: 'bad cron x y' })).status).to.equal(400);
      expect((await req(B, 'GET', '/schedules/none')).status).to.equal(404);
      expect((await req(B, 'DELETE', `/schedules/${c.body.schedule.id}`)).status).to.equal(200);
      expect((await req(B, 'GET', `/schedules/${c.body.schedule.id}`)).status).to.equal(404);
      const list = await req<ScheduleList>(B, 'GET', '/schedules');
      expect(list.body.total).to.equal(list.body.schedules.length);
    });

    it('fires a cron every second with two scheduler processes: each run once, outcomes counted', async () => {
      const ws = openWs<WsMessage<Record<string, unknown>>>(`${B.replace('http', 'ws')}/ws`);
      await ws.opened;
      const r = await req(B, 'POST', '/schedules', { id: 'every-second', name: 'every second', schedule: '* * * * * *', job_template: { operation: 'noop' } });
      expect(r.status, r.text).to.equal(201);
      await new Promise((res) => setTimeout(res, 5200));
      await req(B, 'POST', '/schedules/every-second/disable');
      await new Promise((res) => setTimeout(res, 1200));
      const jobs = (await req<DaemonJobList>(B, 'POST', '/jobs/query', { limit: 1000 })).body.jobs.filter((j) => j.schedule_id === 'every-second');
      const iters = jobs.map((j) => Number(j.id.split('-').pop()));
      expect(new Set(iters).size).to.equal(jobs.length);
      expect(jobs.length).to.be.within(3, 7);
      const secs = iters.map((t: number) => Math.floor(t / 1000));
      expect(new Set(secs).size, 'one run per second').to.equal(secs.length);
      const s = await until(async () => { const v = (await req<ScheduleView>(B, 'GET', '/schedules/every-second')).body; return v.successful_runs === jobs.length && v; }, 15000, 'outcomes counted');
      expect(s.run_count).to.equal(jobs.length);
      expect(s.failed_runs).to.equal(0);
      expect(s.last_run).to.be.a('string');
      const stats = (await req<ScheduleStats>(B, 'GET', '/api/v1/schedules/stats')).body;
      expect(stats.successful_runs).to.be.at.least(jobs.length);
      const evs = ws.msgs.filter((m) => m.type === 'schedule_event' && m.data.schedule_id === 'every-second');
      expect(evs.filter((m) => m.data.event === 'triggered')).to.have.length(jobs.length);
      expect(evs.filter((m) => m.data.event === 'completed').length).to.equal(jobs.length);
      ws.ws.close();
    });

    it('trigger runs the template once now; a failing run counts as failed', async () => {
      const t = await req<Triggered>(B, 'POST', '/api/v1/schedules/nightly/trigger');
      expect(t.status).to.equal(200);
      expect(t.body.job_id).to.match(/^sched-nightly-m/);
      const j = await until(async () => { const v = await dJob(t.body.job_id!); return v.status === 'failed' && v; }, 15000, 'failed run');
      expect(j.schedule_id).to.equal('nightly');
      await until(async () => (await req<ScheduleView>(B, 'GET', '/schedules/nightly')).body.failed_runs === 1, 10000, 'failed run counted');
      expect((await req(B, 'POST', '/schedules/none/trigger')).status).to.equal(404);
    });
  });

  describe('webhooks', () => {
    it('refuses private targets and bad input', async () => {
      for (const url of ['http://10.1.2.3/hook', 'http://192.168.0.5/x', 'http://[fd00::1]/x']) {
        const r = await req<DaemonError>(B, 'POST', '/webhooks', { url, events: ['job.completed'] });
        expect(r.status, url).to.equal(400);
        expect(r.body.error).to.include('private');
      }
      expect((await req<DaemonError>(B, 'POST', '/webhooks', { url: 'ftp://x/y' })).body.error).to.include('url');
      expect((await req<DaemonError>(B, 'POST', '/webhooks', { url: `${R}/ok`, events: ['job.exploded'] })).body.error).to.include('events');
    });

    it('delivers signed job events with headers, retries after a 500, times out a slow target, and logs every delivery', async () => {
      const ok = await req<WebhookAdded>(B, 'POST', '/webhooks', { url: `${R}/ok`, events: ['job.created', 'job.started', 'job.completed'], headers: { 'X-Custom': 'yes', Authorization: 'Bearer abc' }, secret: HOOK_SECRET, timeout: 5, retry_count: 1 });
      expect(ok.status, ok.text).to.equal(201);
      expect(ok.body.webhook).to.include({ has_secret: true });
      expect(ok.body.webhook.headers.Authorization).to.equal('[redacted]');
      expect(JSON.stringify(ok.body)).not.to.include(HOOK_SECRET);
      // Neither the signing secret nor the Authorization header value is stored in clear in Redis.
      const stored = await rc.lrange('ferry:webhooks', 0, -1);
      expect(stored.join('\n')).to.include('X-Custom').and.not.include('Bearer abc').and.not.include(HOOK_SECRET);
      expect((await req(B, 'POST', '/api/v1/webhooks', { url: `${R}/flaky`, events: ['job.completed'], retry_count: 3 })).status).to.equal(201);
      expect((await req(B, 'POST', '/webhooks', { url: `${R}/slow`, events: ['job.completed'], timeout: 1, retry_count: 1 })).status).to.equal(201);
      const id = await gwJob('d-hooked', { steps: 2, sleep_ms: 200 });
      const okHits = await until(() => { const h = received.filter((x) => x.path === '/ok' && (JSON.parse(x.body) as WebhookBody).data.job_id === id); return h.length >= 3 && h; }, 15000, 'ok deliveries');
      const events = okHits.map((h) => (JSON.parse(h.body) as WebhookBody).event);
      expect(events).to.include.members(['job.created', 'job.started', 'job.completed']);
      for (const h of okHits) {
        expect(h.headers['x-ferry-signature']).to.equal('sha256=' + createHmac('sha256', HOOK_SECRET).update(h.body).digest('hex'));
        expect(h.headers['x-custom']).to.equal('yes');
        expect(h.headers.authorization).to.equal('Bearer abc');
      }
      const completed = JSON.parse(okHits.find((h) => (JSON.parse(h.body) as WebhookBody).event === 'job.completed')!.body) as WebhookBody;
      expect(completed.data).to.include({ job_id: id, status: 'completed', state: 'COMPLETED' });
      const flaky = await until(() => { const h = received.filter((x) => x.path === '/flaky'); return h.length >= 2 && h; }, 15000, 'flaky retried');
      expect(flaky[1].at - flaky[0].at).to.be.greaterThan(90);
      expect(flaky[0].headers['x-ferry-signature']).to.equal(undefined);
      const list = (await req<WebhookList>(B, 'GET', '/webhooks')).body.webhooks;
      const idx = (u: string) => list.findIndex((w) => w.url === `${R}${u}`);
      const flog = await until(async () => { const d = (await req<DeliveryLog>(B, 'GET', `/webhooks/${idx('/flaky')}/deliveries`)).body.deliveries; return d[0]?.status === 'delivered' && d; }, 10000, 'flaky log');
      expect(flog[0]).to.include({ attempts: 2, response_status: 200 });
      const slog = await until(async () => { const d = (await req<DeliveryLog>(B, 'GET', `/webhooks/${idx('/slow')}/deliveries`)).body.deliveries; return d[0]?.status === 'failed' && d; }, 15000, 'slow log');
      expect(slog[0].attempts).to.equal(2);
      expect(slog[0].last_error).to.include('timed out');
      const met = (await req(B, 'GET', '/metrics')).text;
      const count = (st: string) => Number(new RegExp(`svc_webhook_deliveries_total\\{status="${st}",service="daemon"\\} (\\d+)`).exec(met)?.[1]);
      expect(count('failed')).to.be.at.least(1);
      expect(count('retrying')).to.be.at.least(2);
      expect(count('delivered')).to.be.at.least(4);
      const t = await req<WebhookTested>(B, 'POST', '/webhooks/test', { index: idx('/ok') });
      expect(t.body.delivery_ids).to.have.length(1);
      await until(() => received.some((x) => x.path === '/ok' && (JSON.parse(x.body) as WebhookBody).event === 'webhook.test'), 10000, 'test delivery');
      for (const p of PREFIXES) expect((await req(B, 'DELETE', `${p}/webhooks/99`)).status).to.equal(404);
      const before = list.length;
      expect((await req(B, 'DELETE', `/webhooks/${idx('/slow')}`)).status).to.equal(200);
      expect((await req<WebhookList>(B, 'GET', '/api/v1/webhooks')).body.total).to.equal(before - 1);
    });
  });

  describe('WebSocket', () => {
    it('sends jobs and status on connect, status every 2 s, job_update for changes made through the 8000 API', async () => {
      const c = openWs<WsMessage<Record<string, unknown>>>(`${B.replace('http', 'ws')}/api/v1/ws`);
      await c.opened;
      await until(() => c.msgs.length >= 2, 5000, 'first messages');
      expect(c.msgs[0].type).to.equal('jobs');
      expect(c.msgs[0].data.jobs).to.be.an('array').with.length.above(0);
      expect(c.msgs[0].timestamp).to.be.a('string');
      expect(c.msgs[1].type).to.equal('status');
      const id = await gwJob('d-ws-1', { sleep_ms: 20000, steps: 10 });
      await until(() => c.msgs.some((m) => m.type === 'job_update' && m.data.id === id && m.data.status === 'running'), 10000, 'running update');
      expect((await req(gw.url, 'DELETE', `/jobs/${id}`)).status).to.equal(200);
      await until(() => c.msgs.some((m) => m.type === 'job_update' && m.data.id === id && m.data.status === 'cancelled'), 10000, 'cancelled update');
      await until(() => c.msgs.filter((m) => m.type === 'status').length >= 3, 8000, 'periodic status');
      const st = c.msgs.filter((m) => m.type === 'status');
      const gap = st[st.length - 1].at - st[st.length - 2].at;
      expect(gap).to.be.within(1500, 2600);
      expect(st[0].data).to.include.keys('total_jobs', 'running_jobs', 'completed_jobs', 'failed_jobs');
      c.ws.close();
      const m = openWs<WsMessage<Record<string, unknown>>>(`${B.replace('http', 'ws')}/api/v1/ws/metrics`);
      await m.opened;
      await until(() => m.msgs.length >= 1, 5000, 'metrics message');
      expect(m.msgs[0].type).to.equal('metrics');
      expect(m.msgs[0].data).to.include.keys('jobs', 'workers', 'queues', 'websocket_clients');
      m.ws.close();
    });
  });

  describe('authentication', () => {
    let auth: Awaited<ReturnType<typeof startDaemonProc>>;
    let mport: number;
    before(async () => {
      mport = await freePort();
      const cfg = path.join(dir, 'auth.yaml');
      writeFileSync(cfg, `auth:\n  enabled: true\n  api_keys: ["${API_KEY}"]\nmetrics:\n  enabled: true\n  port: ${mport}\n`);
      auth = await startDaemonProc({ ...testEnv(redis.url), FERRY_HOST: '127.0.0.1' }, cfg);
      procs.push(auth);
    });

    it('is off by default and on with one setting: 401 without a key, 403 with a wrong one, on HTTP and /ws', async () => {
      expect((await req(B, 'GET', '/jobs')).status).to.equal(200);
      for (const p of PREFIXES) {
        expect((await req(auth.url, 'GET', `${p}/jobs`)).status).to.equal(401);
        expect((await req(auth.url, 'GET', `${p}/jobs`, undefined, { 'X-API-Key': 'wrong-key-wrong-key' })).status).to.equal(403);
        expect((await req(auth.url, 'GET', `${p}/jobs`, undefined, { 'X-API-Key': API_KEY })).status).to.equal(200);
        expect((await req(auth.url, 'GET', `${p}/status`, undefined, { Authorization: `Bearer ${API_KEY}` })).status).to.equal(200);
        expect((await req(auth.url, 'GET', `${p}/health`)).status).to.equal(200);
      }
      const r = await req<DaemonError>(auth.url, 'POST', '/jobs/submit', { vm_path: '/dc/vm/a/b', output_path: '/o' });
      expect(r.status).to.equal(401);
      expect(r.body).to.include({ status: 401 });
      const wsUrl = `${auth.url.replace('http', 'ws')}/ws`;
      let e1 = '';
      await openWs(wsUrl).opened.catch((e: Error) => (e1 = e.message));
      expect(e1).to.equal('HTTP 401');
      let e2 = '';
      await openWs(wsUrl, { 'X-API-Key': 'nope-nope-nope-nope' }).opened.catch((e: Error) => (e2 = e.message));
      expect(e2).to.equal('HTTP 403');
      const okc = openWs(wsUrl, { Authorization: `Bearer ${API_KEY}` });
      await okc.opened;
      okc.ws.close();
      // A key in the URL is refused; a browser gets a single-use ticket from an authenticated call instead.
      let e3 = '';
      await openWs(`${wsUrl}?api_key=${API_KEY}`).opened.catch((e: Error) => (e3 = e.message));
      expect(e3).to.equal('HTTP 401');
      const t = await req<WsTicket>(auth.url, 'POST', '/ws/ticket', undefined, { 'X-API-Key': API_KEY });
      expect(t.status).to.equal(200);
      const q = openWs(`${wsUrl}?ticket=${t.body.ticket}`);
      await q.opened;
      q.ws.close();
      let e4 = '';
      await openWs(`${wsUrl}?ticket=${t.body.ticket}`).opened.catch((e: Error) => (e4 = e.message));
      expect(e4).to.equal('HTTP 401');
      expect((await req(`http://127.0.0.1:${mport}`, 'GET', '/metrics')).status).to.equal(401);
      const m = await req(`http://127.0.0.1:${mport}`, 'GET', '/metrics', undefined, { 'X-API-Key': API_KEY });
      expect(m.status).to.equal(200);
      expect(m.text).to.include('svc_jobs_total');
      expect((await req(auth.url, 'GET', '/metrics', undefined, { 'X-API-Key': API_KEY })).status).to.equal(404);
    });
  });
});
