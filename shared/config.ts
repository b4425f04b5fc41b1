// Process configuration from the environment: one place for names and defaults.
import os from 'node:os';

function num(name: string, def: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return def;
  const n = Number(raw);
  if (!Number.isFinite(n)) throw new Error(`environment variable ${name} must be a number, got "${raw}"`);
  return n;
}

function str(name: string, def: string): string {
  const raw = process.env[name];
  return raw === undefined || raw === '' ? def : raw;
}

export const config = {
  get redisUrl() { return str('REDIS_URL', 'redis://127.0.0.1:6379'); },
  /** Key prefix for Ferry's own keys; use a hash tag such as "{ferry}" on Redis Cluster. */
  get prefix() { return str('FERRY_PREFIX', 'ferry'); },
  get gatewayPort() { return num('GATEWAY_PORT', 8000); },
  get daemonPort() { return num('DAEMON_PORT', 8080); },
  /** The listen address as set; services pass it through listenHost (shared/auth.ts): unset = 127.0.0.1
   *  without API keys, 0.0.0.0 with them. */
  get host(): string | undefined { return process.env.FERRY_HOST || undefined; },
  /** A worker whose heartbeat is older than this is stale (seed: 300 s). */
  get workerStaleSeconds() { return num('FERRY_WORKER_STALE_SECONDS', 300); },
  /** Lease of a job held by a worker process; renewed while the job runs. */
  get leaseSeconds() { return num('FERRY_LEASE_SECONDS', 30); },
  /** Lease of a job handed out over HTTP; renewed by the worker's heartbeat. It outlives the stale limit, so
   *  the gateway's sweep hands a stale worker's jobs back while it still holds the lease. */
  get httpLeaseSeconds() { return num('FERRY_HTTP_LEASE_SECONDS', Math.ceil(this.workerStaleSeconds * 1.2) + 10); },
  get heartbeatSeconds() { return num('FERRY_HEARTBEAT_SECONDS', 10); },
  /** First retry delay; doubles each attempt, with jitter, capped at 5 minutes. */
  get retryBackoffMs() { return num('FERRY_RETRY_BACKOFF_MS', 2000); },
  get shutdownGraceSeconds() { return num('FERRY_SHUTDOWN_GRACE_SECONDS', 30); },
  /** How often (and after how long) a QUEUED job missing from its BullMQ queue is put back. */
  get reconcileSeconds() { return num('FERRY_RECONCILE_SECONDS', 30); },
  get sseHeartbeatSeconds() { return num('FERRY_SSE_HEARTBEAT_SECONDS', 15); },
  get eventsKeptPerJob() { return num('FERRY_EVENTS_PER_JOB', 10000); },
  get hostname() { return os.hostname(); },
  version: '1.0.0',
};
