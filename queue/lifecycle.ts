// The life of a job, in one place for every caller: the gateway (REST submission, HTTP pull workers, cancel),
// worker processes (claim, progress, finish) and the daemon. Each move goes through JobStore.transition, so
// the transition table and the lease are checked atomically in Redis.
import { randomUUID } from 'node:crypto';
import { canServe, normalizeCaps, parseQueueName, queueName, Requirements, servedQueues } from '../shared/capabilities';
import { config } from '../shared/config';
import { ApiError, badRequest, conflict, notFound } from '../shared/errors';
import { OPERATIONS } from '../shared/operations';
import type { JobSpec, ProgressEvent } from '../shared/schemas/job';
import { isTerminal, JobState } from '../shared/states';
import { jobWaitSeconds } from '../shared/metrics';
import { JobRecord, JobStore, Step } from './store';
import { bullId, jobIdOf, QueueRouter } from './router';
import { Registry } from './registry';

export interface Lease { job_id: string; queue: string; token: string; record: JobRecord }

export function requirementsOf(spec: JobSpec): Requirements {
  const op = OPERATIONS[spec.operation];
  return {
    capabilities: normalizeCaps([...(op?.capabilitiesFor?.(spec.parameters) ?? op?.capabilities ?? []), ...(spec.requirements?.capabilities || [])]),
    execution_mode: spec.requirements?.execution_mode,
  };
}

/** Exponential backoff with +-20% jitter, capped at five minutes. */
export function retryDelayMs(attempt: number): number {
  const base = Math.min(config.retryBackoffMs * 2 ** Math.max(0, attempt - 1), 300_000);
  return Math.round(base * (0.8 + Math.random() * 0.4));
}

export class Lifecycle {
  constructor(readonly store: JobStore, readonly router: QueueRouter, readonly registry: Registry) {
    router.onStalled((q, id) => void this.leaseLost(id, 'its lease expired (no lock renewal or heartbeat)').catch(() => undefined));
  }

  /** Registers a validated spec: CREATED -> VALIDATED (-> QUEUED when `enqueue`). */
  async submit(spec: JobSpec, opts: { enqueue: boolean; meta?: Record<string, unknown> }) {
    const req = requirementsOf(spec);
    const queue = queueName(req);
    const p = spec.execution_policy;
    const steps: Step[] = [{ to: 'VALIDATED', reason: 'specification validated' }];
    if (opts.enqueue) steps.push({ to: 'QUEUED', reason: `queued on ${queue} with priority ${p.priority}` });
    const { created } = await this.store.create(spec.job_id, {
      spec: JSON.stringify(spec),
      operation: spec.operation,
      queue,
      priority: p.priority,
      attempts: 0,
      max_attempts: p.retry_count + 1,
      meta: JSON.stringify(opts.meta || {}),
    }, steps);
    if (!created) throw conflict(`job ${spec.job_id} already exists`);
    if (!opts.enqueue) return { job_id: spec.job_id, state: 'VALIDATED' as JobState, queue_position: 0 };
    await this.placeInQueue(spec.job_id, queue, p.priority);
    return { job_id: spec.job_id, ...(await this.whereNow(spec.job_id, queue)) };
  }

  /** The state a just-queued job really has and its true place: a worker may have claimed it already
   *  (ASSIGNED, even RUNNING or finished), and then it waits in no queue (position 0). */
  private async whereNow(id: string, queue: string): Promise<{ state: JobState; queue_position: number }> {
    const pos = await this.router.position(queue, id);
    if (pos !== null) return { state: 'QUEUED', queue_position: pos };
    const state = ((await this.store.raw(id))?.state || 'QUEUED') as JobState;
    // QUEUED yet out of the waiting set: being handed to a worker right now, so it is first.
    return { state, queue_position: state === 'QUEUED' ? 1 : 0 };
  }

  /** Queues a job that was submitted without ?queue=true. */
  async enqueueExisting(id: string) {
    const h = await this.store.raw(id);
    if (!h) throw notFound(`job ${id} not found`);
    const r = await this.store.transition(id, [{ to: 'QUEUED', reason: `queued on ${h.queue} with priority ${h.priority}` }]);
    if (!r.ok) throw badRequest(`job ${id} is ${r.state}; only a VALIDATED job can be queued`);
    await this.placeInQueue(id, h.queue, Number(h.priority));
    return { job_id: id, ...(await this.whereNow(id, h.queue)) };
  }

