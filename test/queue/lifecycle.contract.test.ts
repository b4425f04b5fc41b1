// The job lifecycle's contract, in-process against queue/ (Lifecycle, JobStore, the Lua scripts, QueueRouter) on
// a private redis-server: create, claim, lease loss, requeue, retry, cancel in each state, racing transitions and
// replayed calls. Each case checks the record, its history, the state indexes and BullMQ's own view of the job.
// The process-level tests (test/spine/) check the same rules through HTTP and worker processes; this suite is the
// fast, exhaustive one (n8n's job-queue.contract.ts is the model).
import { expect } from 'chai';
import { TestRedis } from '../helpers/redis';
import { until } from '../helpers/http';
import { createRedis, RedisClient } from '../../platform/redis';
import type { ValidationError } from 'joi';
import { jobSpecSchema, JobSpec } from '../../domain/schemas/job';
import { JobState, STATES } from '../../domain/states';
import { ApiError } from '../../platform/errors';
import { JobStore } from '../../queue/store';
import { bullId, QueueRouter } from '../../queue/router';
import { Registry } from '../../queue/registry';
import { Lifecycle, NOT_RETRIED } from '../../queue/lifecycle';
import { Bus } from '../../queue/bus';
import { submitEffect } from '../../orchestration/plan-effects';

