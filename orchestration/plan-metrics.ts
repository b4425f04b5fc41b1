// Plan metrics (mtv_*, after Forklift's names) computed at scrape time from the plan store and the VMs' jobs in
// Redis: every daemon replica reports the same figures, whichever of them runs the plan (aggregate with max).
// Labels are bounded: `plan` (operator-made ids, archived plans left out), `status` (the fixed VM and plan
// statuses), `rule` and `severity` (the preflight rule set), `stage` (the job phases). Never a VM path.
import type client from 'prom-client';
import { registerComputed, Sample } from '../platform/metrics';
import { isTerminal } from '../domain/states';
import { PLAN_STATUSES, PLAN_VM_STATUSES as VM_STATUSES, isVmFinal } from '../domain/plan-states';
import { parseField, type JobStore } from '../queue/store';
import type { ProgressEvent } from '../domain/schemas/job';
import type { Plan, PlanStore } from './plans';
import type { WarmState } from '../domain/warm-predict';

/** A VM's migration time (its last job, RUNNING to its end): seconds. */
export const PLAN_DURATION_BUCKETS = [10, 30, 60, 300, 600, 1800, 3600, 7200, 14400, 28800];

const num = (v: unknown) => (v === undefined || v === null || v === '' || !Number.isFinite(Number(v)) ? undefined : Number(v));

/** Bytes a job moved: the most its events reported (bytes_downloaded, the export's count: later phases report
 *  none, so a job's last event alone would show 0 for a VM that failed after its copy), or its total once it
 *  completed. Read from the job's last 500 events; a finished job's figure never changes, so it is remembered. */
async function jobBytes(store: JobStore, id: string, h: Record<string, string> | null, done: Map<string, number>): Promise<number> {
  if (!h) return 0;
  const known = done.get(id);
  if (known !== undefined) return known;
  const last: Partial<Record<string, string>> = parseField<ProgressEvent | null>(h.latest_event, null, { job_id: id, field: 'latest_event' })?.details ?? {};
  let bytes = num(last.bytes_downloaded) ?? 0;
  if (h.state === 'COMPLETED' && num(last.total_bytes) !== undefined) bytes = Math.max(bytes, num(last.total_bytes)!);
  else {
    const rows = (await store.redis.xrevrange(store.k.events(id), '+', '-', 'COUNT', 500)) as [string, string[]][];
    for (const [, f] of rows) {
      const event = parseField<ProgressEvent | null>(f[1], null, { job_id: id, field: 'events' });
      bytes = Math.max(bytes, num(event?.details?.bytes_downloaded) ?? 0);
    }
  }
  if (isTerminal(h.state)) { if (done.size > 50_000) done.clear(); done.set(id, bytes); }
  return bytes;
}

/** When the job entered the phase it is in now (ms): the oldest event of the current phase among the last 500,
 *  else the job's start (RUNNING) or creation (QUEUED). */
async function stageSince(store: JobStore, id: string, h: Record<string, string>): Promise<{ stage: string; since: number } | null> {
  const rows = (await store.redis.xrevrange(store.k.events(id), '+', '-', 'COUNT', 500)) as [string, string[]][];
  const evs = rows.map(([, f]) => parseField<ProgressEvent | null>(f[1], null, { job_id: id, field: 'events' })).filter((e): e is ProgressEvent => !!e);
  if (h.state === 'QUEUED' || h.state === 'ASSIGNED' || !evs.length) {
    const since = h.state === 'RUNNING' ? num(h.started_at) : Date.parse(h.created_at);
    return since ? { stage: h.state === 'RUNNING' ? 'starting' : 'queued', since } : null;
  }
  const phase = evs[0].phase;
  let since = Date.parse(evs[0].timestamp);
  for (const e of evs) { if (e.phase !== phase) break; since = Date.parse(e.timestamp); }
  return { stage: phase, since };
}

interface Snapshot { plans: Plan[]; jobs: Map<string, Record<string, string> | null> }

