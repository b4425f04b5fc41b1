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

/** A duration: plain seconds ("90") or with units ("7d", "12h", "90s", "1h30m", "500ms"). */
export function parseDurationMs(raw: string): number | null {
  const s = raw.trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s) * 1000;
  if (!/^(\d+(\.\d+)?(ms|d|h|m|s))+$/.test(s)) return null;
  const mult: Record<string, number> = { d: 86_400_000, h: 3_600_000, m: 60_000, s: 1000, ms: 1 };
  let total = 0;
  for (const m of s.matchAll(/(\d+(?:\.\d+)?)(ms|d|h|m|s)/g)) total += Number(m[1]) * mult[m[2]];
  return total;
}

function duration(name: string, def: string): number {
  const raw = str(name, def);
  const ms = parseDurationMs(raw);
  if (ms === null || ms <= 0) throw new Error(`environment variable ${name} must be a duration such as 7d, 12h or 90s, got "${raw}"`);
  return ms;
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
  /** How often the gateway ends attempts of HTTP pull workers that ran past execution_policy.timeout_seconds. */
  get timeoutSweepSeconds() { return num('FERRY_TIMEOUT_SWEEP_SECONDS', 5); },
  get sseHeartbeatSeconds() { return num('FERRY_SSE_HEARTBEAT_SECONDS', 15); },
  /** Progress events kept per job (the stream is trimmed to about this many). */
  get eventsKeptPerJob() { return num('FERRY_EVENTS_PER_JOB', 10000); },
  /** How long a finished (COMPLETED, FAILED, CANCELLED) job's record, history and events stay in Redis. */
  get jobRetentionMs() { return duration('FERRY_JOB_RETENTION', '7d'); },
  /** A worker record whose last heartbeat is older than this (and that holds no job) is removed. */
  get workerPruneMs() { return duration('FERRY_WORKER_PRUNE_AFTER', '1d'); },
  /** Capability names accepted beside the known set (shared/capabilities.ts), comma-separated. */
  get extraCapabilities() { return str('FERRY_EXTRA_CAPABILITIES', '').split(',').map((c) => c.trim()).filter(Boolean); },
  /** Browser origins allowed to call the APIs (CORS), comma-separated, "*" for any; none by default. */
  get corsOrigins() { return str('FERRY_CORS_ORIGINS', '').split(',').map((o) => o.trim().replace(/\/+$/, '')).filter(Boolean); },
  /** Host bridges a NIC may name directly, comma-separated (FERRY_LIBVIRT_BRIDGES); none by default: a job's or a
   *  request's network must be a libvirt network, so no caller puts a guest on a host LAN the operator did not offer. */
  get libvirtBridges() { return str('FERRY_LIBVIRT_BRIDGES', '').split(',').map((b) => b.trim()).filter(Boolean); },
  /** Peers whose X-Forwarded-For is believed (shared/client-address.ts): addresses or CIDRs, comma-separated;
   *  none by default, so a request's client address is its socket's peer. */
  get trustedProxies() { return str('FERRY_TRUSTED_PROXIES', '').split(',').map((o) => o.trim()).filter(Boolean); },
  /** Refused requests (401, 403) one client address may cause per window before it gets 429 (0 turns it off). */
  get refusalLimit() { return num('FERRY_REFUSAL_LIMIT', 600); },
  get refusalWindowSeconds() { return Math.max(1, num('FERRY_REFUSAL_WINDOW_SECONDS', 60)); },
  /** Refusals of one client address written to the audit's refusal stream per window; the rest are counted. */
  get refusalAuditSample() { return num('FERRY_REFUSAL_AUDIT_SAMPLE', 20); },
  /** Length cap of the audit's refusal stream, apart from the accepted requests' records (FERRY_AUDIT_MAX_ENTRIES). */
  get refusalAuditMaxEntries() { return Math.max(100, num('FERRY_REFUSAL_AUDIT_MAX_ENTRIES', 20_000)); },
  /** Stored plans, archived ones included (past it POST /plans is 409), and VMs in one plan (past it 400 naming vms). */
  get planMaxStored() { return num('FERRY_PLAN_MAX_STORED', 1000); },
  get planMaxVms() { return num('FERRY_PLAN_MAX_VMS', 1000); },
  /** Guest preflight appliances (libguestfs, ~1 GiB each) running for requests, per caller and in this process
   *  (0 = no cap); over the caller's cap 429, over the total 503 (shared/limits.ts). */
  get guestAppliances() { return { perCaller: num('FERRY_GUEST_APPLIANCES_PER_CALLER', 2), total: num('FERRY_GUEST_APPLIANCES', 4) }; },
  /** nbdkit processes serving source disks to those appliances, each counted, per caller and in this process. */
  get nbdkitProcesses() { return { perCaller: num('FERRY_NBDKIT_PROCESSES_PER_CALLER', 64), total: num('FERRY_NBDKIT_PROCESSES', 128) }; },
  /** How long POST /vms/shutdown and /vms/poweroff wait for their vm_power job (a worker with vsphere_access);
   *  past it the job is cancelled and the answer is 504. */
  get vmActionWaitSeconds() { return Math.max(1, num('FERRY_VM_ACTION_WAIT_SECONDS', 120)); },
  get hostname() { return os.hostname(); },
  version: '1.0.0',
};
