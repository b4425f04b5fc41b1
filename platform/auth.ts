// The one authentication layer of Ferry (docs/security.md): API keys with roles, read from FERRY_API_KEYS and/or
// the keys file FERRY_API_KEYS_FILE (and the daemon's auth.api_keys). Any key configured turns auth on for every
// service: both APIs, SSE, WebSocket and every metrics port. Without keys, services listen on 127.0.0.1 only.
//
// Roles: read (GETs, streams, metrics) < submit (jobs, cancel, schedules, webhooks); read < worker (register,
// heartbeat, dequeue, report-back); admin is everything (DELETE /workers, privileged execution mode for any job).
// submit and worker are deliberately unrelated: a worker key cannot submit jobs, a submit key cannot claim them.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type http from 'node:http';
import { CAPABILITY_PATTERN, PRIVILEGED } from './capabilities';
import { keys } from './redis';
import { setting as declared } from './settings';

export const ROLES = ['read', 'submit', 'worker', 'admin'] as const;
export type KeyRole = (typeof ROLES)[number];
/** What a route needs: a role, or nothing at all ('public'). */
export type Need = KeyRole | 'public';

const GRANTS: Record<KeyRole, KeyRole[]> = {
  read: ['read'],
  submit: ['read', 'submit'],
  worker: ['read', 'worker'],
  admin: ['read', 'submit', 'worker', 'admin'],
};

export interface ApiKey {
  name: string;
  role: KeyRole;
  /** Capabilities a worker using this key may claim; undefined = any. */
  capabilities?: string[];
  digest: Buffer;
}

export interface Auth {
  enabled: boolean;
  keys: ApiKey[];
}

export class AuthConfigError extends Error {}

const MIN_KEY = 16;
const digest = (k: string) => createHash('sha256').update(k).digest();

function makeKey(name: string, role: string, key: string, caps: string | undefined, where: string): ApiKey {
  if (!(ROLES as readonly string[]).includes(role)) throw new AuthConfigError(`${where}: role "${role}" is not one of ${ROLES.join(', ')}`);
  if (key.length < MIN_KEY) throw new AuthConfigError(`${where}: the key of "${name}" is shorter than ${MIN_KEY} characters`);
  let capabilities: string[] | undefined;
  if (caps !== undefined && caps !== '*') {
    capabilities = caps.split(',').map((c) => c.trim()).filter(Boolean);
    for (const c of capabilities) if (!CAPABILITY_PATTERN.test(c)) throw new AuthConfigError(`${where}: "${c}" is not a capability name`);
  }
  return { name, role: role as KeyRole, capabilities, digest: digest(key) };
}

/** One FERRY_API_KEYS entry (or auth.api_keys item): `name:role:key`, `role:key`, or a bare key (role admin, the
 *  meaning keys had before roles existed). */
export function parseKeyEntry(entry: string, i: number, where: string): ApiKey {
  const parts = entry.split(':');
  if (parts.length >= 3 && (ROLES as readonly string[]).includes(parts[1])) return makeKey(parts[0], parts[1], parts.slice(2).join(':'), undefined, where);
  if (parts.length >= 2 && (ROLES as readonly string[]).includes(parts[0])) return makeKey(`${parts[0]}-${i + 1}`, parts[0], parts.slice(1).join(':'),
    undefined, where);
  return makeKey(`key-${i + 1}`, 'admin', entry, undefined, where);
}

/** The keys file: one key per line, `name role key [capabilities]` (capabilities comma-separated, or `*`);
 *  blank lines and `#` comments ignored. */
