// The daemon's YAML configuration file (also read by the scheduler and the notifier), validated at start so a
// typo stops the process with a message naming the key instead of being ignored.
import { readFileSync } from 'node:fs';
import Joi from 'joi';
import yaml from 'js-yaml';
import { Auth, AuthConfigError, loadAuth } from './auth';
import { SettingError, setting } from './settings';

/** Go-style durations: 48h, 1h30m, 90s, 500ms. */
export function parseDuration(s: string): number | null {
  const re = /(\d+(?:\.\d+)?)(ms|h|m|s)/g;
  if (!/^(\d+(\.\d+)?(ms|h|m|s))+$/.test(s)) return null;
  const mult: Record<string, number> = { h: 3600, m: 60, s: 1, ms: 0.001 };
  let total = 0;
  for (const m of s.matchAll(re)) total += Number(m[1]) * mult[m[2]];
  return total;
}

export function formatDuration(seconds: number): string {
  const s = Math.floor(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return `${h ? h + 'h' : ''}${h || m ? m + 'm' : ''}${s % 60}s`;
}

const duration = Joi.string().custom((v: string, h) => {
  const n = parseDuration(v);
  if (n === null || n <= 0) return h.message({ custom: `{{#label}} must be a duration such as 48h, 90m or 30s, got "${v}"` });
  if (n > 7 * 24 * 3600) return h.message({ custom: '{{#label}} must be at most 168h (7 days)' });
  return v;
});

const schema = Joi.object({
  daemon: Joi.object({
    addr: Joi.string().pattern(/^[^:]*:\d{1,5}$/).messages({ 'string.pattern.base': '{{#label}} must be host:port or :port' }),
    job_timeout: duration.default('24h'),
    parallel_downloads: Joi.number().integer().min(1).max(64).default(4),
  }).default(),
  metrics: Joi.object({
    enabled: Joi.boolean().default(true),
    port: Joi.number().integer().min(0).max(65535).description('serve /metrics on its own port; unset = on the API port'),
  }).default(),
  auth: Joi.object({
    enabled: Joi.boolean().default(false).description('true requires a key; any key configured turns auth on regardless'),
    api_keys: Joi.array().items(Joi.string().min(16).max(300)).default([]).description(
      'entries as in FERRY_API_KEYS: name:role:key, role:key or a bare key (admin); also FERRY_API_KEYS and FERRY_API_KEYS_FILE'),
  }).default(),
  webhooks: Joi.object({
    allow_private: Joi.boolean().default(false).description(
      'allow targets on private addresses (RFC 1918, unique-local fc00::/7, CGNAT 100.64.0.0/10); also FERRY_WEBHOOK_ALLOW_PRIVATE=1. Link-local ' +
      '(169.254.169.254) is never allowed'),
    allow_loopback: Joi.boolean().default(false).description('allow targets on 127.0.0.0/8 and ::1; also FERRY_WEBHOOK_ALLOW_LOOPBACK=1'),
    concurrency: Joi.number().integer().min(1).max(1000).default(50),
    backoff_ms: Joi.number().integer().min(10).max(600_000).default(1000).description('first retry delay; doubles each attempt, with jitter'),
  }).default(),
  websocket: Joi.object({
    status_interval_seconds: Joi.number().min(0.1).max(3600).default(2),
    ping_interval_seconds: Joi.number().min(0.5).max(3600).default(30),
    max_buffered_bytes: Joi.number().integer().min(1024).default(1024 * 1024),
  }).default(),
}).label('config');

export interface DaemonConfig {
  daemon: { addr?: string; job_timeout: string; parallel_downloads: number };
  metrics: { enabled: boolean; port?: number };
  auth: { enabled: boolean; api_keys: string[] };
  webhooks: { allow_private: boolean; allow_loopback: boolean; concurrency: number; backoff_ms: number };
  websocket: { status_interval_seconds: number; ping_interval_seconds: number; max_buffered_bytes: number };
  /** Derived: daemon.job_timeout, or JOB_TIMEOUT when set. */
  jobTimeoutSeconds: number;
  /** Derived: every key (auth.api_keys, FERRY_API_KEYS, FERRY_API_KEYS_FILE); platform/auth.ts. */
  keys: Auth;
}

export class ConfigError extends Error {}

/** A declared setting (platform/settings.ts); a bad value is this module's ConfigError, naming the variable. */
function envSetting<K extends 'JOB_TIMEOUT' | 'FERRY_WEBHOOK_ALLOW_LOOPBACK' | 'FERRY_WEBHOOK_ALLOW_PRIVATE' | 'FERRY_CONFIG'>(name: K,
  env: NodeJS.ProcessEnv = process.env) {
  try { return setting(name, env); } catch (e) { throw e instanceof SettingError ? new ConfigError(e.message) : e; }
}

/** Reads the file (or nothing), validates it, then applies environment overrides. */
export function loadConfig(file?: string, env: NodeJS.ProcessEnv = process.env): DaemonConfig {
  let raw: unknown = {};
  if (file) {
    let text: string;
    try { text = readFileSync(file, 'utf8'); } catch (e) { throw new ConfigError(`cannot read config file ${file}: ${(e as Error).message}`); }
    try { raw = yaml.load(text) ?? {}; } catch (e) { throw new ConfigError(`config file ${file} is not valid YAML: ${(e as Error).message}`); }
    if (typeof raw !== 'object' || Array.isArray(raw)) throw new ConfigError(`config file ${file} must hold a mapping`);
  }
  const { error, value } = schema.validate(raw, { abortEarly: false, errors: { wrap: { label: '' } } }) as { error?: Joi.ValidationError; value: unknown };
  if (error) throw new ConfigError(`invalid config${file ? ` in ${file}` : ''}: ${error.details.map((d) => `${d.path.join('.')}: ${d.message}`).join('; ')}`);
  const cfg = value as DaemonConfig;
  const jobTimeout = envSetting('JOB_TIMEOUT', env);
  if (jobTimeout) cfg.daemon.job_timeout = jobTimeout;
  cfg.jobTimeoutSeconds = Math.ceil(parseDuration(cfg.daemon.job_timeout)!);
  // The explicit opt-in for webhook receivers on this host or the operator's network (the tests use loopback).
  for (const [name, key] of [['FERRY_WEBHOOK_ALLOW_LOOPBACK', 'allow_loopback'], ['FERRY_WEBHOOK_ALLOW_PRIVATE', 'allow_private']] as const) {
    const v = envSetting(name, env);
    if (v !== undefined) cfg.webhooks[key] = v;
  }
  try { cfg.keys = loadAuth(env, cfg.auth.api_keys); } catch (e) { throw new ConfigError((e as AuthConfigError).message); }
  if (cfg.auth.enabled &&
    !cfg.keys.enabled) throw new ConfigError('auth.enabled is true but no API key is configured (auth.api_keys, FERRY_API_KEYS or FERRY_API_KEYS_FILE)');
  cfg.auth.enabled = cfg.keys.enabled;
  return cfg;
}

/** The config file named by --config or FERRY_CONFIG. */
export function configPath(argv: string[] = process.argv.slice(2)): string | undefined {
  const i = argv.findIndex((a) => a === '--config' || a === '-config');
  if (i >= 0) return argv[i + 1];
  const eq = argv.find((a) => a.startsWith('--config='));
  return eq ? eq.slice('--config='.length) : envSetting('FERRY_CONFIG');
}
