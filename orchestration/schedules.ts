// Schedules in Redis and their BullMQ job schedulers. A schedule's definition lives in one hash; its counters
// in another; each enabled schedule has a BullMQ job scheduler of the same id, so however many scheduler
// processes run, each cron iteration is one BullMQ job taken by one of them.
import { Queue } from 'bullmq';
import { CronExpressionParser } from 'cron-parser';
import { randomUUID } from 'node:crypto';
import { ApiError, badRequest, fieldError } from '../platform/errors';
import type { Keys, RedisClient } from '../platform/redis';
import { expectedError, ignoreError } from '../platform/log';
import type { Caller, KeyRole } from '../platform/auth';
import { onBullError } from '../queue/router';

export const SCHEDULE_QUEUE = 'schedules';

/** The key whose rights a schedule's runs have: its creator, or whoever last changed its job template. */
export interface ScheduleOwner { key: string | null; role: KeyRole }

export interface Schedule {
  id: string; name: string; description: string; schedule: string; timezone: string; enabled: boolean;
  job_template: Record<string, unknown> | null; created_at: string; updated_at: string;
  /** Absent on schedules stored before owners were kept. */
  owner?: ScheduleOwner;
}

/** With authentication off every caller has every right (loopback only), so its schedules keep role admin. */
export const ownerOf = (key: Caller | null): ScheduleOwner => (key ? { key: key.name, role: key.role } : { key: null, role: 'admin' });

/** The caller a run acts as. A schedule stored before owners were kept runs with the least role that may
 *  create one (submit): nothing it asks beyond that is granted. */
export function callerOf(s: Schedule): Caller {
  if (!s.owner) return { name: '(unknown creator)', role: 'submit' };
  return { name: s.owner.key ?? '(no key: authentication was off)', role: s.owner.role };
}

/** Validates a cron expression (5 fields, or 6 with leading seconds) and a time zone; 400 with the reason. */
export function checkCron(expr: string, tz: string, field = 'schedule') {
  const n = expr.trim().split(/\s+/).length;
  if (n !== 5 && n !== 6) throw fieldError(400, field, 'wrong number of fields',
    `${field} "${expr}" must have 5 fields (minute hour day month weekday) or 6 with leading seconds`);
  try { new Intl.DateTimeFormat('en', { timeZone: tz }); } catch { throw fieldError(400, 'timezone', 'unknown time zone',
    `timezone "${tz}" is not a known IANA time zone`); }
  try { CronExpressionParser.parse(expr, { tz }); } catch (e) {
    throw fieldError(400, field, (e as Error).message, `${field} "${expr}" is not a valid cron expression: ${(e as Error).message}`);
  }
}

export function nextRun(s: Schedule): string | null {
  if (!s.enabled) return null;
  try { return CronExpressionParser.parse(s.schedule, { tz: s.timezone }).next().toISOString(); } catch {
    return null; /* no next run: a cron without a future time (validated at creation) */ }
}

/** `o[key]` when `o` is an object, else undefined (a template is checked before it is validated). */
const prop = (o: unknown, key: string): unknown => (typeof o === 'object' && o !== null ? (o as Record<string, unknown>)[key] : undefined);

/** Templates are stored in Redis, so they may not carry passwords (GOVC_PASSWORD serves scheduled jobs). */
export function refusePasswords(t: unknown, field: string) {
  if (prop(t, 'password') !== undefined || prop(prop(t, 'source'), 'password') !== undefined) {
    throw badRequest(`${field} may not carry a password: schedules are stored in Redis; scheduled jobs use GOVC_PASSWORD`);
  }
}

export class ScheduleStore {
  readonly queue: Queue;
  constructor(readonly redis: RedisClient, readonly k: Keys) {
    this.queue = new Queue(SCHEDULE_QUEUE, { connection: redis, prefix: k.bullPrefix });
    this.queue.on('error', onBullError('schedules', this.queue.name, 'the command that failed reports it to its caller; BullMQ reconnects'));
  }

