// The audit log (docs/security.md "Audit log"): every request that changes state (any method but GET, HEAD,
// OPTIONS) on the gateway and the daemon, and every refused one (401/403), as one record (a worker's routine
// reports only when refused, rejected or failed: RouteDef.audit): time, service, key name
// and role, method, route pattern and concrete path, target ids, status and outcome. Never a body, a header or a
// message a caller wrote: target ids only, redacted by platform/sensitive.ts like every log line. Kept in one Redis
// sorted set scored by time, trimmed to the job retention (FERRY_JOB_RETENTION) and a count cap on every write
// and read; each record also goes to the logs as one structured line.
// Refusals (401, 403, and the 429s of the rate limits) go elsewhere: a Redis stream of their own, capped by length
// (FERRY_REFUSAL_AUDIT_MAX_ENTRIES) and the retention, sampled per client address (the first
// FERRY_REFUSAL_AUDIT_SAMPLE of each FERRY_REFUSAL_WINDOW_SECONDS are written, the rest only counted), so a client
// with no key can flood neither Redis nor the logs, and can never push the accepted requests' records out.
import { randomBytes } from 'node:crypto';
import type http from 'node:http';
import type Koa from 'koa';
import Joi from 'joi';
import { Auth, identify, presentedKey } from './auth';
import { config } from './config';
import { clientAddress } from './client-address';
import { errorText } from './errors';
import type { Logger } from './log';
import type { RedisClient } from './redis';
import { redact } from './sensitive';
import { setting } from './settings';

export interface AuditRecord {
  id: string;
  time: string;
  service: string;
  /** The API key's name (null: no key, an unknown key, or authentication off). */
  key_name: string | null;
  role: string | null;
  method: string;
  route: string | null;
  path: string;
  targets: Record<string, string | string[]>;
  status: number;
  outcome: 'ok' | 'refused' | 'rejected' | 'failed';
  /** Why authentication refused it (Ferry's own words, never the caller's). */
  reason?: string;
  ip: string;
  duration_ms: number;
}

const READS = new Set(['GET', 'HEAD', 'OPTIONS']);
/** Fields of params, body and answer that name what a request acted on. */
const TARGET_KEYS = ['job_id', 'job_ids', 'id', 'schedule_id', 'webhook_id', 'worker_id', 'name', 'domain', 'vm_path', 'vm_name', 'pool', 'network', 'volume'];
const MAX_TARGET = 256;
const MAX_LIST = 50;
const WRITE_WAIT_MS = 2000;

export const auditKey = (prefix: string) => `${prefix}:audit`;
export const refusalKeys = (prefix: string) => ({ stream: `${prefix}:audit:refusals`, seen: (ip: string) => `${prefix}:audit:refusals:seen:${ip}`,
  unwritten: `${prefix}:audit:refusals:unwritten` });

/** One refusal: written to the capped stream while its client address is within its sample for the window, else
 *  only counted. KEYS: stream, the address's count, the unwritten count; ARGV: window ms, sample, cap, oldest id
 *  kept, record. Returns 1 when written. */
const REFUSAL_SCRIPT = `
local n = redis.call('INCR', KEYS[2])
if n == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[1]) end
if n > tonumber(ARGV[2]) then redis.call('INCR', KEYS[3]); return 0 end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'r', ARGV[5])
redis.call('XTRIM', KEYS[1], 'MINID', '~', ARGV[4])
return 1`;
/** A count cap beside the retention, so a flood of refused requests cannot grow Redis without end. */
export const auditMaxEntries = () => setting('FERRY_AUDIT_MAX_ENTRIES');

function pick(into: Record<string, string | string[]>, from: unknown) {
  if (!from || typeof from !== 'object' || Object.getPrototypeOf(from) !== Object.prototype) return; // plain objects: never a stream's fields
  for (const k of TARGET_KEYS) {
    const v = (from as Record<string, unknown>)[k];
    if (typeof v === 'string' || typeof v === 'number') into[k] ??= String(v).slice(0, MAX_TARGET);
    else if (Array.isArray(v)) into[k] ??= v.filter((x) => typeof x === 'string').slice(0, MAX_LIST).map((x) => x.slice(0, MAX_TARGET));
  }
}

/** The ids a request named: path parameters, then body fields, then what the answer created (a generated id). */
export function targetsOf(ctx: Koa.Context): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  pick(out, ctx.params);
  pick(out, ctx.request.body);
  if (ctx.status < 300) pick(out, ctx.body);
  return redact(out);
}

