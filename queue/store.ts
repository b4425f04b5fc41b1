// Job records in Redis: create, read, list, move between states, and the per-job progress-event log.
import { keys as makeKeys, Keys, RedisClient } from '../platform/redis';
import { HELD, isHeld, JobState, isTerminal, STATES, TERMINAL } from '../domain/states';
import type { JobSpec, ProgressEvent } from '../domain/schemas/job';
import { isLastStreamId } from '../domain/schemas/common';
import { config } from '../platform/config';
import { randomBytes } from 'node:crypto';
import { withCommands, FerryCommands } from './scripts';
import { createLogger } from '../platform/log';
import type { Made, MadeEntry, MadeGuard } from '../domain/libvirt/ledger';

export interface HistoryEntry { state: JobState; timestamp: string; reason: string; worker_id?: string }

export interface JobRecord {
  job_id: string;
  spec: JobSpec;
  state: JobState;
  state_history: HistoryEntry[];
  result: Record<string, unknown> | null;
  latest_event: ProgressEvent | null;
  created_at: string;
  updated_at: string;
  is_terminal: boolean;
  attempts: number;
  max_attempts: number;
  worker_id: string | null;
  queue: string | null;
  priority: number;
  error: string | null;
  started_at: string | null;
  finished_at: string | null;
  /** Extra data other services keep with the job (the daemon's export/migration view); never secrets. */
  meta: Record<string, unknown>;
  /** What the job's attempts made on a target, recorded as they made it (domain/libvirt/ledger.ts). */
  ledger: MadeEntry[];
}

export interface Step { to: JobState; reason: string; worker_id?: string }
export type TransitionResult = { ok: true; prev: JobState; eventId?: string } | { ok: false; code: 'missing' | 'conflict' | 'lease'; state: JobState | null };
export interface StoredEvent extends ProgressEvent { id: string }

const log = createLogger('queue');

/** A JSON field of a record. Ferry writes only JSON there, so one that does not parse is damage: logged at error
 *  (which job, which field), and the record is shown with the field's empty value so listings still answer. */
export function parseField<T>(s: string | undefined | null, dflt: T, where: { job_id: string; field: string }): T {
  if (!s) return dflt;
  try {
    return JSON.parse(s) as T;
  } catch (e) {
    log.error('a job record holds unreadable JSON; shown as empty', { ...where, error: (e as Error).message });
    return dflt;
  }
}
/** A history entry as stored: [state, timestamp, reason, worker id?] (includes/history.lua), or an object (the
 *  layout before). */
type StoredEntry = [JobState, string, string, string?] | HistoryEntry;
const historyEntry = (e: StoredEntry): HistoryEntry => (Array.isArray(e) ? { state: e[0], timestamp: e[1], reason: e[2],
  ...(e[3] ? { worker_id: e[3] } : {}) } : e);
/** Names one call, so that a resend of it is recognised: this process's random name (10 characters, 60 bits) and
 *  a counter, unique across processes without asking the random generator for every call (a synchronous OpenSSL
 *  call that was 5% of a worker's CPU per job). Never secret: it only tells a resend from a new call. */
const PROCESS_NONCE = randomBytes(8).toString('base64url').slice(0, 10);
let calls = 0;
const callId = () => PROCESS_NONCE + (calls++).toString(36).padStart(6, '0');
/** Entries a job's ledger may hold: 26 disks, their copies and a domain per attempt, many times over. */
const LEDGER_MAX = 1024;
/** What names a thing made in the owners hash (includes/made.lua), as the Lua commands take it. */
const madeIds = (es: Made[]) => JSON.stringify(es.map(({ kind, id, virt_uri }) => ({ kind, id, virt_uri })));
const iso = (ms: string | undefined) => (ms ? new Date(Number(ms)).toISOString() : null);

export class JobStore {
  readonly k: Keys;
  readonly redis: RedisClient & FerryCommands;
  /** KEYS shared by createJob and transitionJob after the job's own (queue/commands/*.lua headers). */
  private readonly stateKeys: string[];
  constructor(redis: RedisClient, prefix = config.prefix) {
    this.redis = withCommands(redis);
    this.k = makeKeys(prefix);
    this.stateKeys = [this.k.queuedCounts, this.k.jobsFinished, this.k.stats, ...STATES.map((s) => this.k.jobsInState(s))];
  }

