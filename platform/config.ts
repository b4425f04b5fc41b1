// Process configuration from the environment, by the names the code uses. Every variable, with its type, default,
// validation and doc, is declared once in platform/settings.ts; these getters read through it (a bad value throws
// naming the variable; services refuse to start with one, platform/check-settings.ts).
import os from 'node:os';
import { setting as s } from './settings';

/** A duration: plain seconds ("90") or with units ("7d", "12h", "90s", "1h30m", "500ms"). */
export { parseDurationMs } from './settings';

export const config = {
  get redisUrl() { return s('REDIS_URL'); },
  /** Key prefix for Ferry's own keys; use a hash tag such as "{ferry}" on Redis Cluster. */
  get prefix() { return s('FERRY_PREFIX'); },
  get gatewayPort() { return s('GATEWAY_PORT'); },
  get daemonPort() { return s('DAEMON_PORT'); },
  /** The listen address as set; services pass it through listenHost (platform/auth.ts): unset = 127.0.0.1
   *  without API keys, 0.0.0.0 with them. */
  get host(): string | undefined { return s('FERRY_HOST'); },
  /** A worker whose heartbeat is older than this is stale (seed: 300 s). */
  get workerStaleSeconds() { return s('FERRY_WORKER_STALE_SECONDS'); },
  /** Lease of a job held by a worker process; renewed while the job runs. */
  get leaseSeconds() { return s('FERRY_LEASE_SECONDS'); },
  /** Lease of a job handed out over HTTP; renewed by the worker's heartbeat. It outlives the stale limit, so
   *  the gateway's sweep hands a stale worker's jobs back while it still holds the lease. */
  get httpLeaseSeconds() { return s('FERRY_HTTP_LEASE_SECONDS') ?? Math.ceil(this.workerStaleSeconds * 1.2) + 10; },
  get heartbeatSeconds() { return s('FERRY_HEARTBEAT_SECONDS'); },
  /** First retry delay; doubles each attempt, with jitter, capped at 5 minutes. */
  get retryBackoffMs() { return s('FERRY_RETRY_BACKOFF_MS'); },
  get shutdownGraceSeconds() { return s('FERRY_SHUTDOWN_GRACE_SECONDS'); },
  /** How often (and after how long) a QUEUED job missing from its BullMQ queue is put back. */
  get reconcileSeconds() { return s('FERRY_RECONCILE_SECONDS'); },
  /** How often the gateway ends attempts of HTTP pull workers that ran past execution_policy.timeout_seconds. */
  get timeoutSweepSeconds() { return s('FERRY_TIMEOUT_SWEEP_SECONDS'); },
  get sseHeartbeatSeconds() { return s('FERRY_SSE_HEARTBEAT_SECONDS'); },
  /** Progress events kept per job (the stream is trimmed to about this many). */
  get eventsKeptPerJob() { return s('FERRY_EVENTS_PER_JOB'); },
  /** How long a finished (COMPLETED, FAILED, CANCELLED) job's record, history and events stay in Redis. */
  get jobRetentionMs() { return s('FERRY_JOB_RETENTION'); },
  /** A worker record whose last heartbeat is older than this (and that holds no job) is removed. */
  get workerPruneMs() { return s('FERRY_WORKER_PRUNE_AFTER'); },
  /** Capability names accepted beside the known set (platform/capabilities.ts), comma-separated. */
  get extraCapabilities() { return s('FERRY_EXTRA_CAPABILITIES'); },
  /** Browser origins allowed to call the APIs (CORS), comma-separated, "*" for any; none by default. */
  get corsOrigins() { return s('FERRY_CORS_ORIGINS').map((o) => o.replace(/\/+$/, '')); },
  /** Host bridges a NIC may name directly, comma-separated (FERRY_LIBVIRT_BRIDGES); none by default: a job's or a
   *  request's network must be a libvirt network, so no caller puts a guest on a host LAN the operator did not offer. */
  get libvirtBridges() { return s('FERRY_LIBVIRT_BRIDGES'); },
  /** Peers whose X-Forwarded-For is believed (platform/client-address.ts): addresses or CIDRs, comma-separated;
   *  none by default, so a request's client address is its socket's peer. */
  get trustedProxies() { return s('FERRY_TRUSTED_PROXIES'); },
  /** Refused requests (401, 403) one client address may cause per window before it gets 429 (0 turns it off). */
  get refusalLimit() { return s('FERRY_REFUSAL_LIMIT'); },
  get refusalWindowSeconds() { return s('FERRY_REFUSAL_WINDOW_SECONDS'); },
  /** Refusals of one client address written to the audit's refusal stream per window; the rest are counted. */
  get refusalAuditSample() { return s('FERRY_REFUSAL_AUDIT_SAMPLE'); },
  /** Length cap of the audit's refusal stream, apart from the accepted requests' records (FERRY_AUDIT_MAX_ENTRIES). */
  get refusalAuditMaxEntries() { return s('FERRY_REFUSAL_AUDIT_MAX_ENTRIES'); },
  /** Stored plans, archived ones included (past it POST /plans is 409), and VMs in one plan (past it 400 naming vms). */
  get planMaxStored() { return s('FERRY_PLAN_MAX_STORED'); },
  get planMaxVms() { return s('FERRY_PLAN_MAX_VMS'); },
  /** Guest preflight appliances (libguestfs, ~1 GiB each) running for requests, per caller and in this process
   *  (0 = no cap); over the caller's cap 429, over the total 503 (platform/limits.ts). */
  get guestAppliances() { return { perCaller: s('FERRY_GUEST_APPLIANCES_PER_CALLER'), total: s('FERRY_GUEST_APPLIANCES') }; },
  /** nbdkit processes serving source disks to those appliances, each counted, per caller and in this process. */
  get nbdkitProcesses() { return { perCaller: s('FERRY_NBDKIT_PROCESSES_PER_CALLER'), total: s('FERRY_NBDKIT_PROCESSES') }; },
  /** How long POST /vms/shutdown and /vms/poweroff wait for their vm_power job (a worker with vsphere_access);
   *  past it the job is cancelled and the answer is 504. */
  get vmActionWaitSeconds() { return s('FERRY_VM_ACTION_WAIT_SECONDS'); },
  get hostname() { return os.hostname(); },
  version: '1.0.0',
};