  private async placeInQueue(id: string, queue: string, priority: number) {
    try {
      await this.router.enqueue(queue, id, priority);
    } catch (e) {
      await this.store.transition(id, [{ to: 'FAILED', reason: `could not be placed in the queue: ${(e as Error).message}` }]).catch(() => undefined);
      throw new ApiError(503, `job ${id} could not be queued (storage unavailable); retry with a new job_id`);
    }
  }

  /** Takes the next job this worker can run, most specific queue first, and moves it to ASSIGNED under a lease. */
  async claim(worker: { worker_id: string; capabilities: string[]; execution_mode?: string }, queues?: string[]): Promise<Lease | null> {
    const served = queues || servedQueues(worker, await this.router.knownQueues());
    if (!served.length) return null;
    for (let tries = 0; tries < 50; tries++) {
      const token = `${worker.worker_id}:${randomUUID()}`;
      const got = await this.router.next(served, token);
      if (!got) return null;
      const id = jobIdOf(got.job.id!);
      const h = await this.store.raw(id);
      if (!h || isTerminal(h.state)) {
        await this.router.finish(got.queue, id, token); // cancelled while queued, or an orphan: drop it
        continue;
      }
      const steps: Step[] = [];
      const attempts = Number(h.attempts || 0);
      const max = Number(h.max_attempts || 1);
      if (h.state === 'ASSIGNED' || h.state === 'RUNNING') {
        steps.push({ to: 'QUEUED', reason: `worker ${h.worker_id} lost its lease; requeued` });
      } else if (h.state === 'VALIDATED') {
        steps.push({ to: 'QUEUED', reason: `queued on ${got.queue}` });
      }
      if (attempts >= max) {
        steps.push({ to: 'FAILED', reason: `no attempts left (${attempts} of ${max} used)` });
        await this.store.transition(id, steps, { fields: { lease: null, worker_id: null } });
        await this.router.finish(got.queue, id, token);
        continue;
      }
      steps.push({ to: 'ASSIGNED', reason: `assigned to worker ${worker.worker_id} (attempt ${attempts + 1} of ${max})`, worker_id: worker.worker_id });
      const r = await this.store.transition(id, steps, { fields: { worker_id: worker.worker_id, lease: token, attempts: attempts + 1 } });
      if (!r.ok) {
        await this.router.finish(got.queue, id, token);
        continue;
      }
      if (h.state === 'QUEUED' && h.updated_at) jobWaitSeconds.observe({ queue: got.queue }, Math.max(0, Date.now() - Date.parse(h.updated_at)) / 1000);
      // Independent commands, issued together: one round trip.
      const [, record] = await Promise.all([this.registry.holdJob(worker.worker_id, id), this.store.get(id)]);
      return { job_id: id, queue: got.queue, token, record: record! };
    }
    return null;
  }

  /** ASSIGNED -> RUNNING, with the first progress event (phase initialization, 0%) recorded in the same atomic
   *  step. `attempt` (the claim's attempt number) saves reading the record when the caller knows it. */
  async start(id: string, workerId: string, lease: string, attempt?: number) {
    if (attempt === undefined) attempt = Number((await this.store.raw(id))?.attempts || 1);
    const r = await this.store.transition(id, [{ to: 'RUNNING', reason: `worker ${workerId} started attempt ${attempt || 1}`, worker_id: workerId }], {
      lease, event: { ev: this.event(id, { phase: 'initialization', percentage: 0, message: `started on worker ${workerId}`, details: {} }), before: false },
    });
    return r.ok;
  }

  private event(id: string, ev: Omit<ProgressEvent, 'job_id' | 'timestamp'> & { timestamp?: string }): ProgressEvent {
    return { job_id: id, timestamp: ev.timestamp || new Date().toISOString(), phase: ev.phase, percentage: ev.percentage, message: ev.message || '', details: ev.details || {} };
  }

