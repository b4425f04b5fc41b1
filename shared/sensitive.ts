// The one definition of "sensitive": logs, webhook headers and payloads, and API responses (GET /jobs/{id}, the
// daemon's records, WebSocket messages) all redact by it, so a secret hidden in one place is hidden in all.
// A value is sensitive when its key names a credential: password, password_hash, secret, token, authorization,
// api_key, any *-key or *_key, cookie, ticket... `credentials` (plural) is left out: in a job it only says where the manager
// password comes from (job, environment, none), never the password itself.
export const SENSITIVE_KEY = /pass(word|phrase|wd)?|secret|token|authori[sz]ation|api[-_]?key|(^|[-_])key$|cookie|credential(?!s$)|ticket/i;

export const REDACTED = '[redacted]';

export function isSensitiveKey(key: string): boolean {
  return SENSITIVE_KEY.test(key);
}

/** A deep copy of `value` with every sensitive key's (non-empty) value replaced by "[redacted]". */
export function redact<T>(value: T, depth = 0): T {
  if (depth > 16 || value === null || typeof value !== 'object') return value;
  if (value instanceof Error) return { name: value.name, message: value.message } as unknown as T;
  if (Array.isArray(value)) return value.map((v) => redact(v, depth + 1)) as unknown as T;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    out[k] = isSensitiveKey(k) && v !== undefined && v !== null && v !== '' ? REDACTED : redact(v, depth + 1);
  }
  return out as T;
}
