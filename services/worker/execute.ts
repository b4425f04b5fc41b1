// One attempt of a job on this worker: admitted (or handed back while a shared limit is full), started, run with
// progress under its lease, then completed, or failed, cancelled or handed back as what stopped it says.
import { OperationError } from '../../platform/errors';
import { dropped, Logger } from '../../platform/log';
import { outputId, type OutputClaims } from '../../platform/roots';
import type { Lease, Lifecycle } from '../../queue/lifecycle';
import type { JobStore } from '../../queue/store';
import type { JobSpec } from '../../domain/schemas/job';
import { IMPLEMENTATIONS } from './operations';
import type { Ledger } from '../../domain/libvirt/ledger';
import type { WorkerMetrics } from './worker-metrics';

export interface Running { lease: Lease; abort: AbortController; why?: 'cancel' | 'timeout' | 'shutdown' }

export interface ExecDeps { workerId: string; log: Logger; life: Lifecycle; store: JobStore; running: Map<string, Running>; metrics: WorkerMetrics }

type Impl = (typeof IMPLEMENTATIONS)[string];

/** Outputs a job wrote (outputId), kept in its record so any worker's retry recognises them. Recorded under the
 *  attempt's lease (addOutput-1.lua): an attempt that lost its lease claims nothing. */
function claimsOf(store: JobStore, id: string, lease: string): OutputClaims {
  return {
    record: async (st) => {
      if (!(await store.recordOutput(id, lease, outputId(st)))) {
        throw new OperationError(`job ${id}: the lease of this attempt is gone; its output is not recorded as the job's`, false);
      }
    },
    owns: async (st) => (await store.ownedOutputs(id)).includes(outputId(st)),
  };
}

/** The job's ledger for this attempt: each entry written into the record under the attempt's lease, so that an
 *  attempt that lost its job (cancelled, taken over) records nothing and stops (addMade-2.lua). */
function ledgerOf(store: JobStore, id: string, lease: string, attempt: number): Ledger {
  return {
    record: async (e) => {
      const r = await store.recordMade(id, lease, { ...e, attempt, at: new Date().toISOString() });
      if (r !== 'added' && r !== 'known') {
        const why = r === 'full' ? 'its ledger is full' : 'this attempt no longer holds the job';
        throw new OperationError(`job ${id}: ${why}; ${e.kind} ${e.name} is not recorded as the job's, so nothing more is made`, false);
      }
    },
  };
}

/** Runs an admitted attempt to its end; returns the outcome ('completed', 'lost', 'cancelled'). */
async function runAttempt(d: ExecDeps, r: Running, impl: Impl): Promise<string> {
  const { lease } = r;
  const { record } = lease;
  const spec = record.spec;
  if (!(await d.life.start(lease.job_id, d.workerId, lease.token, record.attempts))) return 'lost';
  let lastBytes = 0;
  const result = await impl.run({
    job: record, spec, workerId: d.workerId, attempt: record.attempts, signal: r.abort.signal, log: d.log,
    claims: claimsOf(d.store, lease.job_id, lease.token), ledger: ledgerOf(d.store, lease.job_id, lease.token, record.attempts), store: d.store,
    progress: async (phase, percentage, message, details = {}) => {
      const det = Object.fromEntries(Object.entries(details).map(([k, v]) => [k, String(v)]));
      if (phase === 'conversion' && det.bytes_processed) {
        const b = Number(det.bytes_processed);
        if (b > lastBytes) { d.metrics.bytesTotal.inc(b - lastBytes); lastBytes = b; }
      }
      const ok = await d.life.progress(lease.job_id, lease.token, { phase, percentage, message, details: det });
      if (!ok.ok && !r.abort.signal.aborted) { r.why = 'cancel'; r.abort.abort(new Error('lease lost')); }
    },
  });
  if (await d.life.complete(lease.job_id, d.workerId, lease.token, result, lease.queue)) return 'completed';
  // Cancelled as it finished: leave nothing behind. Taken over by another worker (this one lost its lease): the
  // output is that attempt's too, so it stays.
  const now = await d.store.raw(lease.job_id);
  if (now?.state !== 'CANCELLED') return 'lost';
  await impl.cleanup?.(spec, true, d.store);
  return 'cancelled';
}

/** An attempt that threw: cancelled, handed back (shutdown) or failed (retryable unless the operation says not). */
async function settleError(d: ExecDeps, r: Running, impl: Impl | undefined, spec: JobSpec, err: Error): Promise<void> {
  const { lease } = r;
  await impl?.cleanup?.(spec, false, d.store);
  if (r.why === 'cancel') {
    d.log.info('job cancelled; process stopped and partial output removed', { job_id: lease.job_id });
    return;
  }
  if (r.why === 'shutdown') {
    await d.life.handBack(lease.job_id, d.workerId, lease.token, 'worker shutting down');
    return;
  }
  const msg = r.why === 'timeout' ? `timed out after ${spec.execution_policy.timeout_seconds} s` : err.message;
  const retryable = r.why === 'timeout' || !(err instanceof OperationError) || err.retryable;
  await d.life.fail(lease.job_id, d.workerId, lease.token, msg, retryable);
  d.log.warn('attempt failed', { job_id: lease.job_id, error: msg, retryable });
}

export async function execute(d: ExecDeps, lease: Lease) {
  const spec = lease.record.spec;
  const impl = IMPLEMENTATIONS[spec.operation];
  const r: Running = { lease, abort: new AbortController() };
  d.running.set(lease.job_id, r);
  const t0 = Date.now();
  const timer = setTimeout(() => { r.why = 'timeout'; r.abort.abort(new Error('timeout')); }, spec.execution_policy.timeout_seconds * 1000);
  let outcome = 'completed';
  let admitted: { release: () => Promise<void> } | undefined;
  try {
    if (!impl) throw new OperationError(`this worker has no implementation of operation ${spec.operation}`, true);
    if (impl.admit) {
      const a = await impl.admit(spec, d.store);
      if (!a.ok) {
        // Not now (a shared limit is full): back to the queue without using an attempt, saying why.
        outcome = 'deferred';
        await d.life.handBack(lease.job_id, d.workerId, lease.token, a.reason, { delayMs: 500 + Math.round(Math.random() * 1000), waitingReason: a.reason });
        return;
      }
      admitted = a;
    }
    outcome = await runAttempt(d, r, impl);
  } catch (e) {
    outcome = r.why === 'cancel' ? 'cancelled' : r.why === 'shutdown' ? 'handed_back' : 'failed';
    await settleError(d, r, impl, spec, e as Error);
  } finally {
    clearTimeout(timer);
    await admitted?.release().catch(dropped(d.log, 'a slot not released expires with its own time limit', { job_id: lease.job_id }));
    d.running.delete(lease.job_id);
    d.metrics.jobsTotal.inc({ operation: spec.operation, outcome });
    d.metrics.jobSeconds.observe({ operation: spec.operation }, (Date.now() - t0) / 1000);
  }
}
