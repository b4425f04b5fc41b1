// Plan events, live: the plan view (orchestration/plan-view.ts, what GET /plans/{id} answers) each time a plan changes, to
// the daemon's WebSocket clients (`plan_update`) and to the plan's SSE streams (GET /plans/{id}/events/stream).
// A plan changes when it is written (the `plans` bus channel, published by PlanStore on every write, from any
// daemon) or when a job of one of its running VMs changes state or reports progress (the `jobs` and `events`
// channels; which jobs belong to which plan comes in the `plans` messages themselves, so no read per job message).
// Coalesced: changes mark the plan; the view is built at most once per `intervalMs` for all the plan's changes,
// and a view equal to the last one sent (updated_at aside) is not
// sent again. The last change is always sent (trailing edge), so the final status always arrives.
import type Koa from 'koa';
import type { ServerResponse } from 'node:http';
import type { Bus } from '../queue/bus';
import type { JobStore } from '../queue/store';
import type { PlanStore } from './plans';
import { planView } from './plan-view';
import { openEventStream, writeFrame } from '../queue/sse-stream';
import { notFound } from '../platform/errors';
import { createLogger } from '../platform/log';

const log = createLogger('queue');
const FINAL_PLAN = new Set(['completed', 'failed', 'cancelled']);

interface SseClient { res: ServerResponse; sent: string | null; closed: boolean }

export interface PlanHubDeps {
  bus: Bus; store: JobStore; plans: PlanStore;
  /** At most one update per plan per interval (ms). */
  intervalMs: number;
  heartbeatSeconds: number;
  /** Whether any WebSocket client would take a plan_update now. */
  wsWants: () => boolean;
  /** Sends a plan_update to every WebSocket client (`key`: one pending update per plan for a slow client). */
  toWs: (planId: string, view: unknown) => void;
}

export class PlanHub {
  /** Job id -> plan id, for the running VMs' jobs (from the `plans` messages). */
  private jobPlan = new Map<string, string>();
  private planJobs = new Map<string, string[]>();
  /** The last view sent to WebSocket clients, per plan (without updated_at). */
  private wsSent = new Map<string, { key: string; at: number }>();
  private sse = new Map<string, Set<SseClient>>();
  private dirty = new Set<string>();
  private timer?: NodeJS.Timeout;
  private heartbeat?: NodeJS.Timeout;
  private flushing = false;
  private lastFlush = 0;
  private stopped = false;
  private unsubscribe: (() => void)[] = [];
  constructor(private d: PlanHubDeps) {}

  get size() { let n = 0; for (const s of this.sse.values()) n += s.size; return n; }

  async start() {
    this.unsubscribe.push(await this.d.bus.on('plans', (m) => {
      if (!m?.plan_id) return;
      this.track(m.plan_id, m.status && !FINAL_PLAN.has(m.status) ? m.job_ids ?? [] : []);
      this.mark(m.plan_id);
    }));
    const byJob = (m: { job_id?: string }) => { const p = m?.job_id && this.jobPlan.get(m.job_id); if (p) this.mark(p); };
    this.unsubscribe.push(await this.d.bus.on('jobs', byJob), await this.d.bus.on('events', byJob));
    // Plans already running when this daemon starts: their jobs are known before their next write.
    for (const id of await this.d.plans.ids()) {
      const p = await this.d.plans.get(id);
      if (p?.status === 'running') this.track(id, p.vms.filter((v) => v.status === 'running' && v.job_id).map((v) => v.job_id!));
    }
    this.heartbeat = setInterval(() => {
      for (const set of this.sse.values()) for (const c of set) this.write(c, ': heartbeat\n\n');
    }, this.d.heartbeatSeconds * 1000);
    this.heartbeat.unref();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    clearInterval(this.heartbeat);
    for (const u of this.unsubscribe) u();
    for (const [id, set] of this.sse) for (const c of set) this.drop(id, c);
  }

