// The worker job protocol over HTTP against a real gateway and Redis: every endpoint, status code and error
// of the seed, and the report-back endpoints of pull workers.
import { expect } from 'chai';
import { TestRedis } from '../helpers/redis';
import { startGatewayProc, testEnv } from '../helpers/procs';
import { postOversized, req, until } from '../helpers/http';
import type { JobApiError } from '../helpers/http';
import type { Claimed, FailAnswer, Heartbeat, JobList, JobStatus, QueueStatus, StoredEvent, Submitted, WorkerList } from '../helpers/api-types';
import type { JsonSchema } from '../../platform/openapi';

/** POST /workers/register. */
interface Registered { worker_id: string; message: string; capabilities: string[]; registered_at: string }
/** GET /health. */
interface Health { status: string; version: string; timestamp: string; workers: number; active_jobs: number }
/** GET /openapi.json (platform/http.ts Api.openapi): what these tests read of it. */
interface OpenApiDoc { openapi: string; paths: Record<string, Record<string, { requestBody?: { content: Record<string, { schema: JsonSchema }> } }>> }

describe('gateway API (port 8000 protocol)', function () {
  this.timeout(60000);
  const redis = new TestRedis();
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let base: string;
  const spec = (id: string, extra: Record<string, unknown> = {}) => ({
    job_id: id, operation: 'convert', image: { path: '/srv/in/disk.vmdk', format: 'vmdk' },
    parameters: { output_format: 'qcow2', output_dir: '/srv/out' }, ...extra,
  });

  before(async () => {
    await redis.start();
    gw = await startGatewayProc({ ...testEnv(redis.url), FERRY_WORKER_STALE_SECONDS: '3' });
    base = gw.url;
  });
  after(async () => { await gw?.stop(); await redis.stop(); });

  describe('POST /jobs', () => {
    it('registers a job without ?queue as VALIDATED, with history CREATED -> VALIDATED', async () => {
      const r = await req<Submitted>(base, 'POST', '/jobs', spec('plain-1'));
      expect(r.status).to.equal(201);
      expect(r.body).to.include({ job_id: 'plain-1', state: 'VALIDATED', queue_position: 0 });
      expect(r.body.message).to.be.a('string');
      const j = await req<JobStatus>(base, 'GET', '/jobs/plain-1');
      expect(j.body.state_history.map((h) => h.state)).to.deep.equal(['CREATED', 'VALIDATED']);
      for (const h of j.body.state_history) expect(h.reason).to.be.a('string').with.length.above(0);
    });

    it('queues with ?queue=true: 201, QUEUED, and a real queue position', async () => {
      const a = await req<Submitted>(base, 'POST', '/jobs?queue=true', spec('q-a', { execution_policy: { priority: 50 } }));
      const b = await req<Submitted>(base, 'POST', '/jobs?queue=true', spec('q-b', { execution_policy: { priority: 50 } }));
      const c = await req<Submitted>(base, 'POST', '/jobs?queue=true', spec('q-c', { execution_policy: { priority: 90 } }));
      expect([a.status, b.status, c.status]).to.deep.equal([201, 201, 201]);
      expect(a.body.state).to.equal('QUEUED');
      expect(b.body.queue_position).to.equal(a.body.queue_position + 1);
      // The urgent job goes ahead of both.
      expect(c.body.queue_position).to.equal(1);
      const again = await req<JobStatus>(base, 'GET', '/jobs/q-b');
      expect(again.body.queue).to.include({ name: 'jobs.img_tool', position: 3 });
    });

    it('says why a job waits when no active worker has its capabilities', async () => {
      const j = await req<JobStatus>(base, 'GET', '/jobs/q-a');
      expect(j.body.queue.waiting_reason).to.match(/no active worker.*img_tool/);
      const q = await req<QueueStatus>(base, 'GET', '/queue');
      const entry = q.body.queues.find((x) => x.name === 'jobs.img_tool');
      expect(entry).to.include({ queued: 3, active_workers: 0 });
      expect(entry!.waiting_reason).to.match(/img_tool/);
    });

    it('queue position counts the execution mode: a mode queue the same workers take first is ahead, another mode is not', async () => {
      const pos = async (id: string) => (await req<JobStatus>(base, 'GET', `/jobs/${id}`)).body.queue;
      const container = await req(base, 'POST', '/jobs?queue=true', spec('em-container', { requirements: { capabilities: [], execution_mode: 'CONTAINER' } }));
      expect(container.status).to.equal(201);
      expect((await pos('em-container')).name).to.equal('jobs.img_tool@CONTAINER');
      const containerAt = (await pos('em-container')).position;
      // A CONTAINER worker with img_tool serves jobs.img_tool@CONTAINER before jobs.img_tool: a plain job waits behind it.
      const plain = await req<Submitted>(base, 'POST', '/jobs?queue=true', spec('em-plain'));
      const plainQueue = await pos('em-plain');
      expect(plainQueue.name).to.equal('jobs.img_tool');
      const own = (await req<QueueStatus>(base, 'GET', '/queue')).body.queues.find((x) => x.name === 'jobs.img_tool')!.queued;
      expect(plain.body.queue_position).to.equal(own + 1).and.to.equal(plainQueue.position);
      // More capabilities but another mode: a PROCESS worker cannot take the CONTAINER job, so nothing moves ahead of it.
      const other = await req(base, 'POST', '/jobs?queue=true', spec('em-process', { requirements: { capabilities: ['lvm_tools'], execution_mode: 'PROCESS' } }));
      expect(other.status).to.equal(201);
      expect((await pos('em-container')).position).to.equal(containerAt);
      for (const id of ['em-container', 'em-plain', 'em-process']) expect((await req(base, 'DELETE', `/jobs/${id}`)).status).to.equal(200);
    });

    it('fills defaults into the stored spec', async () => {
      const j = await req<JobStatus>(base, 'GET', '/jobs/plain-1');
      expect(j.body.spec.execution_policy).to.deep.equal({ timeout_seconds: 86400, retry_count: 3, priority: 50, idempotent: true });
      expect(j.body.spec.parameters).to.include({ compress: false, output_format: 'qcow2' });
      expect(j.body.result).to.equal(null);
    });

    it('generates a job_id when none is given', async () => {
      const { job_id, ...rest } = spec('x');
      const r = await req<Submitted>(base, 'POST', '/jobs', rest);
      expect(r.status).to.equal(201);
      expect(r.body.job_id).to.match(/^[0-9a-f-]{36}$/);
    });

    it('answers 409 for a duplicate job_id and keeps the first job', async () => {
      const r = await req<JobApiError>(base, 'POST', '/jobs', spec('plain-1', { image: { path: '/srv/in/other.vmdk', format: 'vmdk' } }));
      expect(r.status).to.equal(409);
      expect(r.body.error).to.include({ code: 409, path: '/jobs' });
      expect(r.body.error.message).to.include('plain-1');
      expect((await req<JobStatus>(base, 'GET', '/jobs/plain-1')).body.spec.image!.path).to.equal('/srv/in/disk.vmdk');
    });

    const bad: [string, unknown, string[]][] = [
      ['missing operation', { image: { path: '/a', format: 'vmdk' }, parameters: { output_dir: '/o' } }, ['operation']],
      ['unknown operation', { operation: 'explode', parameters: {} }, ['operation']],
      ['relative image path and bad format', { operation: 'convert', image: { path: 'a.vmdk', format: 'floppy' }, parameters: { output_dir: '/o' } }, ['image.path', 'image.format']],
      ['bad output format', { operation: 'convert', image: { path: '/a', format: 'vmdk' }, parameters: { output_format: 'vhd', output_dir: '/o' } }, ['parameters.output_format']],
      ['compress with raw', { operation: 'convert', image: { path: '/a', format: 'vmdk' }, parameters: { output_format: 'raw', compress: true, output_dir: '/o' } }, ['parameters.compress']],
      ['no output place', { operation: 'convert', image: { path: '/a', format: 'vmdk' }, parameters: {} }, ['parameters']],
      ['priority out of range', { operation: 'noop', execution_policy: { priority: 101 } }, ['execution_policy.priority']],
      ['negative retry_count', { operation: 'noop', execution_policy: { retry_count: -1 } }, ['execution_policy.retry_count']],
      ['zero timeout', { operation: 'noop', execution_policy: { timeout_seconds: 0 } }, ['execution_policy.timeout_seconds']],
      ['bad job_id', { job_id: 'a b/c', operation: 'noop' }, ['job_id']],
      ['unknown field', { operation: 'noop', colour: 'red' }, ['colour']],
      ['bad tags', { operation: 'noop', audit_info: { tags: [1] } }, ['audit_info.tags.0']],
      ['bad capability', { operation: 'noop', requirements: { capabilities: ['Not Valid'] } }, ['requirements.capabilities.0']],
    ];
    for (const [name, body, fields] of bad) {
      it(`400 naming the field: ${name}`, async () => {
        const r = await req<JobApiError>(base, 'POST', '/jobs', body);
        expect(r.status).to.equal(400);
        expect(r.body.error).to.include({ code: 400, path: '/jobs' });
        expect(Number.isNaN(Date.parse(r.body.error.timestamp)), 'a parseable timestamp').to.equal(false);
        expect(r.body.error.fields!.map((f) => f.field)).to.include.members(fields);
        for (const f of fields) expect(r.body.error.message).to.include(`"${f.replace(/\.(\d+)/g, '[$1]')}"`);
      });
    }

    it('400 for malformed JSON, an empty body, and a JSON body that is not an object', async () => {
      const m = await req<JobApiError>(base, 'POST', '/jobs', '{"job_id": ', { 'content-type': 'application/json' });
      expect(m.status).to.equal(400);
      expect(m.body.error.message).to.match(/malformed/);
      const e = await req(base, 'POST', '/jobs');
      expect(e.status).to.equal(400);
      const arr = await req(base, 'POST', '/jobs', [1, 2]);
      expect(arr.status).to.equal(400);
      const q = await req<JobApiError>(base, 'POST', '/jobs?queue=maybe', spec('qq'));
      expect(q.status).to.equal(400);
      expect(q.body.error.message).to.include('queue');
    });

    it('one body reader: 413 naming body for a JSON or YAML body over 2 MiB, 400 naming body for malformed YAML; nothing stored', async () => {
      const before = await req<JobList>(base, 'GET', '/jobs?limit=1');
      for (const [path, type] of [['/jobs', 'application/json'], ['/migrationjobs', 'application/yaml']]) {
        for (const how of ['declared', 'streamed'] as const) {
          const r = await postOversized<JobApiError>(base, path, type, how);
          expect(r.status, `${path} ${type} ${how}`).to.equal(413);
          expect(r.body.error.message).to.equal('body: larger than 2 MiB');
          expect(r.body.error.fields).to.deep.equal([{ field: 'body', message: 'larger than 2 MiB' }]);
        }
      }
      const bad = await req<JobApiError>(base, 'POST', '/migrationjobs', 'kind: [unclosed', { 'content-type': 'application/yaml' });
      expect(bad.status).to.equal(400);
      expect(bad.body.error.message).to.match(/^body: malformed YAML/);
      expect(bad.body.error.fields![0].field).to.equal('body');
      // YAML is read only where a route takes it: on /jobs it is not a JSON body.
      expect((await req(base, 'POST', '/jobs', 'job_id: y1', { 'content-type': 'application/yaml' })).status).to.equal(400);
      expect((await req<JobList>(base, 'GET', '/jobs?limit=1')).body.total).to.equal(before.body.total);
    });
  });

  describe('GET /jobs', () => {
    it('lists newest first in a stable order, with total, limit, offset and a state filter', async () => {
      for (let i = 0; i < 5; i++) await req(base, 'POST', '/jobs', spec(`list-${i}`));
      const all = await req<JobList>(base, 'GET', '/jobs?limit=3');
      expect(all.status).to.equal(200);
      expect(all.body.jobs.map((j) => j.job_id)).to.deep.equal(['list-4', 'list-3', 'list-2']);
      expect(all.body.total).to.be.greaterThan(5);
      const next = await req<JobList>(base, 'GET', '/jobs?limit=2&offset=3');
      expect(next.body.jobs.map((j) => j.job_id)).to.deep.equal(['list-1', 'list-0']);
      for (const j of all.body.jobs) expect(j).to.have.keys('job_id', 'state', 'created_at', 'is_terminal');
      const queued = await req<JobList>(base, 'GET', '/jobs?state=QUEUED');
      expect(queued.body.jobs.every((j) => j.state === 'QUEUED')).to.equal(true);
      expect(queued.body.total).to.equal(queued.body.jobs.length);
      expect(queued.body.jobs.map((j) => j.job_id)).to.deep.equal(['q-c', 'q-b', 'q-a']);
    });
    it('400 for an unknown state or a bad limit', async () => {
      expect((await req(base, 'GET', '/jobs?state=DONE')).status).to.equal(400);
      const r = await req<JobApiError>(base, 'GET', '/jobs?limit=0');
      expect(r.status).to.equal(400);
      expect(r.body.error.message).to.include('limit');
      expect((await req(base, 'GET', '/jobs?limit=abc')).status).to.equal(400);
    });
  });

  describe('GET /jobs/{id}, events, 404s', () => {
    it('404 naming the job for every per-job endpoint', async () => {
      for (const [m, p] of [['GET', '/jobs/nope'], ['DELETE', '/jobs/nope'], ['GET', '/jobs/nope/events'], ['GET', '/jobs/nope/events/stream']] as const) {
        const r = await req<JobApiError>(base, m, p);
        expect(r.status, `${m} ${p}`).to.equal(404);
        expect(r.body.error).to.include({ code: 404, path: p });
        expect(r.body.error.message).to.include('nope');
      }
    });
    it('unknown routes answer 404 and wrong methods 405, in the error envelope', async () => {
      const r = await req<JobApiError>(base, 'GET', '/nothing-here');
      expect(r.status).to.equal(404);
      expect(r.body.error.code).to.equal(404);
      const m = await req<JobApiError>(base, 'PUT', '/jobs');
      expect(m.status).to.equal(405);
      expect(m.body.error.code).to.equal(405);
    });
  });

  describe('DELETE /jobs/{id}', () => {
    it('cancels a queued job: CANCELLED, removed from the queue and from by_priority', async () => {
      await req(base, 'POST', '/jobs?queue=true', spec('c-1', { execution_policy: { priority: 7 } }));
      const before = await req<QueueStatus>(base, 'GET', '/queue');
      expect(before.body.by_priority['7']).to.equal(1);
      const r = await req<{ job_id: string; state: string; message: string }>(base, 'DELETE', '/jobs/c-1');
      expect(r.status).to.equal(200);
      expect(r.body).to.include({ job_id: 'c-1', state: 'CANCELLED' });
      expect(r.body.message).to.include('cancelled');
      const after = await req<QueueStatus>(base, 'GET', '/queue');
      expect(after.body.by_priority['7']).to.equal(undefined);
      expect(after.body.total_jobs).to.equal(before.body.total_jobs - 1);
      const j = await req<JobStatus>(base, 'GET', '/jobs/c-1');
      expect(j.body.is_terminal).to.equal(true);
      expect(j.body.state_history.at(-1)).to.include({ state: 'CANCELLED' });
    });
    it('400 naming the job and its state when it is already terminal', async () => {
      const r = await req<JobApiError>(base, 'DELETE', '/jobs/c-1');
      expect(r.status).to.equal(400);
      expect(r.body.error.message).to.include('c-1').and.include('CANCELLED');
    });
    it('cancels a VALIDATED (never queued) job too', async () => {
      const r = await req(base, 'DELETE', '/jobs/list-0');
      expect(r.status).to.equal(200);
    });
  });

  describe('workers', () => {
    const reg = { worker_id: 'http-w1', capabilities: ['img_tool', 'nbd_access'], execution_mode: 'PRIVILEGED_CONTAINER', system_info: { hostname: 'h1', os: 'Debian', kernel: '6.1', architecture: 'x86_64', memory_mb: 2048, disk_space_mb: 10000 } };
    it('registers (201), lists (total, active), heartbeats (200) and deregisters (200)', async () => {
      const r = await req<Registered>(base, 'POST', '/workers/register', reg);
      expect(r.status).to.equal(201);
      expect(r.body).to.include({ worker_id: 'http-w1' });
      expect(r.body.capabilities).to.deep.equal(['img_tool', 'nbd_access']);
      expect(Number.isNaN(Date.parse(r.body.registered_at)), 'a parseable registered_at').to.equal(false);
      const l = await req<WorkerList>(base, 'GET', '/workers');
      expect(l.body.total).to.equal(1);
      expect(l.body.active).to.equal(1);
      expect(l.body.workers[0]).to.include({ worker_id: 'http-w1' });
      expect(l.body.workers[0].system_info).to.include({ hostname: 'h1', memory_mb: 2048 });
      const hb = await req<Heartbeat>(base, 'POST', '/workers/http-w1/heartbeat');
      expect(hb.status).to.equal(200);
      expect(hb.body).to.include({ worker_id: 'http-w1' });
      expect(Number.isNaN(Date.parse(hb.body.timestamp)), 'a parseable timestamp').to.equal(false);
    });
    it('400 for a bad registration, 404 for unknown workers', async () => {
      const b = await req<JobApiError>(base, 'POST', '/workers/register', { worker_id: 'x', capabilities: 'img_tool' });
      expect(b.status).to.equal(400);
      expect(b.body.error.message).to.include('capabilities');
      expect((await req(base, 'POST', '/workers/ghost/heartbeat')).status).to.equal(404);
      expect((await req(base, 'DELETE', '/workers/ghost')).status).to.equal(404);
    });
    it('counts a worker whose heartbeat is older than the stale limit as inactive', async () => {
      await req(base, 'POST', '/workers/register', { worker_id: 'quiet', capabilities: [] });
      await until(async () => (await req<WorkerList>(base, 'GET', '/workers')).body.workers.find((w) => w.worker_id === 'quiet' && !w.active), 8000, 'quiet worker stale');
      const l = await req<WorkerList>(base, 'GET', '/workers');
      expect(l.body.total).to.equal(2);
      expect((await req(base, 'DELETE', '/workers/quiet')).status).to.equal(200);
    });
  });

  describe('pull workers: POST /queue/dequeue and the report-back endpoints', () => {
    let qcLease = '';
    it('hands the most urgent matching job, moves it to ASSIGNED naming the worker, then null when none match', async () => {
      const none = await req(base, 'POST', '/queue/dequeue', { worker_id: 'nbd-only', capabilities: ['nbd_access'] });
      expect(none.status).to.equal(200);
      expect(none.text).to.equal('null');
      const got = await req<Claimed>(base, 'POST', '/queue/dequeue', { worker_id: 'http-w1', capabilities: ['img_tool'], execution_mode: 'PRIVILEGED_CONTAINER' });
      expect(got.status).to.equal(200);
      expect(got.body.job_id).to.equal('q-c');
      expect(got.body).to.include.keys('operation', 'image', 'parameters', 'execution_policy');
      const j = await req<JobStatus>(base, 'GET', '/jobs/q-c');
      expect(j.body.state).to.equal('ASSIGNED');
      expect(j.body.state_history.at(-1)!.reason).to.include('http-w1');
      expect(j.body.worker_id).to.equal('http-w1');
      expect(got.body.lease_token).to.be.a('string').and.equal(got.headers.get('x-lease-token'));
      expect(JSON.stringify(j.body)).to.not.include(got.body.lease_token);
      qcLease = got.body.lease_token;
    });
    it('400 for a bad dequeue body', async () => {
      const r = await req<JobApiError>(base, 'POST', '/queue/dequeue', { capabilities: ['img_tool'] });
      expect(r.status).to.equal(400);
      expect(r.body.error.message).to.include('worker_id');
    });
    it('takes progress events (first one starts the job), then complete with a result', async () => {
      const e1 = await req<{ id: string }>(base, 'POST', '/jobs/q-c/events', { worker_id: 'http-w1', lease_token: qcLease, phase: 'conversion', percentage: 40, message: 'copying', details: { bytes_processed: '40', total_bytes: '100' } });
      expect(e1.status).to.equal(201);
      expect(e1.body.id).to.match(/^\d+-\d+$/);
      const wrong = await req(base, 'POST', '/jobs/q-c/events', { worker_id: 'other', lease_token: qcLease, phase: 'x', percentage: 1 });
      expect(wrong.status).to.equal(409);
      const badPct = await req<JobApiError>(base, 'POST', '/jobs/q-c/events', { worker_id: 'http-w1', lease_token: qcLease, phase: 'x', percentage: 101 });
      expect(badPct.status).to.equal(400);
      expect(badPct.body.error.message).to.include('percentage');
      const mid = await req<JobStatus>(base, 'GET', '/jobs/q-c');
      expect(mid.body.state).to.equal('RUNNING');
      expect(mid.body.latest_event).to.include({ phase: 'conversion', percentage: 40 });
      const done = await req(base, 'POST', '/jobs/q-c/complete', { worker_id: 'http-w1', lease_token: qcLease, result: { output_path: '/srv/out/q-c.qcow2' } });
      expect(done.status).to.equal(200);
      const j = await req<JobStatus>(base, 'GET', '/jobs/q-c');
      expect(j.body.state).to.equal('COMPLETED');
      expect(j.body.result).to.deep.equal({ output_path: '/srv/out/q-c.qcow2' });
      expect(j.body.state_history.map((h) => h.state)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED', 'ASSIGNED', 'RUNNING', 'COMPLETED']);
      const evs = await req<StoredEvent[]>(base, 'GET', '/jobs/q-c/events');
      expect(evs.body.map((e) => e.phase)).to.deep.equal(['initialization', 'conversion', 'completed']);
      expect(evs.body[0]).to.include({ percentage: 0, job_id: 'q-c' });
      const since = await req<StoredEvent[]>(base, 'GET', `/jobs/q-c/events?since=${encodeURIComponent(evs.body[0].timestamp)}`);
      expect(since.body.every((e) => Date.parse(e.timestamp) > Date.parse(evs.body[0].timestamp))).to.equal(true);
      expect((await req(base, 'GET', '/jobs/q-c/events?since=yesterday')).status).to.equal(400);
      expect((await req(base, 'POST', '/jobs/q-c/complete', { worker_id: 'http-w1', lease_token: qcLease })).status).to.equal(409);
    });
    it('a failed attempt goes back to QUEUED while retry_count allows, then FAILED with the reason', async () => {
      await req(base, 'POST', '/jobs?queue=true', { job_id: 'flaky', operation: 'noop', execution_policy: { retry_count: 1, priority: 100 } });
      const d1 = await req<Claimed>(base, 'POST', '/queue/dequeue', { worker_id: 'http-w1', capabilities: [] });
      expect(d1.body.job_id).to.equal('flaky');
      const f1 = await req<FailAnswer>(base, 'POST', '/jobs/flaky/fail', { worker_id: 'http-w1', lease_token: d1.body.lease_token, error: 'disk full' });
      expect(f1.body.state).to.equal('QUEUED');
      const d2 = await until(async () => { const r = await req<Claimed | null>(base, 'POST', '/queue/dequeue', { worker_id: 'http-w1', capabilities: [] }); return r.body; }, 10000, 'retry to be handed out');
      expect(d2.job_id).to.equal('flaky');
      const f2 = await req<FailAnswer>(base, 'POST', '/jobs/flaky/fail', { worker_id: 'http-w1', lease_token: d2.lease_token, error: 'disk still full' });
      expect(f2.body.state).to.equal('FAILED');
      const j = await req<JobStatus>(base, 'GET', '/jobs/flaky');
      const states = j.body.state_history.map((h) => h.state);
      expect(states).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED', 'ASSIGNED', 'QUEUED', 'ASSIGNED', 'FAILED']);
      expect(j.body.state_history[4].reason).to.include('disk full').and.include('retrying');
      expect(j.body.state_history[6].reason).to.include('disk still full');
      expect(j.body.error).to.equal('disk still full');
    });
    it('a pull worker that goes stale gives its job back to the queue', async () => {
      await req(base, 'POST', '/jobs?queue=true', { job_id: 'orphan', operation: 'noop', execution_policy: { priority: 100 } });
      const d = await req<Claimed>(base, 'POST', '/queue/dequeue', { worker_id: 'doomed', capabilities: [] });
      expect(d.body.job_id).to.equal('orphan');
      const j = await until(async () => { const r = await req<JobStatus>(base, 'GET', '/jobs/orphan'); return r.body.state === 'QUEUED' && r.body; }, 15000, 'stale worker job requeued');
      expect(j.state_history.at(-1)!.reason).to.include('doomed');
      const again = await req<Claimed>(base, 'POST', '/queue/dequeue', { worker_id: 'http-w1', capabilities: [] });
      expect(again.body.job_id).to.equal('orphan');
      expect((await req<JobStatus>(base, 'GET', '/jobs/orphan')).body.attempts).to.equal(2);
      expect((await req(base, 'POST', '/jobs/orphan/complete', { worker_id: 'http-w1', lease_token: again.body.lease_token })).status).to.equal(200);
    });
    it('DELETE /workers/{id} hands the jobs it holds back to the queue', async () => {
      await req(base, 'POST', '/jobs?queue=true', { job_id: 'held', operation: 'noop', execution_policy: { priority: 100 } });
      await req(base, 'POST', '/workers/register', { worker_id: 'leaver', capabilities: [] });
      const d = await req<Claimed>(base, 'POST', '/queue/dequeue', { worker_id: 'leaver', capabilities: [] });
      expect(d.body.job_id).to.equal('held');
      expect((await req(base, 'DELETE', '/workers/leaver')).status).to.equal(200);
      const j = await req<JobStatus>(base, 'GET', '/jobs/held');
      expect(j.body.state).to.equal('QUEUED');
      const again = await req<Claimed>(base, 'POST', '/queue/dequeue', { worker_id: 'http-w1', capabilities: [] });
      expect(again.body.job_id).to.equal('held');
    });
  });

  describe('GET /queue, /health, /metrics, /openapi.json', () => {
    it('GET /queue counts queued jobs by priority', async () => {
      const q = await req<QueueStatus>(base, 'GET', '/queue');
      expect(q.status).to.equal(200);
      const listed = await req<JobList>(base, 'GET', '/jobs?state=QUEUED&limit=1000');
      expect(q.body.total_jobs).to.equal(listed.body.total);
      const sum = Object.values<number>(q.body.by_priority).reduce((a, b) => a + b, 0);
      expect(sum).to.equal(q.body.total_jobs);
      expect(q.body.by_priority['50']).to.equal(2);
    });
    it('GET /health', async () => {
      const h = await req<Health>(base, 'GET', '/health');
      expect(h.status).to.equal(200);
      expect(h.body).to.include({ status: 'healthy', version: 'v1' });
      expect(h.body.workers).to.be.a('number');
      expect(h.body.active_jobs).to.equal(1); // "held", assigned to http-w1
    });
    it('GET /metrics exposes the seed metrics and request metrics by route template', async () => {
      const m = await req(base, 'GET', '/metrics');
      expect(m.status).to.equal(200);
      expect(m.headers.get('content-type')).to.include('text/plain');
      expect(m.text).to.match(/svc_migration_total\{status="completed",service="gateway"\} [1-9]/);
      expect(m.text).to.match(/svc_migration_total\{status="failed",service="gateway"\} 1/);
      expect(m.text).to.include('svc_migration_duration_seconds_bucket{le="60"');
      expect(m.text).to.include('svc_migration_duration_seconds_bucket{le="300"');
      expect(m.text).to.include('svc_migration_duration_seconds_bucket{le="600"');
      expect(m.text).to.include('svc_migration_duration_seconds_bucket{le="+Inf"');
      expect(m.text).to.match(/svc_worker_jobs_active\{service="gateway"\} 1/);
      expect(m.text).to.match(/svc_queue_depth\{queue="jobs.img_tool",state="QUEUED"/);
      expect(m.text).to.include('path="/jobs/:job_id"');
      expect(m.text).to.not.include('path="/jobs/q-c"');
      expect(m.text).to.include('process_cpu_seconds_total');
    });
    it('GET /openapi.json describes every route from the same schemas', async () => {
      const o = await req<OpenApiDoc>(base, 'GET', '/openapi.json');
      expect(o.status).to.equal(200);
      expect(o.body.openapi).to.match(/^3\./);
      for (const p of ['/jobs', '/jobs/{job_id}', '/jobs/{job_id}/events', '/jobs/{job_id}/events/stream', '/workers/register', '/workers/{worker_id}/heartbeat', '/workers', '/workers/{worker_id}', '/queue', '/queue/dequeue', '/health', '/metrics', '/openapi.json']) {
        expect(o.body.paths, p).to.have.property(p);
      }
      const body = o.body.paths['/jobs'].post.requestBody!.content['application/json'].schema;
      expect(body.required).to.include('operation');
      expect(body.properties!.execution_policy.properties!.priority).to.include({ minimum: 0, maximum: 100, default: 50 });
      expect(body.properties!.image.properties!.format.enum).to.include('vhdx');
    });
  });
});