export function registerPlanMetrics(registry: client.Registry, plans: PlanStore, store: JobStore) {
  // One read of plans and jobs per scrape, shared by the metrics below (each asks within the same scrape).
  let cached: { at: number; p: Promise<Snapshot> } | null = null;
  const snapshot = () => {
    if (cached && Date.now() - cached.at < 500) return cached.p;
    const p = (async () => {
      const ps = await plans.list(false);
      const ids = [...new Set(ps.flatMap((x) => x.vms.flatMap((v) => v.jobs)))];
      const hs = ids.length ? await store.many(ids, ['state', 'latest_event', 'created_at', 'started_at', 'finished_at', 'warm']) : [];
      return { plans: ps, jobs: new Map(ids.map((id, i) => [id, hs[i]])) };
    })();
    cached = { at: Date.now(), p };
    p.catch(() => { cached = null; });
    return p;
  };

  registerComputed(registry, 'mtv_plans_status', 'Plans by status: 1 for the status each plan is in, 0 for the others', 'gauge', async () => {
    const { plans: ps } = await snapshot();
    return ps.flatMap((p) => PLAN_STATUSES.map((status) => ({ labels: { plan: p.id, status }, value: Number(p.status === status) })));
  });
  registerComputed(registry, 'mtv_planned_vms_total', 'VMs listed in each plan', 'gauge', async () =>
    (await snapshot()).plans.map((p) => ({ labels: { plan: p.id }, value: p.vms.length })));
  registerComputed(registry, 'mtv_migrated_vms_total', 'VMs of each plan migrated (completed)', 'gauge', async () =>
    (await snapshot()).plans.map((p) => ({ labels: { plan: p.id }, value: p.vms.filter((v) => v.status === 'completed').length })));
  registerComputed(registry, 'mtv_workload_migrations_status_total', `VMs of each plan by status (${VM_STATUSES.join(', ')})`, 'gauge', async () =>
    (await snapshot()).plans.flatMap((p) => VM_STATUSES.map((status) => ({
      labels: { plan: p.id, status }, value: p.vms.filter((v) => v.status === status).length,
    }))));
  const finishedBytes = new Map<string, number>();
  registerComputed(registry, 'mtv_migration_data_transferred_bytes',
    'Bytes moved for each plan, over every job of its VMs (retries included)', 'counter', async () => {
    const { plans: ps, jobs } = await snapshot();
    const out: Sample[] = [];
    for (const p of ps) {
      let value = 0;
      for (const v of p.vms) for (const j of v.jobs) value += await jobBytes(store, j, jobs.get(j) ?? null, finishedBytes);
      out.push({ labels: { plan: p.id }, value });
    }
    return out;
  });
  registerComputed(registry, 'mtv_migration_duration_seconds',
    "A VM's migration time (its last job, RUNNING to its end), by plan and the VM's final status", 'histogram', async () => {
    const { plans: ps, jobs } = await snapshot();
    return ps.flatMap((p) => durationSamples(p, jobs));
  });
  registerComputed(registry, 'mtv_plan_findings', 'Preflight findings by plan, rule, severity and whether an override accepted them', 'gauge', async () =>
    findingSamples((await snapshot()).plans));
  registerComputed(registry, 'ferry_plan_vm_predicted_downtime_seconds',
    'A warm VM\'s predicted downtime of a cutover now (its last prediction), by plan and the VM\'s position in the plan', 'gauge', async () =>
    warmSamples((await snapshot()), (w) => w.prediction?.seconds));
  registerComputed(registry, 'ferry_plan_vm_downtime_seconds',
    'A warm VM\'s measured downtime after its cutover (power-off to the boot milestone), by plan and the VM\'s position in the plan', 'gauge',
    async () =>
    warmSamples((await snapshot()), (w) => w.downtime?.seconds));
  registerComputed(registry, 'mtv_plan_vm_stage_seconds',
    "How long the running VM that has been longest in its current stage has been there, by plan and stage "
      + "(the job's phase; queued while it waits for a worker or a slot)", 'gauge', async () => {
    const { plans: ps, jobs } = await snapshot();
    return stageSamples(store, ps, jobs);
  });
}

/** The duration histogram's samples for one plan: its VMs that ended, by their final status. */
function durationSamples(p: Plan, jobs: Snapshot['jobs']): Sample[] {
  const out: Sample[] = [];
  const by = new Map<string, number[]>();
  for (const v of p.vms) {
    const h = v.job_id ? jobs.get(v.job_id) : null;
    const s = num(h?.started_at), e = num(h?.finished_at);
    if (!isVmFinal(v.status) || v.status === 'blocked' || s === undefined || e === undefined) continue;
    by.set(v.status, [...(by.get(v.status) ?? []), Math.max(0, (e - s) / 1000)]);
  }
  for (const [status, xs] of by) {
    const labels = { plan: p.id, status };
    for (const le of [...PLAN_DURATION_BUCKETS, '+Inf' as const]) {
      out.push({ metricName: 'mtv_migration_duration_seconds_bucket', labels: { ...labels, le }, value: xs.filter((x) => le === '+Inf' || x <= le).length });
    }
    out.push({ metricName: 'mtv_migration_duration_seconds_sum', labels, value: xs.reduce((a, b) => a + b, 0) });
    out.push({ metricName: 'mtv_migration_duration_seconds_count', labels, value: xs.length });
  }
  return out;
}

/** Findings counted by plan, rule, severity and override. */
function findingSamples(ps: Plan[]): Sample[] {
  const out = new Map<string, Sample>();
  for (const p of ps) for (const v of p.vms) for (const f of v.findings) {
    const labels = { plan: p.id, rule: f.rule, severity: f.severity, overridden: String(!!f.overridden) };
    const key = JSON.stringify(labels);
    const s = out.get(key) ?? { labels, value: 0 };
    s.value++;
    out.set(key, s);
  }
  return [...out.values()];
}

/** Per plan and stage, the longest any running VM has been in that stage (seconds). */
async function stageSamples(store: JobStore, ps: Plan[], jobs: Snapshot['jobs']): Promise<Sample[]> {
  const max = new Map<string, Sample>();
  const now = Date.now();
  for (const p of ps) for (const v of p.vms) {
    const h = v.status === 'running' && v.job_id ? jobs.get(v.job_id) : null;
    if (!h || isTerminal(h.state)) continue;
    const s = await stageSince(store, v.job_id!, h);
    if (!s) continue;
    const key = `${p.id}\0${s.stage}`;
    const value = Math.max(0, (now - s.since) / 1000);
    if ((max.get(key)?.value ?? -1) < value) max.set(key, { labels: { plan: p.id, stage: s.stage }, value });
  }
  return [...max.values()];
}

/** One sample per warm VM (its last job's `warm` field, orchestration/warm.ts) that has the figure; labelled by plan and the
 *  VM's position in it (bounded, never its path). */
function warmSamples(snap: Snapshot, pick: (w: WarmState) => number | undefined): Sample[] {
  const out: Sample[] = [];
  for (const p of snap.plans) for (const [i, v] of p.vms.entries()) {
    const h = v.job_id ? snap.jobs.get(v.job_id) : null;
    const w = h?.warm ? parseField<WarmState | null>(h.warm, null, { job_id: v.job_id!, field: 'warm' }) : null;
    const value = w ? pick(w) : undefined;
    if (value !== undefined) out.push({ labels: { plan: p.id, vm: String(i) }, value });
  }
  return out;
}
