// The life of a job, in one place for every caller: the gateway (REST submission, HTTP pull workers, cancel),
// worker processes (claim, progress, finish) and the daemon. Each move goes through JobStore.transition, so
// the transition table and the lease are checked atomically in Redis.
import { createHash, randomUUID, timingSafeEqual } from 'node:crypto';
import { canServe, normalizeCaps, parseQueueName, queueName, Requirements, servedQueues } from '../platform/capabilities';
import { config } from '../platform/config';
import { ApiError, badRequest, conflict, fieldError, notFound } from '../platform/errors';
import { OPERATIONS } from '../domain/operations';
import type { JobSpec, ProgressEvent } from '../domain/schemas/job';
import { HELD, isHeld, isTerminal, JobState } from '../domain/states';
import { jobWaitSeconds } from '../platform/metrics';
import { createLogger, expected } from '../platform/log';
import { checkSubmittedPaths } from '../platform/roots';
import { Caller, mayRunPrivileged } from '../platform/auth';
import { checkSubmittedImages } from '../domain/image-confine';
import { seal, unseal } from '../platform/sensitive';
import { checkInsecure } from '../domain/vsphere/job-credentials';
import { adminOnly } from '../platform/admin-only';
import { JobRecord, JobStore, Step } from './store';
import { bullId, jobIdOf, QueueRouter } from './router';
import { ActiveWorker, Registry } from './registry';
import { publish } from './bus';

const log = createLogger('queue');

export interface Lease { job_id: string; queue: string; token: string; record: JobRecord }

/** What the operation itself needs, from its table (domain/operations.ts): what privilege follows from. */
export function operationCapabilities(spec: Pick<JobSpec, 'operation' | 'parameters'>): string[] {
  const op = OPERATIONS[spec.operation];
  return op?.capabilitiesFor?.(spec.parameters) ?? op?.capabilities ?? [];
}

export function requirementsOf(spec: JobSpec): Requirements {
  return {
    capabilities: normalizeCaps([...operationCapabilities(spec), ...(spec.requirements?.capabilities || [])]),
    execution_mode: spec.requirements?.execution_mode,
    ...(OPERATIONS[spec.operation]?.lane ? { lane: OPERATIONS[spec.operation].lane } : {}),
  };
}

/** What a caller may not ask of this job (403 naming the field): the one check of submission, of a schedule's
 *  creation and of each of its runs. A caller listing device capabilities gains no privilege by it. `parameters.plan`
 *  (a plan VM's slots and window end, orchestration/plan-slots.ts; the preflight's reading of its guest) only the plan runner sets (`planRunner`): from anyone
 *  else it would take slots by any name, a VM's source guard among them (400 naming it). */
export function checkCaller(spec: JobSpec, caller: Caller | null, where = '', opts: { planRunner?: boolean; internal?: boolean } = {}) {
  const op = OPERATIONS[spec.operation];
  const opField = [where, 'operation'].filter(Boolean).join('.');
  // Operations no caller submits: they skip nothing, because their submitter applies the action's own rules.
  if (op?.submittedBy === 'daemon' && !opts.internal) {
    throw fieldError(400, opField, 'is submitted only by the daemon',
      `${opField} ${spec.operation} is submitted only by the daemon's own routes (a plan's validate, start and retry; POST /vms/shutdown and /vms/poweroff; ` +
      `the /virt routes), which apply that action's role and limits; use those`);
  }
  // A plan's side effects (rollback_kvm, remove_source) act on what another job recorded: only its runner asks.
  if (op?.submittedBy === 'plan' && !opts.planRunner) {
    throw fieldError(400, opField, 'is run only by a plan (POST /plans), never submitted by a caller',
      `${opField} ${spec.operation} is a plan's own side effect, submitted only by the plan runner for a VM of a plan; use the plan's routes (cancel, ` +
      `rollback) instead`);
  }
  if (op?.role) adminOnly(caller, opField, `operation ${spec.operation} needs the ${op.role} role, as the same direct action does`);
  if (!opts.planRunner && (spec.parameters as { plan?: unknown } | undefined)?.plan !== undefined) {
    const field = [where, 'parameters.plan'].filter(Boolean).join('.');
    throw fieldError(400, field, 'is set only by a plan (POST /plans), never by a caller',
      `${field} is set only by the plan runner for a plan's own jobs (its limits' slots, its window, its preflight's reading of the guest); ` +
      'submit a plan (POST /plans) instead');
  }
  const mode = spec.requirements?.execution_mode;
  if (!mayRunPrivileged(caller, mode, operationCapabilities(spec))) {
    const field = [where, 'requirements.execution_mode'].filter(Boolean).join('.');
    throw fieldError(403, field, 'needs an admin key',
      `${field} ${mode} needs an admin key: operation ${spec.operation} does not need device access (capabilities a job lists do not count), and the key ` +
      `"${caller!.name}" has role ${caller!.role}`);
  }
  // Turning off TLS verification for a manager not configured as insecure is an admin's call, for a schedule's runs too.
  const mp = spec.parameters as { manager_url?: string; insecure?: boolean };
  checkInsecure(caller, mp.manager_url, mp.insecure, [where, 'parameters.insecure'].filter(Boolean).join('.'));
}

