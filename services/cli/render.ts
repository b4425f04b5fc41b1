// How the `ferry` command prints: aligned tables, findings blockers first, and one progress line per VM.
import { isVmFinal } from '../../domain/plan-states';

export function table(headers: string[], rows: (string | number | undefined | null)[][]): string {
  const cells = [headers, ...rows.map((r) => r.map((c) => (c === undefined || c === null ? '' : String(c))))];
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => (r[i] || '').length)));
  return cells.map((r) => r.map((c, i) => (i === r.length - 1 ? c : (c || '').padEnd(widths[i]))).join('  ')).join('\n');
}

export function bytes(n?: number | null): string {
  if (n === undefined || n === null || !Number.isFinite(n)) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n, u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  return `${v.toFixed(u ? 1 : 0)} ${units[u]}`;
}

export function bar(fraction: number, width = 30): string {
  const f = Math.max(0, Math.min(1, Number.isFinite(fraction) ? fraction : 0));
  const full = Math.round(f * width);
  return `[${'#'.repeat(full)}${'.'.repeat(width - full)}] ${(f * 100).toFixed(0).padStart(3)}%`;
}

export interface Finding { rule: string; severity: 'blocker' | 'warning' | 'info'; message: string; fix?: string; overridden?: unknown }

/** Findings of every VM, blockers first, as rows of a table. */
export function findingRows(vms: { vm_path: string; findings?: Finding[] }[]): string[][] {
  const rank = (f: Finding) => (f.severity === 'blocker' && !f.overridden ? 0 : f.severity === 'blocker' ? 1 : 2);
  return vms.flatMap((v) => (v.findings || []).map((f) => ({ v, f })))
    .sort((a, b) => rank(a.f) - rank(b.f) || a.v.vm_path.localeCompare(b.v.vm_path))
    .map(({ v, f }) => [f.overridden ? `${f.severity} (overridden)` : f.severity, v.vm_path, f.rule, f.message, f.fix || '']);
}

export const blockers = (vms: { findings?: Finding[] }[]) => vms.reduce(
  (n, v) => n + (v.findings || []).filter((f) => f.severity === 'blocker' && !f.overridden).length,
  0,
);

/** What the CLI reads of one VM of a plan as the daemon shows it (orchestration/plan-view.ts); the daemon's answer is
 *  read as it comes, so every field may be missing. */
export interface PlanVmView {
  vm_path?: string; status?: string; total_bytes?: number | null; bytes_done?: number | null;
  waiting_reason?: string | null; error?: string | null; stage?: string | null;
  /** a warm VM (docs/plans.md, Warm migration) */
  warm?: {
    status?: string; rounds?: { bytes_copied?: number }[]; prediction?: { seconds?: number } | null; downtime?: { seconds?: number };
    cutover_requested?: unknown;
  };
}
/** What the CLI reads of a plan record (GET /plans/:id, POST /plans and its actions). */
export interface PlanView {
  id?: string; name?: string; status?: string; vms?: PlanVmView[]; vm_count?: number; created_at?: string;
  rate_bytes_per_second?: number | null; eta_seconds?: number | null;
}

/** One line per VM of a plan record and a total bar: what `plan start --wait` and `plan status` show. */
export function planProgress(plan: PlanView): string {
  const vms = plan.vms || [];
  const done = vms.filter((v) => isVmFinal(v.status ?? '')).length;
  const lines = vms.map((v) => {
    const pct = v.total_bytes ? `${Math.floor((100 * (v.bytes_done || 0)) / v.total_bytes).toString().padStart(3)}%` : '    ';
    const detail = v.waiting_reason ? `waiting: ${v.waiting_reason}` : v.error || v.stage || '';
    return `  ${String(v.vm_path).padEnd(30)} ${String(v.status).padEnd(11)} ${pct}  ${detail}${warmLine(v.warm)}`;
  });
  const rate = plan.rate_bytes_per_second ? ` ${bytes(plan.rate_bytes_per_second)}/s` : '';
  const eta = plan.eta_seconds !== undefined && plan.eta_seconds !== null ? ` ETA ${Math.round(plan.eta_seconds)} s` : '';
  const head = `plan ${plan.name || plan.id} ${plan.status}: ${done}/${vms.length} VMs done ${bar(vms.length ? done / vms.length : 0)}${rate}${eta}`;
  return [head, ...lines].join('\n');
}

/** A warm VM's rounds, prediction and (after cutover) measured downtime, on its status line. */
function warmLine(w: PlanVmView['warm']): string {
  if (!w) return '';
  const rounds = w.rounds?.length ?? 0;
  const parts = [`warm ${w.status ?? ''}`.trim(), `${rounds} round${rounds === 1 ? '' : 's'}`];
  if (w.prediction?.seconds !== undefined) parts.push(`predicted downtime ${w.prediction.seconds} s`);
  if (w.downtime?.seconds !== undefined) parts.push(`downtime ${w.downtime.seconds} s`);
  if (w.cutover_requested && w.status === 'copying') parts.push('cutover requested');
  return ` [${parts.join(', ')}]`;
}
