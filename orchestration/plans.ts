// Migration plans in Redis: one JSON document per plan (`<prefix>:plan:<id>`), an index sorted by creation
// time (`<prefix>:plans`) and the set of running plans (`<prefix>:plans:running`, kept in the same script as
// each write, what the plan runner walks). Every change goes through `mutate`, a compare-and-set, so two daemons
// (or the plan runner and an API call) never lose each other's writes; the runner's writes are also fenced by
// its leader lease.
import { randomUUID } from 'node:crypto';
import { ApiError, conflict, fieldError, notFound } from '../platform/errors';
import { config } from '../platform/config';
import type { Keys, RedisClient } from '../platform/redis';
import type { Caller } from '../platform/auth';
import type { Plan, PlanCaller, PlanCreate, PlanOptions, PlanVm } from '../domain/plans/types';
import { publish } from '../queue/bus';
import { createLogger, dropped } from '../platform/log';

const log = createLogger('queue');

// The plan types live in domain/plans/types.ts, below the rules, the schemas and this store that all use them;
// re-exported here for the code that imported them from the store.
export type { Override, PlanOptions, PlanVm, PlanAction, PlanOutboxEntry, PlanSelector, PlanCaller, Plan, PlanCreate } from '../domain/plans/types';

/** The record of a request's caller (callerOf(ctx): null with authentication off). */
export const planCallerOf = (key: Caller | null | undefined): PlanCaller => (key ? { name: key.name, role: key.role } : { name: 'anonymous', role: null });

/** The caller every job of the plan carries (Lifecycle.submit checks it as it checks a direct request's): whoever
 *  started the plan (or last retried it); null when authentication was off then (every caller had every right). A
 *  plan started before starters were kept acts as submit, the least role that may start one. */
export function jobCallerOf(p: Pick<Plan, 'started_by'>): Caller | null {
  if (!p.started_by) return { name: '(unknown starter)', role: 'submit' };
  return p.started_by.role ? { name: p.started_by.name, role: p.started_by.role } : null;
}

/** A plan as stored, read: the one place a stored plan is parsed (get, list, mutate). Plans stored before callers
 *  were records kept `created_by` as the key's name (a string; "anonymous" with authentication off): it is read as
 *  {name, role: 'submit'}, the least role that may create a plan (role null for "anonymous", as with authentication
 *  off), so nothing reads a plain string. A string `started_by` (never written by Ferry) is likewise {name, role:
 *  'submit'}, never more: the jobs of such a plan act as submit, as a plan with no starter does (jobCallerOf). */
export function storedPlan(raw: string): Plan {
  const stored = JSON.parse(raw) as Omit<Plan, 'created_by' | 'started_by'> & { created_by: PlanCaller | string; started_by?: PlanCaller | string | null };
  if (typeof stored.created_by !== 'string' && typeof stored.started_by !== 'string') return stored as Plan;
  const { created_by: c, started_by: st, ...p } = stored;
  const created_by: PlanCaller = typeof c === 'string' ? { name: c, role: c === 'anonymous' ? null : 'submit' } : c;
  const started_by: PlanCaller | null | undefined = typeof st === 'string' ? { name: st, role: 'submit' } : st;
  return { ...p, created_by, ...(started_by !== undefined ? { started_by } : {}) };
}

export const planKeys = (k: Keys) => ({ plan: (id: string) => `${k.prefix}:plan:${id}`, index: `${k.prefix}:plans`, running: `${k.prefix}:plans:running` });

export function newVm(entry: string | { vm_path: string; options?: PlanOptions }): PlanVm {
  const e = typeof entry === 'string' ? { vm_path: entry } : entry;
  return {
    vm_path: e.vm_path, ...(e.options ? { options: e.options } : {}), status: 'pending', job_id: null, jobs: [], findings: [], overrides: {},
    error: null, waiting_reason: null, stage: null,
  };
}