export function parseKeysFile(text: string, file: string): ApiKey[] {
  const out: ApiKey[] = [];
  text.split('\n').forEach((line, n) => {
    const l = line.replace(/(^|\s)#.*$/, '').trim();
    if (!l) return;
    const f = l.split(/\s+/);
    if (f.length < 3 || f.length > 4) throw new AuthConfigError(`${file} line ${n + 1}: expected "name role key [capabilities]"`);
    out.push(makeKey(f[0], f[1], f[2], f[3], `${file} line ${n + 1}`));
  });
  return out;
}

/** Keys from the environment (FERRY_API_KEYS, FERRY_API_KEYS_FILE) plus `extra` (the daemon's auth.api_keys). */
export function loadAuth(env: NodeJS.ProcessEnv = process.env, extra: string[] = []): Auth {
  const keys: ApiKey[] = extra.map((e, i) => parseKeyEntry(e.trim(), i, 'auth.api_keys'));
  const list = (declared('FERRY_API_KEYS', env) ?? '').split(',').map((s) => s.trim()).filter(Boolean);
  keys.push(...list.map((e, i) => parseKeyEntry(e, i, 'FERRY_API_KEYS')));
  const file = declared('FERRY_API_KEYS_FILE', env);
  if (file) {
    let text: string;
    try { text = readFileSync(file, 'utf8'); } catch (e) { throw new AuthConfigError(`FERRY_API_KEYS_FILE: cannot read ${file}: ${(e as Error).message}`); }
    const fromFile = parseKeysFile(text, file);
    if (!fromFile.length) throw new AuthConfigError(`FERRY_API_KEYS_FILE: ${file} holds no key`);
    keys.push(...fromFile);
  }
  return { enabled: keys.length > 0, keys };
}

let cached: { sig: string; auth: Auth } | undefined;
/** The process's keys (read once per distinct setting). */
export function processAuth(extra: string[] = []): Auth {
  const sig = JSON.stringify([declared('FERRY_API_KEYS'), declared('FERRY_API_KEYS_FILE'), extra]);
  if (!cached || cached.sig !== sig) cached = { sig, auth: loadAuth(process.env, extra) };
  return cached.auth;
}

export function grantsRole(role: KeyRole, need: Need): boolean {
  return need === 'public' || GRANTS[role].includes(need);
}

export function grants(key: ApiKey, need: Need): boolean {
  return grantsRole(key.role, need);
}

/** The key a request presents: X-API-Key or Authorization: Bearer. Never the URL. */
export function presentedKey(headers: http.IncomingHttpHeaders): string | undefined {
  const x = headers['x-api-key'];
  const k = (Array.isArray(x) ? x[0] : x) || /^Bearer\s+(.+)$/i.exec(String(headers.authorization || ''))?.[1];
  return k?.trim() || undefined;
}

/** Finds the key in constant time per configured key (digests of equal length, every one compared). */
export function identify(auth: Auth, presented: string): ApiKey | undefined {
  const d = digest(presented);
  let found: ApiKey | undefined;
  for (const k of auth.keys) if (timingSafeEqual(k.digest, d) && !found) found = k;
  return found;
}

export type Verdict = { status: 0; key: ApiKey | null } | { status: 401 | 403; message: string };

/** 0 with the caller's key (null when auth is off), 401 without a key, 403 with an unknown key or one whose role
 *  does not reach `need`. */
export function authorize(auth: Auth, headers: http.IncomingHttpHeaders, need: Need): Verdict {
  if (!auth.enabled || need === 'public') return { status: 0, key: null };
  const presented = presentedKey(headers);
  if (!presented) return { status: 401, message: 'an API key is required (X-API-Key or Authorization: Bearer)' };
  const key = identify(auth, presented);
  if (!key) return { status: 403, message: 'the API key is not accepted' };
  if (!grants(key, need)) return { status: 403, message: `the API key "${key.name}" has role ${key.role}; this needs role ${need}` };
  return { status: 0, key };
}

/** Capabilities a worker asks for that its key does not allow. */
export function capabilitiesBeyond(key: ApiKey | null, caps: string[]): string[] {
  if (!key || !key.capabilities || key.role === 'admin') return [];
  const ok = new Set(key.capabilities);
  return caps.filter((c) => !ok.has(c));
}

/** Capabilities that mean device access (NBD, mounting, LVM): only their jobs need the privileged mode. */
export const DEVICE_CAPABILITIES = ['nbd_access', 'mount_operations', 'lvm_tools'];

/** Who asks: an API key, or a schedule acting with its creator's key name and role. */
export type Caller = Pick<ApiKey, 'name' | 'role'>;

/** The privileged execution mode is for operations that need device access by their own capability table
 *  (`operationCaps`, never the capabilities a caller adds to its requirements), or for admin keys. */
export function mayRunPrivileged(key: Caller | null, executionMode: string | undefined, operationCaps: string[]): boolean {
  if (executionMode !== PRIVILEGED || !key || key.role === 'admin') return true;
  return operationCaps.some((c) => DEVICE_CAPABILITIES.includes(c));
}

// Safe by default: without keys, listening beyond loopback is refused unless FERRY_INSECURE_NO_AUTH=1.
const LOOPBACK = /^(127(\.\d{1,3}){3}|::1|\[::1\]|localhost|::ffff:127(\.\d{1,3}){3})$/i;

export function isLoopback(host: string): boolean {
  return LOOPBACK.test(host);
}

/**
 * The address a service listens on. `requested` is what the operator set through `setting` (FERRY_HOST,
 * -addr...); unset means 0.0.0.0 when keys are configured and 127.0.0.1 when not. A non-loopback address
 * without keys throws, naming the setting.
 */
export function listenHost(auth: Auth, requested: string | undefined, setting: string, env: NodeJS.ProcessEnv = process.env): string {
  if (!requested) return auth.enabled ? '0.0.0.0' : '127.0.0.1';
  if (auth.enabled || isLoopback(requested) || declared('FERRY_INSECURE_NO_AUTH', env)) return requested;
  throw new AuthConfigError(
    `${setting}=${requested} would expose Ferry without authentication: configure API keys (FERRY_API_KEYS or FERRY_API_KEYS_FILE), listen on 127.0.0.1, or ` +
    `set FERRY_INSECURE_NO_AUTH=1 to accept the risk`);
}

/** A short-lived single-use ticket for a browser's WebSocket (browsers cannot set its headers, and a key must
 *  never travel in a URL). Kept in Redis (any daemon replica can redeem it) under its digest. */
export interface TicketStore {
  set(key: string, value: string, ex: 'EX', seconds: number): Promise<unknown>;
  getdel(key: string): Promise<string | null>;
}
export const TICKET_SECONDS = 30;

export async function issueTicket(redis: TicketStore, prefix: string, key: ApiKey | null): Promise<{ ticket: string; expires_in: number }> {
  const ticket = randomBytes(24).toString('base64url');
  await redis.set(keys(prefix).wsTicket(digest(ticket).toString('hex')), JSON.stringify(key ? { name: key.name, role: key.role } : {}), 'EX', TICKET_SECONDS);
  return { ticket, expires_in: TICKET_SECONDS };
}

/** The role a ticket was issued to, once; null when unknown, used or expired. */
export async function redeemTicket(redis: TicketStore, prefix: string, ticket: string): Promise<{ name?: string; role?: KeyRole } | null> {
  if (!/^[A-Za-z0-9_-]{16,64}$/.test(ticket)) return null;
  const v = await redis.getdel(keys(prefix).wsTicket(digest(ticket).toString('hex')));
  return v ? JSON.parse(v) as { name?: string; role?: KeyRole } : null; // written by issueTicket above
}
