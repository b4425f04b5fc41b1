// How the daemon shows a plan: the stored plan with, per VM, what its current job says now (stage, bytes, the
// limit holding it), and for the plan the counts per status, bytes done and total, the summed rate and an ETA.
import type { Plan } from './plans';
import type { JobStore } from '../queue/store';
import { jobViews } from './daemon-views';
import { parseField } from '../queue/store';
import type { WarmState } from '../domain/warm-predict';

/** A job as jobViews shows it. */
type JobView = Awaited<ReturnType<typeof jobViews>>[number];

/** A plan as GET /plans/:id answers it. */
export type PlanView = Awaited<ReturnType<typeof planView>>;

export async function planView(store: JobStore, p: Plan) {
  const ids = p.vms.map((v) => v.job_id).filter((x): x is string => !!x);
  const jobs = new Map((await jobViews(store, ids)).map((j) => [j.id, j]));
  const warm = await warmViews(store, ids);
  let done = 0, total = 0, rate = 0;
  const counts: Record<string, number> = {};
  const vms = p.vms.map((v) => {
    const j = v.job_id ? jobs.get(v.job_id) : undefined;
    const pr = j?.progress;
    const bytes = v.status === 'completed' ? pr?.total_bytes ?? pr?.bytes_downloaded ?? 0 : pr?.bytes_downloaded ?? 0;
    const tb = pr?.total_bytes ?? 0;
    done += bytes; total += tb;
    if (v.status === 'running' && pr?.rate_bytes_per_second) rate += pr.rate_bytes_per_second;
    counts[v.status] = (counts[v.status] ?? 0) + 1;
    return vmView(v, j, warm, bytes, tb);
  });
  const { events_sent: _e, ...plan } = p;
  return {
    ...plan,
    counts,
    bytes_done: done,
    total_bytes: total,
    rate_bytes_per_second: Math.round(rate),
    eta_seconds: rate > 0 && total > done ? Math.round((total - done) / rate) : null,
    vms,
  };
}

/** One VM as the plan view shows it: the stored VM (without its options) with its job's stage, wait, warm state, bytes and rate. */
function vmView(v: Plan['vms'][number], j: JobView | undefined, warm: Awaited<ReturnType<typeof warmViews>>, bytes: number, tb: number) {
  const pr = j?.progress;
  const { options: _o, ...rest } = v;
  return {
    ...rest, stage: j && v.status === 'running' ? pr?.stage ?? null : v.stage,
    waiting_reason: v.status === 'running' && j?.status === 'pending' ? j.waiting_reason ?? 'queued for a worker' : v.waiting_reason,
    ...(v.job_id && warm.get(v.job_id) ? { warm: warm.get(v.job_id) } : {}),
    bytes_done: bytes, total_bytes: tb, job_status: j?.status ?? null, ...vmRate(v.status === 'running' ? pr?.rate_bytes_per_second : undefined, bytes, tb),
  };
}

/** One running VM's rate (its job's, the daemon's one rule for it) and the ETA of its bytes at that rate. */
function vmRate(rate: number | null | undefined, done: number, total: number) {
  const r = rate && rate > 0 ? Math.round(rate) : null;
  return { rate_bytes_per_second: r, eta_seconds: r && total > done ? Math.round((total - done) / r) : null };
}

/** Each warm job's rounds, prediction and cutover (orchestration/warm.ts), with a pending manual cutover request. */
async function warmViews(store: JobStore, ids: string[]) {
  const hs = await store.many(ids, ['state', 'warm', 'warm_cutover']);
  const out = new Map<string, WarmState & { cutover_requested?: unknown }>();
  for (const [i, h] of hs.entries()) {
    const w = parseField<WarmState | null>(h?.warm, null, { job_id: ids[i], field: 'warm' });
    const req = parseField<unknown>(h?.warm_cutover, null, { job_id: ids[i], field: 'warm_cutover' });
    if (w || req) out.set(ids[i], { ...(w ?? { status: 'copying', rounds: [], prediction: null }), ...(req ? { cutover_requested: req } : {}) });
  }
  return out;
}
