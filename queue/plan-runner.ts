// Runs started plans: each tick follows every running VM's job to its end (rolling back a failed one when the
// plan says so, cleaning up a cancelled one), and submits pending VMs as shape B jobs while the plan is inside
// its start time and windows and below its own limit. The limits that span plans and workers (ESXi host,
// datastore, target host, plan) travel in the job as slot names and are taken by the worker before it starts
// (queue/plan-slots.ts), leased in Redis, so a dead worker frees its slots. A VM is claimed for submission in the
// same compare-and-set as the plan's write, so two daemons never submit one VM twice.
import { randomUUID } from 'node:crypto';
import type { Lifecycle } from './lifecycle';
import type { WebhookStore } from './webhooks';
import { jobCallerOf, newVm, Plan, PlanCaller, PlanStore, PlanVm } from './plans';
import { blocks, planManager, planManagerName, vmOption, type VmResult } from '../shared/plans/preflight';
import { rollbackVm } from '../shared/plans/rollback';
import { recheckTarget } from '../shared/plans/target';
import { buildSpec } from '../shared/daemon-jobs';
import { isTerminal } from '../shared/states';
import { conflict } from '../shared/errors';
import { dropped, type Logger } from '../shared/log';
import { planSlots } from './plan-slots';
import { vmGuardHolder } from './vm-guard';
import { destroyVm } from '../shared/vsphere/actions';
import { PLAN_ONLY_OPTIONS } from '../shared/schemas/plans';

export interface RunnerDeps { plans: PlanStore; life: Lifecycle; hooks: WebhookStore; log: Logger; jobTimeoutSeconds: number; parallelDownloads: number; tickMs?: number; webhookBackoffMs?: number }

const now = () => new Date().toISOString();
const FINAL = new Set(['completed', 'failed', 'cancelled', 'blocked', 'rolled_back']);

/** Whether VMs may start now, and until when (the end of the window we are in; null: no end). */
export function windowNow(p: Pick<Plan, 'start_at' | 'windows'>, t = Date.now()): { open: boolean; until: number | null; why?: string } {
  if (p.start_at && t < Date.parse(p.start_at)) return { open: false, until: null, why: `the plan starts at ${p.start_at}` };
  if (!p.windows.length) return { open: true, until: null };
  const w = p.windows.find((x) => Date.parse(x.start) <= t && t < Date.parse(x.end));
  if (w) return { open: true, until: Date.parse(w.end) };
  const next = p.windows.map((x) => x.start).filter((s) => Date.parse(s) > t).sort()[0];
  return { open: false, until: null, why: next ? `outside the plan's windows; the next opens at ${next}` : 'every window of the plan has closed' };
}

function applyResults(p: Plan, results: VmResult[], which: (v: PlanVm) => boolean) {
  for (const r of results) {
    const v = p.vms.find((x) => x.vm_path === r.vm_path);
    if (!v || !which(v)) continue;
    v.findings = r.findings;
    if (r.placement) v.placement = r.placement;
    v.status = blocks(r) ? 'blocked' : 'pending';
    v.error = blocks(r) ? `blocked by preflight: ${r.findings.filter((f) => f.severity === 'blocker' && !f.overridden).map((f) => f.rule).join(', ')}` : null;
  }
}

export class PlanRunner {
  private timer?: NodeJS.Timeout;
  private busy = false;
  constructor(private d: RunnerDeps) {}

  begin() { this.timer = setInterval(() => void this.tick(), this.d.tickMs ?? 1000); this.timer.unref(); }
  stop() { clearInterval(this.timer); }

  /** `by`: the starter, whom every job of the plan acts as (jobCallerOf). */
  async start(id: string, results: VmResult[], by: PlanCaller) {
    const p = await this.d.plans.mutate(id, (q) => {
      if (q.status !== 'pending') throw conflict(`plan ${q.id} is ${q.status}`);
      applyResults(q, results, () => true);
      q.status = 'running'; q.started_at = now(); q.validated_at = now(); q.started_by = by;
    });
    await this.event(p, 'plan.started', { plan_id: p.id, name: p.name, vms: p.vms.length, blocked: p.vms.filter((v) => v.status === 'blocked').length });
    void this.tick();
    return p;
  }