/** Why an attempt of a job whose spec says `execution_policy.idempotent: false` is not run again: running it twice
 *  may do its effect twice, so a failed or lost attempt ends the job. */
export const NOT_RETRIED = 'not retried: execution_policy.idempotent is false';

/** The spec's execution policy, read from a raw record (idempotent unless it says otherwise). */
function policyOf(h: Record<string, string>): { idempotent: boolean; timeout_seconds: number } {
  let p: Partial<JobSpec['execution_policy']> = {};
  try { p = (JSON.parse(h.spec || '{}') as JobSpec).execution_policy || {}; } catch { /* a record without a readable spec keeps the defaults */ }
  return { idempotent: p.idempotent !== false, timeout_seconds: Number(p.timeout_seconds) || 86400 };
}

/** Compares lease tokens in constant time (digests of equal length). */
export function sameLease(a: string | undefined | null, b: string | undefined | null): boolean {
  if (!a || !b) return false;
  return timingSafeEqual(createHash('sha256').update(a).digest(), createHash('sha256').update(b).digest());
}

/** Exponential backoff with +-20% jitter, capped at five minutes. */
export function retryDelayMs(attempt: number): number {
  const base = Math.min(config.retryBackoffMs * 2 ** Math.max(0, attempt - 1), 300_000);
  return Math.round(base * (0.8 + Math.random() * 0.4));
}

export class Lifecycle {
  constructor(readonly store: JobStore, readonly router: QueueRouter, readonly registry: Registry) {
    router.onStalled((q, id) => void this.leaseLost(id, 'its lease expired (no lock renewal or heartbeat)')
      .catch((e) => log.warn('could not record a lost lease; the next claim of the job requeues or fails it',
        { job_id: id, queue: q, error: (e as Error).message })));
  }