/** The caller's key: the one authentication accepted, else (a refusal, answered before it) the one presented. */
function callerKey(ctx: Koa.Context, auth: Auth): { name: string; role: string } | null {
  const key = ctx.state.apiKey as { name: string; role: string } | null | undefined;
  if (key !== undefined || !auth.enabled) return key ?? null;
  const p = presentedKey(ctx.req.headers);
  return p ? identify(auth, p) ?? null : null;
}

function outcomeOf(status: number): AuditRecord['outcome'] {
  if (status === 401 || status === 403) return 'refused';
  return status >= 500 ? 'failed' : status >= 400 ? 'rejected' : 'ok';
}

export class AuditLog {
  readonly key: string;
  constructor(private redis: RedisClient, private prefix: string, private log: Logger, private service: string, private retentionMs = config.jobRetentionMs) {
    this.key = auditKey(prefix);
  }

  /** Whether a request is audited: it may change state, or it was refused. A route that audits only refusals (a
   *  worker's routine report, RouteDef.audit) is audited when refused, rejected or failed (status 400 and up). */
  static wanted(method: string, status: number, refusalsOnly = false): boolean {
    if (refusalsOnly) return status >= 400;
    return !READS.has(method) || status === 401 || status === 403;
  }

  /** Records a finished request (the caller's key as authentication found it, or as presented when refused). */
  async request(ctx: Koa.Context, auth: Auth, started: number, route: string | undefined, reason?: string, refusalsOnly = false): Promise<void> {
    const limited = ctx.state.refusal === true && ctx.status === 429; // a rate limit's answer (platform/http.ts)
    if (!AuditLog.wanted(ctx.method, ctx.status, refusalsOnly) && !limited) return;
    const key = callerKey(ctx, auth);
    const refused = ctx.status === 401 || ctx.status === 403;
    const rec: AuditRecord = {
      id: `${started.toString(36)}-${randomBytes(4).toString('hex')}`,
      time: new Date(started).toISOString(), service: this.service, key_name: key?.name ?? null, role: key?.role ?? null,
      method: ctx.method, route: route ?? null, path: ctx.path.slice(0, 1024),
      targets: targetsOf(ctx), status: ctx.status,
      outcome: outcomeOf(ctx.status),
      ...(refused && reason ? { reason: reason.slice(0, 512) } : {}),
      ip: clientAddress(ctx.req), duration_ms: Date.now() - started,
    };
    await this.store(rec, refused || limited);
  }

  /** A WebSocket upgrade, which no koa middleware sees: a refused one (401, 403), or one that may change state
   *  (a console writer, status 101), with the key as authentication found it or as presented. */
  async upgrade(req: http.IncomingMessage, auth: Auth, u: { path: string; status: number; caller?: { name: string; role: string } | null; reason?: string;
    targets?: Record<string, string> }): Promise<void> {
    if (u.status !== 401 && u.status !== 403 && u.status !== 101) return;
    await this.outside(req, auth, { ...u, method: 'WEBSOCKET' });
  }

  /** A plain port's request (a metrics port, no koa app either), when refused (401, 403) or past the refusal
   *  budget (429): kept with the refusals, as the APIs' are. */
  async plain(req: http.IncomingMessage, auth: Auth, u: { method: string; path: string; status: number; reason?: string }): Promise<void> {
    if (u.status !== 401 && u.status !== 403 && u.status !== 429) return;
    await this.outside(req, auth, u);
  }

  /** A plan's side effect a worker has done (a rollback, a source removal): no request carries it, so its record
   *  names the key it acted as (the plan's starter, or the admin who asked for the rollback) and what it acted on. */
  async effect(e: { operation: string; job_id: string; acting_as: { name: string; role: string | null } | null;
    targets: Record<string, string> }): Promise<void> {
    const now = Date.now();
    await this.store({
      id: `${now.toString(36)}-${randomBytes(4).toString('hex')}`, time: new Date(now).toISOString(), service: this.service,
      key_name: e.acting_as?.name ?? null, role: e.acting_as?.role ?? null, method: 'EFFECT', route: e.operation, path: `job/${e.job_id}`.slice(0, 1024),
      targets: redact({ ...e.targets, job_id: e.job_id }), status: 200, outcome: 'ok', ip: '', duration_ms: 0,
    });
  }

