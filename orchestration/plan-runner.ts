// Runs started plans, on one daemon: the holder of the `plans` leader lease (queue/leader.ts). A step of a plan
// follows each running VM's job to its end (rolling back a failed one when the plan says so, cleaning up a
// cancelled one), and submits pending VMs as shape B jobs while the plan is inside its start time and windows and
// below its own limit. A plan is stepped when the bus says one of its jobs ended or the plan was written (start,
// retry, cancel from any daemon), and by a slow pass over the running plans' set (orchestration/plans.ts) for what no
// message announces: a window opening, a message missed. The limits that span plans and workers (ESXi host,
// datastore, target host, plan) travel in the job as slot names and are taken by the worker before it starts
// (orchestration/plan-slots.ts), leased in Redis, so a dead worker frees its slots.
// Claims: every side effect (submitting a VM's job, a rollback, a source removal) is first recorded in the VM's
// `actions` by a compare-and-set fenced by the lease, then done, then marked done; a claim a dead leader left
// undone is resumed by the next one (each of these effects is idempotent: a job id is created once, a rollback
// and a removal check first), a done one is never done again. A rollback and a source removal are worker jobs
// (rollback_kvm, remove_source: orchestration/plan-effects.ts) under an id derived from the claim and recorded in it, so
// the daemon runs neither virsh nor a vSphere call; the claim is marked done from the job's end. Webhook events go into the plan's outbox in the
// same write as the change they tell of and are queued under deterministic ids (a second queueing is a no-op).
import { randomUUID } from 'node:crypto';
import type { Lifecycle } from '../queue/lifecycle';
import type { WebhookStore } from './webhooks';
import type { Bus } from '../queue/bus';
import { Leader } from '../queue/leader';
import { Fence, jobCallerOf, LeaseLost, newVm, Plan, PlanAction, PlanCaller, PlanOutboxEntry, PlanStore, PlanVm } from './plans';
import { blocks, planManagerName, vmOption, type VmResult } from '../domain/plans/preflight';
import { recheckTarget } from '../domain/plans/target';
import { PLAN_OPTION_ROLES } from '../domain/plans/caller';
import { preflightInspection } from '../domain/plans/guest-rules';
import { grantsRole, type Auth, type Caller } from '../platform/auth';
import { buildSpec } from '../domain/daemon-jobs';
import { isTerminal } from '../domain/states';
import { isVmFinal, isVmRetryable, vmMayMove } from '../domain/plan-states';
import { ApiError, conflict } from '../platform/errors';
import { dropped, type Logger } from '../platform/log';
import { planSlots } from './plan-slots';
import { awaitEffect, effectEnd, EffectEnd, effectJobId, EffectOp, submitEffect } from './plan-effects';
import { PLAN_ONLY_OPTIONS } from '../domain/schemas/plans';

export interface RunnerDeps {
  plans: PlanStore; life: Lifecycle; hooks: WebhookStore; bus: Bus; log: Logger; jobTimeoutSeconds: number; parallelDownloads: number;
  /** The safety-net pass over the running plans (ms; default 3000): also the leader lease's scale (60% of it). */
  passMs?: number; webhookBackoffMs?: number;
  /** This daemon's API keys: a plan's starter is checked again against them before a source is removed. */
  auth?: Auth;
}

const now = () => new Date().toISOString();
/** A webhook event for the outbox: its id is what makes a second queueing a no-op, so it names what happened
 *  (the plan, the job or time that makes it unique, the event), never when it was queued. */
const outbox = (p: Plan, key: string, event: string, data: Record<string, unknown>): PlanOutboxEntry => ({ id: `${p.id}.${key}.${event}`, event, data });
const vmOf = (p: Plan, vmPath: string) => p.vms.find((x) => x.vm_path === vmPath)!;
/** What a claim answers: run the effect (`run`), use what it recorded (`done`), or leave the VM for now (`busy`). */
type Claim = { run: true; resumed: boolean } | { run: false; done?: PlanAction };
/** How long an API rollback waits for its job before it answers 202 (the claim shows the job; a later call of
 *  the route records its end). */