  /** `by`: who retries; the jobs from now on act as this caller (started_by). */
  async retry(id: string, results: VmResult[], by: PlanCaller) {
    const p = await this.d.plans.mutate(id, (q) => {
      q.started_by = by;
      if (q.status === 'running' && q.vms.every((v) => !['failed', 'cancelled', 'blocked'].includes(v.status))) throw conflict(`plan ${q.id} has no failed, cancelled or blocked VM`);
      for (const v of q.vms) if (['failed', 'cancelled', 'blocked'].includes(v.status)) { Object.assign(v, { ...newVm(v), jobs: v.jobs, overrides: v.overrides }); }
      applyResults(q, results, (v) => v.status === 'pending');
      q.status = 'running'; q.finished_at = null; q.cancel_requested = false;
    });
    void this.tick();
    return p;
  }

  async cancel(id: string, vmPath?: string) {
    const toCancel: string[] = [];
    const p = await this.d.plans.mutate(id, (q) => {
      toCancel.length = 0;
      const vms = vmPath ? q.vms.filter((v) => v.vm_path === vmPath) : q.vms;
      if (vmPath && !vms.length) throw conflict(`plan ${q.id} has no VM ${vmPath}`);
      if (!vmPath) { if (q.status !== 'running' && q.status !== 'pending') throw conflict(`plan ${q.id} is ${q.status}`); q.cancel_requested = true; }
      for (const v of vms) {
        if (v.status === 'pending') { v.status = 'cancelled'; v.error = 'cancelled before it started'; }
        else if (v.status === 'running' && v.job_id) toCancel.push(v.job_id);
      }
      if (!vmPath && q.status === 'pending') { q.status = 'cancelled'; q.finished_at = now(); }
    });
    for (const j of toCancel) await this.d.life.cancel(j, `plan ${id} cancelled${vmPath ? ` for ${vmPath}` : ''}`).catch((e) => this.d.log.info('job already finished when its plan was cancelled', { job_id: j, error: (e as Error).message }));
    void this.tick();
    return p;
  }

  async rollback(id: string, vmPath: string, why: string) {
    const p = await this.d.plans.must(id);
    const v = p.vms.find((x) => x.vm_path === vmPath)!;
    const detail = v.placement && v.job_id ? await rollbackVm(planManager(p), { ...v.placement, vm_path: v.vm_path }, await this.d.life.store.made(v.job_id)) : 'nothing was placed';
    const q = await this.d.plans.mutate(id, (x) => {
      const w = x.vms.find((y) => y.vm_path === vmPath)!;
      w.rollback = { at: now(), detail: `${why}: ${detail}` };
      w.status = 'rolled_back';
    });
    await this.event(q, 'plan.vm_rolled_back', { plan_id: id, vm_path: vmPath, detail });
    return q;
  }

  /** One pass over every running plan; a failing plan is logged and the others go on. */
  async tick() {
    if (this.busy) return;
    this.busy = true;
    try {
      for (const id of await this.d.plans.ids()) {
        const p = await this.d.plans.get(id);
        if (!p || p.status !== 'running') continue;
        await this.step(p).catch((e) => this.d.log.warn('plan step failed; tried again on the next tick', { plan_id: id, error: (e as Error).message }));
      }
    } catch (e) {
      this.d.log.warn('plan tick failed; tried again on the next tick', { error: (e as Error).message });
    } finally { this.busy = false; }
  }

  private async step(p: Plan) {
    await this.follow(p);
    const q = await this.d.plans.must(p.id);
    if (!q.cancel_requested) await this.submit(q);
    await this.finish(p.id);
  }