  async progress(id: string, lease: string, ev: Omit<ProgressEvent, 'job_id' | 'timestamp'> & { timestamp?: string }) {
    return this.store.appendEvent(id, this.event(id, ev), lease);
  }

  /** RUNNING -> COMPLETED with the final progress event (phase completed, 100%) in the same atomic step; the
   *  lease is checked there. `queue` (known to a worker from its claim) saves reading the record. */
  async complete(id: string, workerId: string, lease: string, result: Record<string, unknown>, queue?: string): Promise<boolean> {
    if (queue === undefined) {
      const h = await this.store.raw(id);
      if (!h || h.lease !== lease) return false;
      queue = h.queue;
    }
    const r = await this.store.transition(id, [{ to: 'COMPLETED', reason: `completed by worker ${workerId}`, worker_id: workerId }], {
      lease, fields: { result: JSON.stringify(result), lease: null, error: null },
      event: { ev: this.event(id, { phase: 'completed', percentage: 100, message: 'job completed', details: {} }), before: true },
    });
    // Even when the lease is gone the calls are harmless (BullMQ refuses a stale token) and drop our own references.
    await Promise.all([this.router.finish(queue!, id, lease), this.registry.releaseJob(workerId, id)]);
    return r.ok;
  }

  /** A failed attempt: back to QUEUED with backoff while retry_count allows, FAILED otherwise. */
  async fail(id: string, workerId: string, lease: string, message: string, retryable: boolean): Promise<{ ok: boolean; state?: JobState; retry_in_ms?: number }> {
    const h = await this.store.raw(id);
    if (!h || h.lease !== lease) return { ok: false };
    const attempts = Number(h.attempts || 1);
    const max = Number(h.max_attempts || 1);
    try {
      if (retryable && attempts < max) {
        const delay = retryDelayMs(attempts);
        const r = await this.store.transition(id, [{ to: 'QUEUED', reason: `attempt ${attempts} of ${max} failed on worker ${workerId}: ${message}; retrying in ${(delay / 1000).toFixed(1)} s` }], { lease, fields: { lease: null, worker_id: null, error: message } });
        if (r.ok) await this.router.requeue(h.queue, id, lease, delay);
        return { ok: r.ok, state: 'QUEUED', retry_in_ms: delay };
      }
      const why = retryable ? `${message} (attempt ${attempts} of ${max}; no retries left)` : message;
      const r = await this.store.transition(id, [{ to: 'FAILED', reason: why, worker_id: workerId }], { lease, fields: { lease: null, error: message } });
      await this.router.finish(h.queue, id, lease);
      return { ok: r.ok, state: 'FAILED' };
    } finally {
      await this.registry.releaseJob(workerId, id);
    }
  }

  /** The worker gives the job back without it counting as an attempt (shutdown, or it cannot start it). */
  async handBack(id: string, workerId: string, lease: string, reason: string) {
    const h = await this.store.raw(id);
    if (!h || h.lease !== lease) return false;
    const r = await this.store.transition(id, [{ to: 'QUEUED', reason: `handed back by worker ${workerId}: ${reason}` }], { lease, fields: { lease: null, worker_id: null, attempts: Math.max(0, Number(h.attempts) - 1) } });
    if (r.ok) await this.router.requeue(h.queue, id, lease, 0);
    await this.registry.releaseJob(workerId, id);
    return r.ok;
  }

  /** A worker's lease ran out (BullMQ found the job stalled, or the worker went stale or was removed). */
  async leaseLost(id: string, why: string) {
    const h = await this.store.raw(id);
    if (!h || (h.state !== 'ASSIGNED' && h.state !== 'RUNNING')) return;
    const attempts = Number(h.attempts || 1);
    const max = Number(h.max_attempts || 1);
    if (h.worker_id) await this.registry.releaseJob(h.worker_id, id);
    if (attempts >= max) {
      await this.store.transition(id, [{ to: 'FAILED', reason: `worker ${h.worker_id} lost: ${why}; no retries left (${attempts} of ${max})` }], { lease: h.lease, fields: { lease: null, error: `worker ${h.worker_id} lost` } });
      await this.router.remove(h.queue, id);
      return;
    }
    await this.store.transition(id, [{ to: 'QUEUED', reason: `worker ${h.worker_id} lost: ${why}; requeued (attempt ${attempts} of ${max} used)` }], { lease: h.lease, fields: { lease: null, worker_id: null } });
  }

