// Every setting Ferry reads from its environment, declared once: name, type, default, validation and a one-line doc.
// Code reads a value with setting('NAME') (parsed and validated here, so a typo is an error naming the variable,
// never a NaN); every service checks them all when it starts (exitOnBadSettings, from platform/check-settings.ts),
// and docs/configuration.md is generated from this table (scripts/gen-settings-doc.ts; test/deploy/settings.test.ts
// fails while it is stale). Variables that only tests, benchmarks, the image build or compose itself read are in
// NOT_SETTINGS below, with where they are read. It imports nothing of Ferry's own (joi and ipaddr.js only), so
// every layer may use it.
import path from 'node:path';
import ipaddr from 'ipaddr.js';
import Joi from 'joi';

export type Group = 'process' | 'api' | 'limits' | 'jobs' | 'storage' | 'vsphere' | 'libvirt' | 'guest' | 'programs' | 'cli';

export const GROUPS: Record<Group, string> = {
  process: 'Processes and Redis',
  api: 'HTTP APIs and security',
  limits: 'Limits on the APIs',
  jobs: 'Jobs, workers and plans',
  storage: 'Storage and exports',
  vsphere: 'vSphere',
  libvirt: 'libvirt',
  guest: 'Guest inspection and repair',
  programs: 'External programs',
  cli: 'The `ferry` command',
};

/** One declared setting: `schema` turns the raw text into the value (joi, with conversion), `expect` says in words
 *  what is accepted (errors and docs), `def` is the value when unset or empty. `secret`: never shown. */
export interface Decl<T> { schema: Joi.Schema; expect: string; def: T; defText: string; doc: string; group: Group; secret?: boolean }

interface Opts { group: Group; doc: string; secret?: boolean }
const decl = <T>(schema: Joi.Schema, expect: string, def: T, o: Opts, defText = def === undefined ? '(unset)' : String(def)): Decl<T> =>
  ({ schema, expect, def, defText, ...o });

function int(def: number, min: number, max: number, o: Opts): Decl<number>;
function int(def: undefined, min: number, max: number, o: Opts): Decl<number | undefined>;
function int(def: number | undefined, min: number, max: number, o: Opts) {
  return decl(Joi.number().integer().min(min).max(max), `a whole number from ${min} to ${max}`, def, o);
}
/** A number that may have a fraction (seconds below one). */
const num = (def: number, min: number, max: number, o: Opts) => decl(Joi.number().min(min).max(max), `a number from ${min} to ${max}`, def, o);
function port(def: number, o: Opts): Decl<number>;
function port(def: undefined, o: Opts): Decl<number | undefined>;
function port(def: number | undefined, o: Opts) { return decl(Joi.number().integer().min(0).max(65535), 'a TCP port from 0 to 65535', def, o); }

const TRUE = ['1', 'yes', 'on'];
const FALSE = ['0', 'no', 'off'];
function bool(def: boolean, o: Opts): Decl<boolean>;
function bool(def: undefined, o: Opts): Decl<boolean | undefined>;
function bool(def: boolean | undefined, o: Opts) {
  return decl(Joi.boolean().truthy(...TRUE).falsy(...FALSE), '1, 0, true, false, yes, no, on or off', def, o);
}

function text(def: string, o: Opts & { pattern?: RegExp; expect?: string; max?: number }): Decl<string>;
function text(def: undefined, o: Opts & { pattern?: RegExp; expect?: string; max?: number }): Decl<string | undefined>;
function text(def: string | undefined, o: Opts & { pattern?: RegExp; expect?: string; max?: number }) {
  let s = Joi.string().max(o.max ?? 4096);
  if (o.pattern) s = s.pattern(o.pattern);
  return decl(s, o.expect ?? `text of at most ${o.max ?? 4096} characters`, def, o);
}

function oneOf<V extends string>(values: readonly V[], def: V, o: Opts): Decl<V>;
function oneOf<V extends string>(values: readonly V[], def: undefined, o: Opts): Decl<V | undefined>;
function oneOf<V extends string>(values: readonly V[], def: V | undefined, o: Opts) {
  return decl(Joi.string().valid(...values), `one of ${values.join(', ')}`, def, o);
}