describe('job lifecycle contract (queue/ in-process, real Redis)', function () {
  this.timeout(60000);
  const server = new TestRedis();
  const saved = { backoff: process.env.FERRY_RETRY_BACKOFF_MS };
  let redis: RedisClient;
  let store: JobStore;
  let router: QueueRouter;
  let registry: Registry;
  let life: Lifecycle;
  // A second process's view with a one-second lease and BullMQ's stalled check running: lease loss for real.
  let shortRedis: RedisClient;
  let shortRouter: QueueRouter;
  let shortLife: Lifecycle;
  let n = 0;

  const spec = (over: Record<string, unknown> = {}): JobSpec => {
    const { value, error } = jobSpecSchema.validate({ job_id: `c-${++n}`, operation: 'noop', ...over }) as { value: unknown; error?: ValidationError };
    if (error) throw error;
    return value as JobSpec;
  };
  const worker = (id: string, capabilities: string[] = []) => ({ worker_id: id, capabilities });
  const history = async (id: string) => (await store.get(id))!.state_history.map((h) => h.state);
  const bullState = (queue: string, id: string) => router.queue(queue).getJobState(bullId(id));
  /** Which state indexes hold the job and what the per-state counter says, so a move cannot leave a stale copy. */
  const indexed = async (id: string) => {
    const p = redis.pipeline();
    for (const s of STATES) p.zscore(store.k.jobsInState(s), id);
    const res = (await p.exec())!;
    return STATES.filter((_, i) => res[i][1] !== null);
  };
  const expectState = async (id: string, state: JobState) => {
    expect((await store.raw(id))!.state).to.equal(state);
    expect(await indexed(id)).to.deep.equal([state]);
  };
  const refusal = async (p: Promise<unknown>) => {
    try { await p; } catch (e) { return e as ApiError; }
    throw new Error('expected the call to be refused');
  };

  before(async () => {
    process.env.FERRY_RETRY_BACKOFF_MS = '100';
    await server.start();
    redis = createRedis({ url: server.url });
    store = new JobStore(redis);
    router = new QueueRouter(redis, { lockSeconds: 30, stalledCheck: false });
    registry = new Registry(redis);
    life = new Lifecycle(store, router, registry);
    shortRedis = createRedis({ url: server.url });
    shortRouter = new QueueRouter(shortRedis, { lockSeconds: 1 });
    shortLife = new Lifecycle(new JobStore(shortRedis), shortRouter, new Registry(shortRedis));
  });
  after(async () => {
    // Assigning undefined would store the string "undefined" and break the files that run after this one.
    if (saved.backoff === undefined) delete process.env.FERRY_RETRY_BACKOFF_MS;
    else process.env.FERRY_RETRY_BACKOFF_MS = saved.backoff;
    await router?.close();
    await shortRouter?.close();
    redis?.disconnect();
    shortRedis?.disconnect();
    await server.stop();
  });

  describe('create', () => {
    it('submit with enqueue: CREATED -> VALIDATED -> QUEUED in one step, waiting in BullMQ at its position', async () => {
      const s = spec({ requirements: { capabilities: ['vsphere_access'] } });
      const r = await life.submit(s, { enqueue: true });
      expect(r).to.deep.equal({ job_id: s.job_id, state: 'QUEUED', queue_position: 1 });
      expect(await history(s.job_id)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED']);
      await expectState(s.job_id, 'QUEUED');
      const rec = (await store.get(s.job_id))!;
      expect(rec).to.include({ attempts: 0, max_attempts: 4, queue: 'jobs.vsphere_access', priority: 50 });
      expect(rec.spec).to.deep.equal(s);
      expect(await bullState('jobs.vsphere_access', s.job_id)).to.equal('prioritized');
      const second = spec({ requirements: { capabilities: ['vsphere_access'] }, execution_policy: { priority: 10 } });
      expect((await life.submit(second, { enqueue: true })).queue_position).to.equal(2);
      const urgent = spec({ requirements: { capabilities: ['vsphere_access'] }, execution_policy: { priority: 90 } });
      expect((await life.submit(urgent, { enqueue: true })).queue_position).to.equal(1);
      for (const id of [s.job_id, second.job_id, urgent.job_id]) await life.cancel(id);
    });

    it('a duplicate job_id is a 409 and changes nothing', async () => {
      const s = spec();
      await life.submit(s, { enqueue: false });
      const e = await refusal(life.submit({ ...s, execution_policy: { ...s.execution_policy, priority: 99 } }, { enqueue: true }));
      expect(e.status).to.equal(409);
      expect(await history(s.job_id)).to.deep.equal(['CREATED', 'VALIDATED']);
      expect((await store.get(s.job_id))!.priority).to.equal(50);
      expect(await redis.zcard(`${router.k.bullPrefix}:jobs.any:prioritized`)).to.equal(0);
    });

    it('without enqueue the job waits VALIDATED outside any queue; enqueueExisting queues it once', async () => {
      const s = spec();
      expect(await life.submit(s, { enqueue: false })).to.deep.equal({ job_id: s.job_id, state: 'VALIDATED', queue_position: 0 });
      await expectState(s.job_id, 'VALIDATED');
      expect(await bullState('jobs.any', s.job_id)).to.equal('unknown');
      expect((await life.enqueueExisting(s.job_id)).state).to.equal('QUEUED');
      expect((await refusal(life.enqueueExisting(s.job_id))).status).to.equal(400);
      expect((await refusal(life.enqueueExisting('no-such-job'))).status).to.equal(404);
      expect(await history(s.job_id)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED']);
      await life.cancel(s.job_id);
    });
  });

  describe('claim', () => {
    it('hands a job only to a worker with its capabilities, under a lease, most specific queue first', async () => {
      const general = spec();
      const special = spec({ requirements: { capabilities: ['nbd_access'] } });
      await life.submit(general, { enqueue: true });
      await life.submit(special, { enqueue: true });
      const plain = worker('plain');
      const first = await life.claim(plain);
      expect(first!.job_id).to.equal(general.job_id); // the nbd job is not for it
      expect(await life.claim(plain)).to.equal(null);
      await life.submit(spec(), { enqueue: true }); // a general job, submitted after the special one
      const nbd = await life.claim(worker('nbd', ['nbd_access']));
      expect(nbd!.job_id).to.equal(special.job_id);
      expect(nbd!.queue).to.equal('jobs.nbd_access');
      expect(nbd!.token).to.match(/^nbd:/);
      expect(nbd!.record).to.include({ state: 'ASSIGNED', worker_id: 'nbd', attempts: 1 });
      await expectState(special.job_id, 'ASSIGNED');
      expect(await bullState('jobs.nbd_access', special.job_id)).to.equal('active');
      expect(await registry.heldJobs('nbd')).to.deep.equal([special.job_id]);
      expect((await store.raw(special.job_id))!.lease).to.equal(nbd!.token);
      const last = (await store.get(special.job_id))!.state_history.at(-1)!;
      expect(last).to.include({ state: 'ASSIGNED', worker_id: 'nbd', reason: 'assigned to worker nbd (attempt 1 of 4)' });
      // The rest of the run: start, progress, complete; the lease is checked at each step.
      expect(await life.start(special.job_id, 'nbd', 'nbd:wrong-token')).to.equal(false);
      expect(await life.start(special.job_id, 'nbd', nbd!.token)).to.equal(true);
      expect((await life.progress(special.job_id, 'nbd:wrong-token', { phase: 'work', percentage: 50, message: '', details: {} })).ok).to.equal(false);
      expect((await life.progress(special.job_id, nbd!.token, { phase: 'work', percentage: 50, message: 'half', details: {} })).ok).to.equal(true);
      expect(await life.complete(special.job_id, 'nbd', 'nbd:wrong-token', {})).to.equal(false);
      expect(await life.complete(special.job_id, 'nbd', nbd!.token, { ok: 1 })).to.equal(true);
      await expectState(special.job_id, 'COMPLETED');
      const done = (await store.get(special.job_id))!;
      expect(done.result).to.deep.equal({ ok: 1 });
      expect(done.state_history.map((h) => h.state)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED', 'ASSIGNED', 'RUNNING', 'COMPLETED']);
      expect((await store.events(special.job_id)).map((e) => `${e.phase}:${e.percentage}`)).to.deep.equal(['initialization:0', 'work:50', 'completed:100']);
      expect(await bullState('jobs.nbd_access', special.job_id)).to.equal('unknown'); // removed on completion
      expect(await registry.heldJobs('nbd')).to.deep.equal([]);
      // The nbd worker serves general jobs too, once no more specific one waits.
      expect((await life.claim(worker('nbd', ['nbd_access'])))!.queue).to.equal('jobs.any');
    });

    it('a job cancelled while queued is dropped by the claim, not handed out', async () => {
      const s = spec({ requirements: { capabilities: ['mount_operations'] } });
      await life.submit(s, { enqueue: true });
      // Simulate the cancel racing the queue removal: the record is CANCELLED, the BullMQ entry still waits.
      await store.transition(s.job_id, [{ to: 'CANCELLED', reason: 'cancelled by request' }]);
      expect(await life.claim(worker('m', ['mount_operations']))).to.equal(null);
      expect(await bullState('jobs.mount_operations', s.job_id)).to.equal('unknown');
      await expectState(s.job_id, 'CANCELLED');
    });

    it('no attempts left at claim time: FAILED with the reason, not handed out', async () => {
      const s = spec({ requirements: { capabilities: ['mount_operations'] }, execution_policy: { retry_count: 0 } });
      await life.submit(s, { enqueue: true });
      await redis.hset(store.k.job(s.job_id), 'attempts', 1); // the one attempt already used (a lost hand-back)
      expect(await life.claim(worker('m', ['mount_operations']))).to.equal(null);
      await expectState(s.job_id, 'FAILED');
      expect((await store.get(s.job_id))!.state_history.at(-1)!.reason).to.equal('no attempts left (1 of 1 used)');
    });
  });

  describe('lease loss', () => {
    it('a lease that is not renewed expires: BullMQ finds the job stalled, it is requeued with the reason and taken by another worker; the old lease is refused', async () => {
      const s = spec({ requirements: { capabilities: ['lvm_tools'] }, execution_policy: { retry_count: 1 } });
      await life.submit(s, { enqueue: true });
      const a = await shortLife.claim(worker('lvm-a', ['lvm_tools']));
      expect(a!.job_id).to.equal(s.job_id);
      await shortLife.start(s.job_id, 'lvm-a', a!.token);
      // No renewal: within about two stalled-check intervals the job is back.
      await until(async () => (await store.raw(s.job_id))!.state === 'QUEUED', 20000, 'the stalled job to be requeued');
      const lost = (await store.get(s.job_id))!.state_history.at(-1)!;
      expect(lost.reason).to.match(/^worker lvm-a lost: its lease expired .*; requeued \(attempt 1 of 2 used\)$/);
      expect(await registry.heldJobs('lvm-a')).to.deep.equal([]);
      const b = await until(() => shortLife.claim(worker('lvm-b', ['lvm_tools'])), 10000, 'the requeued job to be claimable');
      expect(b.job_id).to.equal(s.job_id);
      expect(b.record.attempts).to.equal(2);
      // The first worker comes back and reports: every call with its old lease is refused and changes nothing.
      expect(await shortLife.complete(s.job_id, 'lvm-a', a!.token, {})).to.equal(false);
      expect((await shortLife.fail(s.job_id, 'lvm-a', a!.token, 'late', true)).ok).to.equal(false);
      expect((await shortLife.progress(s.job_id, a!.token, { phase: 'x', percentage: 1, message: '', details: {} })).ok).to.equal(false);
      expect(await shortLife.handBack(s.job_id, 'lvm-a', a!.token, 'late')).to.equal(false);
      await expectState(s.job_id, 'ASSIGNED');
      // The second loss uses the last attempt: FAILED with the reason, gone from BullMQ.
      await until(async () => (await store.raw(s.job_id))!.state === 'FAILED', 20000, 'the second loss to fail the job');
      expect((await store.get(s.job_id))!.state_history.at(-1)!.reason).to.match(/^worker lvm-b lost: .*; no retries left \(2 of 2\)$/);
      await expectState(s.job_id, 'FAILED');
      await until(async () => (await bullState('jobs.lvm_tools', s.job_id)) === 'unknown', 10000, 'the job to leave BullMQ');
    });

    it('a process with long (HTTP) leases on the same queue does not hold off the stalled check: a lapsed lease is still found within two native lease periods', async () => {
      // The gateway hands jobs to HTTP workers under a lease of minutes; its BullMQ Worker on a queue checks for
      // stalled jobs too, and BullMQ's throttle key is shared by every process on the queue.
      const was = process.env.FERRY_LEASE_SECONDS;
      process.env.FERRY_LEASE_SECONDS = '1';
      const gwRedis = createRedis({ url: server.url });
      const gwRouter = new QueueRouter(gwRedis, { lockSeconds: 370 });
      void new Lifecycle(new JobStore(gwRedis), gwRouter, new Registry(gwRedis)); // records the losses its check finds, as in the gateway
      try {
        const s = spec({ requirements: { capabilities: ['nbd_access'] }, execution_policy: { retry_count: 1 } });
        await life.submit(s, { enqueue: true });
        await gwRouter.watchAll(); // its Worker on every known queue, checking
        await until(async () => (await redis.exists(`${router.k.bullPrefix}:jobs.nbd_access:stalled-check`)) === 1, 10000, "the gateway's first stalled check");
        const a = await shortLife.claim(worker('nbd-a', ['nbd_access']));
        expect(a!.job_id).to.equal(s.job_id);
        await shortLife.start(s.job_id, 'nbd-a', a!.token);
        await until(async () => (await store.raw(s.job_id))!.state === 'QUEUED', 10000, 'the stalled job to be requeued');
        await life.cancel(s.job_id);
      } finally {
        if (was === undefined) delete process.env.FERRY_LEASE_SECONDS;
        else process.env.FERRY_LEASE_SECONDS = was;
        await gwRouter.close();
        gwRedis.disconnect();
      }
    });

    it('a stale or removed worker gives its jobs back at once (releaseWorker)', async () => {
      const s = spec();
      await life.submit(s, { enqueue: true });
      const l = await life.claim(worker('stale-w'));
      expect(l!.job_id).to.equal(s.job_id);
      await life.releaseWorker('stale-w', 'no heartbeat for 300 s');
      await expectState(s.job_id, 'QUEUED');
      expect((await store.get(s.job_id))!.state_history.at(-1)!.reason).to.equal('worker stale-w lost: no heartbeat for 300 s; requeued (attempt 1 of 4 used)');
      expect(await bullState('jobs.any', s.job_id)).to.be.oneOf(['waiting', 'prioritized']);
      expect(await registry.heldJobs('stale-w')).to.deep.equal([]);
      const again = await life.claim(worker('fresh-w'));
      expect(again!.job_id).to.equal(s.job_id);
      expect(again!.record.attempts).to.equal(2);
      await life.cancel(s.job_id);
    });
  });

  describe('requeue and retry', () => {
    it('a hand-back returns the job at once without spending an attempt', async () => {
      const s = spec();
      await life.submit(s, { enqueue: true });
      const l = await life.claim(worker('hb'));
      expect(await life.handBack(s.job_id, 'hb', l!.token, 'worker shutting down')).to.equal(true);
      await expectState(s.job_id, 'QUEUED');
      const h = (await store.get(s.job_id))!;
      expect(h.attempts).to.equal(0);
      expect(h.worker_id).to.equal(null);
      expect(h.state_history.at(-1)!.reason).to.equal('handed back by worker hb: worker shutting down');
      const again = await life.claim(worker('hb2'));
      expect(again!.job_id).to.equal(s.job_id);
      expect(again!.record.attempts).to.equal(1);
      await life.cancel(s.job_id);
    });

    it('a retryable failure requeues after a backoff until retry_count is spent, then FAILED with the reason', async () => {
      const s = spec({ execution_policy: { retry_count: 1 } });
      await life.submit(s, { enqueue: true });
      const a = await life.claim(worker('rt'));
      await life.start(s.job_id, 'rt', a!.token);
      const f = await life.fail(s.job_id, 'rt', a!.token, 'disk full', true);
      expect(f).to.include({ ok: true, state: 'QUEUED' });
      expect(f.retry_in_ms).to.be.within(80, 120);
      await expectState(s.job_id, 'QUEUED');
      expect(await bullState('jobs.any', s.job_id)).to.equal('delayed');
      expect((await store.get(s.job_id))!.error).to.equal('disk full');
      const b = await until(() => life.claim(worker('rt')), 10000, 'the retry to become claimable');
      expect(b.record.attempts).to.equal(2);
      await life.start(s.job_id, 'rt', b.token);
      expect(await life.fail(s.job_id, 'rt', b.token, 'disk full again', true)).to.deep.equal({ ok: true, state: 'FAILED' });
      await expectState(s.job_id, 'FAILED');
      const h = (await store.get(s.job_id))!;
      expect(h.state_history.map((x) => x.state)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED', 'ASSIGNED', 'RUNNING', 'QUEUED', 'ASSIGNED', 'RUNNING', 'FAILED']);
      expect(h.state_history.at(-1)!.reason).to.equal('disk full again (attempt 2 of 2; no retries left)');
      expect(await bullState('jobs.any', s.job_id)).to.equal('unknown');
    });

    it('a failure marked not retryable fails at once whatever retry_count allows', async () => {
      const s = spec();
      await life.submit(s, { enqueue: true });
      const a = await life.claim(worker('nr'));
      await life.start(s.job_id, 'nr', a!.token);
      expect(await life.fail(s.job_id, 'nr', a!.token, 'bad image', false)).to.deep.equal({ ok: true, state: 'FAILED' });
      await expectState(s.job_id, 'FAILED');
      expect((await store.get(s.job_id))!.state_history.at(-1)!.reason).to.equal('bad image');
    });
  });

  describe('execution policy', () => {
    it('idempotent: false: a failed attempt, or a lost one, ends the job with the reason whatever retry_count allows', async () => {
      const s = spec({ execution_policy: { retry_count: 3, idempotent: false } });
      await life.submit(s, { enqueue: true });
      const a = await life.claim(worker('ni'));
      await life.start(s.job_id, 'ni', a!.token);
      expect(await life.fail(s.job_id, 'ni', a!.token, 'write error', true)).to.deep.equal({ ok: true, state: 'FAILED' });
      expect((await store.get(s.job_id))!.state_history.at(-1)!.reason).to.equal(`write error (attempt 1 of 4; ${NOT_RETRIED})`);
      await expectState(s.job_id, 'FAILED');
      const lost = spec({ execution_policy: { retry_count: 3, idempotent: false } });
      await life.submit(lost, { enqueue: true });
      expect((await life.claim(worker('ni-lost')))!.job_id).to.equal(lost.job_id);
      await life.releaseWorker('ni-lost', 'worker deregistered');
      await expectState(lost.job_id, 'FAILED');
      expect((await store.get(lost.job_id))!.state_history.at(-1)!.reason).to.equal(`worker ni-lost lost: worker deregistered; ${NOT_RETRIED}`);
      expect(await bullState('jobs.any', lost.job_id)).to.equal('unknown'); // the lock ended, the entry removed
    });

    it('timeout_seconds: an attempt claimed with a deadline is ended by reapTimedOut once it has passed, and only then', async () => {
      const s = spec({ execution_policy: { timeout_seconds: 5, retry_count: 1 } });
      await life.submit(s, { enqueue: true });
      const t0 = Date.now();
      const a = await life.claim(worker('pull'), undefined, { deadline: true });
      await life.start(s.job_id, 'pull', a!.token);
      const deadline = Number((await store.raw(s.job_id))!.deadline);
      expect(deadline).to.be.within(t0 + 5000, Date.now() + 5000);
      expect(await life.reapTimedOut(deadline - 1)).to.deep.equal([]);
      expect(await life.reapTimedOut(deadline)).to.deep.equal([s.job_id]);
      await expectState(s.job_id, 'QUEUED');
      expect((await store.get(s.job_id))!.state_history.at(-1)!.reason).to.match(/^attempt 1 of 2 failed on worker pull: timed out after 5 s \(execution_policy.timeout_seconds\); retrying in /);
      expect(await life.complete(s.job_id, 'pull', a!.token, {})).to.equal(false);
      // Claimed by a worker process (no deadline): its own timer rules, the sweep leaves it alone.
      const b = await until(() => life.claim(worker('native')), 10000, 'the retry');
      expect((await store.raw(s.job_id))!.deadline).to.equal(undefined);
      expect(await life.reapTimedOut(Date.now() + 86_400_000)).to.deep.equal([]);
      await life.start(s.job_id, 'native', b.token);
      await expectState(s.job_id, 'RUNNING');
      await life.cancel(s.job_id);
    });
  });

  describe('cancel in each state', () => {
    it('CREATED and VALIDATED: CANCELLED, nothing queued', async () => {
      const created = `c-${++n}`;
      await store.create(created, { spec: JSON.stringify(spec({ job_id: created })), queue: 'jobs.any', priority: 50, attempts: 0, max_attempts: 1 }, []);
      await expectState(created, 'CREATED');
      expect((await life.cancel(created)).message).to.equal(`job ${created} was cancelled (was CREATED)`);
      await expectState(created, 'CANCELLED');
      const s = spec();
      await life.submit(s, { enqueue: false });
      expect((await life.cancel(s.job_id)).state).to.equal('CANCELLED');
      expect(await history(s.job_id)).to.deep.equal(['CREATED', 'VALIDATED', 'CANCELLED']);
    });

    it('QUEUED: CANCELLED and removed from BullMQ, so no worker receives it', async () => {
      const s = spec({ requirements: { capabilities: ['libvirt_access'] } });
      await life.submit(s, { enqueue: true });
      await life.cancel(s.job_id, 'operator said so');
      await expectState(s.job_id, 'CANCELLED');
      expect((await store.get(s.job_id))!.state_history.at(-1)!.reason).to.equal('operator said so');
      expect(await bullState('jobs.libvirt_access', s.job_id)).to.equal('unknown');
      expect(await life.claim(worker('lv', ['libvirt_access']))).to.equal(null);
    });

    for (const at of ['ASSIGNED', 'RUNNING'] as const) {
      it(`${at}: CANCELLED, the worker is told on the bus, its lease ends and its reports are refused`, async () => {
        const bus = new Bus(server.url);
        const told: string[] = [];
        await bus.on('cancel', (id) => told.push(String(id)));
        try {
          const s = spec();
          await life.submit(s, { enqueue: true });
          const l = await life.claim(worker(`cw-${at}`));
          if (at === 'RUNNING') await life.start(s.job_id, `cw-${at}`, l!.token);
          await expectState(s.job_id, at);
          expect((await life.cancel(s.job_id)).message).to.equal(`job ${s.job_id} was cancelled (was ${at})`);
          await until(() => told.includes(s.job_id), 5000, 'the cancel message');
          await expectState(s.job_id, 'CANCELLED');
          expect((await store.raw(s.job_id))!.lease).to.equal(undefined);
          expect(await bullState('jobs.any', s.job_id)).to.equal('unknown');
          expect(await registry.heldJobs(`cw-${at}`)).to.deep.equal([]);
          expect(await life.start(s.job_id, `cw-${at}`, l!.token)).to.equal(false);
          expect(await life.complete(s.job_id, `cw-${at}`, l!.token, {})).to.equal(false);
          expect((await life.fail(s.job_id, `cw-${at}`, l!.token, 'x', true)).ok).to.equal(false);
          await expectState(s.job_id, 'CANCELLED');
        } finally {
          await bus.close();
        }
      });
    }

    it('COMPLETED, FAILED, CANCELLED: a 400 naming the state; unknown jobs a 404', async () => {
      for (const end of ['COMPLETED', 'FAILED', 'CANCELLED'] as const) {
        const s = spec();
        await life.submit(s, { enqueue: true });
        const l = await life.claim(worker('end'));
        await life.start(s.job_id, 'end', l!.token);
        if (end === 'COMPLETED') await life.complete(s.job_id, 'end', l!.token, {});
        if (end === 'FAILED') await life.fail(s.job_id, 'end', l!.token, 'broken', false);
        if (end === 'CANCELLED') await life.cancel(s.job_id);
        const e = await refusal(life.cancel(s.job_id));
        expect(e.status).to.equal(400);
        expect(e.message).to.equal(`job ${s.job_id} is already ${end} and cannot be cancelled`);
        await expectState(s.job_id, end);
      }
      expect((await refusal(life.cancel('nobody'))).status).to.equal(404);
    });
  });

  describe('racing transitions', () => {
    it('ten workers claiming at once: each job goes to exactly one', async () => {
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) { const s = spec({ requirements: { capabilities: ['img_tool'] } }); ids.push(s.job_id); await life.submit(s, { enqueue: true }); }
      const got = await Promise.all(Array.from({ length: 10 }, (_, i) => life.claim(worker(`race-${i}`, ['img_tool']))));
      const claimed = got.filter(Boolean).map((l) => l!.job_id);
      expect(claimed.sort()).to.deep.equal([...ids].sort());
      for (const id of ids) {
        const h = (await store.get(id))!;
        expect(h.state_history.filter((x) => x.state === 'ASSIGNED').length).to.equal(1);
        await expectState(id, 'ASSIGNED');
      }
      for (const id of ids) await life.cancel(id);
    });

    it('cancel racing complete: exactly one wins and the record, history and indexes agree', async () => {
      for (let round = 0; round < 5; round++) {
        const s = spec();
        await life.submit(s, { enqueue: true });
        const l = await life.claim(worker('rc'));
        await life.start(s.job_id, 'rc', l!.token);
        const [done, cancelled] = await Promise.allSettled([life.complete(s.job_id, 'rc', l!.token, {}), life.cancel(s.job_id)]);
        const completeWon = done.status === 'fulfilled' && done.value === true;
        const cancelWon = cancelled.status === 'fulfilled';
        expect(completeWon !== cancelWon, `round ${round}: exactly one wins`).to.equal(true);
        const end = completeWon ? 'COMPLETED' : 'CANCELLED';
        await expectState(s.job_id, end);
        const hist = await history(s.job_id);
        expect(hist.filter((x) => x === 'COMPLETED' || x === 'CANCELLED')).to.deep.equal([end]);
      }
    });

    it('three cancels at once: one succeeds, the others are refused', async () => {
      const s = spec();
      await life.submit(s, { enqueue: true });
      const rs = await Promise.allSettled([life.cancel(s.job_id), life.cancel(s.job_id), life.cancel(s.job_id)]);
      expect(rs.filter((r) => r.status === 'fulfilled').length).to.equal(1);
      for (const r of rs) if (r.status === 'rejected') expect((r.reason as ApiError).status).to.be.oneOf([400, 409]);
      expect((await history(s.job_id)).filter((x) => x === 'CANCELLED').length).to.equal(1);
    });

    it('an illegal move is refused and changes nothing', async () => {
      const s = spec();
      await life.submit(s, { enqueue: true });
      expect(await store.transition(s.job_id, [{ to: 'COMPLETED', reason: 'skip the run' }])).to.deep.equal({ ok: false, code: 'conflict', state: 'QUEUED' });
      expect(await store.transition('absent', [{ to: 'QUEUED', reason: 'x' }])).to.deep.equal({ ok: false, code: 'missing', state: null });
      expect(await history(s.job_id)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED']);
      await life.cancel(s.job_id);
    });
  });

  describe('idempotent replays', () => {
    it('a transition resent after a lost reply is answered as applied, once in the history', async () => {
      const s = spec();
      await life.submit(s, { enqueue: false });
      const step = [{ to: 'QUEUED' as const, reason: 'queued' }];
      expect((await store.transition(s.job_id, step, { op: 'op-1' })).ok).to.equal(true);
      expect((await store.transition(s.job_id, step, { op: 'op-1' })).ok).to.equal(true);
      // The same move under another call id is a real second move, refused by the table.
      expect(await store.transition(s.job_id, step, { op: 'op-2' })).to.deep.include({ ok: false, code: 'conflict' });
      expect(await history(s.job_id)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED']);
      await expectState(s.job_id, 'QUEUED');
    });

    it('a create resent after a lost reply makes one job, not a duplicate-id refusal', async () => {
      const id = `c-${++n}`;
      const k = store.k;
      const fields = { queue: 'jobs.any', priority: 50 };
      const step = [{ to: 'VALIDATED' as const, reason: 'validated' }];
      const first = await store.create(id, fields, step, 'create-1');
      const again = await store.create(id, fields, step, 'create-1');
      expect(first).to.deep.equal({ created: true, seq: again.seq });
      expect(again.created).to.equal(true);
      expect(await store.total()).to.equal(await redis.get(k.seq).then(Number));
      expect(await history(id)).to.deep.equal(['CREATED', 'VALIDATED']);
      expect((await store.create(id, fields, step, 'create-2')).created).to.equal(false);
    });

    it('a worker repeating complete or fail after it succeeded gets a refusal and the outcome stands', async () => {
      const s = spec();
      await life.submit(s, { enqueue: true });
      const l = await life.claim(worker('rep'));
      await life.start(s.job_id, 'rep', l!.token);
      expect(await life.start(s.job_id, 'rep', l!.token)).to.equal(false);
      expect(await life.complete(s.job_id, 'rep', l!.token, { n: 1 })).to.equal(true);
      expect(await life.complete(s.job_id, 'rep', l!.token, { n: 2 })).to.equal(false);
      expect((await life.fail(s.job_id, 'rep', l!.token, 'late', true)).ok).to.equal(false);
      const h = (await store.get(s.job_id))!;
      expect(h.result).to.deep.equal({ n: 1 });
      expect(h.state_history.filter((x) => x.state === 'RUNNING' || x.state === 'COMPLETED').map((x) => x.state)).to.deep.equal(['RUNNING', 'COMPLETED']);
      await expectState(s.job_id, 'COMPLETED');
    });
  });

  describe('a plan effect whose leader died between recording its job and adding it to BullMQ', () => {
    it('the next leader resuming the claim puts the QUEUED job back in its queue, once; a job in its queue is left alone', async () => {
      const id = `c-${++n}.rollback`;
      const effect = { id, op: 'rollback_kvm' as const, parameters: { of_job: `c-${n}`, power_on_source: false }, caller: null, meta: { plan_id: 'p' } };
      expect(await submitEffect(life, effect), 'submitted, not ended').to.equal(null);
      const queue = (await store.raw(id))!.queue;
      expect(await bullState(queue, id)).to.be.oneOf(['waiting', 'prioritized']);
      await router.remove(queue, id); // the add that a dead leader never made
      expect(await bullState(queue, id)).to.equal('unknown');
      await expectState(id, 'QUEUED');
      expect(await submitEffect(life, effect), 'resumed: still not ended').to.equal(null);
      expect(await bullState(queue, id), 'back in BullMQ').to.be.oneOf(['waiting', 'prioritized']);
      expect(await life.restoreMissing([id], 0), 'present now: nothing to put back').to.deep.equal([]);
      await expectState(id, 'QUEUED');
    });
  });

  describe('afterwards', () => {
    it('the per-queue counts agree with the state indexes after every case above', async () => {
      const queues = await router.knownQueues();
      const counts: Record<string, Record<string, number>> = await store.queueCounts(queues);
      const p = redis.pipeline();
      for (const s of ['QUEUED', 'ASSIGNED', 'RUNNING']) p.zrange(store.k.jobsInState(s), 0, -1);
      const ids = ((await p.exec()) || []).flatMap(([, v]) => v as string[]);
      const recs = await store.many(ids, ['state', 'queue']);
      const want: Record<string, Record<string, number>> = Object.fromEntries(queues.map((q) => [q, { QUEUED: 0, ASSIGNED: 0, RUNNING: 0 }]));
      for (const h of recs) want[h!.queue][h!.state]++;
      expect(counts).to.deep.equal(want);
      // Every job is in exactly one state index.
      const all = (await Promise.all(STATES.map((s) => redis.zrange(store.k.jobsInState(s), 0, -1)))).flat();
      expect(new Set(all).size).to.equal(all.length);
      expect(await store.total()).to.equal(Number(await redis.get(store.k.seq)));
    });
  });
});
