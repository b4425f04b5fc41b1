// Redis stays bounded: with a shortened FERRY_JOB_RETENTION, finished jobs (completed, failed, cancelled) lose
// their record, history and events once it has passed, and every listing and count on both APIs agrees with
// what is left (a job still waiting stays); event streams are capped per job; a silent worker record is pruned;
// an invented capability is refused with a 400 naming the field and creates no queue.
import { expect } from 'chai';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import IORedis from 'ioredis';
import { TestRedis } from '../helpers/redis';
import { startDaemonProc, startGatewayProc, startWorkerProc, testEnv, Proc } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DaemonError, JobApiError } from '../helpers/http';
import type { DaemonJobList, JobList, QueueStatus, WorkerList } from '../helpers/api-types';

// Long enough that the counts read right after the last job finishes still see every finished job.
const RETENTION_S = 8;

describe('security: Redis stays bounded', function () {
  this.timeout(60000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-retention-'));
  const procs: Proc[] = [];
  let G: string;
  let D: string;
  let rc: IORedis;

  before(async function () {
    this.timeout(90000);
    await redis.start();
    rc = new IORedis(redis.url);
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'metrics:\n  enabled: true\n');
    const env = {
      ...testEnv(redis.url), FERRY_CONFIG: cfg, FERRY_HOST: '127.0.0.1', FERRY_JOB_RETENTION: `${RETENTION_S}s`,
      FERRY_EVENTS_PER_JOB: '20', FERRY_WORKER_STALE_SECONDS: '1', FERRY_WORKER_PRUNE_AFTER: '3s',
    };
    const [gw, daemon] = await Promise.all([startGatewayProc(env), startDaemonProc(env, cfg)]);
    procs.push(gw, daemon, await startWorkerProc(env, 'noop-worker', [], ['--concurrency', '4']));
    G = gw.url;
    D = daemon.url;
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()));
    rc?.disconnect();
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const keysOf = async (pattern: string) => {
    const out: string[] = [];
    let cursor = '0';
    do { const [c, ks] = await rc.scan(cursor, 'MATCH', pattern, 'COUNT', 1000); cursor = c; out.push(...ks); } while (cursor !== '0');
    return out;
  };

  it('removes finished jobs after the retention, keeps waiting ones, and every listing and count agrees', async () => {
    const ids = { done: [] as string[], failed: [] as string[], cancelled: [] as string[] };
    for (let i = 0; i < 12; i++) {
      const r = await req(G, 'POST', '/jobs?queue=true', { job_id: `done-${i}`, operation: 'noop', parameters: { steps: i === 0 ? 300 : 5 }, execution_policy: { retry_count: 0 } });
      expect(r.status, r.text).to.equal(201);
      ids.done.push(`done-${i}`);
    }
    for (let i = 0; i < 3; i++) {
      await req(G, 'POST', '/jobs?queue=true', { job_id: `failed-${i}`, operation: 'noop', parameters: { fail: 'drill' }, execution_policy: { retry_count: 0 } });
      ids.failed.push(`failed-${i}`);
    }
    // Waits for a capability no worker here has: never finished, never purged.
    expect((await req(G, 'POST', '/jobs?queue=true', { job_id: 'waiting', operation: 'noop', requirements: { capabilities: ['lvm_tools'] } })).status).to.equal(201);
    await until(async () => (await req<JobList>(G, 'GET', '/jobs?state=COMPLETED')).body.total === 12 && (await req<JobList>(G, 'GET', '/jobs?state=FAILED')).body.total === 3, 30000, 'the jobs to finish');
    // Cancelled only now, so that none of the three can pass its retention before the counts below are read
    // (cancelled first, they expired while a loaded machine still ran done-0's 300 steps).
    for (let i = 0; i < 3; i++) {
      await req(G, 'POST', '/jobs', { job_id: `cancelled-${i}`, operation: 'noop' });
      expect((await req(G, 'DELETE', `/jobs/cancelled-${i}`)).status).to.equal(200);
      ids.cancelled.push(`cancelled-${i}`);
    }
    // The event stream is capped per job: 302 events sent, about 20 kept (approximate trimming: at most one
    // stream node, 100 entries, over).
    expect(await rc.xlen('ferry:job:done-0:events')).to.be.at.most(20 + 100);
    const st = (await req(D, 'GET', '/status')).body;
    expect(st).to.include({ total_jobs: 19, completed_jobs: 12, failed_jobs: 3, cancelled_jobs: 3, pending_jobs: 1 });

    // After the retention has passed, only the waiting job is left, everywhere.
    await until(async () => (await req<JobList>(G, 'GET', '/jobs')).body.total === 1, (RETENTION_S + 15) * 1000, 'finished jobs to expire');
    const all = (await req<JobList>(G, 'GET', '/jobs')).body;
    expect(all.jobs.map((j) => j.job_id)).to.deep.equal(['waiting']);
    for (const s of ['COMPLETED', 'FAILED', 'CANCELLED']) expect((await req(G, 'GET', `/jobs?state=${s}`)).body, s).to.deep.include({ total: 0, jobs: [] });
    expect((await req<JobList>(G, 'GET', '/jobs?state=QUEUED')).body.total).to.equal(1);
    for (const id of [...ids.done, ...ids.failed, ...ids.cancelled]) {
      expect((await req(G, 'GET', `/jobs/${id}`)).status, id).to.equal(404);
      expect((await req(D, 'GET', `/jobs/${id}`)).status, id).to.equal(404);
    }
    expect((await req(D, 'GET', '/status')).body).to.include({ total_jobs: 1, completed_jobs: 0, failed_jobs: 0, cancelled_jobs: 0, pending_jobs: 1 });
    const dj = (await req<DaemonJobList>(D, 'GET', '/jobs')).body;
    expect(dj.total).to.equal(1);
    expect((await req(D, 'GET', '/jobs/query?status=completed,failed,cancelled')).body).to.deep.include({ total: 0, jobs: [] });
    const q = (await req<QueueStatus>(G, 'GET', '/queue')).body;
    expect(q.total_jobs).to.equal(1);
    const anyQ = q.queues.find((x) => x.name === 'jobs.any');
    expect(anyQ).to.include({ queued: 0, assigned: 0, running: 0 });
    // Redis itself: no key of a finished job is left; the counters hold no negative or stale terminal counts.
    expect(await keysOf('ferry:job:done-*')).to.deep.equal([]);
    expect(await keysOf('ferry:job:failed-*')).to.deep.equal([]);
    expect(await keysOf('ferry:job:cancelled-*')).to.deep.equal([]);
    expect((await keysOf('ferry:job:*')).sort()).to.deep.equal(['ferry:job:waiting']);
    // The waiting job's queue counts it queued; the other queue's counter is back to 0.
    const counts = await rc.hgetall('ferry:counts:queued');
    for (const [s, n] of Object.entries(counts)) expect(Number(n), s).to.equal(s.startsWith('jobs.any|') ? 0 : 1);
    for (const s of ['COMPLETED', 'FAILED', 'CANCELLED']) expect(await rc.zcard(`ferry:jobs:state:${s}`), s).to.equal(0);
    expect(await rc.zcard('ferry:jobs:state:QUEUED')).to.equal(1);
    expect(await rc.zcard('ferry:jobs:finished')).to.equal(0);
    // Prometheus counters of finished jobs are cumulative and stay.
    const met = (await req(D, 'GET', '/metrics')).text;
    expect(met).to.match(/svc_migration_total\{status="completed",service="daemon"\} 12/);
    expect(met).to.match(/svc_job_states\{state="COMPLETED",service="daemon"\} 0/);
  });

  it('prunes a worker record silent for longer than FERRY_WORKER_PRUNE_AFTER', async () => {
    expect((await req(G, 'POST', '/workers/register', { worker_id: 'gone-away', capabilities: ['img_tool'] })).status).to.equal(201);
    expect((await req<WorkerList>(G, 'GET', '/workers')).body.workers.map((w) => w.worker_id)).to.include('gone-away');
    await until(async () => !(await req<WorkerList>(G, 'GET', '/workers')).body.workers.some((w) => w.worker_id === 'gone-away'), 20000, 'the silent worker to be pruned');
    expect(await rc.exists('ferry:worker:gone-away')).to.equal(0);
    // The live worker process heartbeats and stays.
    expect((await req<WorkerList>(G, 'GET', '/workers')).body.workers.map((w) => w.worker_id)).to.include('noop-worker');
  });

  it('refuses an invented capability with a 400 naming the field, and opens no queue for it', async () => {
    const queuesBefore = await rc.smembers('ferry:queues');
    const bullBefore = (await keysOf('ferry:q:*')).length;
    for (const [path, body, field] of [
      ['/jobs?queue=true', { operation: 'noop', requirements: { capabilities: ['made_up_cap'] } }, 'requirements.capabilities.0'],
      ['/workers/register', { worker_id: 'inventor', capabilities: ['img_tool', 'made_up_cap'] }, 'capabilities.1'],
      ['/queue/dequeue', { worker_id: 'inventor', capabilities: ['made_up_cap'] }, 'capabilities.0'],
    ] as const) {
      const r = await req<JobApiError>(G, 'POST', path, body);
      expect(r.status, `${path}: ${r.text}`).to.equal(400);
      expect(r.body.error.message).to.include('not a known capability');
      expect(r.body.error.fields!.map((f) => f.field)).to.include(field);
    }
    const d = await req<DaemonError>(D, 'POST', '/jobs/operation', { operation: 'noop', requirements: { capabilities: ['made_up_cap'] } });
    expect(d.status).to.equal(400);
    expect(d.body.error).to.include('requirements.capabilities');
    expect(await rc.smembers('ferry:queues')).to.deep.equal(queuesBefore);
    expect((await keysOf('ferry:q:*')).length).to.equal(bullBefore);
    expect(await rc.exists('ferry:worker:inventor')).to.equal(0);
  });
});
