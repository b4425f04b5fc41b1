// How the daemon API shows a job (the daemon and the notifier's webhook payloads: the Job record of the daemon seed:
// definition, lowercase status, progress) and its progress with a smoothed rate and an ETA. Built from the raw Redis
// hash, so a page of jobs is one pipelined read.
import { parseField, type JobStore } from '../queue/store';
import { Registry } from '../queue/registry';
import { unservedReason } from '../queue/lifecycle';
import { parseQueueName } from '../platform/capabilities';
import { daemonStatus, isTerminal } from '../domain/states';
import type { JobSpec, ProgressEvent } from '../domain/schemas/job';

/** What a view reads of a record's spec and meta (JSON written by Lifecycle.submit from a validated spec). */
type StoredSpec = Partial<Omit<JobSpec, 'parameters'>> & { parameters?: { name?: string; vm_path?: string; output_path?: string } };
interface StoredMeta { name?: string; kind?: string; schedule_id?: string }

const iso = (ms: string | undefined) => (ms ? new Date(Number(ms)).toISOString() : null);
const num = (v: unknown) => (v === undefined || v === null || v === '' || !Number.isFinite(Number(v)) ? undefined : Number(v));

/** Fields a page of jobs needs (history and result stay in Redis). */
export const VIEW_FIELDS = ['state', 'spec', 'meta', 'latest_event', 'created_at', 'updated_at', 'started_at', 'finished_at', 'error', 'waiting_reason',
  'queue'];

/** A record's progress from the job's latest event: every key present, null when the job did not report it. */
function progressOf(id: string, status: string, ev: ProgressEvent | null) {
  const d: Partial<Record<string, string>> = ev?.details || {};
  const bytes = num(d.bytes_downloaded) ?? num(d.bytes_processed) ?? num(d.current_bytes);
  const phase = ev?.phase || (status === 'pending' ? 'queued' : status);
  return {
    phase, stage: phase,
    current_file: d.current_file ?? null,
    files_downloaded: num(d.files_downloaded) ?? null,
    total_files: num(d.total_files) ?? null,
    bytes_downloaded: bytes ?? null, current_bytes: bytes ?? null,
    total_bytes: num(d.total_bytes) ?? null,
    percent_complete: status === 'completed' ? 100 : ev ? Number(ev.percentage) : 0,
    rate_bytes_per_second: num(d.rate_bytes_per_second) ?? null,
    eta_seconds: num(d.eta_seconds) ?? null,
    files: d.files ? parseField<unknown[] | null>(d.files, null, { job_id: id, field: 'latest_event.details.files' }) : null,
  };
}

export function jobView(id: string, h: Record<string, string>) {
  const spec = parseField<StoredSpec>(h.spec, {}, { job_id: id, field: 'spec' });
  const meta = parseField<StoredMeta>(h.meta, {}, { job_id: id, field: 'meta' });
  const ev = parseField<ProgressEvent | null>(h.latest_event, null, { job_id: id, field: 'latest_event' });
  const p = spec.parameters || {};
  const kind = meta.kind || 'operation';
  const status = daemonStatus(h.state);
  // Every record has every key (jobRecordSchema, docs/daemon.md): a field that does not apply to the job (an
  // operation has no vm_path, a job without byte counts no rate) is null, so clients that index them do not break.
  return {
    id,
    definition: {
      id, name: meta.name || p.name || spec.operation, kind, operation: spec.operation,
      vm_path: p.vm_path ?? null, output_path: p.output_path ?? null, created_at: h.created_at,
    },
    status,
    state: h.state,
    progress: progressOf(id, status, ev),
    waiting_reason: h.state === 'QUEUED' && h.waiting_reason ? h.waiting_reason : null,
    created_at: h.created_at,
    started_at: iso(h.started_at),
    updated_at: h.updated_at,
    completed_at: isTerminal(h.state) ? iso(h.finished_at) || h.updated_at : null,
    error: h.error || null,
    schedule_id: meta.schedule_id || null,
  };
}
export type DaemonJob = ReturnType<typeof jobView>;

/** A job's progress at the start of a phase: nothing reported yet, every key present (null). */
export function startOfPhase(phase: string): DaemonJob['progress'] {
  return {
    phase, stage: phase, current_file: null, files_downloaded: null, total_files: null, bytes_downloaded: null, current_bytes: null,
    total_bytes: null, percent_complete: 0, rate_bytes_per_second: null, eta_seconds: null, files: null,
  };
}