  /** The record of a request no koa middleware saw. */
  private async outside(req: http.IncomingMessage, auth: Auth, u: { method: string; path: string; status: number;
    caller?: { name: string; role: string } | null; reason?: string; targets?: Record<string, string> }): Promise<void> {
    const refused = u.status === 401 || u.status === 403;
    let key = u.caller;
    if (key === undefined && auth.enabled) { const p = presentedKey(req.headers); key = p ? identify(auth, p) ?? null : null; }
    const now = Date.now();
    await this.store({
      id: `${now.toString(36)}-${randomBytes(4).toString('hex')}`, time: new Date(now).toISOString(), service: this.service,
      key_name: key?.name ?? null, role: key?.role ?? null, method: u.method, route: u.path, path: u.path.slice(0, 1024),
      targets: redact(u.targets ?? {}), status: u.status, outcome: refused ? 'refused' : u.status >= 400 ? 'rejected' : 'ok',
      ...(refused && u.reason ? { reason: u.reason.slice(0, 512) } : {}), ip: clientAddress(req), duration_ms: 0,
    }, u.status >= 400);
  }

  /** The log line first, then Redis; the caller waits at most WRITE_WAIT_MS for Redis. A refusal's log line is
   *  sampled in this process as its record is in Redis (logSample), so a flood cannot fill the logs either. */
  private async store(rec: AuditRecord, refusal = false): Promise<void> {
    if (!refusal || this.logSample(rec.ip)) this.log.audit('audit', { audit: rec });
    // Redis commands wait through an outage (the connections retry without end): the answer waits at most
    // WRITE_WAIT_MS for the record, which is still written when Redis returns.
    const written = refusal ? this.writeRefusal(rec) : this.write(rec);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((r) => { timer = setTimeout(() => r('late'), WRITE_WAIT_MS); });
    const first = await Promise.race([written.then(() => 'ok' as const), late]).finally(() => clearTimeout(timer));
    if (first === 'late') {
      this.log.warn('audit record not yet stored in Redis; answering without waiting (its log line stands)', { audit_id: rec.id });
      written.catch((e) => this.log.warn('audit record not stored in Redis; its log line stands', { audit_id: rec.id, error: errorText(e) }));
    }
  }

  private logWindow = { start: 0, seen: new Map<string, number>() };
  /** Whether this process logs a refusal of `ip`: the first config.refusalAuditSample per address and window. */
  private logSample(ip: string): boolean {
    const w = this.logWindow;
    if (Date.now() - w.start >= config.refusalWindowSeconds * 1000) { w.start = Date.now(); w.seen.clear(); }
    const n = (w.seen.get(ip) ?? 0) + 1;
    if (w.seen.size < 100_000 || w.seen.has(ip)) w.seen.set(ip, n); // bounded: past that many addresses, each logs its first
    return n <= config.refusalAuditSample;
  }

  async write(rec: AuditRecord): Promise<void> {
    const at = Date.parse(rec.time);
    await this.redis.multi()
      .zadd(this.key, at, JSON.stringify(rec))
      .zremrangebyscore(this.key, '-inf', `(${Date.now() - this.retentionMs}`)
      .zremrangebyrank(this.key, 0, -(auditMaxEntries() + 1))
      .exec();
  }

  /** A refusal into the refusal stream, or counted as not written when its address is past its sample. */
  async writeRefusal(rec: AuditRecord): Promise<boolean> {
    const k = refusalKeys(this.prefix);
    const n = await this.redis.eval(REFUSAL_SCRIPT, 3, k.stream, k.seen(rec.ip), k.unwritten,
      config.refusalWindowSeconds * 1000, config.refusalAuditSample, config.refusalAuditMaxEntries, Date.now() - this.retentionMs, JSON.stringify(rec));
    return n === 1;
  }

  /** Newest first, filtered, accepted requests' records and sampled refusals merged; at most 20,000 of each are
   *  looked at, so a rare filter cannot walk the whole log. `refusals_unwritten`: refusals past their sample. */
  async query(q: AuditQuery): Promise<{ records: AuditRecord[]; count: number; retention_seconds: number; refusals_unwritten: number }> {
    const k = refusalKeys(this.prefix);
    await this.redis.zremrangebyscore(this.key, '-inf', `(${Date.now() - this.retentionMs}`);
    await this.redis.xtrim(k.stream, 'MINID', Date.now() - this.retentionMs);
    const keep = (r: AuditRecord) => (!q.key || r.key_name === q.key) && (!q.path || r.path.startsWith(q.path) || r.route === q.path)
      && (!q.since || Date.parse(r.time) >= q.since.getTime()) && (!q.until || Date.parse(r.time) <= q.until.getTime());
    const [accepted, refused] = await Promise.all([this.scanAccepted(q, keep), this.scanRefusals(q, keep)]);
    const records = [...accepted, ...refused].sort((a, b) => Date.parse(b.time) - Date.parse(a.time)).slice(0, q.limit);
    const unwritten = Number(await this.redis.get(k.unwritten) ?? 0);
    return { records, count: records.length, retention_seconds: Math.round(this.retentionMs / 1000), refusals_unwritten: unwritten };
  }