/** A file or folder: no NUL, not empty; relative paths are taken from the process's working directory. */
const PATH = /^[^\0]+$/;
function file(def: string, o: Opts & { absolute?: boolean }): Decl<string>;
function file(def: undefined, o: Opts & { absolute?: boolean }): Decl<string | undefined>;
function file(def: string | undefined, o: Opts & { absolute?: boolean }) {
  const s = Joi.string().max(4096).pattern(PATH).custom((v: string, h) => (o.absolute && !path.isAbsolute(v) ? h.error('any.invalid') : v));
  return decl(s, o.absolute ? 'an absolute path' : 'a path', def, o);
}
/** A program: a name looked up on PATH, or a path to it. */
const program = (def: string, o: Opts) => decl(Joi.string().max(4096).pattern(/^[^\s\0]+$/), 'a program name or path, without spaces', def, o);

/** Items separated by `sep`, each valid for `item` (empty items are dropped); the value is the array. */
const list = (sep: string, item: Joi.Schema, itemExpect: string, o: Opts, def: string[] = []) => decl<string[]>(Joi.string().custom((v: string, h) => {
  const items = v.split(sep).map((x) => x.trim()).filter(Boolean);
  for (const x of items) if (item.validate(x).error) return h.error('any.invalid');
  return items;
}), `${itemExpect}, separated by "${sep}"`, def, o, def.length ? def.join(sep) : '(none)');

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
/** A duration in milliseconds (the value), given as parseDurationMs reads it. */
const duration = (def: string, o: Opts) => decl<number>(Joi.string().custom((v: string, h) => {
  const ms = parseDurationMs(v);
  return ms === null || ms <= 0 ? h.error('any.invalid') : ms;
}), 'a duration such as 7d, 12h, 90s or 1h30m (plain numbers are seconds)', parseDurationMs(def)!, o, def);

const HOST_ITEM = Joi.string().pattern(/^[^\s/]+$/);
/** An IP address or a CIDR, as platform/client-address.ts parses them (ipaddr.js). */
const ADDRESS_OR_CIDR = Joi.string().custom((v: string, h) => {
  try { if (v.includes('/')) ipaddr.parseCIDR(v); else if (!ipaddr.isValid(v)) return h.error('any.invalid'); } catch { return h.error('any.invalid'); }
  return v;
});
const CAPABILITY = Joi.string().pattern(/^[a-z][a-z0-9_]{0,63}$/);
const ABSOLUTE = Joi.string().custom((v: string, h) => (path.isAbsolute(v) ? v : h.error('any.invalid')));
const URI = /^[a-z][a-z0-9+.-]*:\/\/\S*$/i;
const P: Group = 'process', A: Group = 'api', L: Group = 'limits', J: Group = 'jobs', S: Group = 'storage';
const V: Group = 'vsphere', LV: Group = 'libvirt', G: Group = 'guest', PR: Group = 'programs';

/** The spawn caps (platform/limits.ts), per caller and in all, in one process; 0 = no cap. */
const perCaller = (def: number, what: string) => int(def, 0, 100_000, { group: L,
  doc: `${what} one caller may run at once in one process (over it: 429; 0 = no cap)` });
const inAll = (def: number, what: string) => int(def, 0, 100_000, { group: L,
  doc: `${what} all callers may run at once in one process (over it: 503; 0 = no cap)` });