  /** Registers a validated spec: CREATED -> VALIDATED (-> QUEUED when `enqueue`). Every path it names must lie in
   *  the storage roots; `caller` (the API key, null with auth off; a plan's starter, a schedule's owner) must be
   *  allowed what it asks (checkCaller); `planRunner` only from orchestration/plan-runner.ts, `internal` only from the
   *  daemon's routes that submit an internal operation (orchestration/worker-jobs.ts). */
  async submit(spec: JobSpec, opts: { enqueue: boolean; meta?: Record<string, unknown>; caller?: Caller | null; planRunner?: boolean; internal?: boolean }) {
    const req = requirementsOf(spec);
    checkCaller(spec, opts.caller ?? null, '', { planRunner: opts.planRunner, internal: opts.internal });
    await checkSubmittedPaths(OPERATIONS[spec.operation]?.paths?.(spec) ?? []);
    await checkSubmittedImages(OPERATIONS[spec.operation]?.images?.(spec) ?? []);
    const queue = queueName(req);
    const p = spec.execution_policy;
    // The daemon's plumbing (OPERATIONS[op].brief) is noted before its record exists, so none escapes its own short
    // retention (JobStore.purgeCalls) or shows in the job lists: an id whose record never came is forgotten by the sweep.
    if (OPERATIONS[spec.operation]?.brief) await this.store.redis.zadd(this.store.k.jobsCalls, Date.now(), spec.job_id);
    const steps: Step[] = [{ to: 'VALIDATED', reason: 'specification validated' }];
    if (opts.enqueue) steps.push({ to: 'QUEUED', reason: `queued on ${queue} with priority ${p.priority}` });
    const { created } = await this.store.create(spec.job_id, {
      spec: JSON.stringify(seal(spec)), // credentials kept encrypted when FERRY_SECRET_KEY is set
      queue,
      priority: p.priority,
      max_attempts: p.retry_count + 1,
      // attempts (0) and an empty meta are what a record without them reads as: not stored.
      ...(opts.meta && Object.keys(opts.meta).length ? { meta: JSON.stringify(opts.meta) } : {}),
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
      await this.store.transition(id, [{ to: 'FAILED', reason: `could not be placed in the queue: ${(e as Error).message}` }])
        .catch((e2) => log.warn('could not record that a job failed to be queued; it stays QUEUED and the reconcile sweep puts it in its queue',
          { job_id: id, error: (e2 as Error).message }));
      throw new ApiError(503, `job ${id} could not be queued (storage unavailable); retry with a new job_id`);
    }
  }

  /** Takes the next job this worker can run, most specific queue first, and moves it to ASSIGNED under a lease.
   *  `deadline`: record when the attempt's timeout_seconds run out, for reapTimedOut (HTTP pull workers; a worker
   *  process keeps its own timer and stops the operation itself). */
  async claim(worker: { worker_id: string; capabilities: string[]; execution_mode?: string }, queues?: string[],
    opts: { deadline?: boolean } = {}): Promise<Lease | null> {
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
      const policy = policyOf(h);
      if (isHeld(h.state) && !policy.idempotent) {
        await this.store.transition(id, [{ to: 'FAILED', reason: `worker ${h.worker_id} lost its lease; ${NOT_RETRIED}` }],
          { fields: { lease: null, error: `worker ${h.worker_id} lost` } });
        await this.router.finish(got.queue, id, token);
        continue;
      }
      if (isHeld(h.state)) {
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
      const r = await this.store.transition(id, steps, { fields: { worker_id: worker.worker_id, lease: token, attempts: attempts + 1, waiting_reason: null,
        deadline: opts.deadline ? Date.now() + policy.timeout_seconds * 1000 : null } });
      if (!r.ok) {
        await this.router.finish(got.queue, id, token);
        continue;
      }
      if (h.state === 'QUEUED' && h.updated_at) jobWaitSeconds.observe({ queue: got.queue }, Math.max(0, Date.now() - Date.parse(h.updated_at)) / 1000);
      const record = await this.store.get(id);
      try {
        record!.spec = unseal(record!.spec);
      } catch (e) {
        await this.fail(id, worker.worker_id, token, (e as Error).message, false);
        continue;
      }
      return { job_id: id, queue: got.queue, token, record: record! };
    }
    return null;
  }

  /**
   * The one rule for a report-back (start, events, complete, fail, lease renewal): the caller presents the lease
   * token its claim was handed. A worker id is public (GET /jobs/{id} shows it); the token is not, and a requeue
   * or a new claim replaces it, so an old token is refused (409) and changes nothing. Native workers carry the
   * token of their claim too; every transition below checks it again atomically in Redis (queue/commands/transitionJob-13.lua).
   */
  async held(id: string, workerId: string, token: string): Promise<Record<string, string>> {
    const h = await this.store.raw(id);
    if (!h) throw notFound(`job ${id} not found`);
    if (!sameLease(h.lease, token) || h.worker_id !== workerId) {
      throw conflict(
        `job ${id} is not held under this lease by worker ${workerId} (state ${h.state}): the lease token is unknown, or from an earlier claim of a job that ` +
        `was requeued or reassigned`);
    }
    return h;
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
    return { job_id: id, timestamp: ev.timestamp || new Date().toISOString(), phase: ev.phase, percentage: ev.percentage, message: ev.message || '',
      details: ev.details || {} };
  }

  async progress(id: string, lease: string, ev: Omit<ProgressEvent, 'job_id' | 'timestamp'> & { timestamp?: string }) {
    return this.store.appendEvent(id, this.event(id, ev), lease);
  }

  /** RUNNING -> COMPLETED with the final progress event (phase completed, 100%) in the same atomic step; the
   *  lease is checked there. `queue` (known to a worker from its claim) saves reading the record. */
  async complete(id: string, workerId: string, lease: string, result: Record<string, unknown>, queue?: string): Promise<boolean> {
    if (queue === undefined) {
      const h = await this.store.raw(id);
      if (!h || !sameLease(h.lease, lease)) return false;
      queue = h.queue;
    }
    const r = await this.store.transition(id, [{ to: 'COMPLETED', reason: `completed by worker ${workerId}`, worker_id: workerId }], {
      lease, fields: { result: JSON.stringify(result), lease: null, error: null },
      event: { ev: this.event(id, { phase: 'completed', percentage: 100, message: 'job completed', details: {} }), before: true },
    });
    // Even when the lease is gone the calls are harmless (BullMQ refuses a stale token) and drop our own references.
    await this.router.finish(queue, id, lease);
    return r.ok;
  }

  /** A failed attempt: back to QUEUED with backoff while retry_count allows, FAILED otherwise. */
  async fail(id: string, workerId: string, lease: string, message: string, retryable: boolean): Promise<{ ok: boolean; state?: JobState;
    retry_in_ms?: number }> {
    const h = await this.store.raw(id);
    if (!h || !sameLease(h.lease, lease)) return { ok: false, state: (h?.state as JobState | undefined) };
    const attempts = Number(h.attempts || 1);
    const max = Number(h.max_attempts || 1);
    const { idempotent } = policyOf(h);
    if (retryable && attempts < max && idempotent) {
      const delay = retryDelayMs(attempts);
      const r = await this.store.transition(id,
        [{ to: 'QUEUED', reason: `attempt ${attempts} of ${max} failed on worker ${workerId}: ${message}; retrying in ${(delay / 1000).toFixed(1)} s` }],
        { lease, fields: { lease: null, worker_id: null, error: message } });
      if (!r.ok) return { ok: false, state: r.state ?? undefined }; // refused: the job is where it was (the state it is in now)
      await this.router.requeue(h.queue, id, lease, delay);
      return { ok: true, state: 'QUEUED', retry_in_ms: delay };
    }
    const why = !retryable ? message : `${message} (attempt ${attempts} of ${max}; ${attempts < max ? NOT_RETRIED : 'no retries left'})`;
    const r = await this.store.transition(id, [{ to: 'FAILED', reason: why, worker_id: workerId }], { lease, fields: { lease: null, error: message } });
    await this.router.finish(h.queue, id, lease);
    return r.ok ? { ok: true, state: 'FAILED' } : { ok: false, state: r.state ?? undefined };
  }

  /** The worker gives the job back without it counting as an attempt (shutdown, or it cannot start it yet:
   *  then `waitingReason` says why, shown while it is QUEUED, and `delayMs` spaces the next try). */
  async handBack(id: string, workerId: string, lease: string, reason: string, opts: { delayMs?: number; waitingReason?: string } = {}) {
    const h = await this.store.raw(id);
    if (!h || !sameLease(h.lease, lease)) return false;
    const r = await this.store.transition(id, [{ to: 'QUEUED', reason: `handed back by worker ${workerId}: ${reason}` }],
      { lease, fields: { lease: null, worker_id: null, attempts: Math.max(0, Number(h.attempts) - 1), waiting_reason: opts.waitingReason ?? null } });
    if (r.ok) await this.router.requeue(h.queue, id, lease, opts.delayMs ?? 0);
    return r.ok;
  }

  /** A worker's lease ran out (BullMQ found the job stalled, or the worker went stale or was removed). */
  async leaseLost(id: string, why: string) {
    const h = await this.store.raw(id);
    if (!h || !isHeld(h.state)) return;
    const attempts = Number(h.attempts || 1);
    const max = Number(h.max_attempts || 1);
    const { idempotent } = policyOf(h);
    if (attempts >= max || !idempotent) {
      const left = attempts >= max ? `no retries left (${attempts} of ${max})` : NOT_RETRIED;
      await this.store.transition(id, [{ to: 'FAILED', reason: `worker ${h.worker_id} lost: ${why}; ${left}` }],
        { lease: h.lease, fields: { lease: null, error: `worker ${h.worker_id} lost` } });
      // A worker still holding the BullMQ lock (a stale HTTP worker) keeps remove from working; end the lock first.
      if (h.lease) await this.router.finish(h.queue, id, h.lease);
      await this.router.remove(h.queue, id);
      return;
    }
    await this.store.transition(id, [{ to: 'QUEUED', reason: `worker ${h.worker_id} lost: ${why}; requeued (attempt ${attempts} of ${max} used)` }],
      { lease: h.lease, fields: { lease: null, worker_id: null } });
  }

  /** Returns the jobs a stale or removed HTTP worker held to the queue at once. */
  async releaseWorker(workerId: string, why: string) {
    for (const id of await this.registry.heldJobs(workerId)) {
      const h = await this.store.raw(id);
      if (h && h.lease && isHeld(h.state) && h.worker_id === workerId) {
        const lease = h.lease;
        await this.leaseLost(id, why);
        const after = await this.store.raw(id);
        if (after?.state === 'QUEUED') await this.router.requeue(h.queue, id, lease,
          0).catch(
          expected(log,
          'the lease no longer holds the BullMQ lock (its stalled check moved the job back already); a QUEUED job missing from its queue is put back by the ' +
          'reconcile sweep', { job_id: id }));
      }
    }
  }

  /**
   * Ends the attempts whose deadline (recorded at claim with `deadline`, for HTTP pull workers) has passed, the way
   * a worker process ends its own on timeout: a failed attempt, retried while retry_count (and idempotent) allow.
   * The worker learns it when its next report is refused (409). Returns the ids it ended.
   */
  async reapTimedOut(now = Date.now(), still: () => Promise<boolean> = () => Promise.resolve(true)): Promise<string[]> {
    const r = this.store.redis;
    const ids = (await Promise.all(HELD.map((s) => r.zrange(this.store.k.jobsInState(s), 0, -1)))).flat();
    const hs = await this.store.many(ids, ['state', 'deadline', 'lease', 'worker_id']);
    const ended: string[] = [];
    for (const [i, h] of hs.entries()) {
      if (!h?.deadline || !h.lease || !h.worker_id || Number(h.deadline) > now) continue;
      if (!(await still())) break; // the sweep's lease is gone: its new holder carries on
      const full = await this.store.raw(ids[i]); // the spec, only for the few that ran out
      if (!full) continue;
      const failed = await this.fail(ids[i], h.worker_id, h.lease, `timed out after ${policyOf(full).timeout_seconds} s (execution_policy.timeout_seconds)`,
        true);
      if (failed.ok) ended.push(ids[i]);
    }
    return ended;
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
    if (isHeld(r.prev)) {
      // The worker kills its process and removes partial output; the lease ends here.
      await publish(this.store.redis, this.store.k, 'cancel', id);
      if (h.lease) await this.router.finish(h.queue, id, h.lease);
    }
    return { job_id: id, state: 'CANCELLED', message: `job ${id} was cancelled (was ${r.prev})` };
  }

  /**
   * Puts back into BullMQ any QUEUED job whose queue entry is missing: a gateway that died between recording
   * QUEUED and adding the job to the queue would otherwise leave it waiting forever. One process at a time does
   * this (the gateway that leads the periodic work, services/gateway/sweeps.ts); jobs younger than `minAgeMs` are left alone, since their add may be in flight.
   */
  async reconcileQueued(minAgeMs: number, still: () => Promise<boolean> = () => Promise.resolve(true)): Promise<string[]> {
    const ids = await this.store.redis.zrange(this.store.k.jobsInState('QUEUED'), 0, -1);
    const restored: string[] = [];
    for (let i = 0; i < ids.length; i += 500) {
      if (!(await still())) break; // the sweep's lease is gone: its new holder carries on
      restored.push(...await this.restoreMissing(ids.slice(i, i + 500), minAgeMs));
    }
    return restored;
  }

  /** Of `ids`, the QUEUED jobs at least `minAgeMs` old whose BullMQ entry is missing, put back (their ids). A plan's
   *  effect job, whose submitter held the lease now held by the caller, is checked with no age: no add is in flight. */
  async restoreMissing(ids: string[], minAgeMs: number): Promise<string[]> {
    const hs = await this.store.many(ids, ['state', 'queue', 'priority', 'updated_at']);
    const p = this.store.redis.pipeline();
    for (const [j, h] of hs.entries()) if (h?.queue) this.router.bull.exists(p, h.queue, bullId(ids[j]));
    const exists = ((await p.exec()) || []).map(([, v]) => Number(v));
    const restored: string[] = [];
    let n = 0;
    for (const [j, h] of hs.entries()) {
      if (!h?.queue) continue;
      const present = exists[n++];
      if (present || h.state !== 'QUEUED' || Date.now() - Date.parse(h.updated_at) < minAgeMs) continue;
      await this.router.enqueue(h.queue, ids[j], Number(h.priority));
      restored.push(ids[j]);
    }
    return restored;
  }

  /** Why a queued job is still waiting, or null when some active worker can take it. With `jobId`, the reason
   *  a worker gave when it handed the job back (a full per-manager export limit) comes first. */
  async waitingReason(queue: string, jobId?: string): Promise<string | null> {
    if (jobId) {
      const own = await this.store.redis.hget(this.store.k.job(jobId), 'waiting_reason');
      if (own) return own;
    }
    const req = parseQueueName(queue);
    return req ? unservedReason(req, await this.registry.active()) : null;
  }
}

/** Why jobs needing `req` wait when none of the `active` workers can take them, or null when one can. */
export function unservedReason(req: Requirements, active: ActiveWorker[]): string | null {
  if (active.some((w) => canServe(w, req))) return null;
  const need = req.capabilities.length ? req.capabilities.join(', ') : 'no capabilities';
  return `no active worker has the capabilities this job needs (${need}${req.execution_mode ? `, execution mode ${req.execution_mode}` : ''})`;
}
