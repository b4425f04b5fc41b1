// A plan's side effects on a target host or the source (a rollback, a source removal) as worker jobs: the plan
// runner (orchestration/plan-runner.ts) claims the effect in the VM's actions, then submits its job under an id derived
// from the claim, so a second submission (a new leader resuming the claim) finds the job and creates none; the
// claim is marked done from the job's end, with what the job did. The job acts as the plan's starter (or the
// admin who asked for a rollback), checked by checkCaller like any request; only the runner may submit these
// operations (OPERATIONS[op].submittedBy 'plan').
import type { Lifecycle } from '../queue/lifecycle';
import type { Caller } from '../platform/auth';
import { ApiError } from '../platform/errors';
import { createLogger } from '../platform/log';
import { validate } from '../platform/http';
import { jobSpecSchema, type JobSpec } from '../domain/schemas/job';
import { isTerminal } from '../domain/states';

export type EffectOp = 'rollback_kvm' | 'remove_source';

/** The effect's job id: the VM's job, the effect, and the claim's key when it is not that job (an API rollback). */
export function effectJobId(vmJob: string, action: 'rollback' | 'remove_source', key: string): string {
  return [vmJob, action, ...(key === vmJob ? [] : [key])].join('.');
}

/** How an effect's job ended: null while it has not. */
export type EffectEnd = { ok: true; result: Record<string, unknown> } | { ok: false; error: string };

/** Reads an effect job's end from its record (null: not ended, or not there yet). */
export async function effectEnd(life: Lifecycle, id: string): Promise<EffectEnd | null> {
  const h = await life.store.raw(id);
  if (!h || !isTerminal(h.state)) return null;
  if (h.state === 'COMPLETED') {
    try { return { ok: true, result: JSON.parse(h.result || '{}') as Record<string, unknown> }; } catch { return { ok: true, result: {} }; }
  }
  return { ok: false, error: h.error || `its job ${id} was ${h.state.toLowerCase()}` };
}

const log = createLogger('plans');

/** Submits the effect's job unless it exists (a resumed claim); answers its end when it has one already, a
 *  refusal of the submission (a caller without the role, a bad parameter) as a failed end, else null. */
export async function submitEffect(
  life: Lifecycle, o: { id: string; op: EffectOp; parameters: Record<string, unknown>; caller: Caller | null; meta: Record<string, unknown> },
): Promise<EffectEnd | null> {
  const seen = await effectEnd(life, o.id);
  if (seen) return seen;
  if (await life.store.raw(o.id)) {
    // A leader that died between recording the job QUEUED and adding it to BullMQ left it waiting for no worker.
    if ((await life.restoreMissing([o.id], 0)).length) log.warn('a plan effect\'s job was missing from its queue; put back', { job_id: o.id, operation: o.op });
    return null;
  }
  try {
    // A rollback goes before the plan's next migrations; each effect checks first, so another attempt is safe.
    const spec = validate<JobSpec>(jobSpecSchema, {
      job_id: o.id, operation: o.op, parameters: o.parameters, execution_policy: { timeout_seconds: 900, retry_count: 3, priority: 90 },
    }, 'body');
    await life.submit(spec, {
      enqueue: true,
      meta: { kind: 'operation', name: o.op, ...o.meta, acting_as: o.caller ? { name: o.caller.name, role: o.caller.role } : null },
      caller: o.caller, planRunner: true,
    });
  } catch (e) {
    // Created meanwhile by another submission of the same claim: that job is the effect's.
    if (e instanceof ApiError && e.status === 409 && (await life.store.raw(o.id))) return effectEnd(life, o.id);
    return { ok: false, error: `its job could not be submitted: ${(e as Error).message}` };
  }
  return effectEnd(life, o.id);
}

/** Waits for an effect's job to end (an API rollback answers with it), polling its record; null after `ms`. */
export async function awaitEffect(life: Lifecycle, id: string, ms: number): Promise<EffectEnd | null> {
  const until = Date.now() + ms;
  for (;;) {
    const end = await effectEnd(life, id);
    if (end || Date.now() >= until) return end;
    await new Promise((r) => setTimeout(r, 250));
  }
}
