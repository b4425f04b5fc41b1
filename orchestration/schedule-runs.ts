// One run of a schedule: a job created from its template through Lifecycle.submit, exactly once per cron
// iteration (the job id is derived from the iteration, so a second attempt conflicts), and the run's outcome
// (its job's outcome) counted once, however many scheduler processes see it.
import type { Lifecycle } from '../queue/lifecycle';
import { ApiError } from '../platform/errors';
import { isTerminal } from '../domain/states';
import type { Logger } from '../platform/log';
import { buildSpec } from '../domain/daemon-jobs';
import { publish } from '../queue/bus';
import { callerOf, type Schedule, type ScheduleStore } from './schedules';
import { checkCaller } from '../queue/lifecycle';
import type { Caller } from '../platform/auth';
import { ignoreError } from '../platform/log';

export interface RunDeps { life: Lifecycle; schedules: ScheduleStore; jobTimeoutSeconds: number; parallelDownloads: number; log: Logger }

/** Refuses (403 naming the field) a template asking for what `caller` may not have, at creation and at each
 *  change. A template that does not build is not refused here: each run reports why (as before). */
export function checkTemplate(deps: Pick<RunDeps, 'jobTimeoutSeconds' | 'parallelDownloads'>, template: unknown, caller: Caller | null, field: string) {
  if (!template) return;
  let built;
  try { built = buildSpec(template, { where: field, jobTimeoutSeconds: deps.jobTimeoutSeconds, parallelDownloads: deps.parallelDownloads }); } catch {
    return; /* named above: each run reports why it does not build */ }
  checkCaller(built.spec, caller, field);
}

/** A run that created no job, counted once per iteration (`jobId`), with its reason kept (GET /schedules/{id}:
 *  last_error) and sent as a schedule event. */
async function failedRun(deps: RunDeps, s: Schedule, jobId: string, manual: boolean, error: string) {
  const r = deps.schedules.redis;
  const stats = deps.schedules.k.scheduleStats(s.id);
  if (!(await r.set(`${stats}:once:${jobId}`, '1', 'EX', 86400, 'NX'))) return;
  await r.multi().hincrby(stats, 'run_count', 1).hincrby(stats, 'failed', 1).hset(stats, { last_run: new Date().toISOString(), last_error: error }).exec();
  await publishScheduleEvent(deps, s.id, 'triggered', { manual });
  await publishScheduleEvent(deps, s.id, 'failed', { error });
  deps.log.warn('schedule run created no job: counted as failed, the schedule stays as it is', { schedule_id: s.id, job_id: jobId, error });
}

export async function publishScheduleEvent(deps: RunDeps, schedule_id: string, event: 'triggered' | 'completed' | 'failed',
  extra: Record<string, unknown> = {}) {
  const k = deps.schedules.k;
  await publish(deps.schedules.redis, k, 'schedules', { schedule_id, event, timestamp: new Date().toISOString(), ...extra });
}

/** Returns the created job id, or null when this iteration already ran or the schedule is gone or disabled. */
export async function runSchedule(deps: RunDeps, scheduleId: string, how: { manual: boolean; iteration?: string }): Promise<string | null> {
  const { schedules, life } = deps;
  const r = schedules.redis;
  const k = schedules.k;
  const s = await schedules.get(scheduleId);
  if (!s) { await schedules.queue.removeJobScheduler(scheduleId).catch(ignoreError(
    'could not remove the job scheduler of a deleted schedule; its next iteration tries again', { schedule_id: scheduleId })); return null; }
  if (!s.enabled && !how.manual) return null;
  const jobId = how.manual ? `sched-${s.id}-m${Date.now()}${Math.floor(Math.random() * 1000)}` : `sched-${s.id}-${how.iteration}`;
  const now = new Date().toISOString();
  if (!s.job_template) { await failedRun(deps, s, jobId, how.manual, 'schedule has no job template'); return null; }
  let built;
  try {
    built = buildSpec(s.job_template, { where: 'job_template', jobTimeoutSeconds: deps.jobTimeoutSeconds, parallelDownloads: deps.parallelDownloads, jobId });
  } catch (e) {
    await failedRun(deps, s, jobId, how.manual, (e as Error).message);
    return null;
  }
  // Recorded before the job exists, so an instant outcome is never missed.
  await r.hset(k.scheduleRuns, jobId, s.id);
  try {
    // Checked again now, as its owner: a template stored before a rule existed, or changed in Redis, gets no more.
    await life.submit(built.spec, { enqueue: true, meta: { ...built.meta, schedule_id: s.id, schedule_name: s.name, manual: how.manual },
      caller: callerOf(s) });
  } catch (e) {
    if (e instanceof ApiError && e.status === 409) return null; // another scheduler process ran this iteration
    await r.hdel(k.scheduleRuns, jobId);
    if (e instanceof ApiError && e.status < 500) { await failedRun(deps, s, jobId, how.manual, e.message); return null; }
    throw e;
  }
  await r.multi().hincrby(k.scheduleStats(s.id), 'run_count', 1).hset(k.scheduleStats(s.id), { last_run: now, last_job_id: jobId }).hdel(k.scheduleStats(s.id),
    'last_error').exec();
  await publishScheduleEvent(deps, s.id, 'triggered', { job_id: jobId, manual: how.manual });
  deps.log.info('schedule fired', { schedule_id: s.id, job_id: jobId, manual: how.manual });
  return jobId;
}

/** Counts a finished run once: HDEL succeeds for exactly one caller. */
export async function recordOutcome(deps: RunDeps, jobId: string, state: string, error?: string | null) {
  const r = deps.schedules.redis;
  const k = deps.schedules.k;
  const sid = await r.hget(k.scheduleRuns, jobId);
  if (!sid || !isTerminal(state)) return;
  if ((await r.hdel(k.scheduleRuns, jobId)) !== 1) return;
  const ok = state === 'COMPLETED';
  await r.hincrby(k.scheduleStats(sid), ok ? 'successful' : 'failed', 1);
  await publishScheduleEvent(deps, sid, ok ? 'completed' : 'failed', { job_id: jobId, state, ...(error ? { error } : {}) });
}

/** Finds outcomes missed while no scheduler was listening. */
export async function sweepOutcomes(deps: RunDeps) {
  const r = deps.schedules.redis;
  const runs = await r.hgetall(deps.schedules.k.scheduleRuns);
  const ids = Object.keys(runs);
  if (!ids.length) return;
  const hs = await deps.life.store.many(ids, ['state', 'error']);
  for (let i = 0; i < ids.length; i++) {
    if (!hs[i]) { await r.hdel(deps.schedules.k.scheduleRuns, ids[i]); continue; }
    if (isTerminal(hs[i]!.state)) await recordOutcome(deps, ids[i], hs[i]!.state, hs[i]!.error);
  }
}