  private track(planId: string, jobIds: string[]) {
    for (const j of this.planJobs.get(planId) ?? []) this.jobPlan.delete(j);
    if (jobIds.length) this.planJobs.set(planId, jobIds); else this.planJobs.delete(planId);
    for (const j of jobIds) this.jobPlan.set(j, planId);
  }

  private mark(planId: string) {
    if (this.stopped) return;
    this.dirty.add(planId);
    this.schedule();
  }

  /** A flush no sooner than `intervalMs` after the last one began (one timer for every plan). */
  private schedule() {
    if (this.timer || this.flushing) return;
    const wait = Math.max(0, this.lastFlush + this.d.intervalMs - Date.now());
    this.timer = setTimeout(() => { this.timer = undefined; void this.flush(); }, wait);
    this.timer.unref();
  }

  private async flush() {
    this.flushing = true;
    this.lastFlush = Date.now();
    const ids = [...this.dirty];
    this.dirty.clear();
    try {
      const ws = this.d.wsWants();
      for (const id of ids) {
        const clients = this.sse.get(id);
        if (!ws && !clients?.size) continue;
        await this.send(id, ws, clients).catch((e) => {
          log.warn('could not build a plan update (Redis did not answer); the next change sends it', { plan_id: id, error: (e as Error).message });
          this.dirty.add(id);
        });
      }
    } finally {
      this.flushing = false;
      if (this.dirty.size) this.schedule();
    }
  }

  private async send(id: string, ws: boolean, clients: Set<SseClient> | undefined) {
    const p = await this.d.plans.get(id);
    if (!p) {
      this.wsSent.delete(id);
      for (const c of clients ?? []) { this.write(c, `event: complete\ndata: ${JSON.stringify({ status: 'deleted' })}\n\n`); this.drop(id, c); }
      return;
    }
    const view = await planView(this.d.store, p);
    const key = JSON.stringify({ ...view, updated_at: undefined });
    const final = FINAL_PLAN.has(view.status);
    const last = this.wsSent.get(id);
    if (ws && last?.key !== key) {
      // A flush asked for by a new SSE client comes early: WebSocket clients still get one update per interval.
      if (last && Date.now() - last.at < this.d.intervalMs) this.dirty.add(id);
      else { this.wsSent.set(id, { key, at: Date.now() }); this.d.toWs(id, view); }
    }
    if (clients?.size) {
      const frame = `event: plan\nid: ${Date.now()}\ndata: ${JSON.stringify(view)}\n\n`;
      for (const c of clients) {
        if (c.sent !== key) { c.sent = key; this.write(c, frame); }
        if (final) { this.write(c, `event: complete\nid: ${Date.now()}\ndata: ${JSON.stringify({ status: view.status })}\n\n`); this.drop(id, c); }
      }
    }
  }

  private write(c: SseClient, s: string) {
    if (!c.closed) writeFrame(c.res, s);
  }

  private drop(id: string, c: SseClient) {
    if (!c.closed) { c.closed = true; c.res.end(); }
    const set = this.sse.get(id);
    set?.delete(c);
    if (set && !set.size) this.sse.delete(id);
  }

  /** GET /plans/{id}/events/stream: 404 for an unknown plan; 204 for a client that reconnects (Last-Event-ID)
   *  to a plan that is final (it had `complete`); else the current view at once, a view per change, and
   *  `complete {status}` when the plan is final. */
  async serve(ctx: Koa.Context, id: string) {
    const p = await this.d.plans.get(id);
    if (!p) throw notFound(`plan ${id} not found`);
    if ((ctx.get('Last-Event-ID') || ctx.query.last_event_id) && FINAL_PLAN.has(p.status)) { ctx.status = 204; return; }
    const res = openEventStream(ctx);
    const c: SseClient = { res, sent: null, closed: false };
    let set = this.sse.get(id);
    if (!set) this.sse.set(id, (set = new Set()));
    set.add(c);
    ctx.req.on('close', () => this.drop(id, c));
    // The first view goes through the same flush as every other (so it is never older than one sent after it).
    this.dirty.add(id);
    if (!this.timer && !this.flushing) void this.flush(); else this.schedule();
  }
}