const API_ROLLBACK_WAIT_MS = 120_000;
/** What a rollback job's end says, as the VM's rollback detail. */
const detailOf = (end: EffectEnd & { ok: true }, otherwise: string) => (typeof end.result.detail === 'string' ? end.result.detail : otherwise);
const rollbackDetail = (end: EffectEnd) => (end.ok ? detailOf(end, 'rolled back') : `rollback failed: ${end.error}`);

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
  private leader?: Leader;
  private unsubscribe: (() => void)[] = [];
  /** Job id -> plan id, for the running VMs' jobs (from the `plans` messages and each step). */
  private jobPlan = new Map<string, string>();
  /** One step per plan at a time; a step asked for meanwhile runs once after it. */
  private stepping = new Map<string, Promise<void>>();
  private again = new Set<string>();
  private indexed = false;
  constructor(private d: RunnerDeps) {}

  /** Runs plans while this daemon holds the `plans` lease; every daemon calls it, one leads. */
  async begin() {
    const { plans, life } = this.d;
    this.leader = new Leader(plans.redis, life.store.k, 'plans', this.d.log).every('plans', this.d.passMs ?? 3000, (still) => this.pass(still));
    this.unsubscribe.push(await this.d.bus.on('plans', (m) => {
      if (!m?.plan_id || m.status !== 'running') return;
      for (const j of m.job_ids ?? []) this.jobPlan.set(j, m.plan_id);
      void this.nudge(m.plan_id);
    }));
    this.unsubscribe.push(await this.d.bus.on('jobs', (m) => {
      const id = m?.job_id && isTerminal(m.state) ? this.jobPlan.get(m.job_id) : undefined;
      if (id) { this.jobPlan.delete(m.job_id); void this.nudge(id); }
    }));
    this.leader.start();
  }

  async stop() {
    for (const u of this.unsubscribe.splice(0)) u();
    await this.leader?.stop();
    await Promise.all([...this.stepping.values()]);
  }

  /** The fence of the runner's writes: the lease this daemon holds (null: it does not lead, it must not write). */
  private fence(): Fence | null {
    const lease = this.leader?.lease;
    return lease ? { key: this.leader!.leaseKey, value: lease } : null;
  }

  /** The slow pass: every running plan (the running set), in turn; the first pass after taking the lease also
   *  indexes plans written before the set existed. */
  private async pass(still: () => Promise<boolean>) {
    if (!this.indexed) { await this.d.plans.reindex(); this.indexed = true; }
    for (const id of await this.d.plans.runningIds()) {
      if (!(await still())) return;
      await this.nudge(id);
    }
  }

  /** Steps one plan on the leader (nothing elsewhere: the leader hears the same messages). */
  nudge(id: string): Promise<void> {
    if (!this.leader?.leading) return Promise.resolve();
    const busy = this.stepping.get(id);
    if (busy) { this.again.add(id); return busy; }
    const run = this.stepOne(id).finally(() => {
      this.stepping.delete(id);
      if (this.again.delete(id)) void this.nudge(id);
    });
    this.stepping.set(id, run);
    return run;
  }

  private async stepOne(id: string) {
    try {
      const p = await this.d.plans.get(id);
      // A plan leaves the running set in the write that ends it; only a deleted one is taken out here.
      if (!p) { await this.d.plans.unindex(id); return; }
      if (p.status !== 'running') { await this.flush(p); return; }
      for (const v of p.vms) {
        if (v.status === 'running' && v.job_id) this.jobPlan.set(v.job_id, id);
        // An effect's job under way (this leader's or a dead one's): its end steps the plan.
        for (const a of v.actions ?? []) if (a.job_id && !a.done_at) this.jobPlan.set(a.job_id, id);
      }
      await this.step(p);
    } catch (e) {
      if (e instanceof LeaseLost) this.d.log.info('plan step stopped: this daemon no longer leads the plans', { plan_id: id });
      else this.d.log.warn('plan step failed; tried again on the next pass', { plan_id: id, error: (e as Error).message });
    }
  }

  /** `by`: the starter, whom every job of the plan acts as (jobCallerOf). */
  async start(id: string, results: VmResult[], by: PlanCaller) {
    const p = await this.d.plans.mutate(id, (q) => {
      if (q.status !== 'pending') throw conflict(`plan ${q.id} is ${q.status}`);
      applyResults(q, results, () => true);
      q.status = 'running'; q.started_at = now(); q.validated_at = now(); q.started_by = by;
      q.outbox = [...(q.outbox ?? []), outbox(q, q.started_at, 'plan.started', {
        plan_id: q.id, name: q.name, vms: q.vms.length, blocked: q.vms.filter((v) => v.status === 'blocked').length,
      })];
    });
    await this.flush(p);
    void this.nudge(id);
    return p;
  }

  /** `by`: who retries; the jobs from now on act as this caller (started_by). */
  async retry(id: string, results: VmResult[], by: PlanCaller) {
    const p = await this.d.plans.mutate(id, (q) => {
      q.started_by = by;
      if (q.status === 'running' && !q.vms.some((v) => isVmRetryable(v.status))) {
        throw conflict(`plan ${q.id} has no failed, cancelled, blocked or rolled back VM`);
      }
      for (const v of q.vms) {
        if (!isVmRetryable(v.status)) continue;
        Object.assign(v, { ...newVm(v), jobs: v.jobs, overrides: v.overrides, ...(v.actions ? { actions: v.actions } : {}) });
        delete v.cancel_requested; // the cancel was for the job that ended; the retry's job must not inherit it
      }
      applyResults(q, results, (v) => v.status === 'pending');
      q.status = 'running'; q.finished_at = null; q.cancel_requested = false;
    });
    void this.nudge(id);
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
        // Remembered on the VM: a job claimed but not yet created cannot be cancelled now; the leader's next
        // step cancels it once it exists (follow).
        else if (v.status === 'running' && v.job_id) { toCancel.push(v.job_id); v.cancel_requested = true; }
      }
      if (!vmPath && q.status === 'pending') { q.status = 'cancelled'; q.finished_at = now(); }
    });
    for (const j of toCancel) {
      await this.d.life.cancel(j, `plan ${id} cancelled${vmPath ? ` for ${vmPath}` : ''}`)
        .catch((e) => this.d.log.info('job already finished when its plan was cancelled', { job_id: j, error: (e as Error).message }));
    }
    void this.nudge(id);
    return p;
  }

  /** One VM rolled back through the API (any daemon, admin): claimed like the leader's own rollbacks, so two
   *  calls at once do it once (the second gets 409), done by a rollback_kvm job acting as `by` on the ledger of
   *  the VM's last job only (never on a name), and recorded with its event. `pending`: the job has not ended
   *  within API_ROLLBACK_WAIT_MS; the claim names it and a later call records its end. */
  async rollback(id: string, vmPath: string, why: string, by: Caller | null): Promise<{ plan: Plan; pending: boolean }> {
    await this.finishApiRollbacks(id, vmPath, why);
    const p = await this.d.plans.must(id);
    const v = vmOf(p, vmPath);
    const key = `api-${Date.now()}-${randomUUID().slice(0, 8)}`;
    const jobId = v.job_id ? effectJobId(v.job_id, 'rollback', key) : undefined;
    const claim = await this.claim(p.id, v, 'rollback', key, null, v.placement ? jobId : undefined);
    if (!claim.run) throw conflict(`a rollback of ${vmPath} is under way`);
    if (!v.placement || !jobId) return { plan: await this.rolledBack(id, vmPath, key, why, 'nothing was placed'), pending: false };
    const end = (await submitEffect(this.d.life, {
      id: jobId, op: 'rollback_kvm', parameters: { of_job: v.job_id, power_on_source: !!v.placement.source_was_on }, caller: by,
      meta: { plan_id: id, vm_path: vmPath, of_job: v.job_id },
    }))
      ?? (await awaitEffect(this.d.life, jobId, API_ROLLBACK_WAIT_MS));
    if (!end) return { plan: await this.d.plans.must(id), pending: true };
    return { plan: await this.apiRollbackEnded(id, vmPath, key, why, jobId, end), pending: false };
  }

  /** Earlier API rollbacks of the VM whose jobs have ended since their call answered: recorded now. */
  private async finishApiRollbacks(id: string, vmPath: string, why: string) {
    const v = vmOf(await this.d.plans.must(id), vmPath);
    for (const a of (v.actions ?? []).filter((x) => x.action === 'rollback' && x.fence === null && x.job_id && !x.done_at)) {
      const end = await effectEnd(this.d.life, a.job_id!);
      if (end) {
        await this.apiRollbackEnded(id, vmPath, a.key, why, a.job_id!, end).catch((e) => this.d.log.info(
          'an earlier API rollback that failed is recorded as failed', { plan_id: id, vm_path: vmPath, error: (e as Error).message }));
      }
    }
  }

  /** An API rollback's job ended: a failure is recorded done with its error (the next call may try again at once)
   *  and answered 502; a success rolls the VM back. */
  private async apiRollbackEnded(id: string, vmPath: string, key: string, why: string, jobId: string, end: EffectEnd): Promise<Plan> {
    if (!end.ok) {
      await this.done(id, vmPath, 'rollback', key, rollbackDetail(end));
      throw new ApiError(502, `the rollback job ${jobId} of ${vmPath} failed: ${end.error}`);
    }
    return this.rolledBack(id, vmPath, key, why, rollbackDetail(end));
  }

  /** Records an API rollback done: the claim, the VM rolled back, its event. */
  private async rolledBack(id: string, vmPath: string, key: string, why: string, detail: string): Promise<Plan> {
    const q = await this.d.plans.mutate(id, (x) => {
      const w = vmOf(x, vmPath);
      markDone(w, 'rollback', key, detail);
      w.rollback = { at: now(), detail: `${why}: ${detail}` };
      w.status = 'rolled_back';
      x.outbox = [...(x.outbox ?? []), outbox(x, `${w.job_id}.${key}`, 'plan.vm_rolled_back', { plan_id: id, vm_path: vmPath, detail })];
    });
    await this.flush(q);
    return q;
  }

  private async step(p: Plan) {
    await this.flush(p);
    await this.follow(p);
    const q = await this.d.plans.must(p.id);
    if (!q.cancel_requested) await this.submit(q);
    await this.finish(p.id);
  }

  /** Claims one side effect of a VM (`fence` null: an API call, not the leader): records it in the VM's actions
   *  unless it is there. A done claim answers what it recorded; an undone one of a leader (a previous one that
   *  died, or this one after a step that failed before it marked it done; steps of a plan never overlap on the
   *  leader) is taken over and its effect resumed: every effect checks first; this leader's own undone claim (its
   *  effect's job under way) is followed, not taken over again. An API rollback is refused while any rollback of
   *  the VM is under way (claimed within the last 10 minutes, not done). `jobId`: the effect's job (effectJobId). */
  private async claim(planId: string, v: PlanVm, action: PlanAction['action'], key: string, fence: Fence | null, jobId?: string): Promise<Claim> {
    const mine = { ...this.newClaim(action, key, fence), ...(jobId ? { job_id: jobId } : {}) };
    let out: Claim = { run: false };
    await this.d.plans.mutate(planId, (q) => {
      const w = vmOf(q, v.vm_path);
      out = { run: false };
      if (w.job_id !== v.job_id) return;
      const actions = (w.actions ??= []);
      if (!fence && actions.some((x) => x.action === action && !x.done_at && Date.now() - Date.parse(x.at) < 600_000)) return;
      const a = actions.find((x) => x.action === action && x.key === key);
      if (a?.done_at) { out = { run: false, done: a }; return; }
      if (a && a.fence === null) return;
      if (a?.claimed_by === mine.claimed_by && a.fence === mine.fence) { out = { run: true, resumed: false }; return; }
      if (a) {
        Object.assign(a, { claimed_by: mine.claimed_by, fence: mine.fence, at: mine.at, resumed: (a.resumed ?? 0) + 1 });
        out = { run: true, resumed: true };
        return;
      }
      actions.push(mine);
      out = { run: true, resumed: false };
    }, fence);
    return out;
  }

  /** Records that a claimed effect was done, with what it did (a fact: written even if the lease went meanwhile). */
  private async done(planId: string, vmPath: string, action: PlanAction['action'], key: string, result: unknown) {
    await this.d.plans.mutate(planId, (q) => markDone(vmOf(q, vmPath), action, key, result));
  }

  /** A claimed effect of the leader, done once: its recorded result when it was done already, null when another
   *  holds it (the VM waits for the next step). */
  private async once<T>(p: Plan, v: PlanVm, action: PlanAction['action'], fn: (resumed: boolean) => Promise<T>): Promise<T | null> {
    const c = await this.claim(p.id, v, action, v.job_id!, this.leaderFence());
    if (!c.run) return c.done ? (c.done.result as T) : null;
    const r = await fn(c.resumed);
    await this.done(p.id, v.vm_path, action, v.job_id!, r);
    return r;
  }

  /** A claimed effect of the leader done by a worker job (rollback_kvm, remove_source), keyed by the VM's job:
   *  what `settle` makes of the job's end (the claim marked done with it), the recorded result of a claim done
   *  already, or null while the job runs or another holds the claim (its end steps the plan again). */
  private async viaJob<T>(
    p: Plan, v: PlanVm, action: 'rollback' | 'remove_source',
    o: { op: EffectOp; parameters: Record<string, unknown>; caller: Caller | null }, settle: (end: EffectEnd) => T,
  ): Promise<T | null> {
    const key = v.job_id!;
    const id = effectJobId(key, action, key);
    const c = await this.claim(p.id, v, action, key, this.leaderFence(), id);
    if (!c.run) return c.done ? (c.done.result as T) : null;
    this.jobPlan.set(id, p.id);
    const end = await submitEffect(this.d.life, {
      id, op: o.op, parameters: o.parameters, caller: o.caller, meta: { plan_id: p.id, vm_path: v.vm_path, of_job: key },
    });
    if (!end) return null;
    this.jobPlan.delete(id);
    const r = settle(end);
    await this.done(p.id, v.vm_path, action, key, r);
    return r;
  }

  /** Running VMs whose job has ended: their outcome, a rollback or clean-up, and the event. */
  private async follow(p: Plan) {
    for (const v of p.vms.filter((x) => x.status === 'running' && x.job_id)) await this.followVm(p, v);
  }

  /** One running VM: its job submitted again when missing, its submission recorded when that record was lost,
   *  then its job followed until it ends. */
  private async followVm(p: Plan, v: PlanVm) {
    const h = await this.d.life.store.raw(v.job_id!);
    // Claimed but never submitted (the leader stopped in between): the next leader submits it.
    if (!h) { await this.resubmit(p, v); return; }
    // Its job exists but the submission was never marked done (the leader stopped in between): a fact to record.
    if (v.actions?.some((a) => a.action === 'submit' && a.key === v.job_id && !a.done_at)) {
      await this.done(p.id, v.vm_path, 'submit', v.job_id!, 'submitted (its job was found by a later step)');
    }
    if (await this.stillGoing(p, v, h.state)) return;
    await this.ended(p, v, h);
  }

  /** A job that has not ended: a queued one whose window closed is cancelled and its VM pending again; a running
   *  one whose VM the plan cancelled is cancelled. False once the job has ended. */
  private async stillGoing(p: Plan, v: PlanVm, state: string): Promise<boolean> {
    const w = windowNow(p);
    if (state === 'QUEUED' && !w.open) {
      await this.d.life.cancel(v.job_id!, `window closed before it started: ${w.why}`).catch(dropped(this.d.log,
        'could not cancel a queued job whose window closed; the VM goes back to pending, and a job that starts anyway is followed as usual',
        { plan_id: p.id, job_id: v.job_id }));
      await this.settle(p, v, 'pending', null);
      return true;
    }
    if (isTerminal(state)) return false;
    if (v.cancel_requested) {
      await this.d.life.cancel(v.job_id!, `plan ${p.id} cancelled for ${v.vm_path}`)
        .catch(dropped(this.d.log, 'could not cancel a plan VM\'s job; the next step tries again', { plan_id: p.id, job_id: v.job_id }));
    }
    return true;
  }

  /** An ended job: its outcome, a rollback when the plan says so (claimed first: nothing is settled while another
   *  holds the claim), the source's fate after a success, and the events. */
  private async ended(p: Plan, v: PlanVm, h: Record<string, string>) {
    const outcome = h.state === 'COMPLETED' ? 'completed' : h.state === 'CANCELLED' ? 'cancelled' : 'failed';
    let status = outcome;
    let detail: string | null = outcome === 'completed' ? null : h.error || outcome;
    if (outcome !== 'completed' && v.placement && (outcome === 'cancelled' || vmOption(p, v.vm_path, 'rollback') !== false)) {
      // The job acts on the ledger of the VM's job alone (services/worker/operations/plan-effects.ts).
      const r = await this.viaJob(p, v, 'rollback', {
        op: 'rollback_kvm', parameters: { of_job: v.job_id, power_on_source: !!v.placement.source_was_on }, caller: jobCallerOf(p),
      }, rollbackDetail);
      if (r === null) return;
      if (outcome === 'failed' && !/^rollback failed/.test(r)) status = 'rolled_back';
      detail = `${detail}; ${r}`;
    }
    const source = outcome === 'completed' ? await this.afterSuccess(p, v) : undefined;
    if (source === null) return;
    const event = outcome === 'completed' ? 'plan.vm_completed' : outcome === 'failed' ? 'plan.vm_failed' : 'plan.vm_cancelled';
    const events = [outbox(p, v.job_id!, event, { plan_id: p.id, vm_path: v.vm_path, job_id: v.job_id, status, error: detail })];
    if (status === 'rolled_back') events.push(outbox(p, v.job_id!, 'plan.vm_rolled_back', { plan_id: p.id, vm_path: v.vm_path, detail }));
    await this.settle(p, v, status, detail, source, events);
  }

  /** A VM claimed for submission whose job does not exist. Claimed by a leader that died before it submitted:
   *  submitted now under the claimed job id (a job id is created once, so a late submission by that leader
   *  gets a conflict). Submitted and gone (removed past retention): failed. */
  private async resubmit(p: Plan, v: PlanVm) {
    const a = v.actions?.find((x) => x.action === 'submit' && x.key === v.job_id);
    // A claim from before claims were recorded: after a minute it is pending again.
    if (!a) { if (Date.now() - Date.parse(v.claimed_at ?? '') > 60_000) await this.settle(p, v, 'pending', null); return; }
    if (a.done_at) { await this.settle(p, v, 'failed', `its job ${v.job_id} is no longer in the store`); return; }
    const r = await this.once(p, v, 'submit', () => this.submitVm(p, v, windowNow(p).until)
      .then(() => 'submitted', (e) => `could not submit its job: ${(e as Error).message}`));
    if (r && r !== 'submitted') await this.settle(p, v, 'failed', r);
  }

  /** A completed VM's source (its job completed only once the target booted): deleted on vSphere by a
   *  remove_source job when the VM's options say remove_source (the job refuses while another job exports it),
   *  kept otherwise. A failed deletion is recorded and logged; the migrated VM stays completed. The deletion is
   *  claimed first (null: another holds the claim, or its job runs). */
  private async afterSuccess(p: Plan, v: PlanVm): Promise<PlanVm['source'] | null> {
    if (vmOption(p, v.vm_path, 'remove_source') !== true) return { action: 'kept', at: now(), detail: 'options.remove_source is false' };
    // Checked again here, not only on the routes: a plan stored before the rule, or changed in Redis, acts as its
    // starter, who must hold the role the direct deletion needs (the job's submission checks it too: checkCaller).
    const starter = this.starterNow(p);
    const need = PLAN_OPTION_ROLES['options.remove_source'].role;
    if (typeof starter === 'string') {
      return { action: 'remove_failed', at: now(), detail: `the source stays: options.remove_source needs role ${need}, and ${starter}` };
    }
    if (starter && !grantsRole(starter.role, need)) {
      return {
        action: 'remove_failed', at: now(),
        detail: `the source stays: options.remove_source needs role ${need}, and the plan's starter "${starter.name}" has role ${starter.role}`,
      };
    }
    return this.viaJob(p, v, 'remove_source', { op: 'remove_source', parameters: { of_job: v.job_id }, caller: starter }, (end): PlanVm['source'] => {
      if (end.ok) return { action: 'removed', at: now(), detail: detailOf(end, `${v.vm_path} deleted`) };
      this.d.log.warn('a migrated VM\'s source could not be removed; it stays on vSphere', { plan_id: p.id, vm_path: v.vm_path, error: end.error });
      return { action: 'remove_failed', at: now(), detail: `the source stays: ${end.error}` };
    });
  }

  /** The plan's starter as this daemon's keys have it now (authentication on): a key removed since the start is
   *  no caller (why, as a string), one given another role acts with that role; otherwise the recorded starter. */
  private starterNow(p: Plan): Caller | null | string {
    const starter = jobCallerOf(p);
    if (!starter || !this.d.auth?.enabled) return starter;
    const key = this.d.auth.keys.find((k) => k.name === starter.name);
    if (!key) return `the plan's starter "${starter.name}" has no API key on this daemon any more`;
    return { name: starter.name, role: key.role };
  }

  /** A running VM's end (or its return to pending), with the events it causes, in one fenced write; a VM that
   *  is no longer running under this job was settled already and is left alone. */
  private async settle(p: Plan, v: PlanVm, status: string, detail: string | null, source?: PlanVm['source'], events: PlanOutboxEntry[] = []) {
    const q = await this.d.plans.mutate(p.id, (x) => {
      const w = vmOf(x, v.vm_path);
      if (w.job_id !== v.job_id || w.status !== 'running' || !vmMayMove(w.status, status)) return;
      w.status = status; w.error = detail;
      if (source) w.source = source;
      if (status === 'pending') w.job_id = null;
      if (status === 'rolled_back') w.rollback = { at: now(), detail: detail ?? '' };
      if (events.length) x.outbox = [...(x.outbox ?? []), ...events];
    }, this.leaderFence());
    await this.flush(q);
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
    const fence = this.leaderFence();
    // Each picked VM is claimed (its submit action recorded) in the same fenced write that marks it running.
    const q = await this.d.plans.mutate(p.id, (x) => {
      for (const v of x.vms) {
        if (v.status !== 'pending') continue;
        const j = jobIds.get(v.vm_path);
        if (j) {
          v.status = 'running'; v.job_id = j; v.jobs = [...v.jobs, j]; v.waiting_reason = null; v.claimed_at = now();
          v.actions = [...(v.actions ?? []), this.newClaim('submit', j, fence)];
        } else v.waiting_reason = reason;
      }
    }, fence);
    for (const v of q.vms.filter((x) => jobIds.has(x.vm_path) && x.job_id === jobIds.get(x.vm_path))) {
      await this.submitVm(q, v, w.until).then(() => this.done(q.id, v.vm_path, 'submit', v.job_id!, 'submitted'),
        async (e) => {
          const why = `could not submit its job: ${(e as Error).message}`;
          await this.done(q.id, v.vm_path, 'submit', v.job_id!, why);
          await this.settle(q, v, 'failed', why);
        });
    }
  }

  private async submitVm(p: Plan, v: PlanVm, until: number | null) {
    const opts = { ...p.options, ...(v.options ?? {}) };
    for (const k of PLAN_ONLY_OPTIONS) delete opts[k];
    const destination = {
      type: 'kvm',
      ...(v.placement?.virt_uri ? { virt_uri: v.placement.virt_uri } : p.destination.virt_uri ? { virt_uri: p.destination.virt_uri } : {}),
    };
    const def = {
      name: v.placement?.domain, vm_path: v.vm_path, source: { type: 'vsphere', ...p.source }, destination,
      options: { ...opts, network_mapping: p.network_map },
    };
    if (v.placement) await recheckTarget(v.placement);
    const b = buildSpec(def, { where: '', jobTimeoutSeconds: this.d.jobTimeoutSeconds, parallelDownloads: this.d.parallelDownloads, jobId: v.job_id! });
    b.spec.parameters = {
      ...b.spec.parameters, pool: v.placement?.pool || undefined, domain_name: v.placement?.domain || undefined,
      plan: { id: p.id, slots: planSlots(p, v, planManagerName(p)), ...(until ? { not_after: until } : {}), inspection: preflightInspection(v.findings) },
    };
    // As its starter, checked as a direct request (checkCaller); parameters.plan only the runner may set.
    await this.d.life.submit(b.spec, { enqueue: true, meta: { ...b.meta, plan_id: p.id }, caller: jobCallerOf(p), planRunner: true });
  }

  private async finish(id: string) {
    const q = await this.d.plans.mutate(id, (x) => {
      if (x.status !== 'running' || !x.vms.every((v) => isVmFinal(v.status))) return;
      x.status = x.cancel_requested ? 'cancelled' : x.vms.every((v) => v.status === 'completed') ? 'completed' : 'failed';
      x.finished_at = now();
      const counts: Record<string, number> = {};
      for (const v of x.vms) counts[v.status] = (counts[v.status] ?? 0) + 1;
      x.outbox = [...(x.outbox ?? []), outbox(x, x.finished_at, 'plan.completed', { plan_id: id, status: x.status, counts })];
    }, this.leaderFence());
    await this.flush(q);
  }

  /** Queues the plan's outbox to the webhooks that want each event (under the entry's id: queued once however
   *  often this runs) and moves the ids to events_sent. A failure to queue is logged; the next step tries again. */
  private async flush(p: Plan) {
    const box = p.outbox ?? [];
    if (!box.length) return;
    try {
      for (const e of box) await this.d.hooks.enqueue(e.event, e.data, e.id, { backoffMs: this.d.webhookBackoffMs ?? 1000 });
    } catch (e) {
      this.d.log.warn('could not queue a plan webhook; the plan\'s next step queues it', { plan_id: p.id, error: (e as Error).message });
      return;
    }
    const sent = new Set(box.map((e) => e.id));
    await this.d.plans.mutate(p.id, (q) => {
      const left = (q.outbox ?? []).filter((e) => !sent.has(e.id));
      if (left.length) q.outbox = left; else delete q.outbox;
      q.events_sent = [...q.events_sent.filter((x) => !sent.has(x)), ...sent].slice(-500);
    });
  }

  /** The fence of a write of the leader's, or LeaseLost when this daemon does not lead (then it must not write). */
  private leaderFence(): Fence {
    const f = this.fence();
    if (!f) throw new LeaseLost('this daemon does not lead the plans');
    return f;
  }

  private newClaim(action: PlanAction['action'], key: string, fence: Fence | null): PlanAction {
    return {
      action, key, claimed_by: this.leader?.id ?? `${process.pid}:api`, fence: fence ? Number(fence.value.split('#').pop()) : null, at: now(),
      done_at: null,
    };
  }
}

function markDone(w: PlanVm, action: PlanAction['action'], key: string, result: unknown) {
  const a = w.actions?.find((x) => x.action === action && x.key === key);
  if (a && !a.done_at) Object.assign(a, { done_at: now(), result });
}
