// Warm migration's state beside a migrate_vm job's record (issue 37): the rounds and the prediction the worker
// writes (`warm`), the snapshots it made on the source (`warm_snapshots`, recorded the moment each exists, so any
// attempt, cancel or rollback removes exactly those), and a cutover request (`warm_cutover`, written by the daemon's
// POST /plans/{id}/cutover). The prediction's repair, import and boot times come from recent migrations' measured
// times (a capped list), the prediction rule itself from shared/warm-predict.ts.
import type { RedisClient } from '../shared/redis';
import type { Keys } from '../shared/redis';
import { createLogger } from '../shared/log';
import type { StageSeconds, WarmState } from '../shared/warm-predict';

const log = createLogger('queue');

/** A snapshot Ferry made, by its managed object id (never its name). */
export interface WarmSnapshot { vm: string; snapshot: string; round: number; at: string }

const read = async <T>(redis: RedisClient, key: string, field: string, dflt: T): Promise<T> => {
  const raw = await redis.hget(key, field);
  if (!raw) return dflt;
  try { return JSON.parse(raw) as T; } catch (e) {
    log.error('a warm migration field does not parse; it is read as empty', { key, field, error: (e as Error).message });
    return dflt;
  }
};

export const warmState = (redis: RedisClient, k: Keys, jobId: string) => read<WarmState | null>(redis, k.job(jobId), 'warm', null);
export const writeWarmState = (redis: RedisClient, k: Keys, jobId: string, s: WarmState) => redis.hset(k.job(jobId), 'warm', JSON.stringify(s)).then(() => undefined);

export const warmSnapshots = (redis: RedisClient, k: Keys, jobId: string) => read<WarmSnapshot[]>(redis, k.job(jobId), 'warm_snapshots', []);
export async function recordSnapshot(redis: RedisClient, k: Keys, jobId: string, s: WarmSnapshot) {
  const all = (await warmSnapshots(redis, k, jobId)).filter((x) => x.snapshot !== s.snapshot);
  await redis.hset(k.job(jobId), 'warm_snapshots', JSON.stringify([...all, s]));
}
export async function forgetSnapshot(redis: RedisClient, k: Keys, jobId: string, snapshot: string) {
  const all = (await warmSnapshots(redis, k, jobId)).filter((x) => x.snapshot !== snapshot);
  await redis.hset(k.job(jobId), 'warm_snapshots', JSON.stringify(all));
}

export interface CutoverRequest { at: string; by: string | null }
export const cutoverRequest = (redis: RedisClient, k: Keys, jobId: string) => read<CutoverRequest | null>(redis, k.job(jobId), 'warm_cutover', null);
/** Asks a running warm job to cut over at its next check (within a second while it waits between rounds). Only
 *  an existing job record gets the field. */
export async function requestCutover(redis: RedisClient, k: Keys, jobId: string, by: string | null): Promise<boolean> {
  if (!(await redis.exists(k.job(jobId)))) return false;
  await redis.hset(k.job(jobId), 'warm_cutover', JSON.stringify({ at: new Date().toISOString(), by }));
  return true;
}

const STAGE_TIMES_KEPT = 20;
/** Records one migration's measured repair, import and boot seconds (newest first, the last 20 kept). */
export async function recordStageTimes(redis: RedisClient, k: Keys, t: StageSeconds) {
  await redis.multi().lpush(k.warmStageTimes, JSON.stringify(t)).ltrim(k.warmStageTimes, 0, STAGE_TIMES_KEPT - 1).exec();
}
export async function recentStageTimes(redis: RedisClient, k: Keys): Promise<StageSeconds[]> {
  const out: StageSeconds[] = [];
  for (const raw of await redis.lrange(k.warmStageTimes, 0, STAGE_TIMES_KEPT - 1)) {
    try { out.push(JSON.parse(raw) as StageSeconds); } catch { log.warn('a recorded stage time does not parse; left out of the prediction', { raw: raw.slice(0, 200) }); }
  }
  return out;
}