  private async scanAccepted(q: AuditQuery, keep: (r: AuditRecord) => boolean): Promise<AuditRecord[]> {
    const max = q.until ? q.until.getTime() : '+inf';
    const min = q.since ? q.since.getTime() : '-inf';
    const records: AuditRecord[] = [];
    const page = 500;
    for (let offset = 0; records.length < q.limit && offset < 20_000; offset += page) {
      const rows = await this.redis.zrevrangebyscore(this.key, max, min, 'LIMIT', offset, page);
      for (const row of rows) {
        const r = JSON.parse(row) as AuditRecord;
        if (keep(r) && records.length < q.limit) records.push(r);
      }
      if (rows.length < page) break;
    }
    return records;
  }

  /** The refusal stream, newest first; its entry ids are the times they were written, near the records' own. */
  private async scanRefusals(q: AuditQuery, keep: (r: AuditRecord) => boolean): Promise<AuditRecord[]> {
    const stream = refusalKeys(this.prefix).stream;
    const records: AuditRecord[] = [];
    const page = 500;
    let end = q.until ? String(q.until.getTime() + WRITE_WAIT_MS) : '+';
    const start = q.since ? String(q.since.getTime()) : '-';
    for (let seen = 0; records.length < q.limit && seen < 20_000; seen += page) {
      const rows = await this.redis.xrevrange(stream, end, start, 'COUNT', page);
      for (const [, fields] of rows) {
        const r = JSON.parse(fields[1]) as AuditRecord; // fields: ['r', the record] (REFUSAL_SCRIPT)
        if (keep(r) && records.length < q.limit) records.push(r);
      }
      if (rows.length < page) break;
      end = `(${rows[rows.length - 1][0]}`;
    }
    return records;
  }
}

export interface AuditQuery { key?: string; path?: string; since?: Date; until?: Date; limit: number }

export const auditQuerySchema = Joi.object({
  key: Joi.string().max(256).description('only records of this API key name'),
  path: Joi.string().max(1024).description('only records whose concrete path starts with this, or whose route pattern is this'),
  since: Joi.date().iso().description('only records at or after this time (ISO 8601)'),
  until: Joi.date().iso().description('only records at or before this time (ISO 8601)'),
  limit: Joi.number().integer().min(1).max(1000).default(100),
});

const auditRecordSchema = Joi.object({
  id: Joi.string(), time: Joi.string().isoDate(), service: Joi.string(), key_name: Joi.string().allow(null), role: Joi.string().allow(null),
  method: Joi.string(), route: Joi.string().allow(null), path: Joi.string(), targets: Joi.object().unknown(true), status: Joi.number().integer(),
  outcome: Joi.string().valid('ok', 'refused', 'rejected', 'failed'), reason: Joi.string(), ip: Joi.string(), duration_ms: Joi.number(),
}).label('AuditRecord');

/** `GET /audit`, for `admin` keys only. */
export function auditRoute(audit: AuditLog, errorSchema: Joi.Schema) {
  return {
    method: 'get' as const, role: 'admin' as const, path: '/audit', tags: ['audit'], query: auditQuerySchema,
    summary: 'The audit log: requests that changed state and refused ones, newest first (both APIs write it; kept for FERRY_JOB_RETENTION)',
    responses: {
      200: { description: 'records, newest first', schema: Joi.object({ records: Joi.array().items(auditRecordSchema), count: Joi.number().integer(),
        retention_seconds: Joi.number().integer(), refusals_unwritten: Joi.number().integer().description(
        'refused requests past their client address\'s sample (FERRY_REFUSAL_AUDIT_SAMPLE per FERRY_REFUSAL_WINDOW_SECONDS): counted, not written') }) },
      400: { description: 'a bad filter, naming the field', schema: errorSchema },
      403: { description: 'not an admin key', schema: errorSchema },
    },
    handler: (_ctx: Koa.Context, input: { query: AuditQuery }) => audit.query(input.query),
  };
}
