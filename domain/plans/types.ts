// The plan types: a migration plan as stored in Redis (orchestration/plans.ts), as POST /plans gives it
// (domain/schemas/plans.ts validates it), and the parts the plan rules read (domain/plans/). They live here, in
// the lowest layer that uses them, so that the rules and the schemas need not import the store
// (orchestration/plans.ts re-exports them). docs/plans.md describes the fields; docs/glossary.md the states.
import type { KeyRole } from '../../platform/auth';
import type { TargetNameRule } from './names';
import type { Finding } from './rules';

export interface Override { by: string; at: string; reason: string }
/** A plan's options, or a VM's overrides of them (planOptions in domain/schemas/plans.ts): the shape B job's
 *  options, which the runner passes on to the job, and the plan's own (PLAN_ONLY_OPTIONS). */
export interface PlanOptions {
  rollback?: boolean; remove_source?: boolean; target_name?: TargetNameRule; guest_preflight?: boolean; power_off?: string;
  [option: string]: unknown;
}
export interface PlanVm {
  vm_path: string; options?: PlanOptions; status: string; job_id: string | null; jobs: string[];
  findings: (Finding & { overridden?: Override })[]; overrides: Record<string, Override>;
  error: string | null; waiting_reason: string | null; stage: string | null; claimed_at?: string;
  /** a cancel was asked for this VM's current job (the runner cancels it once the job exists) */
  cancel_requested?: boolean;
  placement?: { esxi_host: string; datastores: string[]; virt_uri: string; pool: string; domain: string; target_existed: boolean; source_was_on: boolean };
  rollback?: { at: string; detail: string } | null;
  /** the selectors (their index) that chose this VM; absent for a VM the plan lists */
  selected_by?: number[];
  /** what was done with the source after success (options.remove_source) */
  source?: { action: 'removed' | 'kept' | 'remove_failed'; at: string; detail: string };
  /** every side effect done for this VM, each claimed (recorded here) before it was done (orchestration/plan-runner.ts) */
  actions?: PlanAction[];
}
/** One side effect, claimed in the plan's compare-and-set before it is done, and marked done after: `key` is the
 *  job it is for (`api-<time>-<random>` for a rollback asked through the API); `fence` is the leader lease's fencing token
 *  (null: an API call); a claim left undone by a leader that died is resumed by the next (`resumed`). A rollback
 *  or a source removal is done by a worker job (`job_id`) and marked done from that job's end. */
export interface PlanAction {
  action: 'submit' | 'rollback' | 'remove_source'; key: string; claimed_by: string; fence: number | null; at: string;
  done_at: string | null; result?: unknown; resumed?: number;
  /** the worker job that does a rollback or a source removal, its id derived from the claim (effectJobId) */
  job_id?: string;
}
/** A plan webhook event, written in the same compare-and-set as the change it tells of, then queued under its
 *  deterministic id (a second queueing of the same id is a no-op) and moved to events_sent. */
export interface PlanOutboxEntry { id: string; event: string; data: Record<string, unknown> }
export interface PlanSelector { folder?: string; name?: string; power_state?: string }
/** Who created or started a plan: the API key's name and role; with authentication off "anonymous", role null. */
export interface PlanCaller { name: string; role: KeyRole | null }
export interface Plan {
  id: string; name: string; description: string; source: { manager_url?: string; insecure?: boolean };
  destination: { type: string; virt_uri?: string; virt_uris?: string[]; placement?: string }; selectors?: PlanSelector[];
  network_map: Record<string, string>; storage_map: Record<string, string>;
  options: PlanOptions; limits: Record<string, number>; start_at: string | null; windows: { start: string; end: string }[];
  status: string; archived: boolean; created_at: string; updated_at: string; started_at: string | null; finished_at: string | null;
  created_by: PlanCaller; started_by?: PlanCaller | null; validated_at: string | null; events_sent: string[]; cancel_requested?: boolean; vms: PlanVm[];
  outbox?: PlanOutboxEntry[];
}

/** A new plan as POST /plans gives it, validated by planCreateSchema (its defaults filled in). */
export interface PlanCreate {
  id?: string; name: string; description?: string; source?: Plan['source']; destination: Plan['destination'];
  vms?: (string | { vm_path: string; options?: PlanOptions })[]; selectors?: PlanSelector[];
  network_map: Record<string, string>; storage_map: Record<string, string>; options?: PlanOptions; limits: Record<string, number>;
  start_at?: Date | string; windows?: { start: Date | string; end: Date | string }[];
}
