// Structured JSON logs on stderr. Values under sensitive keys (shared/sensitive.ts) are replaced before they are
// written.
import { redact } from './sensitive';
const LEVELS = { debug: 10, info: 20, warn: 30, error: 40 } as const;
type Level = keyof typeof LEVELS;

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
