// Warm migration's options (issue 37, docs/plans.md "Warm migration"): one joi schema for a shape B job's
// options.warm, a plan's options.warm (the plan options are the job's) and the migrate_vm parameter the worker reads.
import Joi from 'joi';

/** Seconds between the end of one copy round and the start of the next. Forklift's default precopy interval is
 *  60 minutes; Ferry's minimum (5 s) is for tests and small VMs: below it a round is mostly its own snapshot. */
export const PRECOPY_INTERVAL = { min: 5, default: 3600, max: 86_400 } as const;

export interface WarmOptions {
  precopy_interval: number;
  /** cut over at this time (the next round boundary at or after it) */
  cutover_at?: string;
  /** cut over as soon as the predicted downtime of a cutover now is at most this many seconds */
  downtime_budget_seconds?: number;
  enable_cbt: boolean;
}

export const warmOptionsSchema = Joi.object<WarmOptions>({
  precopy_interval: Joi.number().integer().min(PRECOPY_INTERVAL.min).max(PRECOPY_INTERVAL.max).default(PRECOPY_INTERVAL.default)
    .description(`seconds between copy rounds while the VM runs (min ${PRECOPY_INTERVAL.min}, default ${PRECOPY_INTERVAL.default}, `
      + `max ${PRECOPY_INTERVAL.max})`),
  cutover_at: Joi.date().iso().raw()
    .description('cutover rule "at a time": power off and copy the last delta at the first round boundary at or after this time'),
  downtime_budget_seconds: Joi.number().integer().min(1).max(86_400)
    .description('cutover rule "by budget": cut over when the predicted downtime of a cutover now is at most this (inside the plan\'s windows)'),
  enable_cbt: Joi.boolean().default(true)
    .description('turn changed-block tracking on where it is off (a VM reconfiguration); false: a VM without it is refused'),
}).oxor('cutover_at', 'downtime_budget_seconds').label('WarmOptions')
  .description('warm migration: copy while the VM runs, sync changed blocks in rounds, then cut over (power off, last delta, repair, import, boot). '
    + 'Without cutover_at or downtime_budget_seconds the cutover is manual (POST /plans/{id}/cutover)');
