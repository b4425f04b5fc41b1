// execution_policy obeyed by the running services: `idempotent: false` ends a job at its first failed or lost
// attempt (worker processes and HTTP pull workers alike), and `timeout_seconds` ends the attempts of HTTP pull
// workers too (the gateway's timeout sweep), not only those of worker processes, which stop on their own timer.
import { expect } from 'chai';
import { TestRedis } from '../helpers/redis';
import { Proc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DequeueAnswer, JobStatus, WorkerList } from '../helpers/api-types';
import { createRedis, keys, RedisClient } from '../../platform/redis';
import { BullLayout } from '../../queue/bullmq-layout';
import { bullId } from '../../queue/router';

const NOT_RETRIED = 'not retried: execution_policy.idempotent is false';
const terminal = (s: string) => ['COMPLETED', 'FAILED', 'CANCELLED'].includes(s);

describe('execution policy: idempotent and timeout_seconds', function () {
  this.timeout(120000);
  const redis = new TestRedis();
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let env: Record<string, string>;
  let r: RedisClient;
  const procs: Proc[] = [];

  const job = async (id: string) => (await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`)).body;
  const waitFor = (id: string, pred: (j: JobStatus) => boolean, what: string, ms = 60000) =>
    until(async () => { const j = await job(id); return pred(j) && j; }, ms, `job ${id}: ${what}`).catch(async (e: Error) => { throw new Error(`${e.message}; now ${JSON.stringify((await job(id))?.state_history)}`); });
  /** BullMQ's own record of the job: gone once Ferry has finished with it. */
  const inBullmq = async (queue: string, id: string) => (await r.exists(new BullLayout(keys('ferry').bullPrefix).job(queue, bullId(id)))) === 1;
  const submit = async (body: object) => {
    const res = await req(gw.url, 'POST', '/jobs?queue=true', body);
    expect(res.status, res.text).to.equal(201);
  };

  before(async () => {
    await redis.start();
    env = { ...testEnv(redis.url), FERRY_TIMEOUT_SWEEP_SECONDS: '1' };
    gw = await startGatewayProc(env);
    r = createRedis({ url: redis.url });
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await gw?.stop();
    r?.disconnect();
    await redis.stop();
  });

  describe('idempotent: false, worker processes', () => {
    before(async () => {
      procs.push(await startWorkerProc(env, 'pw-1', ['img_tool']));
      await until(async () => (await req<WorkerList>(gw.url, 'GET', '/workers')).body.workers.some((w) => w.worker_id === 'pw-1' && w.active), 30000, 'worker pw-1');
    });

    it('a failed attempt is not retried: FAILED at once with the reason, while an idempotent twin is retried', async () => {
      await submit({ job_id: 'once-fail', operation: 'noop', parameters: { fail: 'disk write error' }, execution_policy: { retry_count: 3, idempotent: false } });
      await submit({ job_id: 'twice-fail', operation: 'noop', parameters: { fail: 'disk write error' }, execution_policy: { retry_count: 1 } });
      const once = await waitFor('once-fail', (j) => terminal(j.state), 'finished');
      expect(once.state).to.equal('FAILED');
      expect(once.attempts).to.equal(1);
      expect(once.state_history.map((h) => h.state)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED', 'ASSIGNED', 'RUNNING', 'FAILED']);
      expect(once.state_history.at(-1)!.reason).to.equal(`disk write error (attempt 1 of 4; ${NOT_RETRIED})`);
      const twice = await waitFor('twice-fail', (j) => terminal(j.state), 'finished');
      expect(twice.state_history.filter((h) => h.state === 'RUNNING').length).to.equal(2);
      expect(await inBullmq('jobs.img_tool', 'once-fail')).to.equal(false);
    });

    it('a lost attempt (worker process killed mid-run) is not retried: FAILED with the reason, never run again', async () => {
      const victim = await startWorkerProc(env, 'victim', ['img_tool', 'lvm_tools']);
      procs.push(victim);
      await submit({ job_id: 'once-lost', operation: 'noop', parameters: { sleep_ms: 60000, steps: 60 }, requirements: { capabilities: ['lvm_tools'] }, execution_policy: { retry_count: 3, idempotent: false } });
      await waitFor('once-lost', (j) => j.state === 'RUNNING' && j.worker_id === 'victim', 'running on victim');
      await victim.kill();
      // Another process serving the queue finds the stalled job (the lease is 2 s here).
      const rescuer = await startWorkerProc(env, 'rescuer', ['img_tool', 'lvm_tools']);
      procs.push(rescuer);
      const j = await waitFor('once-lost', (x) => terminal(x.state), 'failed after the loss', 90000)
        .catch((e: Error) => { throw new Error(`${e.message}\nrescuer logs:\n${rescuer.logs.join('')}`); });
      expect(j.state).to.equal('FAILED');
      expect(j.state_history.at(-1)!.reason).to.match(/^worker victim lost.*; not retried: execution_policy\.idempotent is false$/);
      expect(j.state_history.filter((h) => h.state === 'ASSIGNED').length).to.equal(1);
      expect(j.attempts).to.equal(1);
      await until(async () => !(await inBullmq('jobs.lvm_tools', 'once-lost')), 15000, 'the job to leave BullMQ');
      // The rescuer is idle and serves the queue: a later job there runs, and the failed one stays failed.
      await submit({ job_id: 'after-lost', operation: 'noop', requirements: { capabilities: ['lvm_tools'] } });
      expect((await waitFor('after-lost', (x) => terminal(x.state), 'done')).worker_id).to.equal('rescuer');
      expect((await job('once-lost')).state_history.length).to.equal(j.state_history.length);
    });
  });

  describe('HTTP pull workers', () => {
    const w = { worker_id: 'puller', capabilities: ['mount_operations'] };
    let beat: NodeJS.Timeout | undefined;
    const tokens = new Map<string, string>(); // job id -> the lease token its dequeue handed out
    before(async () => {
      expect((await req(gw.url, 'POST', '/workers/register', { ...w, system_info: {}, execution_mode: 'PROCESS' })).status).to.equal(201);
      // A well-behaved worker heartbeats (renewing its leases): that does not stretch timeout_seconds.
      beat = setInterval(() => {
        req(gw.url, 'POST', '/workers/puller/heartbeat', { lease_tokens: [...tokens.values()] }).catch(() => undefined); // the next beat retries
      }, 500);
    });
    after(() => clearInterval(beat));

    const take = async (id: string) => {
      let asked = 0; // when the successful dequeue was sent: the attempt's clock starts at or after it
      const got = await until(async () => { asked = Date.now(); return (await req<DequeueAnswer>(gw.url, 'POST', '/queue/dequeue', w)).body; }, 10000, `dequeue of ${id}`);
      expect(got.job_id).to.equal(id);
      tokens.set(id, got.lease_token);
      expect((await req(gw.url, 'POST', `/jobs/${id}/start`, { worker_id: w.worker_id, lease_token: got.lease_token })).status).to.equal(200);
      return asked;
    };

    it('timeout_seconds ends an attempt the pull worker overruns: retried while retry_count allows, then FAILED; late reports refused', async () => {
      await submit({ job_id: 'slow-pull', operation: 'noop', requirements: { capabilities: ['mount_operations'] }, execution_policy: { timeout_seconds: 2, retry_count: 1 } });
      const t1 = await take('slow-pull');
      const requeued = await waitFor('slow-pull', (j) => j.state === 'QUEUED' && j.attempts === 1, 'requeued after the timeout', 15000);
      expect(Date.now() - t1).to.be.at.least(2000);
      expect(requeued.state_history.at(-1)!.reason).to.match(/^attempt 1 of 2 failed on worker puller: timed out after 2 s \(execution_policy.timeout_seconds\); retrying in /);
      // The worker finishes late: refused, and the job is not completed by it.
      const late = await req(gw.url, 'POST', '/jobs/slow-pull/complete', { worker_id: w.worker_id, lease_token: tokens.get('slow-pull'), result: { late: true } });
      expect(late.status).to.equal(409);
      const t2 = await take('slow-pull');
      const failed = await waitFor('slow-pull', (j) => terminal(j.state), 'failed after the second timeout', 15000);
      expect(Date.now() - t2).to.be.at.least(2000);
      expect(failed.state).to.equal('FAILED');
      expect(failed.result).to.equal(null);
      expect(failed.error).to.equal('timed out after 2 s (execution_policy.timeout_seconds)');
      expect(failed.state_history.at(-1)!.reason).to.equal('timed out after 2 s (execution_policy.timeout_seconds) (attempt 2 of 2; no retries left)');
      expect(failed.state_history.map((h) => h.state)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED', 'ASSIGNED', 'RUNNING', 'QUEUED', 'ASSIGNED', 'RUNNING', 'FAILED']);
      expect((await req(gw.url, 'POST', '/jobs/slow-pull/events', { worker_id: w.worker_id, lease_token: tokens.get('slow-pull'), phase: 'work', percentage: 99 })).status).to.equal(409);
      expect(await inBullmq('jobs.mount_operations', 'slow-pull')).to.equal(false);
      expect((await req<WorkerList>(gw.url, 'GET', '/workers')).body.workers.find((x) => x.worker_id === 'puller')!.jobs).to.deep.equal([]);
    });

    it('a pull worker that reports in time is not touched by the sweep', async () => {
      await submit({ job_id: 'quick-pull', operation: 'noop', requirements: { capabilities: ['mount_operations'] }, execution_policy: { timeout_seconds: 3, retry_count: 0 } });
      await take('quick-pull');
      expect((await req(gw.url, 'POST', '/jobs/quick-pull/complete', { worker_id: w.worker_id, lease_token: tokens.get('quick-pull'), result: { ok: true } })).status).to.equal(200);
      // A sentinel taken now with a longer timeout: once the sweep has ended it, the sweep has run past
      // quick-pull's deadline too.
      await submit({ job_id: 'sentinel', operation: 'noop', requirements: { capabilities: ['mount_operations'] }, execution_policy: { timeout_seconds: 4, retry_count: 0 } });
      await take('sentinel');
      expect((await waitFor('sentinel', (x) => terminal(x.state), 'ended by the sweep', 20000)).state).to.equal('FAILED');
      const j = await job('quick-pull');
      expect(j.state).to.equal('COMPLETED');
      expect(j.state_history.at(-1)!.state).to.equal('COMPLETED');
      expect(j.result).to.deep.equal({ ok: true });
    });

    it('idempotent: false with a pull worker: a timed-out attempt, or one lost when the worker is removed, fails at once', async () => {
      await submit({ job_id: 'once-slow', operation: 'noop', requirements: { capabilities: ['mount_operations'] }, execution_policy: { timeout_seconds: 1, retry_count: 3, idempotent: false } });
      await take('once-slow');
      const j = await waitFor('once-slow', (x) => terminal(x.state), 'failed at the timeout', 15000);
      expect(j.state).to.equal('FAILED');
      expect(j.state_history.at(-1)!.reason).to.equal(`timed out after 1 s (execution_policy.timeout_seconds) (attempt 1 of 4; ${NOT_RETRIED})`);
      expect(await inBullmq('jobs.mount_operations', 'once-slow')).to.equal(false);

      const other = { worker_id: 'leaver', capabilities: ['mount_operations'] };
      await submit({ job_id: 'once-left', operation: 'noop', requirements: { capabilities: ['mount_operations'] }, execution_policy: { retry_count: 3, idempotent: false } });
      expect((await req<DequeueAnswer>(gw.url, 'POST', '/queue/dequeue', other)).body!.job_id).to.equal('once-left');
      expect((await req(gw.url, 'DELETE', '/workers/leaver')).status).to.equal(200);
      const left = await job('once-left');
      expect(left.state).to.equal('FAILED');
      expect(left.state_history.at(-1)!.reason).to.equal(`worker leaver lost: worker deregistered; ${NOT_RETRIED}`);
      // Not waiting in BullMQ either: no worker can receive it.
      expect(await inBullmq('jobs.mount_operations', 'once-left')).to.equal(false);
      expect((await req(gw.url, 'POST', '/queue/dequeue', w)).text).to.equal('null');
    });
  });
});
