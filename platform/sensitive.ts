// The one definition of "sensitive": logs, webhook headers and payloads, and API responses (GET /jobs/{id}, the
// daemon's records, WebSocket messages) all redact by it, so a secret hidden in one place is hidden in all.
// A value is sensitive when its key names a credential: password, password_hash, secret, token, authorization,
// api_key, any *-key or *_key, cookie, ticket... `credentials` (plural) is left out: in a job it only says where the manager
// password comes from (job, environment, none), never the password itself.
import { canEncrypt, decryptSecret, encryptSecret } from './secretbox';

export const SENSITIVE_KEY = /pass(word|phrase|wd)?|secret|token|authori[sz]ation|api[-_]?key|(^|[-_])key$|cookie|credential(?!s$)|ticket/i;

export const REDACTED = '[redacted]';

export function isSensitiveKey(key: string): boolean {
  return SENSITIVE_KEY.test(key);
}

/** A deep copy of `value` with every sensitive key's (non-empty) value replaced by "[redacted]". */
export function redact<T>(value: T, depth = 0): T {
  if (depth > 16 || value === null || typeof value !== 'object') return value;
  if (value instanceof Error) return { name: value.name, message: value.message } as unknown as T;
  if (Array.isArray(value)) return (value as unknown[]).map((v) => redact(v, depth + 1)) as T;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    out[k] = isSensitiveKey(k) && v !== undefined && v !== null && v !== '' ? REDACTED : redact(v, depth + 1);
  }
  return out as T;
}

/** A URL as shown to a caller who may not see its credentials (a webhook's, to non-admin keys): userinfo and the
 *  query string, where tokens travel, replaced by [redacted]; the scheme, host and path stay. Not a URL: redacted whole. */
export function redactUrl(url: string): string {
  let u: URL;
  try { u = new URL(url); } catch { return REDACTED; }
  const auth = u.username || u.password ? `${REDACTED}@` : '';
  const query = u.search ? `?${REDACTED}` : '';
  return `${u.protocol}//${auth}${u.host}${u.pathname}${query}`;
}

/** Every occurrence of `url` (and of its parsed form) in `text` shown as redactUrl shows it. */
export function redactUrlIn(text: string, url: string): string {
  let out = text.split(url).join(redactUrl(url));
  try { const href = new URL(url).href; out = out.split(href).join(redactUrl(url)); } catch { /* not a URL: the first pass did it */ }
  return out;
}

const SEALED = 'sealed:';

/** A copy of `value` whose sensitive string values are encrypted (kept in Redis that way); the worker that claims
 *  the job opens them again (unseal). A value that already reads `sealed:` is sealed again: it can only be one
 *  copied from another job, and opened once it must stay that literal text, not the other job's secret.
 *  Without FERRY_SECRET_KEY the value is returned as it is. */
export function seal<T>(value: T, depth = 0): T {
  if (!canEncrypt() || depth > 16 || value === null || typeof value !== 'object') return value;
  if (Array.isArray(value)) return (value as unknown[]).map((v) => seal(v, depth + 1)) as T;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    out[k] = isSensitiveKey(k) && typeof v === 'string' && v !== '' ? SEALED + encryptSecret(v) : seal(v, depth + 1);
  }
  return out as T;
}

/** The sealed values opened, and only where `seal` puts them: a string under a sensitive key. A `sealed:` value
 *  copied into any other field (a name, a noop's `fail` message, an array) stays sealed, so a caller who got hold
 *  of a sealed secret cannot have a worker open it into a field that is shown. Throws (naming FERRY_SECRET_KEY)
 *  when this process cannot open one. */
export function unseal<T>(value: T, depth = 0): T {
  if (depth > 16 || value === null || typeof value !== 'object') return value;
  if (Array.isArray(value)) return (value as unknown[]).map((v) => unseal(v, depth + 1)) as T;
  return Object.fromEntries(Object.entries(value as Record<string, unknown>).map(
    ([k, v]) => [k, isSensitiveKey(k) && typeof v === 'string' ? open(v) : unseal(v, depth + 1)])) as T;
}

function open(value: string): string {
  if (!value.startsWith(SEALED)) return value;
  if (!canEncrypt()) throw new Error('the job holds credentials sealed with FERRY_SECRET_KEY, which this process does not have');
  try { return decryptSecret(value.slice(SEALED.length)); } catch { throw new Error('the job holds credentials sealed with a different FERRY_SECRET_KEY'); }
}
