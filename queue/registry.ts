// Worker registration and heartbeats: who is alive, with which capabilities.
import { keys as makeKeys, RedisClient } from '../platform/redis';
import { config } from '../platform/config';
import { normalizeCaps } from '../platform/capabilities';
import { HELD } from '../domain/states';
import { withCommands } from './scripts';

export interface WorkerInfo {
  worker_id: string;
  capabilities: string[];
  system_info: Record<string, unknown>;
  execution_mode: string;
  registered_at: string;
  last_heartbeat: string;
  active: boolean;
  kind: string;
  jobs: string[];
}

/** The oldest last heartbeat (epoch ms) of a worker still active: within the stale limit. */
const activeSince = () => Date.now() - config.workerStaleSeconds * 1000;

/** Keys per ferryReadFields call (queue/commands/readFields-n.lua): one call holds Redis about 2 ms at most. */
const READ_BATCH = 1000;
/** The record fields a listing shows (toInfo), in the order list() takes them apart. */
const RECORD_FIELDS = ['worker_id', 'capabilities', 'system_info', 'execution_mode', 'registered_at', 'last_heartbeat', 'kind'] as const;

/** What an active worker offers a queue. */
export type ActiveWorker = Pick<WorkerInfo, 'worker_id' | 'capabilities' | 'execution_mode'>;

export class Registry {
  readonly k = makeKeys();
  constructor(readonly redis: RedisClient) {}

  /** `keyName`: the API key an HTTP worker registered with; other keys may not act as this worker id. */
  async register(w: { worker_id: string; capabilities: string[]; system_info: object; execution_mode: string }, kind: 'http' | 'native', keyName?: string) {
    const now = new Date();
    await this.redis.multi()
      .hset(this.k.worker(w.worker_id), {
        worker_id: w.worker_id,
        capabilities: JSON.stringify(normalizeCaps(w.capabilities)),
        system_info: JSON.stringify(w.system_info || {}),
        execution_mode: w.execution_mode,
        registered_at: now.toISOString(),
        last_heartbeat: now.toISOString(),
        kind,
        ...(keyName ? { key_name: keyName } : {}),
      })
      .zadd(this.k.workers, now.getTime(), w.worker_id)
      .exec();
    return now.toISOString();
  }

  /** The API key name a worker id is bound to, if any. */
  async keyOf(id: string): Promise<string | null> {
    return this.redis.hget(this.k.worker(id), 'key_name');
  }

  /** Null when the worker is not registered. */
  async heartbeat(id: string): Promise<string | null> {
    if (!(await this.redis.exists(this.k.worker(id)))) return null;
    const now = new Date();
    await this.redis.multi().hset(this.k.worker(id), 'last_heartbeat', now.toISOString()).zadd(this.k.workers, now.getTime(), id).exec();
    return now.toISOString();
  }

  async get(id: string): Promise<WorkerInfo | null> {
    const [h, jobs] = await Promise.all([this.redis.hgetall(this.k.worker(id)), this.heldJobs(id)]);
    return h && h.worker_id ? this.toInfo(h, jobs) : null;
  }

  /** `since`: activeSince() of the caller, once per listing. */
  private toInfo(h: Partial<Record<string, string | null>>, jobs: string[], since = activeSince()): WorkerInfo {
    return {
      worker_id: h.worker_id!,
      capabilities: JSON.parse(h.capabilities || '[]') as string[], // written by register() from the validated request
      system_info: JSON.parse(h.system_info || '{}') as Record<string, unknown>,
      execution_mode: h.execution_mode ?? '',
      registered_at: h.registered_at ?? '',
      last_heartbeat: h.last_heartbeat ?? '',
      active: Date.parse(h.last_heartbeat ?? '') >= since,
      kind: h.kind ?? '',
      jobs: jobs.sort(),
    };
  }

  async list(): Promise<WorkerInfo[]> {
    const ids = await this.redis.zrevrange(this.k.workers, 0, -1);
    if (!ids.length) return [];
    const [rows, held] = await Promise.all([this.readFields(ids.map((id) => this.k.worker(id)), RECORD_FIELDS), this.held()]);
    const since = activeSince();
    const out: WorkerInfo[] = [];
    for (const [worker_id, capabilities, system_info, execution_mode, registered_at, last_heartbeat, kind] of rows) {
      // A record removed between the two reads (prune, deregister) is not a worker any more.
      if (worker_id) out.push(this.toInfo({ worker_id, capabilities, system_info, execution_mode, registered_at, last_heartbeat, kind }, held.get(worker_id) ??
        [], since));
    }
    return out;
  }

