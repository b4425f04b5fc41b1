// Structured JSON logs on stderr. Values under sensitive keys (shared/sensitive.ts) are replaced before they are
// written.
import { redact } from './sensitive';
const LEVELS = { debug: 10, info: 20, warn: 30, error: 40 } as const;
type Level = keyof typeof LEVELS;

export function createLogger(service: string) {
  const min = LEVELS[(process.env.LOG_LEVEL || 'info').toLowerCase() as Level] ?? LEVELS.info;
  // 'audit' lines (shared/audit.ts) are written whatever LOG_LEVEL says: an audit trail is not a verbosity.
  const write = (level: Level | 'audit', msg: string, fields?: Record<string, unknown>) => {
    if (level !== 'audit' && LEVELS[level] < min) return;
    const line = { ts: new Date().toISOString(), level, service, msg, ...(redact(fields || {}) as object) };
    process.stderr.write(JSON.stringify(line) + '\n');
  };
  return {
    debug: (m: string, f?: Record<string, unknown>) => write('debug', m, f),
    info: (m: string, f?: Record<string, unknown>) => write('info', m, f),
    warn: (m: string, f?: Record<string, unknown>) => write('warn', m, f),
    error: (m: string, f?: Record<string, unknown>) => write('error', m, f),
    audit: (m: string, f?: Record<string, unknown>) => write('audit', m, f),
  };
}
export type Logger = ReturnType<typeof createLogger>;

/** A `.catch` handler for an error the caller may drop: `why` says why that is safe, and the error is still
 *  logged (at debug level) so it can be found when it should not have happened. */
export function dropped(log: Logger, why: string, fields?: Record<string, unknown>) {
  return (e: unknown): undefined => { log.debug(`ignored: ${why}`, { ...fields, error: e instanceof Error ? e.message : String(e) }); return undefined; };
}

let fallback: Logger | undefined;
/** `dropped` for code without a logger of its own (shared/ libraries): logged under the process's script name. */
export function ignoreError(why: string, fields?: Record<string, unknown>) {
  fallback ??= createLogger(String(process.argv[1] || 'ferry').split('/').slice(-2).join('/').replace(/\.[jt]s$/, ''));
  return dropped(fallback, why, fields);
}

/** `p`, its rejection marked as handled now: the caller awaits it later and deals with its error there. Without
 *  this, a rejection before that await would count as unhandled and end the process. */
export function awaitedLater<T>(p: Promise<T>): Promise<T> {
  p.catch(() => { /* handled where p is awaited */ });
  return p;
}
