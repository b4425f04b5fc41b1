// Redis connections: one factory, so every service connects the same way (single node, Sentinel or Cluster).
import IORedis, { Cluster, Redis, RedisOptions } from 'ioredis';
import { config } from './config';
import { setting } from './settings';

export type RedisClient = Redis | Cluster;

/**
 * How a Cluster client rides out the failover of a primary, as the single-node client rides out a restart
 * (maxRetriesPerRequest null): a command waits instead of failing. Until a replica is promoted (cluster-node-timeout
 * plus an election: seconds here, 15-20 s with Redis' defaults) the surviving nodes still answer MOVED to the dead
 * primary and ioredis' reconnect to it fails with "Connection is closed". Every such MOVED, CLUSTERDOWN or closed
 * connection counts as one redirection; with ioredis' defaults (16, MOVED retried at once, the others after 100 ms)
 * a command gives up after a second or two with "Too many Cluster redirections" (redis/ioredis#1195, #1863): the
 * gateway answered 5xx and a worker process exited on the unhandled rejection. Here each retry waits (MOVED too: it only
 * comes after the layout changed, and the retry refreshes the slot cache) and the budget
 * covers 40-100 s of failover (400 retries of 100-250 ms); past it the command fails (the gateway answers 503).
 */
const CLUSTER_FAILOVER = {
  retryDelayOnMoved: 100,
  retryDelayOnFailover: 250,
  retryDelayOnClusterDown: 250,
  retryDelayOnTryAgain: 250,
  maxRedirections: 400,
};

/**
 * REDIS_URL forms:
 *   redis://host:port/db                       a single node
 *   redis-sentinel://h1:26379,h2:26379/mymaster  Sentinel (master name after the slash)
 *   redis-cluster://h1:7000,h2:7001             Cluster (keys use FERRY_PREFIX with a hash tag)
 */
export function createRedis(opts: { blocking?: boolean; url?: string } = {}): RedisClient {
  const url = opts.url || config.redisUrl;
  // BullMQ needs maxRetriesPerRequest null on connections it blocks on; we use it everywhere so a Redis
  // restart makes commands wait for the reconnect instead of failing the job.
  const base: RedisOptions = {
    maxRetriesPerRequest: null,
    enableReadyCheck: true,
    retryStrategy: (times) => Math.min(times * 100, 2000),
    lazyConnect: false,
  };
  const m = /^redis-(sentinel|cluster):\/\/([^/]+)(?:\/(.*))?$/.exec(url);
  if (m) {
    const nodes = m[2].split(',').map((hp) => {
      const [host, port] = hp.split(':');
      return { host, port: Number(port) };
    });
    if (m[1] === 'sentinel') {
      return new IORedis({ ...base, sentinels: nodes, name: m[3] || 'mymaster', password: setting('REDIS_PASSWORD') });
    }
    return new Cluster(nodes, { ...CLUSTER_FAILOVER, redisOptions: { ...base, password: setting('REDIS_PASSWORD') } });
  }
  return new IORedis(url, base);
}

/** Key names for Ferry's own data, all under one prefix. */
export function keys(prefix = config.prefix) {
  return {
    prefix,
    bullPrefix: `${prefix}:q`,
    seq: `${prefix}:jobs:seq`,
    jobsInState: (s: string) => `${prefix}:jobs:state:${s}`,
    /** Finished jobs by finish time (ms), for the retention sweep. */
    jobsFinished: `${prefix}:jobs:finished`,
    /** The call lane's jobs (the daemon's virsh_call) by submission time (ms): kept out of job lists, removed
     *  after their own short retention (JobStore.purgeCalls). */
    jobsCalls: `${prefix}:jobs:calls`,
    job: (id: string) => `${prefix}:job:${id}`,
    /** which job owns each thing made on a target (queue/commands/includes/made.lua) */
    madeOwners: `${prefix}:made-owners`,
    /** The state history list of the layout before it became the record's `history` field (read and purged only). */
    history: (id: string) => `${prefix}:job:${id}:history`,
    events: (id: string) => `${prefix}:job:${id}:events`,
    /** Queued jobs per queue and priority, fields `<queue>|<priority>` (one fixed key: the scripts name it in KEYS). */
    queuedCounts: `${prefix}:counts:queued`,
    queues: `${prefix}:queues`,
    stats: `${prefix}:stats`,
    workers: `${prefix}:workers`,
    worker: (id: string) => `${prefix}:worker:${id}`,
    /** A worker's job set in the layout before held jobs were derived from the state indexes (deleted only). */
    workerJobs: (id: string) => `${prefix}:worker:${id}:jobs`,
    chanJobs: `${prefix}:bus:jobs`,
    chanEvents: `${prefix}:bus:events`,
    chanCancel: `${prefix}:bus:cancel`,
    chanEnqueued: `${prefix}:bus:enqueued`,
    // daemon, scheduler and notifier (issue 4)
    credentials: (id: string) => `${prefix}:job:${id}:credentials`,
    schedules: `${prefix}:schedules`,
    scheduleRuns: `${prefix}:schedules:runs`,
    scheduleStats: (id: string) => `${prefix}:schedule:${id}:stats`,
    chanSchedules: `${prefix}:bus:schedules`,
    /** Channel: a migration plan changed (orchestration/plans.ts PlanStore; orchestration/plan-events.ts). */
    chanPlans: `${prefix}:bus:plans`,
    webhooks: `${prefix}:webhooks`,
    webhookStats: `${prefix}:webhooks:stats`,
    /** Channel: the webhook list changed (notifiers drop their cached copy). */
    chanWebhooks: `${prefix}:webhooks:changed`,
    /** A one-use WebSocket ticket, by the SHA-256 of the ticket (platform/auth.ts). */
    wsTicket: (digestHex: string) => `${prefix}:wsticket:${digestHex}`,
    webhookDeliveries: (id: string) => `${prefix}:webhook:${id}:deliveries`,
    webhookDeliveryOrder: (id: string) => `${prefix}:webhook:${id}:deliveries:order`,
    // remote managers (issue 10): export slots per manager, a sorted set of job ids scored by lease expiry
    managerSlots: (manager: string) => `${prefix}:manager:${manager}:slots`,
    /** The lease of a group of periodic work (queue/leader.ts): `<holder>#<fence>`, and its fencing counter. */
    leader: (group: string) => `${prefix}:leader:${group}`,
    leaderFence: (group: string) => `${prefix}:leader:${group}:fence`,
    /** The repair, import and boot seconds of recent migrations (a capped list, newest first): warm migration's
     *  prediction (orchestration/warm.ts). */
    warmStageTimes: `${prefix}:warm:stage_seconds`,
  };
}
export type Keys = ReturnType<typeof keys>;
