// Plan and plan-VM statuses and their transitions: the one table the plan runner (orchestration/plan-runner.ts), the
// plan metrics, the schemas, the CLI and the dashboard (served as /web/dashboard/plan-states.js) read, as
// domain/states.ts is for jobs. docs/plans.md shows it.
export const PLAN_STATUSES = ['pending', 'running', 'completed', 'failed', 'cancelled'] as const;
export type PlanStatus = (typeof PLAN_STATUSES)[number];
export const PLAN_VM_STATUSES = ['pending', 'blocked', 'running', 'completed', 'failed', 'cancelled', 'rolled_back'] as const;
export type PlanVmStatus = (typeof PLAN_VM_STATUSES)[number];

/** A plan in one of these is over (a retry of its VMs makes it running again). */
export const PLAN_FINAL: readonly PlanStatus[] = ['completed', 'failed', 'cancelled'];
/** A VM in one of these has nothing running for it; the plan ends when every VM is in one. */
export const VM_FINAL: readonly PlanVmStatus[] = ['completed', 'failed', 'cancelled', 'blocked', 'rolled_back'];
/** What a retry runs again (preflight first): every final VM that did not complete. */
export const VM_RETRYABLE: readonly PlanVmStatus[] = ['failed', 'cancelled', 'blocked', 'rolled_back'];

export const PLAN_TRANSITIONS: Record<PlanStatus, readonly PlanStatus[]> = {
  // start (preflight done), or cancel before the start
  pending: ['running', 'cancelled'],
  // every VM final: completed when all completed, cancelled when asked, failed otherwise
  running: ['completed', 'failed', 'cancelled'],
  // retry of its retryable VMs
  completed: ['running'],
  failed: ['running'],
  cancelled: ['running'],
};

export const VM_TRANSITIONS: Record<PlanVmStatus, readonly PlanVmStatus[]> = {
  // preflight blocks it, the runner claims it and submits its job, or it is cancelled before it started
  pending: ['blocked', 'running', 'cancelled'],
  // its job ended (rolled_back: failed and what Ferry made was removed), or it goes back to wait (its window
  // closed before the job started; a claim never submitted)
  running: ['completed', 'failed', 'cancelled', 'rolled_back', 'pending'],
  // a retry (preflight decides again); a rollback through the API of what an earlier job of it made
  blocked: ['pending', 'blocked', 'rolled_back'],
  failed: ['pending', 'blocked', 'rolled_back'],
  cancelled: ['pending', 'blocked', 'rolled_back'],
  rolled_back: ['pending', 'blocked', 'rolled_back'],
  // a rollback through the API (admin) of a VM that completed
  completed: ['rolled_back'],
};

export const isPlanFinal = (s: string) => (PLAN_FINAL as readonly string[]).includes(s);
export const isVmFinal = (s: string) => (VM_FINAL as readonly string[]).includes(s);
export const isVmRetryable = (s: string) => (VM_RETRYABLE as readonly string[]).includes(s);
export const vmMayMove = (from: string, to: string) => (VM_TRANSITIONS[from as PlanVmStatus] ?? []).includes(to as PlanVmStatus);

/** The table as an ES module for the dashboard (plain JS, no build step): served, never copied by hand. */
export function planStatesModule(): string {
  const out = { PLAN_STATUSES, PLAN_VM_STATUSES, PLAN_FINAL, VM_FINAL, VM_RETRYABLE, PLAN_TRANSITIONS, VM_TRANSITIONS };
  return '// Generated from domain/plan-states.ts by the daemon: the plan and plan-VM state table.\n'
    + `${Object.entries(out).map(([k, v]) => `export const ${k} = ${JSON.stringify(v)};`).join('\n')}\n`;
}