  /** Running VMs whose job has ended: their outcome, a rollback or clean-up, and the event. */
  private async follow(p: Plan) {
    for (const v of p.vms.filter((x) => x.status === 'running' && x.job_id)) {
      const h = await this.d.life.store.raw(v.job_id!);
      // Claimed but never submitted (the daemon stopped in between): after a minute it is pending again.
      if (!h) { if (Date.now() - Date.parse(v.claimed_at ?? '') > 60_000) await this.settle(p, v, 'pending', null); continue; }
      const w = windowNow(p);
      if (h.state === 'QUEUED' && !w.open) { await this.d.life.cancel(v.job_id!, `window closed before it started: ${w.why}`).catch(dropped(this.d.log, 'could not cancel a queued job whose window closed; the VM goes back to pending, and a job that starts anyway is followed as usual', { plan_id: p.id, job_id: v.job_id })); await this.settle(p, v, 'pending', null); continue; }
      if (!isTerminal(h.state)) continue;
      const outcome = h.state === 'COMPLETED' ? 'completed' : h.state === 'CANCELLED' ? 'cancelled' : 'failed';
      let status = outcome;
      let detail: string | null = outcome === 'completed' ? null : h.error || outcome;
      if (outcome !== 'completed' && v.placement && (outcome === 'cancelled' || vmOption(p, v.vm_path, 'rollback') !== false)) {
        const placed = v.placement;
        const r = await this.d.life.store.made(v.job_id!).then((made) => rollbackVm(planManager(p), { ...placed, vm_path: v.vm_path }, made)).catch((e) => `rollback failed: ${(e as Error).message}`);
        if (outcome === 'failed' && !/^rollback failed/.test(r)) status = 'rolled_back';
        detail = `${detail}; ${r}`;
      }
      const source = outcome === 'completed' ? await this.afterSuccess(p, v) : undefined;
      await this.settle(p, v, status, detail, source);
      await this.event(p, outcome === 'completed' ? 'plan.vm_completed' : outcome === 'failed' ? 'plan.vm_failed' : 'plan.vm_cancelled', { plan_id: p.id, vm_path: v.vm_path, job_id: v.job_id, status, error: detail });
      if (status === 'rolled_back') await this.event(p, 'plan.vm_rolled_back', { plan_id: p.id, vm_path: v.vm_path, detail });
    }
  }

  /** A completed VM's source (its job completed only once the target booted): deleted on vSphere when the VM's
   *  options say remove_source, never while another job exports it; kept otherwise. A failed deletion is
   *  recorded and logged; the migrated VM stays completed. */
  private async afterSuccess(p: Plan, v: PlanVm): Promise<PlanVm['source']> {
    if (vmOption(p, v.vm_path, 'remove_source') !== true) return { action: 'kept', at: now(), detail: 'options.remove_source is false' };
    const manager = planManagerName(p);
    try {
      const holder = await vmGuardHolder(this.d.plans.redis, this.d.life.store.k, manager, v.vm_path);
      if (holder) throw new Error(`job ${holder} is exporting it`);
      await destroyVm(planManager(p), v.vm_path);
      return { action: 'removed', at: now(), detail: `${v.vm_path} deleted on ${manager} after ${v.placement?.domain ?? 'its domain'} booted on ${v.placement?.virt_uri ?? 'the target'}` };
    } catch (e) {
      this.d.log.warn('a migrated VM\'s source could not be removed; it stays on vSphere', { plan_id: p.id, vm_path: v.vm_path, error: (e as Error).message });
      return { action: 'remove_failed', at: now(), detail: `the source stays: ${(e as Error).message}` };
    }
  }

  private async settle(p: Plan, v: PlanVm, status: string, detail: string | null, source?: PlanVm['source']) {
    await this.d.plans.mutate(p.id, (q) => {
      const w = q.vms.find((x) => x.vm_path === v.vm_path)!;
      if (w.job_id !== v.job_id) return;
      w.status = status; w.error = detail;
      if (source) w.source = source;
      if (status === 'pending') w.job_id = null;
      if (status === 'rolled_back') w.rollback = { at: now(), detail: detail ?? '' };
    });
  }

