// A counting semaphore in Redis with leases: at most `limit` holders per key across every worker. A holder
// renews its lease while it works; a worker that dies stops renewing and its slot frees itself when the lease
// runs out (FERRY_EXPORTS_PER_MANAGER uses it to protect a vSphere manager from too many exports at once).
import { createHash } from 'node:crypto';
import type { Keys, RedisClient } from '../platform/redis';
import { createLogger, dropped } from '../platform/log';

const log = createLogger('queue');

// KEYS: the set. ARGV: holder, limit, lease ms. Returns 1 when held (again), 0 when full. Time is Redis's own,
// so workers' clocks do not matter.
const ACQUIRE = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
  return 1
end
return 0`;

// KEYS: the set. ARGV: holder, lease ms. Returns 0 when the lease was lost (expired and taken).
const RENEW = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) < now then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return 1`;

export interface Slot { release(): Promise<void>; readonly lost: boolean }

export class Slots {
  constructor(private redis: RedisClient, private k: Keys) {}

  /** The key of a name (a manager URL), hashed so any URL makes a valid, short key. */
  keyOf(name: string) { return this.k.managerSlots(createHash('sha256').update(name).digest('hex').slice(0, 20)); }

  /** Takes a slot for `holder`, or returns null when `limit` holders have live leases. */
  async acquire(name: string, holder: string, limit: number, leaseMs: number): Promise<Slot | null> {
    const key = this.keyOf(name);
    const got = await this.redis.eval(ACQUIRE, 1, key, holder, String(limit), String(leaseMs));
    if (Number(got) !== 1) return null;
    let lost = false;
    const timer = setInterval(() => {
      this.redis.eval(RENEW, 1, key, holder, String(leaseMs)).then((r) => { if (Number(r) !== 1) lost = true; },
        dropped(log, 'could not renew a concurrency slot; tried again on the next tick, within its lease', { holder }));
    }, Math.max(200, Math.floor(leaseMs / 3)));
    timer.unref();
    return {
      get lost() { return lost; },
      release: async () => { clearInterval(timer); await this.redis.zrem(key,
        holder).catch(dropped(log, 'could not release a concurrency slot; it frees itself when its lease runs out', { holder })); },
    };
  }

  /** Live holders of a name's slots. */
  async holders(name: string): Promise<string[]> {
    const key = this.keyOf(name);
    const [sec, usec] = await this.redis.time();
    return this.redis.zrangebyscore(key, Number(sec) * 1000 + Math.floor(Number(usec) / 1000), '+inf');
  }
}
