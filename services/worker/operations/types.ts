import type { JobRecord } from '../../../queue/store';
import type { JobSpec } from '../../../shared/schemas/job';
import type { Logger } from '../../../shared/log';
import type { OutputClaims } from '../../../shared/roots';

export interface OpContext {
  job: JobRecord;
  spec: JobSpec;
  workerId: string;
  attempt: number;
  signal: AbortSignal;
  log: Logger;
  /** The outputs this job wrote on earlier attempts (a retry may replace its own, never another file). */
  claims: OutputClaims;
  /** Publishes a ProgressEvent; details values become strings. */
  progress(phase: string, percentage: number, message: string, details?: Record<string, string | number>): Promise<void>;
}

export type Operation = (ctx: OpContext) => Promise<Record<string, unknown>>;

/** Emits at most one event per whole percent and per `minMs`, and always the last one. */
export function throttle(minMs = 200) {
  let lastPct = -1;
  let lastAt = 0;
  return (pct: number) => {
    const p = Math.floor(pct);
    const now = Date.now();
    if (p === 100 || (p > lastPct && now - lastAt >= minMs)) {
      lastPct = p;
      lastAt = now;
      return true;
    }
    return false;
  };
}
