// Worker leases that cannot be forged, against a real gateway and Redis with auth on: a report-back needs the
// lease token its claim was handed (a worker id alone is public), an old token after a requeue is refused with
// 409 and changes nothing, GET /jobs/{id} never shows the token, a worker id stays with the key that registered
// it, and a native worker's stale lease is refused by the same rule inside queue/.
import { expect } from 'chai';
import { createRedis } from '../../platform/redis';
import { JobStore } from '../../queue/store';
import { QueueRouter } from '../../queue/router';
import { Registry } from '../../queue/registry';
import { Lifecycle } from '../../queue/lifecycle';
import { TestRedis } from '../helpers/redis';
import { Proc, startGatewayProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobApiError } from '../helpers/http';
import type { DequeueAnswer, FailAnswer, Heartbeat, JobStatus, StoredEvent, WorkerList } from '../helpers/api-types';
import type { ApiError } from '../../platform/errors';

const WORKER = 'lease-worker-key-0123456789';
const OTHER = 'other-worker-key-0123456789';
const SUBMIT = 'lease-submit-key-0123456789';

describe('security: worker leases', function () {
  this.timeout(60_000);
  const redis = new TestRedis();
  const procs: Proc[] = [];
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  const as = (k: string) => ({ 'X-API-Key': k });
  const job = async (id: string) => (await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`, undefined, as(SUBMIT))).body;
  const events = async (id: string) => (await req<StoredEvent[]>(gw.url, 'GET', `/jobs/${id}/events`, undefined, as(SUBMIT))).body;

  before(async () => {
    await redis.start();
    gw = await startGatewayProc({ ...testEnv(redis.url, 'lease'), FERRY_API_KEYS: `w1:worker:${WORKER},w2:worker:${OTHER},ci:submit:${SUBMIT}` });
    procs.push(gw);
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await redis.stop();
  });

  it('a forged worker_id (the public one, without the token) is refused and changes nothing', async () => {
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'forge-1', operation: 'noop', requirements: { capabilities: ['lvm_tools'] } }, as(SUBMIT));
    const got = await req<DequeueAnswer>(gw.url, 'POST', '/queue/dequeue', { worker_id: 'honest', capabilities: ['lvm_tools'] }, as(WORKER));
    expect(got.body!.job_id).to.equal('forge-1');
    const before = await job('forge-1');
    expect(before.worker_id).to.equal('honest'); // public, by design
    expect(JSON.stringify(before)).to.not.include(got.body!.lease_token);
    const forged = { worker_id: before.worker_id, lease_token: `honest:${'0'.repeat(8)}-0000-4000-8000-${'0'.repeat(12)}` };
    for (const [p, body] of [
      ['/jobs/forge-1/events', { ...forged, phase: 'evil', percentage: 99 }], ['/jobs/forge-1/complete', { ...forged, result: { pwned: true } }],
      ['/jobs/forge-1/fail', { ...forged, error: 'sabotage', retryable: false }], ['/jobs/forge-1/start', forged], ['/jobs/forge-1/lease', forged],
    ] as [string, object][]) {
      const r = await req<JobApiError>(gw.url, 'POST', p, body, as(OTHER));
      expect(r.status, p).to.equal(409);
      expect(r.body.error.code).to.equal(409);
    }
    // Without any token the body is invalid (400 naming lease_token).
    const bare = await req<JobApiError>(gw.url, 'POST', '/jobs/forge-1/complete', { worker_id: 'honest' }, as(OTHER));
    expect(bare.status).to.equal(400);
    expect(bare.body.error.message).to.include('lease_token');
    const after = await job('forge-1');
    expect(after.state).to.equal('ASSIGNED');
    expect(after.state_history).to.deep.equal(before.state_history);
    expect(after.result).to.equal(null);
    expect(await events('forge-1')).to.have.length(0);
    // The holder still can.
    const ok = await req(gw.url, 'POST', '/jobs/forge-1/complete', { worker_id: 'honest', lease_token: got.body!.lease_token, result: { ok: 1 } }, as(WORKER));
    expect(ok.status).to.equal(200);
  });

  it('an old lease token after a requeue is refused (409) and changes nothing; renewal needs the current one', async () => {
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'replay-1', operation: 'noop', execution_policy: { retry_count: 2 }, requirements: { capabilities: ['lvm_tools'] } }, as(SUBMIT));
    const w = { worker_id: 'replayer', capabilities: ['lvm_tools'] };
    const first = (await req<DequeueAnswer>(gw.url, 'POST', '/queue/dequeue', w, as(WORKER))).body!;
    const old = { worker_id: 'replayer', lease_token: first.lease_token };
    expect((await req(gw.url, 'POST', '/jobs/replay-1/events', { ...old, phase: 'work', percentage: 10 }, as(WORKER))).status).to.equal(201);
    expect((await req<FailAnswer>(gw.url, 'POST', '/jobs/replay-1/fail', { ...old, error: 'transient' }, as(WORKER))).body.state).to.equal('QUEUED');
    // The same worker id claims it again: a new token.
    const second = await until(async () => (await req<DequeueAnswer>(gw.url, 'POST', '/queue/dequeue', w, as(WORKER))).body, 15000, 'the retry to be handed out');
    expect(second.lease_token).to.be.a('string').and.not.equal(first.lease_token);
    const snap = await job('replay-1');
    const evs = await events('replay-1');
    for (const [p, body] of [
      ['/jobs/replay-1/events', { ...old, phase: 'stale', percentage: 90 }], ['/jobs/replay-1/complete', { ...old, result: { stale: true } }],
      ['/jobs/replay-1/fail', { ...old, error: 'stale', retryable: false }], ['/jobs/replay-1/lease', old],
    ] as [string, object][]) expect((await req(gw.url, 'POST', p, body, as(WORKER))).status, p).to.equal(409);
    const hb = await req<Heartbeat>(gw.url, 'POST', '/workers/replayer/heartbeat', { lease_tokens: [first.lease_token] }, as(WORKER));
    expect(hb.body.renewed).to.deep.equal([]);
    const now = await job('replay-1');
    expect(now.state).to.equal('ASSIGNED');
    expect(now.state_history).to.deep.equal(snap.state_history);
    expect(now.attempts).to.equal(2);
    expect(await events('replay-1')).to.deep.equal(evs);
    const cur = { worker_id: 'replayer', lease_token: second.lease_token };
    expect((await req(gw.url, 'POST', '/jobs/replay-1/lease', cur, as(WORKER))).status).to.equal(200);
    expect((await req<Heartbeat>(gw.url, 'POST', '/workers/replayer/heartbeat', { lease_tokens: [second.lease_token] }, as(WORKER))).body.renewed).to.deep.equal(['replay-1']);
    expect((await req(gw.url, 'POST', '/jobs/replay-1/complete', { ...cur, result: { ok: true } }, as(WORKER))).status).to.equal(200);
    expect((await job('replay-1')).state).to.equal('COMPLETED');
  });

  it('a worker id registered with one key cannot be used with another (heartbeat, re-register, dequeue)', async () => {
    expect((await req(gw.url, 'POST', '/workers/register', { worker_id: 'bound-w', capabilities: ['lvm_tools'] }, as(WORKER))).status).to.equal(201);
    for (const [p, body] of [['/workers/bound-w/heartbeat', {}], ['/workers/register', { worker_id: 'bound-w', capabilities: [] }], ['/queue/dequeue', { worker_id: 'bound-w', capabilities: ['lvm_tools'] }]] as [string, object][]) {
      const r = await req<JobApiError>(gw.url, 'POST', p, body, as(OTHER));
      expect(r.status, p).to.equal(403);
      expect(r.body.error.message).to.include('another API key');
    }
    expect((await req<WorkerList>(gw.url, 'GET', '/workers', undefined, as(SUBMIT))).body.workers.find((w) => w.worker_id === 'bound-w')!.capabilities).to.deep.equal(['lvm_tools']);
    expect((await req(gw.url, 'POST', '/workers/bound-w/heartbeat', {}, as(WORKER))).status).to.equal(200);
  });

  it('native workers: the same rule inside queue/ refuses a stale lease', async () => {
    // The objects a worker process builds, under the gateway's key prefix (read from the environment).
    const prefix = process.env.FERRY_PREFIX;
    process.env.FERRY_PREFIX = 'lease';
    const r = createRedis({ url: redis.url });
    const store = new JobStore(r);
    const router = new QueueRouter(r, { stalledCheck: false });
    const life = new Lifecycle(store, router, new Registry(r));
    try {
      await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'native-1', operation: 'noop', execution_policy: { retry_count: 1 }, requirements: { capabilities: ['nbd_access'] } }, as(SUBMIT));
      const me = { worker_id: 'native-w', capabilities: ['nbd_access'] };
      const a = await until(() => life.claim(me), 10000, 'native claim');
      expect(a.job_id).to.equal('native-1');
      expect((await life.fail('native-1', 'native-w', a.token, 'transient', true)).state).to.equal('QUEUED');
      const b = await until(() => life.claim(me), 15000, 'native reclaim');
      const snap = await store.get('native-1');
      expect(await life.complete('native-1', 'native-w', a.token, { stale: true })).to.equal(false);
      expect((await life.progress('native-1', a.token, { phase: 'stale', percentage: 5, message: '', details: {} })).ok).to.equal(false);
      expect((await life.fail('native-1', 'native-w', a.token, 'stale', false)).ok).to.equal(false);
      let refused = '';
      await life.held('native-1', 'native-w', a.token).catch((e: ApiError) => (refused = `${e.status}`));
      expect(refused).to.equal('409');
      const after = await store.get('native-1');
      expect(after!.state_history).to.deep.equal(snap!.state_history);
      expect(after!.state).to.equal('ASSIGNED');
      expect(await life.start('native-1', 'native-w', b.token)).to.equal(true);
      expect(await life.complete('native-1', 'native-w', b.token, { ok: true })).to.equal(true);
    } finally {
      if (prefix === undefined) delete process.env.FERRY_PREFIX; else process.env.FERRY_PREFIX = prefix;
      await router.close();
      r.disconnect();
    }
  });
});