  /** The same fields of many hashes, null where absent (one Lua call per READ_BATCH keys, answered as JSON;
   *  pipelined commands cost the gateway 2-3 times as much at 1,000 workers: docs/performance.md). */
  private async readFields(keys: string[], fields: readonly string[]): Promise<(string | null)[][]> {
    const r = withCommands(this.redis);
    const batches: Promise<string>[] = [];
    for (let i = 0; i < keys.length; i += READ_BATCH) {
      const part = keys.slice(i, i + READ_BATCH);
      batches.push(r.ferryReadFields(part.length, ...part, ...fields));
    }
    const rows = (await Promise.all(batches)).flatMap((json) => JSON.parse(json) as (string | false)[][]);
    return rows.map((row) => row.map((v) => (v === false ? null : v)));
  }

  /** The active workers (heartbeat within the stale limit, by the heartbeat index) with what matching a queue
   *  needs: capabilities and execution mode. Two fields of each active worker's record; `list()` also reads
   *  every stale record, each worker's system_info and the held jobs (GET /queue at 1,000 workers: 1,615 commands
   *  through list(), scripts/bench/fleet.ts). */
  async active(): Promise<ActiveWorker[]> {
    const ids = await this.redis.zrangebyscore(this.k.workers, activeSince(), '+inf');
    if (!ids.length) return [];
    const res = await this.readFields(ids.map((id) => this.k.worker(id)), ['capabilities', 'execution_mode']);
    const out: ActiveWorker[] = [];
    ids.forEach((worker_id, i) => {
      const [caps, mode] = res[i] ?? [];
      // A record removed between the two reads (prune, deregister) is not a worker any more.
      if (caps !== null && caps !== undefined) out.push({ worker_id, capabilities: JSON.parse(caps) as string[], execution_mode: mode ?? '' });
    });
    return out;
  }

  /** How many workers are registered and how many are active (heartbeat within the stale limit), from the
   *  heartbeat index alone: two commands where reading every record (list()) costs one per worker and one per
   *  held job; /status and /health ask this on every call (1,000 workers: scripts/bench/fleet.ts). */
  async counts(): Promise<{ total: number; active: number }> {
    const res = (await this.redis.multi().zcard(this.k.workers).zcount(this.k.workers, activeSince(), '+inf').exec()) || [];
    return { total: Number(res[0]?.[1] ?? 0), active: Number(res[1]?.[1] ?? 0) };
  }

  /** Ids of workers whose heartbeat is older than the stale limit. */
  async stale(): Promise<string[]> {
    return this.redis.zrangebyscore(this.k.workers, 0, activeSince());
  }

  /** Removes workers silent for longer than `olderThanMs` that hold no job; returns their ids. */
  async prune(olderThanMs: number): Promise<string[]> {
    const gone: string[] = [];
    const silent = await this.redis.zrangebyscore(this.k.workers, 0, Date.now() - olderThanMs);
    if (!silent.length) return gone;
    const held = await this.held();
    for (const id of silent) {
      if (!held.get(id)?.length && (await this.remove(id))) gone.push(id);
    }
    return gone;
  }

  async remove(id: string): Promise<boolean> {
    // The per-worker job set of the layout before held jobs were derived goes with its worker.
    const [[, n], [, z]] = (await this.redis.multi().del(this.k.worker(id), this.k.workerJobs(id)).zrem(this.k.workers, id).exec()) as [[Error | null, number],
      [Error | null, number]]; // DEL and ZREM answer counts
    return n > 0 || z > 0;
  }

  /** The jobs each worker holds: the ASSIGNED and RUNNING jobs, grouped by the worker their record names.
   *  Derived, not stored: those two indexes hold as many jobs as the cluster has busy worker slots, and a set per
   *  worker would repeat each record's worker_id (two more commands on every job, and a second truth to keep in
   *  step with the record). */
  async held(): Promise<Map<string, string[]>> {
    const m = this.redis.multi();
    for (const s of HELD) m.zrange(this.k.jobsInState(s), 0, -1);
    const ids = (((await m.exec()) || []) as [unknown, string[]][]).flatMap(([, xs]) => xs);
    const by = new Map<string, string[]>();
    if (!ids.length) return by;
    const res = await this.readFields(ids.map((id) => this.k.job(id)), ['worker_id']);
    ids.forEach((id, i) => {
      const w = res[i]?.[0];
      if (!w) return;
      const l = by.get(w);
      if (l) l.push(id); else by.set(w, [id]);
    });
    return by;
  }

  async heldJobs(workerId: string): Promise<string[]> { return (await this.held()).get(workerId) ?? []; }
}