export async function jobViews(store: JobStore, ids: string[]): Promise<DaemonJob[]> {
  const hs = await store.many(ids, VIEW_FIELDS);
  await explainUnserved(store, hs);
  return ids.map((id, i) => (hs[i] ? jobView(id, hs[i]) : null)).filter((x): x is DaemonJob => !!x);
}

/** A queued job without a reason of its own (a worker's hand-back) that no active worker can take says so, as
 *  the job API's GET /jobs/{id} does (Lifecycle.waitingReason): the active workers are read once per page. */
async function explainUnserved(store: JobStore, hs: (Record<string, string> | null)[]) {
  const queued = hs.filter((h): h is Record<string, string> => !!h && h.state === 'QUEUED' && !h.waiting_reason && !!h.queue);
  if (!queued.length) return;
  const active = await new Registry(store.redis).active();
  for (const h of queued) {
    const req = parseQueueName(h.queue);
    const why = req && unservedReason(req, active);
    if (why) h.waiting_reason = why;
  }
}

export const RATE_WINDOW_SECONDS = 30;

const bytesOf = (e: ProgressEvent) => num(e.details?.bytes_downloaded) ?? num(e.details?.bytes_processed) ?? num(e.details?.current_bytes);

/** Bytes and percent per second from the first to the last sample of a window; null without two samples apart in
 *  time (bytes: without a byte count in both). */
function windowRates(win: ProgressEvent[]): { rateB: number | null; rateP: number | null } {
  if (win.length < 2) return { rateB: null, rateP: null };
  const a = win[0];
  const b = win[win.length - 1];
  const dt = (Date.parse(b.timestamp) - Date.parse(a.timestamp)) / 1000;
  if (!(dt > 0)) return { rateB: null, rateP: null };
  const ba = bytesOf(a);
  const bb = bytesOf(b);
  return {
    rateB: ba !== undefined && bb !== undefined ? Math.max(0, (bb - ba) / dt) : null,
    rateP: Math.max(0, (Number(b.percentage) - Number(a.percentage)) / dt),
  };
}

/** Seconds left: 0 once completed; from the byte rate when there is one, else from the percent rate; null when the
 *  job is not moving (ended otherwise, or no rate). */
function etaOf(status: string, r: { pct: number; total: number | null; done: number | null; rateB: number | null; rateP: number | null }): number | null {
  if (status === 'completed') return 0;
  if (status !== 'running' && status !== 'pending') return null;
  if (r.rateB && r.total !== null && r.done !== null) return Math.max(0, (r.total - r.done) / r.rateB);
  if (r.rateP) return Math.max(0, (100 - r.pct) / r.rateP);
  return null;
}

/** Rate over the events of the last RATE_WINDOW_SECONDS (first to last sample in the window), and the ETA
 *  from it; null (never Infinity or NaN) when fewer than two samples or no advance. */
export async function progressView(store: JobStore, id: string, h: Record<string, string>) {
  const rows = (await store.redis.xrevrange(store.k.events(id), '+', '-', 'COUNT', 500)) as [string, string[]][];
  const evs = rows.map(([, f]) => parseField<ProgressEvent | null>(f[1], null, { job_id: id, field: 'events' })).filter(
    (e): e is ProgressEvent => !!e).reverse();
  const last = evs[evs.length - 1];
  const lastT = last ? Date.parse(last.timestamp) : 0;
  const win = evs.filter((e) => Date.parse(e.timestamp) >= lastT - RATE_WINDOW_SECONDS * 1000 && e.phase === last?.phase);
  const status = daemonStatus(h.state);
  const pct = status === 'completed' ? 100 : last ? Number(last.percentage) : 0;
  const total = last ? num(last.details?.total_bytes) ?? null : null;
  const done = last ? bytesOf(last) ?? null : null;
  const { rateB, rateP } = windowRates(win);
  const eta = etaOf(status, { pct, total, done, rateB, rateP });
  return {
    job_id: id, status, phase: last?.phase || (status === 'pending' ? 'queued' : status), percent_complete: pct,
    bytes_done: done, total_bytes: total, rate_bytes_per_second: rateB, rate_percent_per_second: rateP,
    rate_window_seconds: RATE_WINDOW_SECONDS, eta_seconds: eta === null ? null : Math.round(eta * 10) / 10,
    eta: eta === null ? null : new Date(Date.now() + eta * 1000).toISOString(), samples: win.length, updated_at: h.updated_at,
  };
}
