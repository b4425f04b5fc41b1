// Structured JSON logs on stderr. Values under secret-looking keys are replaced before they are written.
const SECRET_KEY = /pass(word)?|secret|token|authorization|api[-_]?key|credential/i;
const LEVELS = { debug: 10, info: 20, warn: 30, error: 40 } as const;
type Level = keyof typeof LEVELS;

export function redact(value: unknown, depth = 0): unknown {
  if (depth > 8 || value === null || typeof value !== 'object') return value;
  if (value instanceof Error) return { name: value.name, message: value.message };
  if (Array.isArray(value)) return value.map((v) => redact(v, depth + 1));
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    out[k] = SECRET_KEY.test(k) && v !== undefined && v !== null && v !== '' ? '[redacted]' : redact(v, depth + 1);
  }
  return out;
}

export function createLogger(service: string) {
  const min = LEVELS[(process.env.LOG_LEVEL || 'info').toLowerCase() as Level] ?? LEVELS.info;
  const write = (level: Level, msg: string, fields?: Record<string, unknown>) => {
    if (LEVELS[level] < min) return;
    const line = { ts: new Date().toISOString(), level, service, msg, ...(redact(fields || {}) as object) };
    process.stderr.write(JSON.stringify(line) + '\n');
  };
  return {
    debug: (m: string, f?: Record<string, unknown>) => write('debug', m, f),
    info: (m: string, f?: Record<string, unknown>) => write('info', m, f),
    warn: (m: string, f?: Record<string, unknown>) => write('warn', m, f),
    error: (m: string, f?: Record<string, unknown>) => write('error', m, f),
  };
}
export type Logger = ReturnType<typeof createLogger>;

/** A `.catch` handler for an error the caller may drop: `why` says why that is safe, and the error is still
 *  logged (at debug level) so it can be found when it should not have happened. */
export function dropped(log: Logger, why: string, fields?: Record<string, unknown>) {
  return (e: unknown) => { log.debug(`ignored: ${why}`, { ...fields, error: e instanceof Error ? e.message : String(e) }); };
}