// Long because: one table, a line per setting.
export const SETTINGS = {
  // Processes and Redis
  REDIS_URL: text('redis://127.0.0.1:6379', { group: P, secret: true, pattern: /^(redis|rediss|redis-sentinel|redis-cluster):\/\/\S+$/,
    expect: 'a redis://, rediss://, redis-sentinel:// or redis-cluster:// URL',
    doc: 'the Redis every service shares (platform/redis.ts: sentinel and cluster forms); may carry a password' }),
  REDIS_PASSWORD: text(undefined, { group: P, secret: true, doc: 'password for Redis Sentinel and Cluster nodes (a single node takes it in REDIS_URL)' }),
  FERRY_PREFIX: text('ferry', { group: P, max: 100, pattern: /^\S+$/, expect: 'a key prefix without spaces, at most 100 characters',
    doc: 'prefix of every Redis key Ferry writes; on Redis Cluster a hash tag such as {ferry}' }),
  LOG_LEVEL: decl(Joi.string().lowercase().valid('debug', 'info', 'warn', 'error'), 'one of debug, info, warn, error', 'info',
    { group: P, doc: 'least level of the JSON log lines on stderr (audit lines are always written)' }),
  FERRY_SHUTDOWN_GRACE_SECONDS: int(30, 0, 86_400, { group: P, doc: 'seconds running jobs get to finish after SIGTERM before they are handed back' }),
  FERRY_DATA_DIR: file(undefined,
    { group: P, doc: 'folder of Ferry\'s own data: a storage root, exports under exports/ when FERRY_EXPORT_DIR is unset, the cluster script\'s Redis' }),
  FERRY_CONFIG: file(undefined, { group: P, doc: 'the daemon\'s YAML configuration file (daemon, scheduler, notifier), when --config is not given' }),
  FERRY_REDIS_PORT: port(6379, { group: P, doc: 'port of the private redis-server scripts/cluster.ts (npm start) starts when REDIS_URL is unset' }),
  WORKER1_METRICS_PORT: port(9101, { group: P, doc: '/metrics port of worker-1 of scripts/cluster.ts (npm start)' }),
  WORKER2_METRICS_PORT: port(9102, { group: P, doc: '/metrics port of worker-2 of scripts/cluster.ts (npm start)' }),
  HEALTH_PORT: port(8000, { group: P, doc: 'port the container image\'s HEALTHCHECK asks /health on (the Dockerfile reads it; compose sets it per service)' }),
  // HTTP APIs and security
  GATEWAY_PORT: port(8000, { group: A, doc: 'port of the gateway (the worker job protocol)' }),
  DAEMON_PORT: port(8080, { group: A, doc: 'port of the daemon API when neither -addr nor daemon.addr is given' }),
  FERRY_HOST: text(undefined, { group: A, max: 255, pattern: /^[A-Za-z0-9.:%[\]-]+$/, expect: 'an address or host name to listen on',
    doc: 'listen address; unset: 127.0.0.1 without API keys, 0.0.0.0 with them' }),
  FERRY_INSECURE_NO_AUTH: bool(false, { group: A, doc: 'allow listening beyond loopback without API keys (on purpose only)' }),
  FERRY_API_KEYS: text(undefined, { group: A, secret: true, max: 1_000_000,
    doc: 'API keys, comma-separated name:role:key, role:key or a bare key (admin); any key turns auth on (checked at start by platform/auth.ts)' }),
  FERRY_API_KEYS_FILE: file(undefined, { group: A, doc: 'a file of API keys, one entry per line, as FERRY_API_KEYS' }),
  FERRY_SECRET_KEY: text(undefined,
    { group: A, secret: true, doc: 'key that encrypts per-job passwords, webhook secrets, sensitive spec values and console messages through workers ' +
      'in Redis; the same on every service' }),
  FERRY_ALLOWED_HOSTS: list(',', HOST_ITEM, 'host names, ".suffix" or "*"',
    { group: A, doc: 'Host header names accepted beside IP addresses and localhost (others: 421)' }),
  FERRY_CORS_ORIGINS: list(',', Joi.alternatives(Joi.string().valid('*'), Joi.string().pattern(/^[a-z][a-z0-9+.-]*:\/\/[^\s/]+\/*$/i)),
    'origins (scheme://host[:port]) or "*"', { group: A, doc: 'browser origins allowed to call the APIs (CORS); none by default' }),
  FERRY_TRUSTED_PROXIES: list(',', ADDRESS_OR_CIDR, 'IP addresses or CIDRs', { group: A, doc: 'peers whose X-Forwarded-For is believed; none by default' }),
  FERRY_SSE_HEARTBEAT_SECONDS: num(15, 0.1, 3600, { group: A, doc: 'seconds between SSE keep-alive comments' }),
  FERRY_VM_ACTION_WAIT_SECONDS: int(120, 1, 86_400, { group: A, doc: 'how long POST /vms/shutdown and /vms/poweroff wait for their job before 504' }),
  FERRY_WEBHOOK_ALLOW_LOOPBACK: bool(undefined, { group: A, doc: 'allow webhook targets on loopback (overrides webhooks.allow_loopback)' }),
  FERRY_WEBHOOK_ALLOW_PRIVATE: bool(undefined, { group: A, doc: 'allow webhook targets on private addresses (overrides webhooks.allow_private)' }),
  JOB_TIMEOUT: decl<string | undefined>(Joi.string().custom((v: string, h) => {
    const ms = /^(\d+(\.\d+)?(ms|h|m|s))+$/.test(v) ? parseDurationMs(v) : null;
    return ms === null || ms <= 0 || ms > 7 * 86_400_000 ? h.error('any.invalid') : v;
  }), 'a duration such as 48h, 90m or 30s, at most 168h', undefined, { group: A, doc: 'default job timeout of the daemon API (overrides daemon.job_timeout)' }),
  // Limits on the APIs
  FERRY_RATE_LIMIT: int(60_000, 0, 100_000_000, { group: L, doc: 'requests one caller may make per window (0 = no limit)' }),
  FERRY_RATE_WINDOW_SECONDS: int(60, 1, 86_400, { group: L, doc: 'the rate limit\'s window' }),
  FERRY_REFUSAL_LIMIT: int(600, 0, 100_000_000, { group: L, doc: 'refused requests (401, 403) one client address may cause per window before 429 (0 = off)' }),
  FERRY_REFUSAL_WINDOW_SECONDS: int(60, 1, 86_400, { group: L, doc: 'the refusal budget\'s window' }),
  FERRY_REFUSAL_AUDIT_SAMPLE: int(20, 0, 1_000_000, { group: L, doc: 'refusals of one address written to the audit stream per window; the rest are counted' }),
  FERRY_REFUSAL_AUDIT_MAX_ENTRIES: int(20_000, 100, 100_000_000, { group: L, doc: 'length cap of the audit\'s refusal stream' }),
  FERRY_AUDIT_MAX_ENTRIES: int(200_000, 1000, 100_000_000, { group: L, doc: 'length cap of the audit stream of accepted requests' }),
  FERRY_CONSOLE_SESSIONS_PER_CALLER: perCaller(4, 'console sessions'),
  FERRY_CONSOLE_SESSIONS: inAll(32, 'console sessions'),
  FERRY_VIRT_CALLS_PER_CALLER: perCaller(32, 'libvirt calls'),
  FERRY_VIRT_CALLS: inAll(64, 'libvirt calls'),
  FERRY_PROBES_PER_CALLER: perCaller(16, 'image probes (qemu-img)'),
  FERRY_PROBES: inAll(32, 'image probes (qemu-img)'),
  FERRY_GUEST_APPLIANCES_PER_CALLER: perCaller(2, 'guest preflight appliances (libguestfs, ~1 GiB each)'),
  FERRY_GUEST_APPLIANCES: inAll(4, 'guest preflight appliances (libguestfs, ~1 GiB each)'),
  FERRY_NBDKIT_PROCESSES_PER_CALLER: perCaller(64, 'nbdkit processes serving source disks to the preflight'),
  FERRY_NBDKIT_PROCESSES: inAll(128, 'nbdkit processes serving source disks to the preflight'),
  FERRY_PLAN_MAX_STORED: int(1000, 1, 1_000_000, { group: L, doc: 'stored plans, archived ones included (past it POST /plans is 409)' }),
  FERRY_PLAN_MAX_VMS: int(1000, 1, 100_000, { group: L, doc: 'VMs in one plan (past it 400 naming vms)' }),
  // Jobs, workers and plans
  FERRY_WORKER_STALE_SECONDS: int(300, 1, 86_400, { group: J, doc: 'a worker whose heartbeat is older is stale and its jobs are handed back' }),
  FERRY_LEASE_SECONDS: int(30, 1, 3600, { group: J, doc: 'lease of a job held by a worker process, renewed while it runs' }),
  FERRY_HTTP_LEASE_SECONDS: int(undefined, 1, 86_400, { group: J, doc: 'lease of a job handed out over HTTP; unset: 1.2 x FERRY_WORKER_STALE_SECONDS + 10' }),
  FERRY_HEARTBEAT_SECONDS: int(10, 1, 3600, { group: J, doc: 'seconds between a worker\'s heartbeats' }),
  FERRY_RETRY_BACKOFF_MS: int(2000, 0, 3_600_000, { group: J, doc: 'first retry delay in ms; doubles each attempt, with jitter, capped at 5 minutes' }),
  FERRY_RECONCILE_SECONDS: int(30, 1, 86_400, { group: J, doc: 'how often a QUEUED job missing from its BullMQ queue is put back' }),
  FERRY_TIMEOUT_SWEEP_SECONDS: int(5, 1, 86_400, { group: J, doc: 'how often the gateway ends HTTP workers\' attempts past their timeout' }),
  FERRY_EVENTS_PER_JOB: int(10_000, 1, 10_000_000, { group: J, doc: 'progress events kept per job' }),
  FERRY_JOB_RETENTION: duration('7d', { group: J, doc: 'how long a finished job\'s record, history and events stay in Redis' }),
  FERRY_CALL_RETENTION: duration('2m',
    { group: J,
    doc: 'how long a completed call of the call lane (the daemon\'s virsh_call with FERRY_LIBVIRT_VIA=worker) stays in Redis after it ended; the daemon has ' +
         'read its answer by then. Listed only with GET /jobs?internal=true (admin)' }),
  FERRY_CALL_FAILED_RETENTION: duration('1h',
    { group: J, doc: 'how long a failed or cancelled call of the call lane stays in Redis, to be looked at (GET /jobs?internal=true, GET /jobs/{id})' }),
  FERRY_WORKER_PRUNE_AFTER: duration('1d', { group: J, doc: 'a worker record idle this long (holding no job) is removed' }),
  FERRY_EXTRA_CAPABILITIES: list(',', CAPABILITY, 'capability names ([a-z][a-z0-9_]*)', { group: J, doc: 'capability names accepted beside the known set' }),
  FERRY_WORKER_CAPABILITIES: list(',', CAPABILITY, 'capability names ([a-z][a-z0-9_]*)',
    { group: J, doc: 'a worker\'s capabilities (--capabilities overrides)' }, ['img_tool']),
  FERRY_EXECUTION_MODE: oneOf(['PROCESS', 'CONTAINER', 'PRIVILEGED_CONTAINER'] as const, 'PROCESS',
    { group: J, doc: 'a worker\'s execution mode (--execution-mode overrides)' }),
  FERRY_WORKER_CONCURRENCY: int(1, 1, 64, { group: J, doc: 'jobs one worker process runs at once (--concurrency overrides)' }),
  FERRY_WORKER_CALL_SLOTS: int(2, 1, 16,
    { group: J,
    doc: 'slots of a worker process for the call lane only (the daemon\'s virsh_call with FERRY_LIBVIRT_VIA=worker, vm_power, guest_preflight, a plan\'s ' +
         'rollback_kvm), beside its FERRY_WORKER_CONCURRENCY job slots, so a call starts while long jobs hold every job slot (--call-slots overrides)' }),
  FERRY_WORKER_METRICS_PORT: port(undefined, { group: J, doc: 'a worker\'s /metrics port (0 = any free port; unset = none; --metrics-port overrides)' }),
  FERRY_WORKER_ID: text(undefined, { group: J, max: 200, pattern: /^\S+$/, expect: 'a name without spaces, at most 200 characters',
    doc: 'a worker\'s id (--id overrides); unset: <hostname>-<pid>' }),
  FERRY_GUEST_PREFLIGHT: bool(true, { group: J, doc: 'plans run the guest-level preflight (an appliance per VM) unless a plan says otherwise' }),
  FERRY_GUEST_PREFLIGHT_SECONDS: int(600, 1, 86_400, { group: J, doc: 'time limit of one plan\'s guest preflight' }),
  FERRY_REPAIR_BESIDE_COPY_NICE: int(0, 0, 19, { group: J,
    doc: 'how much lower the CPU priority of the repair beside the copy is than the worker\'s (0: the same; '
      + 'higher: the copy keeps the CPU it needs and the repair takes what is left)' }),
  FERRY_GUEST_PREFLIGHT_CACHE_MB: int(256, 16, 65_536,
    { group: J, doc: 'nbdkit cache (MiB, in /dev/shm) per source disk read by the guest preflight or the repair beside the copy' }),
  // Storage and exports
  FERRY_INPUT_ROOTS: list(':', ABSOLUTE, 'absolute paths', { group: S, doc: 'folders jobs may read from; unset: the temp folder, /srv and FERRY_DATA_DIR' }),
  FERRY_OUTPUT_ROOTS: list(':', ABSOLUTE, 'absolute paths', { group: S, doc: 'folders jobs may write to; unset: as FERRY_INPUT_ROOTS' }),
  FERRY_EXPORT_DIR: file(undefined, { group: S, doc: 'where migrate_vm exports go (storage every worker of the job shares); unset: FERRY_DATA_DIR/exports' }),
  FERRY_EXPORTS_PER_MANAGER: int(4, 1, 1000, { group: S, doc: 'exports one worker runs at once against one vSphere manager' }),
  FERRY_EXPORT_CHUNK_BYTES: int(8 * 1024 * 1024, 4096, 1024 * 1024 * 1024, { group: S, doc: 'size of one ranged request of a datastore download' }),
  FERRY_EXPORT_RETRIES: int(5, 0, 100, { group: S, doc: 'retries of one failed download chunk' }),
  FERRY_ONE_PASS_BLOCK_BYTES: int(64 * 1024 * 1024, 65_536, 1024 * 1024 * 1024,
    { group: S, doc: 'block of a one-pass disk\'s block hash list (sha256 per block of the bytes as served, checked after the repair\'s merge)' }),
  // vSphere
  GOVC_URL: text(undefined, { group: V, secret: true, pattern: /^\S+$/, expect: 'a host or https:// URL of the manager',
    doc: 'the default vSphere manager (govc\'s name; may carry user:password@)' }),
  GOVC_USERNAME: text(undefined, { group: V, doc: 'its user name' }),
  GOVC_PASSWORD: text(undefined, { group: V, secret: true, doc: 'its password' }),
  GOVC_INSECURE: bool(false, { group: V, doc: 'accept the default manager\'s untrusted TLS certificate' }),
  FERRY_VSPHERE_MANAGERS: list(',', Joi.alternatives(HOST_ITEM, Joi.string().pattern(URI)), 'hosts, host:port or URLs',
    { group: V, doc: 'managers a request or job may name beside GOVC_URL\'s' }),
  FERRY_VSPHERE_CA: file(undefined, { group: V, doc: 'PEM file of the CA(s) the managers\' certificates are checked against' }),
  FERRY_SOURCE_CHECK_SECONDS: num(5, 0.2, 3600, { group: V, doc: 'how often a running migration checks its source VM is still as it was' }),
  // libvirt
  FERRY_LIBVIRT_URI: text(undefined, { group: LV, pattern: URI, expect: 'a libvirt URI such as qemu:///system or qemu+ssh://host/system',
    doc: 'the default libvirt host; unset: qemu:///system (and ferry-convert\'s virt_test boots with qemu here)' }),
  FERRY_LIBVIRT_URIS: list(',', Joi.string().pattern(URI), 'libvirt URIs', { group: LV, doc: 'every other libvirt URI a job or plan may name' }),
  FERRY_LIBVIRT_BRIDGES: list(',', Joi.string().pattern(/^[A-Za-z0-9_.:-]{1,15}$/), 'bridge names',
    { group: LV, doc: 'host bridges a NIC may name directly; none by default (libvirt networks only)' }),
  FERRY_LIBVIRT_POOL: text('ferry', { group: LV, max: 255, pattern: /^[^\s/]+$/, expect: 'a pool name without spaces or "/"',
    doc: 'storage pool imported volumes go to' }),
  FERRY_LIBVIRT_POOL_DIR: file('/var/lib/libvirt/images/ferry', { group: LV, absolute: true, doc: 'its folder, when Ferry creates the pool' }),
  FERRY_LIBVIRT_VIA: oneOf(['direct', 'worker'] as const, 'direct', { group: LV,
    doc: 'how the daemon reaches libvirt: direct (virsh on its own PATH) or worker (each virsh command a virsh_call job on a worker with libvirt_access; the ' +
         'shipped compose and Kubernetes daemon)' }),
  FERRY_LIBVIRT_DOMAIN_TYPE: oneOf(['kvm', 'qemu'] as const, undefined, { group: LV,
    doc: 'domain type of imported guests; unset: kvm when the host offers it and FERRY_GUESTFS_KVM=1, else qemu' }),
  FERRY_VIRSH_SESSION: bool(true, { group: LV, doc: 'run read-only virsh commands in one long-lived virsh session rather than a process each' }),
  FERRY_VIRT_BATCH_CONCURRENCY: int(4, 1, 64, { group: LV, doc: 'lanes of a /virt batch request' }),
  // Guest inspection and repair
  FERRY_GUESTFS_KVM: bool(false, { group: G, doc: 'libguestfs appliances (and the domain type) may use KVM; else TCG' }),
  FERRY_GUESTFS_LAUNCH_SECONDS: num(300, 0.1, 86_400, { group: G, doc: 'time an appliance launch may take before it is killed and tried again' }),
  FERRY_OVMF_CODE: file('/usr/share/OVMF/OVMF_CODE_4M.fd', { group: G, absolute: true, doc: 'UEFI firmware code for UEFI guests' }),
  FERRY_OVMF_VARS: file('/usr/share/OVMF/OVMF_VARS_4M.fd', { group: G, absolute: true, doc: 'UEFI variable store template' }),
  FERRY_VIRTIO_WIN: file(undefined, { group: G, doc: 'virtio-win driver tree or ISO for Windows guests; unset: /usr/share/virtio-win' }),
  LIBGUESTFS_TMPDIR: file(undefined, { group: G, doc: 'libguestfs\'s own: its scratch folder (a worker checks it is writable); unset: TMPDIR' }),
  LIBGUESTFS_CACHEDIR: file(undefined, { group: G, doc: 'libguestfs\'s own: its appliance cache (checked like LIBGUESTFS_TMPDIR)' }),
  LIBGUESTFS_BACKEND: text(undefined, { group: G, doc: 'libguestfs\'s own; unset: Ferry gives its tools direct' }),
  LIBGUESTFS_BACKEND_SETTINGS: text(undefined, { group: G, doc: 'libguestfs\'s own; unset: force_tcg unless FERRY_GUESTFS_KVM=1' }),
  // External programs
  QEMU_IMG: program('qemu-img', { group: PR, doc: 'qemu-img' }),
  FERRY_QEMU_SYSTEM: program('qemu-system-x86_64', { group: PR, doc: 'qemu for ferry-convert\'s virt_test boots without libvirt' }),
  GUESTFISH: program('guestfish', { group: PR, doc: 'guestfish' }),
  HIVEXREGEDIT: program('hivexregedit', { group: PR, doc: 'hivexregedit (Windows registry edits)' }),
  NBDKIT: program('nbdkit', { group: PR, doc: 'nbdkit (the guest preflight\'s source disks)' }),
  FERRY_PYTHON: program('/usr/bin/python3', { group: PR, doc: 'python3 for the console\'s pty helper' }),
  // The ferry command
  FERRY_URL: text('http://localhost:8080', { group: 'cli', pattern: /^https?:\/\/\S+$/, expect: 'an http:// or https:// URL',
    doc: 'the daemon the `ferry` command talks to (--url overrides)' }),
  FERRY_API_KEY: text(undefined, { group: 'cli', secret: true, doc: 'the API key the `ferry` command sends (--key overrides)' }),
};

export type SettingName = keyof typeof SETTINGS;
type ValueOf<D> = D extends Decl<infer T> ? T : never;
export type SettingValue<K extends SettingName> = ValueOf<(typeof SETTINGS)[K]>;

/** Variables named FERRY_* (or read beside them) that are not settings of the product, and who reads them. */
export const NOT_SETTINGS: Record<string, string> = {
  FERRY_NODE_ARGS: 'test helpers: extra node flags for the services they start (benchmarks\' --cpu-prof)',
  FERRY_TEST_LOGS: 'test helpers: copy the started services\' output to the test\'s stderr',
  FERRY_TEST_TIER: 'scripts/test.ts: the fast tier', FERRY_TEST_TIMES: 'scripts/test.ts: where test times are kept',
  FERRY_FRESH_PROOFS: 'test/helpers/proofs.ts: run every recorded proof again',
  FERRY_PROOF_DIR: 'test/helpers/proofs.ts', FERRY_PROOF_LOG: 'test/helpers/proofs.ts', FERRY_PROOF_MAIN_PID: 'test/helpers/proofs.ts',
  FERRY_CACHE_DIR: 'test fixtures: where built guest images are cached', FERRY_DEBIAN_MIRROR: 'test fixtures: the Debian mirror',
  FERRY_FIRSTBOOT_TIMEOUT: 'test fixtures: first-boot wait', FERRY_FIXTURE_VERBOSE: 'test fixtures: verbose build',
  FERRY_PROGRAMS_FILE: 'test helpers: the programs list a test records against', FERRY_PROGRAM_LOG: 'test helpers: the program record',
  FERRY_SETUP_GUESTFS: 'scripts/setup.sh: install libguestfs', FERRY_SETUP_LIBVIRT: 'scripts/setup.sh: install libvirt',
  FERRY_BENCH_TAG: 'benchmarks: a run\'s tag',
  FERRY_FIXTURE_JOBS: 'scripts/fixtures.ts: fixture builds run at once', FERRY_TIER_GUARD: 'test/helpers/tier.hooks.ts: the fast tier\'s guard',
  FERRY_JOBS_PER_WORKER: 'deploy/k8s/scaling (a comment): the KEDA target, not a variable', FERRY_TEST_UNSET_PW: 'a test\'s own variable (left unset)',
  FERRY_NOPE: 'a test\'s own variable (left unset)',
  FERRY_TEST_OUT: 'a test\'s own variable', FERRY_TEST_PW: 'a test\'s own variable', FERRY_TEST_SRC: 'a test\'s own variable',
  FERRY_IMAGE: 'compose.yaml: the app image', FERRY_TAG: 'compose.yaml: the image tag', FERRY_WORKER_IMAGE: 'compose.yaml: the worker image',
  FERRY_MIGRATE_IMAGE: 'compose.yaml: the migration worker image', FERRY_MIGRATE_CONCURRENCY: 'compose.yaml: FERRY_WORKER_CONCURRENCY of worker-migrate',
  FERRY_IMAGE_CAPABILITIES: 'Dockerfile: the capabilities whose packages an image installs',
  FERRY_VSPHERE_CA_FILE: 'compose.yaml: the file mounted as FERRY_VSPHERE_CA', FERRY_LIBVIRT_SSH_KEY_FILE: 'compose.yaml: the libvirt ssh key file',
  FERRY_LIBVIRT_KNOWN_HOSTS_FILE: 'compose.yaml: the libvirt hosts\' keys file', GRAFANA_ADMIN_PASSWORD: 'compose.yaml: Grafana\'s admin password',
  PATH: 'the system\'s: where programs are found (a worker checks its capabilities\' programs on it)',
  TMPDIR: 'the system\'s: the temp folder (a storage root by default; libguestfs\'s scratch unless LIBGUESTFS_TMPDIR)',
  XDG_RUNTIME_DIR: 'the system\'s: where a qemu:///session libvirt keeps its socket',
};

export class SettingError extends Error {
  constructor(readonly setting: string, message: string) { super(message); this.name = 'SettingError'; }
}

const isName = (n: string): n is SettingName => Object.hasOwn(SETTINGS, n);
const cache = new Map<string, { raw: string; value: unknown }>();

/** The value of a declared setting from `env` (the process's by default): its default when unset or empty,
 *  else the parsed value; throws SettingError naming the variable and what it must be. */
export function setting<K extends SettingName>(name: K, env: NodeJS.ProcessEnv = process.env): SettingValue<K> {
  const d = SETTINGS[name] as Decl<unknown>;
  const raw = env[name];
  if (raw === undefined || raw.trim() === '') return copy(d.def) as SettingValue<K>;
  const hit = cache.get(name);
  if (hit && hit.raw === raw) return copy(hit.value) as SettingValue<K>;
  const { value, error } = d.schema.validate(d.secret ? raw : raw.trim(), { convert: true }) as { value: unknown; error?: Error };
  if (error) throw new SettingError(name,
    `${name} must be ${d.expect}, got ${d.secret ? `a value of ${raw.length} characters (not shown)` : JSON.stringify(raw)}`);
  cache.set(name, { raw, value });
  return copy(value) as SettingValue<K>;
}
const copy = (v: unknown): unknown => (Array.isArray(v) ? (v as unknown[]).slice() : v);

/** Whether `name` is set to something (not unset, not empty): for choices a setting's presence makes. */
export const isSet = (name: SettingName, env: NodeJS.ProcessEnv = process.env): boolean => (env[name] ?? '').trim() !== '';

/** A setting named at run time (the spawn caps' FERRY_<NAME>_PER_CALLER); throws when it is not declared. */
export function settingNamed(name: string, env: NodeJS.ProcessEnv = process.env): unknown {
  if (!isName(name)) throw new Error(`${name} is not a declared setting (platform/settings.ts)`);
  return setting(name, env);
}

/** What is wrong with the environment: one message per bad variable, in declaration order. */
export function settingProblems(env: NodeJS.ProcessEnv = process.env, names: readonly SettingName[] = settingNames()): string[] {
  const out: string[] = [];
  for (const n of names) {
    try { setting(n, env); } catch (e) { out.push((e as Error).message); }
  }
  return out;
}

export const settingNames = (): SettingName[] => Object.keys(SETTINGS) as SettingName[];
/** The settings the services read: all but the `ferry` command's own. */
export const serviceSettings = (): SettingName[] => settingNames().filter((n) => SETTINGS[n].group !== 'cli');

/** The `ferry` command's own settings. */
export const cliSettings = (): SettingName[] => settingNames().filter((n) => SETTINGS[n].group === 'cli');

/** At a process's start: a bad value stops it with one line on stderr naming each bad variable (exit 2). */
export function exitOnBadSettings(who: string, names: readonly SettingName[] = serviceSettings(), env: NodeJS.ProcessEnv = process.env): void {
  const bad = settingProblems(env, names);
  if (!bad.length) return;
  process.stderr.write(`${who}: invalid configuration: ${bad.join('; ')}\n`);
  process.exit(2);
}
