// What must survive: Redis killed and restarted mid-run, SSE clients that drop and reconnect, and racing
// state changes on one job.
import { expect } from 'chai';
import { TestRedis } from '../helpers/redis';
import { Proc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import { openSse } from '../helpers/sse';
import { createRedis } from '../../platform/redis';
import { JobStore } from '../../queue/store';
import type { Claimed, JobList, JobStatus, StoredEvent } from '../helpers/api-types';
import type { ProgressEvent } from '../../domain/schemas/job';
import type { JobState } from '../../domain/states';

/** A frame of a job's event stream: a progress event, or `complete` with the final state. */
type StreamData = Partial<ProgressEvent> & { state?: JobState };

describe('resilience', function () {
  this.timeout(120000);
  const redis = new TestRedis();
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  const procs: Proc[] = [];

  before(async () => {
    await redis.start();
    gw = await startGatewayProc(testEnv(redis.url));
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await gw?.stop();
    await redis.stop();
  });

  it('an SSE client that disconnects and reconnects with Last-Event-ID receives every event exactly once', async () => {
    const w = { worker_id: 'sse-w', capabilities: [] };
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'sse-1', operation: 'noop' });
    const claim = (await req<Claimed | null>(gw.url, 'POST', '/queue/dequeue', w)).body!;
    expect(claim.job_id).to.equal('sse-1');
    const post = (n: number) => req(gw.url, 'POST', '/jobs/sse-1/events', { worker_id: w.worker_id, lease_token: claim.lease_token, phase: 'work', percentage: n, message: `step ${n}` });
    for (const n of [10, 20]) expect((await post(n)).status).to.equal(201);

    const first = openSse<StreamData>(`${gw.url}/jobs/sse-1/events/stream`);
    await first.waitFor((f) => f.length === 3); // initialization + 10 + 20, replayed from the log
    await post(30);
    await first.waitFor((f) => f.length === 4); // live
    first.close();
    const lastId = first.frames.at(-1)!.id!;
    for (const n of [40, 50, 60]) await post(n); // while disconnected

    const second = openSse<StreamData>(`${gw.url}/jobs/sse-1/events/stream`, lastId);
    await second.waitFor((f) => f.length === 3);
    await post(70);
    await req(gw.url, 'POST', '/jobs/sse-1/complete', { worker_id: w.worker_id, lease_token: claim.lease_token, result: {} });
    await second.closed;
    const all = [...first.frames, ...second.frames];
    const progress = all.filter((f) => f.event === 'progress');
    expect(progress.map((f) => f.data.percentage)).to.deep.equal([0, 10, 20, 30, 40, 50, 60, 70, 100]);
    expect(new Set(progress.map((f) => f.id)).size).to.equal(progress.length);
    expect(second.frames.at(-1)).to.deep.include({ event: 'complete', data: { state: 'COMPLETED' } });
    // Matches the polling endpoint exactly.
    const polled = (await req<StoredEvent[]>(gw.url, 'GET', '/jobs/sse-1/events')).body;
    expect(polled.map((e) => e.id)).to.deep.equal(progress.map((f) => f.id));
  });

  it('a stream opened on a finished job replays its events, sends complete and ends; a bad Last-Event-ID is a 400', async () => {
    const s = openSse<StreamData>(`${gw.url}/jobs/sse-1/events/stream`);
    await s.closed;
    expect(s.frames.at(-1)).to.deep.include({ event: 'complete', data: { state: 'COMPLETED' } });
    expect(s.frames.length).to.equal(10);
    const bad = await req(gw.url, 'GET', '/jobs/sse-1/events/stream', undefined, { 'Last-Event-ID': 'garbage' });
    expect(bad.status).to.equal(400);
  });

  it('the largest event id (two u64 maxima) is after every event: the log answers none, the stream only the end', async () => {
    const max = '18446744073709551615-18446744073709551615';
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'sse-max', operation: 'noop' });
    const w = { worker_id: 'sse-max-w', capabilities: [] };
    const claim = (await req<Claimed | null>(gw.url, 'POST', '/queue/dequeue', w)).body!;
    expect(claim.job_id).to.equal('sse-max');
    const lease = { worker_id: w.worker_id, lease_token: claim.lease_token };
    expect((await req(gw.url, 'POST', '/jobs/sse-max/events', { ...lease, phase: 'work', percentage: 50, message: 'half' })).status).to.equal(201);
    // Redis refuses an exclusive range from this id: neither the log nor the stream's replay may ask it.
    expect((await req<StoredEvent[]>(gw.url, 'GET', '/jobs/sse-max/events')).body).to.have.length.above(0);
    const polled = await req<StoredEvent[]>(gw.url, 'GET', `/jobs/sse-max/events?after_id=${max}`);
    expect(polled.status).to.equal(200);
    expect(polled.body).to.deep.equal([]);
    const s = openSse<StreamData>(`${gw.url}/jobs/sse-max/events/stream`, max);
    expect(await s.opened).to.equal(200);
    await req(gw.url, 'POST', '/jobs/sse-max/complete', { ...lease, result: {} });
    await s.closed;
    expect(s.frames.map((f) => f.event)).to.deep.equal(['complete']);
  });

  it('any gateway replica serves any call: submit on one, stream and report on another', async () => {
    const gw2 = await startGatewayProc(testEnv(redis.url));
    try {
      await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'two-gw', operation: 'noop' });
      const s = openSse<StreamData>(`${gw2.url}/jobs/two-gw/events/stream`);
      const claim = (await req<Claimed | null>(gw2.url, 'POST', '/queue/dequeue', { worker_id: 'x-w', capabilities: [] })).body!;
      expect(claim.job_id).to.equal('two-gw');
      await req(gw.url, 'POST', '/jobs/two-gw/events', { worker_id: 'x-w', lease_token: claim.lease_token, phase: 'work', percentage: 50 });
      await req(gw2.url, 'POST', '/jobs/two-gw/complete', { worker_id: 'x-w', lease_token: claim.lease_token, result: { ok: true } });
      await s.closed;
      expect(s.frames.map((f) => f.event + ':' + (f.data.phase || f.data.state))).to.deep.equal(['progress:initialization', 'progress:work', 'progress:completed', 'complete:COMPLETED']);
      expect((await req<JobStatus>(gw.url, 'GET', '/jobs/two-gw')).body.result).to.deep.equal({ ok: true });
    } finally {
      await gw2.stop();
    }
  });

  it('a QUEUED job missing from its BullMQ queue (a gateway died before adding it) is put back and runs', async () => {
    const store = new JobStore(createRedis({ url: redis.url }));
    const spec = { job_id: 'lost-add', operation: 'noop', parameters: {}, execution_policy: { priority: 50, retry_count: 0, timeout_seconds: 60, idempotent: true } };
    const made = await store.create('lost-add', { spec: JSON.stringify(spec), operation: 'noop', queue: 'jobs.any', priority: 50, attempts: 0, max_attempts: 1, meta: '{}' },
      [{ to: 'VALIDATED', reason: 'specification validated' }, { to: 'QUEUED', reason: 'queued on jobs.any with priority 50' }]);
    expect(made.created).to.equal(true);
    const w = { worker_id: 'reconcile-w', capabilities: [] };
    expect((await req(gw.url, 'POST', '/queue/dequeue', w)).text).to.equal('null');
    const got = await until(async () => (await req<Claimed | null>(gw.url, 'POST', '/queue/dequeue', w)).body, 15000, 'the job to be put back');
    expect(got.job_id).to.equal('lost-add');
    store.redis.disconnect();
  });

  it('racing state changes on one job: exactly one wins, history has one entry for it', async () => {
    const store = new JobStore(createRedis({ url: redis.url }));
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'race', operation: 'noop', requirements: { capabilities: ['nbd_access'] } });
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => store.transition('race', [{ to: 'ASSIGNED', reason: `racer ${i}`, worker_id: `r${i}` }], { fields: { worker_id: `r${i}` } })));
    expect(results.filter((r) => r.ok).length).to.equal(1);
    const j = (await req<JobStatus>(gw.url, 'GET', '/jobs/race')).body;
    expect(j.state_history.filter((h) => h.state === 'ASSIGNED').length).to.equal(1);
    // An illegal move is refused and changes nothing.
    const illegal = await store.transition('race', [{ to: 'COMPLETED', reason: 'skip RUNNING' }]);
    expect(illegal).to.deep.equal({ ok: false, code: 'conflict', state: 'ASSIGNED' });
    const races = await Promise.all([req(gw.url, 'DELETE', '/jobs/race'), req(gw.url, 'DELETE', '/jobs/race'), req(gw.url, 'DELETE', '/jobs/race')]);
    expect(races.map((r) => r.status).sort()).to.deep.equal([200, 400, 400]);
    store.redis.disconnect();
  });

  it('a state change resent after a lost reply (same call twice) is answered as applied, not refused', async () => {
    const store = new JobStore(createRedis({ url: redis.url }));
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'resent', operation: 'noop', requirements: { capabilities: ['nbd_access'] } });
    // The same call (same call id) twice, as ioredis resends a command whose reply was lost.
    const step = [{ to: 'ASSIGNED' as const, reason: 'assigned to worker w', worker_id: 'w' }];
    const first = await store.transition('resent', step, { fields: { worker_id: 'w', lease: 't1' }, op: 'op-1' });
    const again = await store.transition('resent', step, { fields: { worker_id: 'w', lease: 't1' }, op: 'op-1' });
    expect(first.ok).to.equal(true);
    expect(again.ok).to.equal(true);
    const other = await store.transition('resent', step, { op: 'op-2' });
    expect(other).to.deep.include({ ok: false, code: 'conflict' });
    const j = (await req<JobStatus>(gw.url, 'GET', '/jobs/resent')).body;
    expect(j.state_history.filter((h) => h.state === 'ASSIGNED').length).to.equal(1);
    store.redis.disconnect();
  });

  it('Redis killed and restarted mid-run: workers resume and no job is lost', async () => {
    const env = testEnv(redis.url);
    procs.push(await startWorkerProc(env, 'rw-1', ['img_tool'], ['--concurrency', '2']));
    procs.push(await startWorkerProc(env, 'rw-2', ['img_tool'], ['--concurrency', '2']));
    const ids = Array.from({ length: 12 }, (_, i) => `survive-${i}`);
    for (const id of ids) {
      const r = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: id, operation: 'noop', parameters: { sleep_ms: 600, steps: 3 } });
      expect(r.status).to.equal(201);
    }
    await until(async () => (await req<JobList>(gw.url, 'GET', '/jobs?state=COMPLETED&limit=1000')).body.jobs.some((j) => j.job_id.startsWith('survive-')), 30000, 'first completion');
    await redis.kill();
    const down = await req(gw.url, 'GET', '/health').catch(() => ({ status: 0 }));
    expect(down.status).to.not.equal(200);
    await new Promise((r) => setTimeout(r, 1500));
    await redis.start(); // same port, same append-only file
    let states: string[] = [];
    const done = await until(async () => {
      states = await Promise.all(ids.map(async (id) => (await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`)).body?.state));
      return states.every((s) => s === 'COMPLETED') && states;
    }, 90000, 'every job completed after the restart').catch((e: Error) => { throw new Error(`${e.message}; states: ${states.join(', ')}`); });
    expect(done.length).to.equal(12);
    expect((await req(gw.url, 'GET', '/health')).status).to.equal(200);
  });
});
