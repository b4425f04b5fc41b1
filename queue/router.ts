// The BullMQ side: one queue per requirement set, enqueue with priority, capability-matched dequeue under a
// lease (the BullMQ lock), and the queue's view of a job's position.
import { Job, Queue, Worker } from 'bullmq';
import { parseQueueName, queuesTakenBefore } from '../platform/capabilities';
import { keys as makeKeys, Keys, RedisClient } from '../platform/redis';
import { config } from '../platform/config';
import { createLogger, dropped, expected } from '../platform/log';
import { BullLayout } from './bullmq-layout';
import { publish } from './bus';
import { queueErrors } from '../platform/metrics';

const log = createLogger('queue');

const lastLogged = new Map<string, number>();
/** The handler for a BullMQ Queue's or Worker's `error` event: BullMQ reports some failures (a broken stalled
 *  check, a lost connection) only there. Each is counted (svc_queue_errors_total); the log says it at most every
 *  10 s per source and name, since a Redis outage repeats it at each reconnect attempt. */
export function onBullError(source: 'queue' | 'worker' | 'schedules' | 'webhooks', name: string, next: string) {
  return (e: Error) => {
    queueErrors.inc({ source });
    const at = `${source}\n${name}`;
    if (Date.now() - (lastLogged.get(at) ?? 0) < 10_000) return;
    lastLogged.set(at, Date.now());
    log.warn(`BullMQ ${source} error; ${next}`, { source, queue: name, error: e.message });
  };
}

/** Ferry priority 0-100 (higher more urgent) onto BullMQ's 1.. (lower more urgent); equal priorities stay FIFO. */
export const bullPriority = (p: number) => 101 - p;
/** BullMQ refuses integer-looking and colon ids, which job_id allows; prefix them. */
export const bullId = (jobId: string) => `j_${jobId}`;
export const jobIdOf = (bid: string) => bid.replace(/^j_/, '');

export interface Claimed { queue: string; job: Job }

/** The known queues as Ferry uses them: requirement-set names only, in a stable order. */
const queueList = (members: string[]) => members.filter((q) => parseQueueName(q)).sort();

export class QueueRouter {
  readonly k: Keys;
  /** BullMQ's keys, for the reads its API does not offer (queue/bullmq-layout.ts). */
  readonly bull: BullLayout;
  private queues = new Map<string, Queue>();
  private workers = new Map<string, Worker>();
  private stalledHandler?: (queue: string, jobId: string) => void;
  /** Jobs this process took with next(), until it finishes or requeues them: saves re-reading each job from Redis
   *  (Job.fromId) at the end. Another process (a second gateway) falls back to reading it. Bounded. */
  private taken = new Map<string, Job>();

  constructor(readonly redis: RedisClient, private opts: { lockSeconds?: number; stalledCheck?: boolean } = {}) {
    this.k = makeKeys();
    this.bull = new BullLayout(this.k.bullPrefix);
  }

  queue(name: string): Queue {
    let q = this.queues.get(name);
    if (!q) {
      q = new Queue(name, { connection: this.redis, prefix: this.k.bullPrefix });
      q.on('error', onBullError('queue', name, 'the command that failed reports it to its caller; BullMQ reconnects'));
      this.queues.set(name, q);
    }
    return q;
  }

  /** A BullMQ Worker without a processor: jobs are fetched by hand (getNextJob) so one process can walk its
   *  queues most specific first, and so the gateway can hand jobs to HTTP workers. */
  private worker(name: string): Worker {
    let w = this.workers.get(name);
    if (!w) {
      const lock = (this.opts.lockSeconds ?? config.leaseSeconds) * 1000;
      w = new Worker(name, null, {
        connection: this.redis,
        prefix: this.k.bullPrefix,
        autorun: false,
        lockDuration: lock,
        // BullMQ throttles the stalled check per queue, across processes: a check sets the queue's stalled-check
        // key for this interval and every other process's check skips until it expires. So the interval must not
        // follow a long lock (the gateway's HTTP lease would hold off every worker's check for minutes, and a
        // dead worker's jobs with it); it follows the native lease, which every process shares.
        stalledInterval: Math.max(500, Math.floor(Math.min(lock, config.leaseSeconds * 1000) / 2)),
        // Ferry counts lost attempts against retry_count itself; BullMQ must never fail a job for stalling.
        maxStalledCount: 1_000_000,
      });
      w.on('error', onBullError('worker', name, 'its stalled check runs again at the next interval; BullMQ reconnects'));
      w.on('stalled', (bid: string) => this.stalledHandler?.(name, jobIdOf(bid)));
      if (this.opts.stalledCheck !== false) void w.startStalledCheckTimer().catch(
        (e) => log.warn('stalled-job check stopped on this queue; other processes serving it still check', { queue: name, error: (e as Error).message }));
      this.workers.set(name, w);
    }
    return w;
  }