/** Writes a resolution into the plan's VM list: listed VMs stay as they are; VMs chosen by selectors are added,
 *  or dropped when no selector matches them any more and they never ran. */
export function applySelection(p: Plan, selected: Map<string, number[]>) {
  p.vms = p.vms.filter((v) => !v.selected_by || selected.has(v.vm_path) || v.jobs.length);
  for (const v of p.vms) if (v.selected_by && selected.has(v.vm_path)) v.selected_by = selected.get(v.vm_path);
  const have = new Set(p.vms.map((v) => v.vm_path));
  for (const [path, which] of selected) if (!have.has(path)) p.vms.push({ ...newVm(path), selected_by: which });
  checkPlanSize(p.vms.length);
}

/** A plan holds at most config.planMaxVms VMs, listed and selected together: past it 400 naming vms. */
export function checkPlanSize(n: number) {
  const max = config.planMaxVms;
  if (max && n > max) {
    throw fieldError(400, 'vms', `more than ${max} VMs`, `vms: a plan holds at most ${max} VMs (FERRY_PLAN_MAX_VMS); this one would hold ${n}`);
  }
}

/** Stores a new plan unless its id exists (0) or config.planMaxStored plans are stored already (-1). */
const CREATE = `
local max = tonumber(ARGV[3])
if max > 0 and redis.call('ZCARD', KEYS[2]) >= max then return -1 end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[4])
return 1`;

// KEYS: the plan, the running set, the fence's lease key (the plan's own key when unfenced). ARGV: the plan as
// read, as written, its id, its new status, the lease value the writer holds ('' unfenced). -1: the lease is
// no longer the writer's, nothing written.
const CAS = `if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[5] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[5] then return -1 end
redis.call('SET', KEYS[1], ARGV[2])
if ARGV[4] == 'running' then redis.call('SADD', KEYS[2], ARGV[3]) else redis.call('SREM', KEYS[2], ARGV[3]) end
return 1`;

/** A fenced write found the lease taken by another process: the writer is no longer the leader. */
export class LeaseLost extends Error {}
export interface Fence { key: string; value: string }

const iso = (d: unknown) => (d instanceof Date ? d.toISOString() : d === undefined || d === null ? null : typeof d === 'string' ? d : JSON.stringify(d));

export class PlanStore {
  private pk: ReturnType<typeof planKeys>;
  constructor(readonly redis: RedisClient, private k: Keys) { this.pk = planKeys(k); }

  /** Tells every daemon that the plan changed (the `plans` bus channel: WebSocket plan_update, the plan's SSE
   *  stream). A lost message costs a late update, never the plan: the write is already done. */
  private changed(id: string, p: Plan | null) {
    const jobIds = p ? p.vms.filter((v) => v.status === 'running' && v.job_id).map((v) => v.job_id!) : [];
    void publish(this.redis, this.k, 'plans', { plan_id: id, status: p?.status ?? null, job_ids: jobIds })
      .catch(dropped(log, 'could not announce a plan change on the bus; listeners see it with the next change', { plan_id: id }));
  }