  /** Creates the record in CREATED and walks it through `steps` in the same atomic call (createJob-14.lua).
   *  `op` names the call: the same call resent (its reply lost) is answered as applied. */
  async create(id: string, fields: Record<string, string | number>, steps: Step[], op: string = callId()): Promise<{ created: boolean; seq: number }> {
    const now = new Date();
    const args: (string | number)[] = [this.k.chanJobs, id, now.toISOString(), now.getTime(), op, JSON.stringify(fields), steps.length];
    for (const s of steps) args.push(s.to, s.reason);
    const k = this.k;
    const [code, seq] = await this.redis.ferryCreateJob(k.job(id), k.seq, k.queues, ...this.stateKeys, ...args);
    // Lifecycle only asks for allowed walks: a refused one is a bug, not a job that exists.
    if (code === 'conflict') throw new Error(
      `job ${id}: the walk CREATED -> ${steps.map((s) => s.to).join(' -> ')} is not in the transition table; nothing created`);
    return { created: code === 'ok', seq: Number(seq) };
  }

  /** Moves the job through `steps` atomically (transitionJob-13.lua). `event`, if given, is recorded in the same
   *  step, only when the move is allowed: before the state change (`before: true`, e.g. the last event of a
   *  completed job) or after. `op` names the call (see create). */
  async transition(id: string, steps: Step[], opts: { lease?: string; fields?: Record<string, string | number | null>;
    event?: { ev: ProgressEvent; before: boolean }; op?: string } = {}): Promise<TransitionResult> {
    const now = new Date();
    const args: (string | number)[] = [this.k.chanJobs, this.k.chanEvents, id, now.toISOString(), now.getTime(), opts.lease || '', opts.op || callId(),
      opts.fields ? JSON.stringify(opts.fields) : '', steps.length];
    for (const s of steps) args.push(s.to, s.reason, s.worker_id || '');
    if (opts.event) args.push(JSON.stringify(opts.event.ev), config.eventsKeptPerJob, opts.event.before ? 'before' : 'after');
    const [code, state, eventId] = await this.redis.ferryTransitionJob(this.k.job(id), this.k.events(id), ...this.stateKeys, ...args);
    if (code === 'ok') return { ok: true, prev: state as JobState, ...(eventId ? { eventId } : {}) };
    return { ok: false, code: code as 'missing' | 'conflict' | 'lease', state: (state || null) as JobState | null };
  }

  /** Jobs per state, from the state indexes' sizes. */
  async stateCounts(): Promise<Record<JobState, number>> {
    const p = this.redis.pipeline();
    for (const s of STATES) p.zcard(this.k.jobsInState(s));
    const res = (await p.exec()) || [];
    return Object.fromEntries(STATES.map((s, i) => [s, Number(res[i]?.[1] || 0)])) as Record<JobState, number>;
  }

  /** Every job in the store. */
  async total(): Promise<number> {
    return Object.values(await this.stateCounts()).reduce((a, b) => a + b, 0);
  }

  /** Queued jobs by queue and by priority, from the one counter the scripts keep (`<queue>|<priority>`). */
  async queued(): Promise<{ byQueue: Record<string, number>; byPriority: Record<string, number> }> {
    const h = (await this.redis.hgetall(this.k.queuedCounts)) || {};
    const byQueue: Record<string, number> = {};
    const byPriority: Record<string, number> = {};
    for (const [f, v] of Object.entries(h)) {
      const n = Number(v);
      if (!(n > 0)) continue;
      const i = f.lastIndexOf('|');
      byQueue[f.slice(0, i)] = (byQueue[f.slice(0, i)] || 0) + n;
      byPriority[f.slice(i + 1)] = (byPriority[f.slice(i + 1)] || 0) + n;
    }
    return { byQueue, byPriority };
  }

  /** QUEUED, ASSIGNED and RUNNING jobs of each queue: queued from the counter, the others from their state
   *  indexes (as many as worker slots, so small). */
  async queueCounts(queues: string[]): Promise<Record<string, { QUEUED: number; ASSIGNED: number; RUNNING: number }>> {
    const [{ byQueue }, ...held] = await Promise.all([this.queued(), ...HELD.map((s) => this.redis.zrange(this.k.jobsInState(s), 0, -1))]);
    const out = Object.fromEntries(queues.map((q) => [q, { QUEUED: byQueue[q] || 0, ASSIGNED: 0, RUNNING: 0 }]));
    const ids = held.flat();
    for (const h of await this.many(ids, ['state', 'queue'])) {
      const c = h?.queue ? out[h.queue] : undefined;
      if (c && isHeld(h!.state)) c[h!.state as 'ASSIGNED' | 'RUNNING']++;
    }
    return out;
  }

  async raw(id: string): Promise<Record<string, string> | null> {
    const h = await this.redis.hgetall(this.k.job(id));
    return h && h.state ? h : null;
  }