  async get(id: string): Promise<Schedule | null> {
    const raw = await this.redis.hget(this.k.schedules, id);
    return raw ? JSON.parse(raw) as Schedule : null; // written by create/update
  }

  async all(): Promise<Schedule[]> {
    const h = await this.redis.hgetall(this.k.schedules);
    return Object.values(h).map((v) => JSON.parse(v) as Schedule).sort((a, b) => a.created_at.localeCompare(b.created_at) || a.id.localeCompare(b.id));
  }

  async stats(id: string) {
    const h = await this.redis.hgetall(this.k.scheduleStats(id));
    return {
      run_count: Number(h.run_count || 0), successful_runs: Number(h.successful || 0), failed_runs: Number(h.failed || 0),
      last_run: h.last_run || null, last_job_id: h.last_job_id || null, last_error: h.last_error || null,
    };
  }

  async view(s: Schedule) {
    return { ...s, ...(await this.stats(s.id)), next_run: nextRun(s) };
  }

  async create(input: { id?: string; name: string; description?: string; schedule: string; timezone?: string; enabled: boolean;
    job_template?: Record<string, unknown>; owner: ScheduleOwner }) {
    const now = new Date().toISOString();
    const s: Schedule = {
      id: input.id || `sch-${randomUUID().slice(0, 8)}`, name: input.name, description: input.description || '', schedule: input.schedule.trim(),
      timezone: input.timezone || 'UTC', enabled: input.enabled, job_template: input.job_template || null, created_at: now, updated_at: now, owner: input.owner,
    };
    checkCron(s.schedule, s.timezone);
    if (!(await this.redis.hsetnx(this.k.schedules, s.id, JSON.stringify(s)))) throw new ApiError(409, `schedule ${s.id} already exists`);
    await this.sync(s);
    return s;
  }

  async update(id: string, patch: Partial<Schedule>) {
    const cur = await this.get(id);
    if (!cur) throw new ApiError(404, `schedule ${id} not found`);
    const s: Schedule = { ...cur, ...Object.fromEntries(Object.entries(patch).filter(([, v]) => v !== undefined)), id, updated_at: new Date().toISOString() };
    checkCron(s.schedule, s.timezone);
    await this.redis.hset(this.k.schedules, id, JSON.stringify(s));
    await this.sync(s);
    return s;
  }

  async remove(id: string) {
    const n = await this.redis.hdel(this.k.schedules, id);
    if (!n) throw new ApiError(404, `schedule ${id} not found`);
    await this.queue.removeJobScheduler(id).catch(
      ignoreError('could not remove the job scheduler of a deleted schedule; it runs once more, finds no schedule and is removed then (runSchedule)',
      { schedule_id: id }));
    await this.redis.del(this.k.scheduleStats(id));
  }

  /** Makes the BullMQ job scheduler match the schedule: present with its pattern when enabled, absent otherwise. */
  async sync(s: Schedule) {
    if (!s.enabled) { await this.queue.removeJobScheduler(s.id).catch(ignoreError(
      'could not remove the job scheduler of a disabled schedule; it runs nothing (runSchedule skips it) and is synced again at the next start',
      { schedule_id: s.id })); return; }
    await this.queue.upsertJobScheduler(s.id, { pattern: s.schedule, tz: s.timezone }, {
      name: 'run', data: { schedule_id: s.id }, opts: { removeOnComplete: 200, removeOnFail: 200 },
    });
  }

  /** A restarted scheduler re-creates missing job schedulers and drops those of deleted schedules. */
  async reconcile() {
    const all = await this.all();
    const ids = new Set(all.map((s) => s.id));
    for (const js of await this.queue.getJobSchedulers(0, -1)) if (js.key && !ids.has(js.key)) await this.queue.removeJobScheduler(js.key);
    for (const s of all) await this.sync(s);
  }

  async close() { await this.queue.close().catch(expectedError('closing: a connection already gone has nothing left to close')); }
}
