// Structured JSON logs on stderr. Values under sensitive keys (platform/sensitive.ts) are replaced before they are
// written.
import { redact } from './sensitive';
import { setting } from './settings';
const LEVELS = { debug: 10, info: 20, warn: 30, error: 40 } as const;
type Level = keyof typeof LEVELS;

export function createLogger(service: string) {
  const min = LEVELS[setting('LOG_LEVEL') as Level];
  // 'audit' lines (platform/audit.ts) are written whatever LOG_LEVEL says: an audit trail is not a verbosity.
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

const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

/** A `.catch` handler for a failure the caller carries on after: logged at warn, `next` says what failed and what
 *  happens next (the error's message is added), so an outage or a bug is seen, not dropped. */
export function dropped(log: Logger, next: string, fields?: Record<string, unknown>) {
  return (e: unknown): undefined => { log.warn(next, { ...fields, error: message(e) }); return undefined; };
}

/** A `.catch` handler for a named case that is the normal path, not a fault (a connection already closed on
 *  shutdown, a domain already off, a directory that exists): `why` names the case and why it is expected. It is
 *  logged at debug, so it can still be found when it should not have happened. */
export function expected(log: Logger, why: string, fields?: Record<string, unknown>) {
  return (e: unknown): undefined => { log.debug(`expected: ${why}`, { ...fields, error: message(e) }); return undefined; };
}

let fallback: Logger | undefined;
/** The logger of code without one of its own (domain/ and platform/ libraries): named after the process's script. */
function processLogger(): Logger {
  fallback ??= createLogger(String(process.argv[1] || 'ferry').split('/').slice(-2).join('/').replace(/\.[jt]s$/, ''));
  return fallback;
}
/** `dropped` for code without a logger of its own. */
export const ignoreError = (next: string, fields?: Record<string, unknown>) => dropped(processLogger(), next, fields);
/** `expected` for code without a logger of its own. */
export const expectedError = (why: string, fields?: Record<string, unknown>) => expected(processLogger(), why, fields);

/** `p`, its rejection marked as handled now: the caller awaits it later and deals with its error there. Without
 *  this, a rejection before that await would count as unhandled and end the process. */
export function awaitedLater<T>(p: Promise<T>): Promise<T> {
  p.catch(() => { /* handled where p is awaited */ });
  return p;
}