  async get(id: string): Promise<JobRecord | null> {
    const h = await this.redis.hgetall(this.k.job(id));
    if (!h || !h.state) return null;
    // A record of the layout before the history field keeps its history in a list of its own.
    const stored = h.history ? parseField<StoredEntry[]>(h.history, [], { job_id: id, field: 'history' }) : (
      await this.redis.lrange(this.k.history(id), 0, -1)).map((e) => JSON.parse(e) as StoredEntry);
    return this.toRecord(id, h, stored.map(historyEntry));
  }

  toRecord(id: string, h: Record<string, string>, history: HistoryEntry[]): JobRecord {
    return {
      job_id: id,
      spec: parseField(h.spec, {} as JobSpec, { job_id: id, field: 'spec' }),
      state: h.state as JobState,
      state_history: history,
      result: parseField(h.result, null, { job_id: id, field: 'result' }),
      latest_event: parseField(h.latest_event, null, { job_id: id, field: 'latest_event' }),
      created_at: h.created_at,
      updated_at: h.updated_at,
      is_terminal: isTerminal(h.state),
      attempts: Number(h.attempts || 0),
      max_attempts: Number(h.max_attempts || 1),
      worker_id: h.worker_id || null,
      queue: h.queue || null,
      priority: Number(h.priority || 0),
      error: h.error || null,
      started_at: iso(h.started_at),
      finished_at: iso(h.finished_at),
      meta: parseField(h.meta, {}, { job_id: id, field: 'meta' }),
      ledger: parseField<MadeEntry[]>(h.ledger, [], { job_id: id, field: 'ledger' }),
    };
  }

  /** Records an output the attempt holding `lease` created (addOutput-1.lua); false when the lease is gone. */
  async recordOutput(id: string, lease: string, outputId: string): Promise<boolean> {
    const [code] = await this.redis.ferryAddOutput(this.k.job(id), lease, outputId, 64);
    return code === 'ok';
  }

  /** The outputs the job's attempts recorded (recordOutput). */
  async ownedOutputs(id: string): Promise<string[]> {
    return parseField<string[]>(await this.redis.hget(this.k.job(id), 'owned_outputs'), [], { job_id: id, field: 'owned_outputs' });
  }

  /** Writes what the attempt holding `lease` made into the job's ledger and makes the job its owner
   *  (addMade-2.lua): 'added', 'known' (already there), or why not ('lease': the attempt no longer holds the job;
   *  'missing'; 'full'). */
  async recordMade(id: string, lease: string, e: MadeEntry): Promise<string> {
    const [code, what] = await this.redis.ferryAddMade(this.k.job(id), this.k.madeOwners, lease, JSON.stringify(e), LEDGER_MAX, id);
    return code === 'ok' ? what : code;
  }

  /** The job's ledger, each entry with the job that owns it now: the job itself, another job that made the same
   *  volume path after this one's was removed, or null (removed by Ferry already). */
  async madeOwners(id: string): Promise<{ entry: MadeEntry; owner: string | null }[]> {
    const ledger = await this.made(id);
    const owners = await this.ownersOf(ledger);
    return ledger.map((entry, i) => ({ entry, owner: owners[i] }));
  }

  /** Each thing's owner now (madeOwners-1.lua), null for none. */
  private async ownersOf(es: Made[]): Promise<(string | null)[]> {
    if (!es.length) return [];
    return (await this.redis.ferryMadeOwners(this.k.madeOwners, madeIds(es))).map((o) => o || null);
  }

  /** What rollback, cancel clean-up and retries may remove for this job: what it owns now, asked per entry right
   *  before each removal; its ownership given up once a thing is gone (releaseMade-1.lua). */
  madeGuard(id: string): MadeGuard {
    return {
      job: id,
      owner: async (e) => (await this.ownersOf([e]))[0],
      released: async (es) => { if (es.length) await this.redis.ferryReleaseMade(this.k.madeOwners, id, madeIds(es)); },
    };
  }

  /** The job's ledger: what its attempts made (recordMade), oldest first. */
  async made(id: string): Promise<MadeEntry[]> {
    return parseField<MadeEntry[]>(await this.redis.hget(this.k.job(id), 'ledger'), [], { job_id: id, field: 'ledger' });
  }

  /** Every id in these states, read from each state's index a page at a time (for work on all of them). */
  async *idsIn(states: readonly string[], page = 1000): AsyncGenerator<string[]> {
    for (const s of states) {
      // By score (the submission sequence), so ids that leave the index while we walk (cancelled) shift nothing.
      for (let after = '-inf'; ;) {
        const flat = await this.redis.zrangebyscore(this.k.jobsInState(s), after, '+inf', 'WITHSCORES', 'LIMIT', 0, page);
        const ids = flat.filter((_, i) => i % 2 === 0);
        if (ids.length) yield ids;
        if (ids.length < page) break;
        after = `(${flat[flat.length - 1]}`;
      }
    }
  }