  /** Returns the jobs a stale or removed HTTP worker held to the queue at once. */
  async releaseWorker(workerId: string, why: string) {
    for (const id of await this.registry.heldJobs(workerId)) {
      const h = await this.store.raw(id);
      if (h && h.lease && (h.state === 'ASSIGNED' || h.state === 'RUNNING') && h.worker_id === workerId) {
        const lease = h.lease;
        await this.leaseLost(id, why);
        const after = await this.store.raw(id);
        if (after?.state === 'QUEUED') await this.router.requeue(h.queue, id, lease, 0).catch(() => undefined);
      }
      await this.registry.releaseJob(workerId, id);
    }
  }

  async cancel(id: string, reason = 'cancelled by request'): Promise<{ job_id: string; state: JobState; message: string }> {
    const h = await this.store.raw(id);
    if (!h) throw notFound(`job ${id} not found`);
    if (isTerminal(h.state)) throw badRequest(`job ${id} is already ${h.state} and cannot be cancelled`);
    const r = await this.store.transition(id, [{ to: 'CANCELLED', reason }], { fields: { lease: null } });
    if (!r.ok) {
      if (r.state && isTerminal(r.state)) throw badRequest(`job ${id} is already ${r.state} and cannot be cancelled`);
      throw conflict(`job ${id} changed state while being cancelled; try again`);
    }
    if (r.prev === 'QUEUED') await this.router.remove(h.queue, id);
    if (r.prev === 'ASSIGNED' || r.prev === 'RUNNING') {
      // The worker kills its process and removes partial output; the lease ends here.
      await this.store.redis.publish(this.store.k.chanCancel, id);
      if (h.lease) await this.router.finish(h.queue, id, h.lease);
      if (h.worker_id) await this.registry.releaseJob(h.worker_id, id);
    }
    return { job_id: id, state: 'CANCELLED', message: `job ${id} was cancelled (was ${r.prev})` };
  }

  /**
   * Puts back into BullMQ any QUEUED job whose queue entry is missing: a gateway that died between recording
   * QUEUED and adding the job to the queue would otherwise leave it waiting forever. One process at a time does
   * this (a short Redis lock); jobs younger than `minAgeMs` are left alone, since their add may be in flight.
   */
  async reconcileQueued(minAgeMs: number): Promise<string[]> {
    const r = this.store.redis;
    const lock = `${this.store.k.prefix}:lock:reconcile`;
    if ((await r.set(lock, '1', 'PX', Math.max(1000, minAgeMs), 'NX')) !== 'OK') return [];
    const restored: string[] = [];
    const ids = await r.zrange(this.store.k.jobsInState('QUEUED'), 0, -1);
    for (let i = 0; i < ids.length; i += 500) {
      const batch = ids.slice(i, i + 500);
      const hs = await this.store.many(batch, ['state', 'queue', 'priority', 'updated_at']);
      const p = r.pipeline();
      for (const [j, h] of hs.entries()) if (h?.queue) this.router.bull.exists(p, h.queue, bullId(batch[j]));
      const exists = ((await p.exec()) || []).map(([, v]) => Number(v));
      let n = 0;
      for (const [j, h] of hs.entries()) {
        if (!h?.queue) continue;
        const present = exists[n++];
        if (present || h.state !== 'QUEUED' || Date.now() - Date.parse(h.updated_at) < minAgeMs) continue;
        await this.router.enqueue(h.queue, batch[j], Number(h.priority));
        restored.push(batch[j]);
      }
    }
    return restored;
  }

  /** Why a queued job is still waiting, or null when some active worker can take it. */
  async waitingReason(queue: string): Promise<string | null> {
    const req = parseQueueName(queue);
    if (!req) return null;
    const active = await this.registry.active();
    if (active.some((w) => canServe(w, req))) return null;
    const need = req.capabilities.length ? req.capabilities.join(', ') : 'no capabilities';
    return `no active worker has the capabilities this job needs (${need}${req.execution_mode ? `, execution mode ${req.execution_mode}` : ''})`;
  }
}
