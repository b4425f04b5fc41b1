// Work the daemon hands to a worker and waits for (issue 33 item 4, issue 38 item 2): a plan preflight's guest
// read (nbdkit and a libguestfs appliance) and the power actions, so the daemon stays a Node-only process. The
// job is an internal operation (domain/operations.ts), submitted as the request's caller (checkCaller holds as for
// any request); its end is awaited on the bus with a bound, and a job still unfinished at the bound is cancelled,
// so nothing acts after the request was answered.
import { randomUUID } from 'node:crypto';
import { queueName } from '../platform/capabilities';
import { validate } from '../platform/http';
import { jobSpecSchema, type JobSpec } from '../domain/schemas/job';
import { isTerminal } from '../domain/states';
import type { Caller } from '../platform/auth';
import { createLogger } from '../platform/log';
import type { Bus } from '../queue/bus';
import type { JobStore } from '../queue/store';
import { requirementsOf, type Lifecycle } from '../queue/lifecycle';

const log = createLogger('worker-jobs');

export interface WorkerJobDeps { life: Lifecycle; bus: Bus }

/** A record field an internal job's worker sets when vSphere refused the action: the VsphereError's kind, so the
 *  daemon answers the HTTP status it answered when it acted itself (services/worker/operations/vm-power.ts). */
export const VSPHERE_ERROR_FIELD = 'vsphere_error';

/** How a worker job ended for the daemon: done, failed or cancelled (its record's fields), never submitted
 *  because no active worker could take it, or not finished within the bound (then cancelled). */
export type WorkerJobEnd =
  | { outcome: 'ended'; job_id: string; state: 'COMPLETED' | 'FAILED' | 'CANCELLED'; result: unknown; error: string | null; record: Record<string, string> }
  | { outcome: 'unserved'; reason: string }
  | { outcome: 'timeout'; job_id: string; waiting_reason: string | null };

/** An internal operation's spec, validated by the operation's own schema (a bug here is a 500, not a 400). Not
 *  retried: a guest read or a power action run again after the bound would act after the answer. */
export function internalSpec(operation: string, parameters: Record<string, unknown>, opts: { timeoutSeconds: number; priority?: number }): JobSpec {
  return validate<JobSpec>(jobSpecSchema, {
    job_id: randomUUID(), operation, parameters,
    execution_policy: { timeout_seconds: Math.max(1, Math.ceil(opts.timeoutSeconds)), priority: opts.priority ?? 90, retry_count: 0, idempotent: false },
  }, 'internal job');
}

/** Why no active worker could take `spec` now (the one rule of the queue's waiting_reason), or null. */
export function unserved(life: Lifecycle, spec: JobSpec): Promise<string | null> {
  return life.waitingReason(queueName(requirementsOf(spec)));
}

/** Resolves with the job's record once it is final, or null when `ms` pass first (or `signal` aborts). The bus
 *  wakes it; the record is read again every few seconds all the same, since a message published while the bus
 *  reconnects is missed. */
export async function awaitJobEnd(bus: Bus, store: JobStore, id: string, ms: number, signal?: AbortSignal): Promise<Record<string, string> | null> {
  const until = Date.now() + ms;
  let wake: () => void = () => undefined;
  const heard = { end: false }; // a message between the read and the wait below is not lost: the wait does not begin
  const off = await bus.on('jobs', (m) => { if (m.job_id === id && isTerminal(m.state)) { heard.end = true; wake(); } });
  try {
    for (;;) {
      heard.end = false;
      const h = await store.raw(id);
      if (!h || isTerminal(h.state)) return h;
      const left = until - Date.now();
      if (left <= 0 || signal?.aborted) return null;
      if (heard.end) continue;
      await new Promise<void>((resolve) => {
        const t = setTimeout(done, Math.min(left, 5000));
        function done() { clearTimeout(t); signal?.removeEventListener('abort', done); resolve(); }
        wake = done;
        signal?.addEventListener('abort', done, { once: true });
      });
    }
  } finally { off(); }
}

/** Submits `spec` as `caller` (no job when no active worker can take it; `beforeSubmit` runs just before) and waits up to `waitMs` for its end;
 *  past it the job is cancelled (a worker holding it stops it) and the answer says where it was waiting. */
export async function runWorkerJob(d: WorkerJobDeps, spec: JobSpec, opts: { caller: Caller | null; waitMs: number; meta?: Record<string, unknown>;
  signal?: AbortSignal; beforeSubmit?: () => Promise<void> }): Promise<WorkerJobEnd> {
  const reason = await unserved(d.life, spec);
  if (reason) return { outcome: 'unserved', reason };
  await opts.beforeSubmit?.(); // what the job reads beside its spec (a sealed password), in place before a worker can claim it
  await d.life.submit(spec, { enqueue: true, caller: opts.caller, internal: true, meta: { kind: 'operation', name: spec.operation, ...opts.meta } });
  const h = await awaitJobEnd(d.bus, d.life.store, spec.job_id, opts.waitMs, opts.signal);
  if (h) return ended(spec.job_id, h);
  const waiting = await d.life.waitingReason(queueName(requirementsOf(spec)), spec.job_id).catch(() => null);
  try {
    await d.life.cancel(spec.job_id, `the daemon stopped waiting for it after ${Math.round(opts.waitMs / 1000)} s`);
  } catch (e) {
    // It ended as the bound passed: its end is the answer.
    const now = await d.life.store.raw(spec.job_id);
    if (now && isTerminal(now.state)) return ended(spec.job_id, now);
    log.warn('a worker job past its bound could not be cancelled; its own timeout_seconds ends it', { job_id: spec.job_id, error: (e as Error).message });
  }
  return { outcome: 'timeout', job_id: spec.job_id, waiting_reason: waiting };
}

function ended(id: string, h: Record<string, string>): WorkerJobEnd {
  let result: unknown;
  try { result = h.result ? JSON.parse(h.result) : null; } catch { result = null; } // Ferry's own worker writes JSON; damage reads as no result
  return { outcome: 'ended', job_id: id, state: h.state as 'COMPLETED' | 'FAILED' | 'CANCELLED', result, error: h.error || null, record: h };
}