  /** Ids newest first (by submission sequence, so the order is stable), optionally of some states. The call lane's
   *  jobs (jobs:calls: the daemon's virsh_call, kept minutes) are left out unless `internal`: they are the daemon's
   *  plumbing, not an operator's jobs. */
  async list(opts: { state?: string; states?: string[]; limit: number; offset?: number; internal?: boolean }): Promise<{ total: number; ids: string[] }> {
    const off = opts.offset || 0;
    const states = opts.states || (opts.state ? [opts.state] : [...STATES]);
    const skip = opts.internal ? new Set<string>() : await this.callIds();
    if (!skip.size) return this.listIn(states, off, opts.limit);
    // Read past the page by as many ids as there are calls, then leave them out: the page stays full and exact.
    const calls = [...skip];
    const all = await this.listIn(states, 0, off + opts.limit + calls.length);
    const p = this.redis.pipeline();
    for (const s of states) p.zmscore(this.k.jobsInState(s), ...calls);
    const listed = ((await p.exec()) || []).reduce((n, [, v]) => n + (v as (string | null)[]).filter((x) => x !== null).length, 0);
    return { total: all.total - listed, ids: all.ids.filter((id) => !skip.has(id)).slice(off, off + opts.limit) };
  }

  /** The call lane's jobs still in Redis (jobs:calls; a few minutes' worth, failed ones an hour's). */
  async callIds(): Promise<Set<string>> {
    return new Set(await this.redis.zrange(this.k.jobsCalls, 0, -1));
  }

  private async listIn(states: string[], off: number, limit: number): Promise<{ total: number; ids: string[] }> {
    if (states.length === 1) {
      const key = this.k.jobsInState(states[0]);
      const [total, ids] = await Promise.all([this.redis.zcard(key), this.redis.zrevrange(key, off, off + limit - 1)]);
      return { total, ids };
    }
    // Several states: merge the per-state indexes by sequence (each already sorted).
    const per = await Promise.all(states.map((s) => this.redis.zrevrange(this.k.jobsInState(s), 0, off + limit - 1, 'WITHSCORES')));
    const totals = await Promise.all(states.map((s) => this.redis.zcard(this.k.jobsInState(s))));
    const all: [string, number][] = [];
    for (const arr of per) for (let i = 0; i < arr.length; i += 2) all.push([arr[i], Number(arr[i + 1])]);
    all.sort((a, b) => b[1] - a[1]);
    return { total: totals.reduce((a, b) => a + b, 0), ids: all.slice(off, off + limit).map((x) => x[0]) };
  }

  /** Several records' hashes in one round trip (history left out). */
  async many(ids: string[], fields?: string[]): Promise<(Record<string, string> | null)[]> {
    if (!ids.length) return [];
    const p = this.redis.pipeline();
    for (const id of ids) {
      if (fields) p.hmget(this.k.job(id), ...fields);
      else p.hgetall(this.k.job(id));
    }
    const res = (await p.exec()) || [];
    return res.map(([, v]) => {
      if (!v) return null;
      if (Array.isArray(v)) {
        const o: Record<string, string> = {};
        fields!.forEach((f, i) => { if (v[i] !== null) o[f] = v[i] as string; });
        return o.state ? o : null;
      }
      const h = v as Record<string, string>;
      return h.state ? h : null;
    });
  }

  async appendEvent(id: string, ev: ProgressEvent, lease = ''): Promise<{ ok: boolean; id?: string; code?: string; state?: string }> {
    const [code, val] = await this.redis.ferryAddEvent(this.k.job(id), this.k.events(id), this.k.chanEvents, id, JSON.stringify(ev), config.eventsKeptPerJob,
      lease);
    return code === 'ok' ? { ok: true, id: val } : { ok: false, code, state: val };
  }

  /** Events in order; `afterId` is exclusive (a reconnecting SSE client's Last-Event-ID). */
  async events(id: string, opts: { afterId?: string; since?: string } = {}): Promise<StoredEvent[]> {
    if (opts.afterId && isLastStreamId(opts.afterId)) return [];
    const start = opts.afterId ? '(' + opts.afterId : '-';
    const rows = (await this.redis.xrange(this.k.events(id), start, '+')) as [string, string[]][];
    let out = rows.map(([eid, f]) => ({ id: eid, ...(JSON.parse(f[1]) as ProgressEvent) }));
    if (opts.since) {
      const t = Date.parse(opts.since);
      out = out.filter((e) => Date.parse(e.timestamp) > t);
    }
    return out;
  }

