// Bounded spawning and rate limits (docs/security.md, "Limits"), one module for both APIs:
// - Slots: how many requests run console sessions, libvirt calls or qemu-img probes at once, per caller and in
//   all, in this process (a request's own parallel calls, such as a batch's lanes, share its one slot). Over the
//   caller's cap: 429, over the total: 503, both with Retry-After; nothing waits, so a loop of requests cannot pile
//   up processes or memory. Only work done for a request counts (`caller`, set by the HTTP layer and the WebSocket
//   hub); a worker's own jobs are bounded by its concurrency instead.
// - RateLimiter: requests per caller (key name, or client address without auth) per window, counted in Redis by
//   one Lua script so every replica shares the count; X-RateLimit-Limit / X-RateLimit-Remaining on answers.
import { AsyncLocalStorage } from 'node:async_hooks';
import { ApiError } from './errors';
import { config } from './config';
import { setting, settingNamed } from './settings';

/** The current request: who it acts for (`key:<name>` or `addr:<address>`) and the slots it holds; unset outside
 *  requests. */
export interface Caller { who: string; held: Map<Slots, { n: number; release: () => void }> }
export const caller = new AsyncLocalStorage<Caller>();
export const runAs = <T>(who: string, fn: () => T): T => caller.run({ who, held: new Map() }, fn);

export class Slots {
  private byCaller = new Map<string, number>();
  private total = 0;
  /** Caps read from FERRY_<env>_PER_CALLER and FERRY_<env> on each take (0 = no cap), as platform/settings.ts
   *  declares them. `each`: every take counts one (processes), rather than one per request however many it runs. */
  constructor(readonly what: string, private env: string, private each = false) {}

  /** Takes a slot for the current request and returns its release (idempotent); throws 429/503 with Retry-After
   *  when a cap is reached. A request counts once however many calls it runs in parallel (a batch's lanes share
   *  its slot). Outside a request nothing is counted. */
  take(): () => void {
    const c = caller.getStore();
    if (!c) return () => { /* outside a request nothing was taken */ };
    if (this.each) return this.count(c.who);
    let mine = c.held.get(this);
    if (!mine) {
      mine = { n: 0, release: this.count(c.who) }; // throws when over a cap
      c.held.set(this, mine);
    }
    mine.n++;
    const slot = mine;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      if (--slot.n === 0) { c.held.delete(this); slot.release(); }
    };
  }

  private count(who: string): () => void {
    const perCaller = settingNamed(`FERRY_${this.env}_PER_CALLER`) as number;
    const total = settingNamed(`FERRY_${this.env}`) as number;
    const mine = this.byCaller.get(who) || 0;
    if (perCaller && mine >= perCaller) throw new ApiError(429,
      `too many ${this.what} at once for this caller (${perCaller}, FERRY_${this.env}_PER_CALLER): retry when one ends`, { retryAfter: 2 });
    if (total && this.total >= total) throw new ApiError(503,
      `too many ${this.what} at once on this service (${total}, FERRY_${this.env}): retry in a few seconds`, { retryAfter: 2 });
    this.byCaller.set(who, mine + 1);
    this.total++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.total--;
      const n = (this.byCaller.get(who) || 1) - 1;
      if (n) this.byCaller.set(who, n); else this.byCaller.delete(who);
    };
  }

  /** Runs `fn` holding a slot. */
  async run<T>(fn: () => Promise<T>): Promise<T> {
    const release = this.take();
    try { return await fn(); } finally { release(); }
  }

  get inUse() { return this.total; }
}

/** The spawn caps every service shares (one instance per process). */
export const spawnSlots = {
  console: new Slots('console sessions', 'CONSOLE_SESSIONS'),
  libvirt: new Slots('libvirt calls', 'VIRT_CALLS'),
  probe: new Slots('image probes', 'PROBES'),
  /** A plan's guest preflight (validate, start, retry): one appliance at a time per request. */
  appliance: new Slots('guest preflight appliances', 'GUEST_APPLIANCES'),
  /** Each nbdkit the guest preflight starts (one per source disk). */
  nbdkit: new Slots('nbdkit processes', 'NBDKIT_PROCESSES', true),
};

/** The script: one INCR per request in the caller's current window, the window's expiry set by its first. */
const WINDOW_SCRIPT = `
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
return {n, ttl}`;

export interface RateRedis { eval(script: string, keys: number, ...args: (string | number)[]): Promise<unknown> }
export interface RateVerdict { limit: number; remaining: number; retryAfterSeconds: number; allowed: boolean }

/** A fixed window per caller: requests (FERRY_RATE_LIMIT per FERRY_RATE_WINDOW_SECONDS) or, for `refusals`, the
 *  401/403 answers one client address caused (config.refusalLimit per config.refusalWindowSeconds); 0 turns it off. */
export class RateLimiter {
  constructor(private redis: RateRedis, private prefix: string, readonly kind: 'requests' | 'refusals' = 'requests') {}

  get limit() { return this.kind === 'refusals' ? config.refusalLimit : setting('FERRY_RATE_LIMIT'); }
  get windowSeconds() { return this.kind === 'refusals' ? config.refusalWindowSeconds : setting('FERRY_RATE_WINDOW_SECONDS'); }

  /** The same store counting the other kind. */
  sibling(kind: 'requests' | 'refusals') { return new RateLimiter(this.redis, this.prefix, kind); }

  /** Counts one request (or refusal) of `who`; undefined when limits are off. */
  async hit(who: string): Promise<RateVerdict | undefined> {
    const limit = this.limit;
    if (!limit) return undefined;
    const ms = this.windowSeconds * 1000;
    const key = `${this.prefix}:${this.kind === 'refusals' ? 'refusals' : 'ratelimit'}:${who}`;
    const [n, ttl] = (await this.redis.eval(WINDOW_SCRIPT, 1, key, ms)) as [number, number];
    return { limit, remaining: Math.max(0, limit - n), retryAfterSeconds: Math.max(1, Math.ceil(ttl / 1000)), allowed: n <= limit };
  }
}
