import type { JobRecord, JobStore } from '../../../queue/store';
import type { JobSpec } from '../../../domain/schemas/job';
import type { Logger } from '../../../platform/log';
import type { OutputClaims } from '../../../platform/roots';
import type { Ledger } from '../../../domain/libvirt/ledger';

export interface OpContext {
  job: JobRecord;
  spec: JobSpec;
  workerId: string;
  attempt: number;
  signal: AbortSignal;
  log: Logger;
  /** The outputs this job wrote on earlier attempts (a retry may replace its own, never another file). */
  claims: OutputClaims;
  /** What the job makes on a target goes here as it is made (domain/libvirt/ledger.ts); its earlier attempts'
   *  entries are in the record (store.made). */
  ledger: Ledger;
  /** The job store (Redis): for what a job keeps beside its record, such as its encrypted manager password. */
  store: JobStore;
  /** Publishes a ProgressEvent; details values become strings. */
  progress(phase: string, percentage: number, message: string, details?: Record<string, string | number>): Promise<void>;
}

export type Operation = (ctx: OpContext) => Promise<Record<string, unknown>>;

/** Decides, before a job starts, whether it may run now (a shared limit); if not, it goes back to the queue
 *  with the reason shown while it waits. */
export type Admit = (spec: JobSpec, store: JobStore) => Promise<{ ok: true; release: () => Promise<void> } | { ok: false; reason: string }>;

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