  /** Puts finished jobs recorded before the retention index existed into it (by their finished_at); idempotent. */
  async indexFinished(): Promise<number> {
    let added = 0;
    for (const st of TERMINAL) {
      const ids = await this.redis.zrange(this.k.jobsInState(st), 0, -1);
      for (let i = 0; i < ids.length; i += 500) {
        const batch = ids.slice(i, i + 500);
        const scores = await this.redis.zmscore(this.k.jobsFinished, ...batch);
        const missing = batch.filter((_, j) => scores[j] === null);
        if (!missing.length) continue;
        const hs = await this.many(missing, ['state', 'finished_at', 'updated_at']);
        const args: (string | number)[] = [];
        hs.forEach((h, j) => { if (h) args.push(Number(h.finished_at) || Date.parse(h.updated_at) || Date.now(), missing[j]); });
        if (args.length) added += await this.redis.zadd(this.k.jobsFinished, 'NX', ...args);
      }
    }
    return added;
  }

  /** Removes finished jobs that finished more than `retentionMs` ago, in batches (one removeJob-9.lua call per job,
   *  a pipeline per batch); returns how many. */
  async purgeFinished(retentionMs: number, still: () => Promise<boolean> = () => Promise.resolve(true), batch = 500): Promise<number> {
    const k = this.k;
    const terminal = TERMINAL.map((s) => k.jobsInState(s));
    let total = 0;
    for (;;) {
      if (!(await still())) return total; // the sweep's lease is gone: its new holder carries on
      const ids = await this.redis.zrangebyscore(k.jobsFinished, '-inf', Date.now() - retentionMs, 'LIMIT', 0, batch);
      if (!ids.length) return total;
      const p = this.redis.pipeline() as unknown as FerryCommands & { exec(): Promise<[Error | null, unknown][] | null> };
      // In a pipeline the call only queues the command (typed as FerryCommands' promise); exec() below answers it.
      for (const id of ids) void p.ferryRemoveJob(k.job(id), k.events(id), k.credentials(id), k.history(id), k.jobsFinished, ...terminal, k.madeOwners, id);
      for (const [err, n] of (await p.exec()) || []) {
        if (err) throw err;
        total += Number(n);
      }
      if (ids.length < batch) return total;
    }
  }

  /** Removes the call lane's jobs (jobs:calls) once `completedMs` (COMPLETED) or `failedMs` (FAILED, CANCELLED,
   *  kept longer to be looked at) have passed since they ended, with removeJob-9.lua as the retention sweep does,
   *  and forgets the ids whose record is gone; returns how many it removed. A call not ended yet stays: its own
   *  timeout_seconds ends it. */
  async purgeCalls(completedMs: number, failedMs: number, still: () => Promise<boolean> = () => Promise.resolve(true), page = 500): Promise<number> {
    const k = this.k;
    const terminal = TERMINAL.map((s) => k.jobsInState(s));
    const now = Date.now();
    let removed = 0;
    // By score (submission time): a call ends after it was submitted, so none younger than the shorter age is due.
    for (let after = '-inf'; ;) {
      if (!(await still())) return removed; // the sweep's lease is gone: its new holder carries on
      const flat = await this.redis.zrangebyscore(k.jobsCalls, after, now - Math.min(completedMs, failedMs), 'WITHSCORES', 'LIMIT', 0, page);
      const ids = flat.filter((_, i) => i % 2 === 0);
      if (!ids.length) return removed;
      const hs = await this.many(ids, ['state', 'finished_at']);
      const due = ids.filter((_, i) => { const h = hs[i]; return h && isTerminal(h.state) &&
        now - Number(h.finished_at) >= (h.state === 'COMPLETED' ? completedMs : failedMs); });
      const gone = ids.filter((_, i) => !hs[i]);
      const p = this.redis.pipeline() as unknown as FerryCommands & { zrem(key: string, ...m: string[]): unknown;
        exec(): Promise<[Error | null, unknown][] | null> };
      for (const id of due) void p.ferryRemoveJob(k.job(id), k.events(id), k.credentials(id), k.history(id), k.jobsFinished, ...terminal, k.madeOwners, id);
      if (due.length + gone.length) p.zrem(k.jobsCalls, ...due, ...gone);
      const res = (await p.exec()) || [];
      for (const [i, [err, n]] of res.entries()) {
        if (err) throw err;
        if (i < due.length) removed += Number(n);
      }
      if (ids.length < page) return removed;
      after = `(${flat[flat.length - 1]}`;
    }
  }
}
