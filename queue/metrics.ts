// Cluster-wide job metrics read from Redis at scrape time: the transition script keeps the counters.
import type client from 'prom-client';
import { registerComputed, Sample } from '../platform/metrics';
import { countByDaemonStatus, STATES, TERMINAL } from '../domain/states';
import { canServe, parseQueueName } from '../platform/capabilities';
import type { JobStore } from './store';
import type { Registry } from './registry';
import type { RedisClient } from '../platform/redis';
import { DURATION_BUCKETS, STAT_FIELDS } from './stat-fields';

const OUTCOMES = TERMINAL.map((s) => s.toLowerCase()) as ('completed' | 'failed' | 'cancelled')[];
const BOUNDS = [...DURATION_BUCKETS.map(String), '+Inf'];
/** Finished jobs that had started, by bucket (`le`) and outcome: the script counts each such job once, in the
 *  first bucket that holds its run time (`duration_in:<le>:<outcome>`, moveIndexes.lua). */
const ran = (s: Record<string, string>, le: string, outcome: string) => Number(s[`${STAT_FIELDS.durationIn}${le}:${outcome}`] || 0);

/** Jobs finished by outcome: those that never ran (`total:<outcome>`) plus those counted in a duration bucket. */
export function finishedTotals(s: Record<string, string>): Record<(typeof OUTCOMES)[number], number> {
  return Object.fromEntries(OUTCOMES.map((o) => [o, Number(s[`${STAT_FIELDS.total}${o}`] || 0) + BOUNDS.reduce((a, le) => a + ran(s, le, o),
    0)])) as Record<(typeof OUTCOMES)[number], number>;
}

/** The run-time histogram: Prometheus buckets are cumulative, so the per-bucket fields are added up here. The
 *  cumulative fields of the layout before (`duration_le:<b>`, `duration_count`) are added in, so the counters
 *  never go back on an upgrade. */
export function durationHistogram(s: Record<string, string>): { buckets: [number | '+Inf', number][]; count: number; sum: number } {
  let running = 0;
  const inBucket = (le: string) => OUTCOMES.reduce((a, o) => a + ran(s, le, o), 0);
  const buckets: [number | '+Inf', number][] = DURATION_BUCKETS.map((b) => {
    running += inBucket(String(b));
    return [b, running + Number(s[`duration_le:${b}`] || 0)];
  });
  const count = running + inBucket('+Inf') + Number(s.duration_count || 0);
  buckets.push(['+Inf', count]);
  return { buckets, count, sum: Number(s[STAT_FIELDS.durationSum] || 0) };
}

export function registerJobMetrics(registry: client.Registry, store: JobStore, workers: Registry) {
  const r = store.redis;
  const k = store.k;
  const stateCounts = () => store.stateCounts();

  registerComputed(registry, 'svc_migration_total', 'Jobs that reached a terminal state, by status', 'counter', async () => {
    const totals = finishedTotals(await r.hgetall(k.stats));
    return Object.entries(totals).map(([status, value]) => ({ labels: { status }, value }));
  });
  registerComputed(registry, 'svc_migration_duration_seconds', 'Run time of finished jobs (RUNNING to COMPLETED or FAILED)', 'histogram', async () => {
    const h = durationHistogram(await r.hgetall(k.stats));
    const out: Sample[] = h.buckets.map(([le, value]) => ({ metricName: 'svc_migration_duration_seconds_bucket', labels: { le }, value }));
    out.push({ metricName: 'svc_migration_duration_seconds_sum', value: h.sum });
    out.push({ metricName: 'svc_migration_duration_seconds_count', value: h.count });
    return out;
  });
  registerComputed(registry, 'svc_worker_jobs_active', 'Jobs held by workers (ASSIGNED or RUNNING)', 'gauge', async () => {
    const c = await stateCounts();
    return [{ value: Number(c.ASSIGNED || 0) + Number(c.RUNNING || 0) }];
  });
  registerComputed(registry, 'svc_job_states', 'Jobs in the store by state', 'gauge', async () => {
    const c = await stateCounts();
    return STATES.map((state) => ({ labels: { state }, value: Number(c[state] || 0) }));
  });
  registerComputed(registry, 'svc_jobs_total', 'Jobs in the store by daemon status (pending, running, completed, failed, cancelled)', 'gauge', async () => {
    return Object.entries(countByDaemonStatus(await stateCounts())).map(([status, value]) => ({ labels: { status }, value }));
  });
  registerComputed(registry, 'svc_queue_depth', 'Jobs per queue (requirement set) and state', 'gauge', async () => {
    const counts = await store.queueCounts(await r.smembers(k.queues));
    return Object.entries(counts).flatMap(([queue, c]) => Object.entries(c).map(([state, value]) => ({ labels: { queue, state }, value })));
  });
  registerComputed(registry, 'svc_workers', 'Registered workers by liveness', 'gauge', async () => {
    const { total, active } = await workers.counts();
    return [{ labels: { state: 'active' }, value: active }, { labels: { state: 'stale' }, value: total - active }];
  });
  registerComputed(registry, 'svc_workers_active_by_capability', 'Active workers per capability', 'gauge', async () => {
    const by: Record<string, number> = {};
    for (const w of await workers.active()) for (const c of w.capabilities.length ? w.capabilities : ['none']) by[c] = (by[c] || 0) + 1;
    return Object.entries(by).map(([capability, value]) => ({ labels: { capability }, value }));
  });
  registerComputed(registry, 'svc_queue_servable_workers', 'Active workers able to take jobs of each queue (requirement set)', 'gauge', async () => {
    const [queues, active] = await Promise.all([r.smembers(k.queues), workers.active()]);
    return queues.map((queue) => {
      const req = parseQueueName(queue);
      return { labels: { queue }, value: req ? active.filter((w) => canServe(w, req)).length : 0 };
    });
  });
  registerRedisHealth(registry, r);
}

/** Redis as this process sees it: 1/0 and ping latency, plus memory and clients from INFO (one node on Cluster). */
export function registerRedisHealth(registry: client.Registry, r: RedisClient) {
  const ping = async () => {
    if (r.status !== 'ready') return null;
    const t0 = process.hrtime.bigint();
    const ok = await Promise.race([r.ping().then(() => true, () => false), new Promise<boolean>((res) => setTimeout(() => res(false), 1000).unref())]);
    return ok ? Number(process.hrtime.bigint() - t0) / 1e9 : null;
  };
  registerComputed(registry, 'svc_redis_up', 'Whether Redis answered a PING within 1 s (1) or not (0)', 'gauge',
    async () => [{ value: (await ping()) === null ? 0 : 1 }]);
  registerComputed(registry, 'svc_redis_ping_seconds', 'Round trip of a Redis PING from this process', 'gauge', async () => {
    const s = await ping();
    return s === null ? [] : [{ value: s }];
  });
  registerComputed(registry, 'svc_redis_info', 'Redis INFO figures: used_memory bytes, connected_clients, ops per second', 'gauge', async () => {
    if (r.status !== 'ready') return [];
    const text = await r.info();
    const get = (f: string) => Number(new RegExp(`^${f}:(\\S+)`, 'm').exec(text)?.[1]);
    return ['used_memory', 'maxmemory', 'connected_clients', 'instantaneous_ops_per_sec', 'aof_last_write_status_ok']
      .map((field) => ({ labels: { field }, value: field === 'aof_last_write_status_ok' ? Number(/^aof_last_write_status:ok/m.test(text)) : get(field) }))
      .filter((x) => Number.isFinite(x.value));
  });
}