  async create(body: PlanCreate, by: PlanCaller): Promise<Plan> {
    const id = body.id || randomUUID();
    const now = new Date().toISOString();
    const dupes = (body.vms ?? []).map((v) => (typeof v === 'string' ? v : v.vm_path)).filter((p, i, a) => a.indexOf(p) !== i);
    if (dupes.length) throw new ApiError(400, `vms: ${dupes[0]} is listed twice`, { fields: [{ field: 'vms', message: `${dupes[0]} is listed twice` }] });
    const plan: Plan = {
      id, name: body.name, description: body.description ?? '', source: body.source ?? {}, destination: body.destination,
      network_map: body.network_map, storage_map: body.storage_map, options: body.options ?? {}, limits: body.limits,
      start_at: iso(body.start_at), windows: (body.windows ?? []).map((w) => ({ start: iso(w.start)!, end: iso(w.end)! })),
      status: 'pending', archived: false, created_at: now, updated_at: now, started_at: null, finished_at: null, created_by: by, started_by: null,
      validated_at: null, events_sent: [], vms: (body.vms ?? []).map(newVm), ...(body.selectors ? { selectors: body.selectors } : {}),
    };
    checkPlanSize(plan.vms.length);
    const max = config.planMaxStored;
    const ok = await this.redis.eval(CREATE, 2, this.pk.plan(id), this.pk.index, JSON.stringify(plan), Date.now(), max, id);
    if (ok === -1) {
      throw conflict(`${max} plans are stored (FERRY_PLAN_MAX_STORED): delete plans that are done before creating another`, {
        fields: [{ field: 'id', message: 'too many stored plans' }],
      });
    }
    if (!ok) throw conflict(`plan ${id} exists`);
    this.changed(id, plan);
    return plan;
  }

  async get(id: string): Promise<Plan | null> {
    const raw = await this.redis.get(this.pk.plan(id));
    return raw ? storedPlan(raw) : null;
  }

  async must(id: string): Promise<Plan> {
    const p = await this.get(id);
    if (!p) throw notFound(`plan ${id} not found`);
    return p;
  }

  async ids(): Promise<string[]> { return this.redis.zrange(this.pk.index, 0, -1); }

  /** The running plans' ids (the set every write keeps). */
  async runningIds(): Promise<string[]> { return this.redis.smembers(this.pk.running); }

  /** Puts every running plan in the running set: plans written before the set existed. One pass over every
   *  plan, run when a daemon becomes the plan leader, never per tick. */
  async reindex(): Promise<number> {
    const running = (await this.list(false)).filter((p) => p.status === 'running').map((p) => p.id);
    if (running.length) await this.redis.sadd(this.pk.running, ...running);
    return running.length;
  }

  /** Drops an id from the running set (a plan that is gone or no longer running). */
  async unindex(id: string) { await this.redis.srem(this.pk.running, id); }

  async list(archived: boolean): Promise<Plan[]> {
    const ids = await this.ids();
    if (!ids.length) return [];
    const raws = await this.redis.mget(...ids.map((i) => this.pk.plan(i)));
    return raws.filter((r): r is string => !!r).map(storedPlan).filter((p) => p.archived === archived);
  }

  /** Applies `fn` to the stored plan and writes it back unless another writer changed it meanwhile (then again):
   *  a compare-and-set in one script, so no connection is held between the read and the write. A change that
   *  changes nothing is not written (and not announced). With `fence`, the write happens only while that lease
   *  is still the writer's (else LeaseLost). */
  async mutate(id: string, fn: (p: Plan) => void | Promise<void>, fence?: Fence | null): Promise<Plan> {
    const key = this.pk.plan(id);
    for (let attempt = 0; attempt < 20; attempt++) {
      const raw = await this.redis.get(key);
      if (!raw) throw notFound(`plan ${id} not found`);
      const p = storedPlan(raw);
      const read = JSON.stringify(p); // a plan stored in an older form is written back only with a real change
      await fn(p);
      if (JSON.stringify(p) === read) return p;
      p.updated_at = new Date().toISOString();
      const r = Number(await this.redis.eval(CAS, 3, key, this.pk.running, fence?.key ?? key, raw, JSON.stringify(p), id, p.status, fence?.value ?? ''));
      if (r === -1) throw new LeaseLost(`plan ${id}: the plan leader's lease is no longer this process's; nothing written`);
      if (r === 1) { this.changed(id, p); return p; }
    }
    throw conflict(`plan ${id} is being changed by others; try again`);
  }

  async remove(id: string) {
    await this.redis.del(this.pk.plan(id));
    await this.redis.zrem(this.pk.index, id);
    await this.unindex(id);
    this.changed(id, null);
  }
}