  onStalled(fn: (queue: string, jobId: string) => void) { this.stalledHandler = fn; }

  async knownQueues(): Promise<string[]> {
    return queueList(await this.redis.smembers(this.k.queues));
  }


  /** Starts stalled checking on every known queue, so a dead worker's job is found even if no live process
   *  serves its queue. */
  async watchAll() {
    for (const q of await this.knownQueues()) this.worker(q);
  }

  async enqueue(queue: string, jobId: string, priority: number, delayMs = 0) {
    await this.queue(queue).add('job', { job_id: jobId }, {
      jobId: bullId(jobId),
      priority: bullPriority(priority),
      delay: delayMs || undefined,
      removeOnComplete: true,
      removeOnFail: true,
      attempts: 1,
    });
    // A wake-up hint for idle workers (they also poll): not awaited, so the caller's next command shares the
    // round trip; a lost hint costs at most the poll interval and must not fail a job that is already queued.
    publish(this.redis, this.k, 'enqueued',
      queue).catch(dropped(log, 'could not publish the wake-up hint for a queued job; idle workers find it at their next poll', { queue }));
  }

  async remove(queue: string, jobId: string): Promise<boolean> {
    try {
      return (await this.queue(queue).remove(bullId(jobId))) === 1;
    } catch (e) {
      // Locked by a worker (BullMQ: "... is locked by another worker"): the claim sees the finished record and drops it.
      if (/locked/i.test((e as Error).message)) return false;
      log.warn('could not remove a job from its BullMQ queue; a claim of it finds the record finished and drops it',
        { queue, job_id: jobId, error: (e as Error).message });
      return false;
    }
  }

  /** Tries each queue in order (most specific first) and takes the first job without blocking. */
  async next(queues: string[], token: string): Promise<Claimed | null> {
    for (const q of queues) {
      const job = (await this.worker(q).getNextJob(token, { block: false }));
      if (job) {
        if (this.taken.size >= 10_000) this.taken.delete(this.taken.keys().next().value!); // lost leases never finish here
        this.taken.set(`${q}\n${job.id}`, job);
        return { queue: q, job };
      }
    }
    return null;
  }

  async extendLocks(queue: string, jobIds: string[], tokens: string[], seconds: number) {
    if (!jobIds.length) return;
    await this.worker(queue).extendJobLocks(jobIds.map(bullId), tokens, seconds * 1000);
  }

  private async bullJob(queue: string, jobId: string): Promise<Job | undefined> {
    return Job.fromId(this.queue(queue), bullId(jobId));
  }

  /** The job as next() took it under `token` (forgotten here), or else as Redis holds it now. */
  private async heldJob(queue: string, jobId: string, token: string): Promise<Job | undefined> {
    const key = `${queue}\n${bullId(jobId)}`;
    const j = this.taken.get(key);
    this.taken.delete(key);
    return j && j.token === token ? j : this.bullJob(queue, jobId);
  }

  async finish(queue: string, jobId: string, token: string) {
    const j = await this.heldJob(queue, jobId, token);
    if (j) await j.moveToCompleted('done', token, false).catch(expected(log,
      'the token no longer holds the BullMQ lock (lease lost, or the job already moved): nothing left to end', { queue, job_id: jobId }));
  }

  /** Back to the queue after `delayMs` (a retry) or at once (a hand-back). */
  async requeue(queue: string, jobId: string, token: string, delayMs: number) {
    const j = await this.heldJob(queue, jobId, token);
    if (!j) return;
    if (delayMs > 0) await j.moveToDelayed(Date.now() + delayMs, token);
    else await j.moveToWait(token);
  }

  /** 1-based rank among the jobs the same workers would take before it: its own queue's jobs ahead of it (by
   *  priority, then submission), plus the waiting jobs of more specific queues, which those workers take first. */
  async position(queue: string, jobId: string): Promise<number | null> {
    // The rank and the list of queues in one write (a submission's last two reads).
    const [[rankErr, rank], [knownErr, members]] = (await this.bull.rank(this.redis.pipeline(), queue, bullId(jobId)).smembers(this.k.queues).exec())!;
    if (rankErr) throw rankErr;
    if (knownErr) throw knownErr;
    if (rank === null) return null;
    const known = queueList(members as string[]);
    const supersets = queuesTakenBefore(queue, known);
    let ahead = rank as number;
    if (supersets.length) {
      const p = this.redis.pipeline();
      for (const q of supersets) this.bull.countWaiting(p, q);
      for (const [, n] of (await p.exec()) || []) ahead += Number(n || 0);
    }
    return ahead + 1;
  }

  async close() {
    const gone = expected(log, 'closing: a connection that is already gone has nothing left to close');
    await Promise.all([...this.workers.values()].map((w) => w.close(true).catch(gone)));
    await Promise.all([...this.queues.values()].map((q) => q.close().catch(gone)));
  }
}