  private async submit(p: Plan) {
    const w = windowNow(p);
    const inFlight = p.vms.filter((v) => v.status === 'running').length;
    const room = Math.max(0, (p.limits.per_plan ?? 4) - inFlight);
    const waiting = p.vms.filter((v) => v.status === 'pending');
    if (!waiting.length) return;
    const reason = !w.open ? w.why! : room ? null : `waiting for the plan's limit: ${inFlight} of ${p.limits.per_plan} VMs in flight (limits.per_plan)`;
    const picked = w.open ? waiting.slice(0, room) : [];
    const jobIds = new Map(picked.map((v) => [v.vm_path, randomUUID()]));
    const q = await this.d.plans.mutate(p.id, (x) => {
      for (const v of x.vms) {
        if (v.status !== 'pending') continue;
        const j = jobIds.get(v.vm_path);
        if (j) { v.status = 'running'; v.job_id = j; v.jobs = [...v.jobs, j]; v.waiting_reason = null; v.claimed_at = now(); } else v.waiting_reason = reason;
      }
    });
    for (const v of q.vms.filter((x) => jobIds.has(x.vm_path) && x.job_id === jobIds.get(x.vm_path))) {
      await this.submitVm(q, v, w.until).catch((e) => this.settle(q, v, 'failed', `could not submit its job: ${(e as Error).message}`));
    }
  }

  private async submitVm(p: Plan, v: PlanVm, until: number | null) {
    const opts = { ...p.options, ...(v.options ?? {}) };
    for (const k of PLAN_ONLY_OPTIONS) delete opts[k];
    const destination = { type: 'kvm', ...(v.placement?.virt_uri ? { virt_uri: v.placement.virt_uri } : p.destination.virt_uri ? { virt_uri: p.destination.virt_uri } : {}) };
    const def = { name: v.placement?.domain, vm_path: v.vm_path, source: { type: 'vsphere', ...p.source }, destination, options: { ...opts, network_mapping: p.network_map } };
    if (v.placement) await recheckTarget(v.placement);
    const b = buildSpec(def, { where: '', jobTimeoutSeconds: this.d.jobTimeoutSeconds, parallelDownloads: this.d.parallelDownloads, jobId: v.job_id! });
    b.spec.parameters = { ...b.spec.parameters, pool: v.placement?.pool || undefined, domain_name: v.placement?.domain || undefined, plan: { id: p.id, slots: planSlots(p, v, planManagerName(p)), ...(until ? { not_after: until } : {}) } };
    // As its starter, checked as a direct request (checkCaller); parameters.plan only the runner may set.
    await this.d.life.submit(b.spec, { enqueue: true, meta: { ...b.meta, plan_id: p.id }, caller: jobCallerOf(p), planRunner: true });
  }

  private async finish(id: string) {
    let ended: Plan | null = null;
    await this.d.plans.mutate(id, (q) => {
      ended = null;
      if (q.status !== 'running' || !q.vms.every((v) => FINAL.has(v.status))) return;
      q.status = q.cancel_requested ? 'cancelled' : q.vms.every((v) => v.status === 'completed') ? 'completed' : 'failed';
      q.finished_at = now();
      ended = q;
    });
    if (ended) {
      const e = ended as Plan;
      const counts: Record<string, number> = {};
      for (const v of e.vms) counts[v.status] = (counts[v.status] ?? 0) + 1;
      await this.event(e, 'plan.completed', { plan_id: id, status: e.status, counts });
    }
  }

  /** A plan event to the webhooks that want it; a failure to queue is logged, the plan goes on. */
  private async event(p: Plan, event: string, data: Record<string, unknown>) {
    await this.d.hooks.enqueue(event, data, `${p.id}.${typeof data.vm_path === 'string' ? data.vm_path : ''}.${Date.now()}`, { backoffMs: this.d.webhookBackoffMs ?? 1000 })
      .catch((e) => this.d.log.warn('could not queue a plan webhook', { plan_id: p.id, event, error: (e as Error).message }));
  }
}
