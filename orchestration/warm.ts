// Warm migration's state beside a migrate_vm job's record (issue 37): the rounds and the prediction the worker
// writes (`warm`), the snapshots it made on the source (`warm_snapshots`, recorded the moment each exists, so any
// attempt, cancel or rollback removes exactly those), and a cutover request (`warm_cutover`, written by askCutover
// for POST /plans/{id}/cutover and POST /jobs/{id}/cutover on both APIs). The prediction's repair, import and boot times come from recent migrations' measured
// times (a capped list), the prediction rule itself from domain/warm-predict.ts.
import type { RedisClient } from '../platform/redis';
import type { Keys } from '../platform/redis';
import { createLogger } from '../platform/log';
import { conflict, notFound } from '../platform/errors';
import type { StageSeconds, WarmState } from '../domain/warm-predict';
import type { JobStore } from '../queue/store';

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
export const writeWarmState = (redis: RedisClient, k: Keys, jobId: string, s: WarmState) => redis.hset(k.job(jobId), 'warm',
  JSON.stringify(s)).then(() => undefined);

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
/** The one rule of a manual cutover, for a plan's VM and a job submitted directly alike: the job exists (404), is a
 *  warm migrate_vm job (409), has not ended (409; one waiting for a worker cuts over when its first round ends)
 *  and has not begun its cutover (409); then the request is recorded on it by the caller's key name. */
export async function askCutover(store: JobStore, jobId: string, by: string | null): Promise<CutoverRequest> {
  const job = await store.get(jobId);
  if (!job) throw notFound(`job ${jobId} not found`);
  if (!(job.spec.parameters as { warm?: unknown } | undefined)?.warm) throw conflict(
    `job ${jobId} is not a warm migration (options.warm): only a running warm job cuts over`);
  if (job.is_terminal) throw conflict(`job ${jobId} is ${job.state}: only a running warm job cuts over`);
  const w = await warmState(store.redis, store.k, jobId);
  if (w && w.status !== 'copying') throw conflict(`job ${jobId} is already ${w.status.replace('_', ' ')}${w.cutover ? ` (${w.cutover.reason})` : ''}`);
  const asked = await requestCutover(store.redis, store.k, jobId, by);
  if (!asked) throw notFound(`job ${jobId} not found`);
  // A second request before the job sees the first would say it was asked later, by someone else: the first stands.
  if (asked.earlier) throw conflict(`cutover of job ${jobId} was already requested at ${asked.request.at}${asked.request.by ? ` by ${asked.request.by}` : ''}`);
  return asked.request;
}

/** Records the request on an existing job record unless one is there already (null: no such job; `earlier`: the
 *  request found, left as it was). The checks are askCutover's (the benchmark, which knows its job, calls this). */
export async function requestCutover(redis: RedisClient, k: Keys, jobId: string,
  by: string | null): Promise<{ request: CutoverRequest; earlier: boolean } | null> {
  if (!(await redis.exists(k.job(jobId)))) return null;
  const request: CutoverRequest = { at: new Date().toISOString(), by };
  if (await redis.hsetnx(k.job(jobId), 'warm_cutover', JSON.stringify(request))) return { request, earlier: false };
  const first = await cutoverRequest(redis, k, jobId);
  return first ? { request: first, earlier: true } : null;
}

const STAGE_TIMES_KEPT = 20;
/** Records one migration's measured repair, import and boot seconds (newest first, the last 20 kept). */
export async function recordStageTimes(redis: RedisClient, k: Keys, t: StageSeconds) {
  await redis.multi().lpush(k.warmStageTimes, JSON.stringify(t)).ltrim(k.warmStageTimes, 0, STAGE_TIMES_KEPT - 1).exec();
}
export async function recentStageTimes(redis: RedisClient, k: Keys): Promise<StageSeconds[]> {
  const out: StageSeconds[] = [];
  for (const raw of await redis.lrange(k.warmStageTimes, 0, STAGE_TIMES_KEPT - 1)) {
    try { out.push(JSON.parse(raw) as StageSeconds); } catch { log.warn('a recorded stage time does not parse; left out of the prediction',
      { raw: raw.slice(0, 200) }); }
  }
  return out;
}
