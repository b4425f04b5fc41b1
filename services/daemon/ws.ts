// WebSocket updates. /ws: `jobs` and `status` on connect, `status` every 2 s, `job_update` for every job change
// seen on Redis pub/sub (so every daemon replica sees changes made anywhere), `schedule_event`, `plan_update` (the
// plan view on each change of a plan, coalesced by orchestration/plan-events.ts).
// /ws/metrics: a metrics snapshot every interval. `job_update`: one message per real change, in order: each
// state change and each progress event is its own message, built from the pub/sub message itself over the job's
// record (so a fast job's `running` shows even when the record is already `completed` when read), and a message
// identical to the one sent before for that job is not sent again. Serialised once for all clients; under a steady
// stream, the messages of up to 100 ms leave together, one write per client (FLUSH_GAP_MS); a slow client
// keeps only the latest update per job instead of an unbounded buffer; clients that miss a ping are dropped.
// The daemon's own plumbing (an operation marked `brief`: virsh_call) is left out of `jobs` and `job_update` as the
// job lists leave it out, unless an admin connects with ?internal=true (another role: 403 naming internal).
import type http from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer, WebSocket } from 'ws';
import type { Bus } from '../../queue/bus';
import type { JobStore } from '../../queue/store';
import type { ProgressEvent } from '../../domain/schemas/job';
import { jobViews, DaemonJob, startOfPhase } from '../../orchestration/daemon-views';
import { daemonStatus, isTerminal } from '../../domain/states';
import { daemonEnvelope } from '../../platform/errors';
import { createLogger, ignoreError } from '../../platform/log';
import type { Caller } from '../../platform/auth';
import { browserRefusal, BrowserRule } from '../../platform/browser';
import { runAs } from '../../platform/limits';
import { clientAddress } from '../../platform/client-address';
import { adminOnly } from '../../platform/admin-only';
import { ApiError } from '../../platform/errors';
import { INTERNAL_JOBS_WHY } from '../../domain/schemas/job';
import { OPERATIONS } from '../../domain/operations';

/** `socket` is the connection ws writes to (handleUpgrade's): corked across a batch of updates (flush). */
interface Client { ws: WebSocket; socket: Duplex; kind: 'events' | 'metrics'; alive: boolean; pending: Map<string, Buffer>; internal: boolean }

export interface WsDeps {
  bus: Bus; store: JobStore;
  statusIntervalMs: number; pingIntervalMs: number; maxBufferedBytes: number;
  status: () => Promise<object>;
  /** The first page of jobs; `internal` includes the daemon's calls (store.list). */
  firstPage: (internal: boolean) => Promise<object>;
  metrics: () => Promise<object>;
  /** status 401/403 refuses the upgrade with the message; 0 lets it through, with the caller (null: auth off) and
   *  `who` (the spawn caps' caller). */
  authorize: (req: http.IncomingMessage) => Promise<{ status: number; message: string; caller?: Caller | null; who?: string }>;
  /** Host and Origin of every upgrade (platform/browser.ts), before anything else. */
  browser: BrowserRule;
  /** Other WebSocket endpoints (the VM console): called after the same authorization, with its caller. */
  others?: Record<string, (req: http.IncomingMessage, socket: Duplex, head: Buffer, caller: Caller | null) => void>;
  /** The audit log's view of an upgrade (refusals; platform/audit.ts), which no HTTP middleware sees. */
  audit?: (req: http.IncomingMessage, u: { path: string; status: number; reason?: string }) => void;
}

const log = createLogger('daemon');
/** The protocol is server -> client: what a client sends is read and dropped. */
const ignoreClientMessage = () => { /* nothing to answer */ };
/** A message as UTF-8 bytes, encoded once for every client it goes to (ws would encode a string on each send:
 *  at 40 job updates a second to 250 clients, 10,000 copies a second for the collector). Sent as text frames. */
const msg = (type: string, data: unknown) => Buffer.from(JSON.stringify({ type, timestamp: new Date().toISOString(), data }));
const TEXT = { binary: false };
/** Batches of job updates start at least this far apart. A change after a quiet spell goes out at once; under a
 *  steady stream (a fleet's progress) the changes of up to 100 ms go out together, each client's in one write
 *  (corkEventClients): at 40 changes a second, four messages per write instead of one. */
const FLUSH_GAP_MS = 100;
const PATHS: Record<string, 'events' | 'metrics'> = { '/ws': 'events', '/api/v1/ws': 'events', '/ws/metrics': 'metrics', '/api/v1/ws/metrics': 'metrics' };

const REASONS: Record<number, string> = {
  401: 'Unauthorized', 403: 'Forbidden', 404: 'Not Found', 421: 'Misdirected Request', 429: 'Too Many Requests', 503: 'Service Unavailable',
};

/** Answers an upgrade with an HTTP error in the daemon's envelope and closes the socket. */
export function refuseUpgrade(socket: Duplex, code: number, text: string, retryAfter?: number) {
  const body = JSON.stringify(daemonEnvelope(code, text));
  const extra = (code === 401 ? 'WWW-Authenticate: Bearer\r\n' : '') + (retryAfter ? `Retry-After: ${retryAfter}\r\n` : '');
  socket.end(`HTTP/1.1 ${code} ${REASONS[code] || 'Error'}\r\nContent-Type: application/json\r\n`
    + `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n${extra}\r\n${body}`);
}

/** `?internal=true` on /ws: true for an admin (or with auth off), the 403's message for another role; false unasked. */
function internalAsked(req: http.IncomingMessage, caller: Caller | null | undefined): boolean | string {
  const v = new URL(req.url || '/', 'http://x').searchParams.get('internal');
  if (v !== 'true' && v !== '1') return false;
  try {
    adminOnly(caller, 'internal', INTERNAL_JOBS_WHY);
    return true;
  } catch (e) {
    if (e instanceof ApiError) return e.message;
    throw e;
  }
}

export class WsHub {
  private wss = new WebSocketServer({ noServer: true, maxPayload: 64 * 1024 });
  private clients = new Set<Client>();
  /** Changes in arrival order: a state change or a progress event. */
  private changed: { id: string; state?: string; event?: ProgressEvent; at?: string }[] = [];
  /** Per job: the state last seen on the bus and the last message sent (to drop identical repeats). */
  private seen = new Map<string, { state?: string; sent?: string }>();
  private flushing = false;
  /** When the last batch of job updates started (FLUSH_GAP_MS). */
  private lastFlush = 0;
  private timers: NodeJS.Timeout[] = [];
  constructor(private d: WsDeps) {}

  get size() { return this.clients.size; }

  /** Whether any client of /ws is connected (orchestration/plan-events.ts builds no plan view otherwise). */
  hasEventClients() { for (const c of this.clients) if (c.kind === 'events') return true; return false; }

  /** A plan changed: its view to every /ws client, serialised once; a slow client keeps only the latest per plan. */
  planUpdate(planId: string, view: unknown) {
    const text = msg('plan_update', view);
    for (const c of this.clients) if (c.kind === 'events') this.send(c, text, `plan:${planId}`);
  }

  async start(server: http.Server) {
    server.on('upgrade', (req, socket: Duplex, head) => {
      const path = (req.url || '/').split('?')[0].replace(/\/+$/, '');
      const kind = PATHS[path];
      const other = this.d.others?.[path];
      const refused = browserRefusal(this.d.browser, 'GET', req.headers, true);
      if (refused) {
        this.d.audit?.(req, { path, status: refused.status, reason: refused.message });
        return refuseUpgrade(socket, refused.status, refused.message);
      }
      if (!kind && !other) return refuseUpgrade(socket, 404, `no WebSocket endpoint at ${path}`);
      this.d.authorize(req).then((v) => {
        if (v.status) { this.d.audit?.(req, { path, status: v.status, reason: v.message }); return refuseUpgrade(socket, v.status, v.message); }
        if (other) return runAs(v.who || `addr:${clientAddress(req)}`, () => other(req, socket, head, v.caller ?? null));
        const internal = internalAsked(req, v.caller);
        if (typeof internal === 'string') { this.d.audit?.(req, { path, status: 403, reason: internal }); return refuseUpgrade(socket, 403, internal); }
        this.wss.handleUpgrade(req, socket, head, (ws) => this.connected(ws, socket, kind, internal));
      }, () => refuseUpgrade(socket, 503, 'storage unavailable, retry'));
    });
    await this.d.bus.on('jobs', (m) => m?.job_id && this.mark({ id: m.job_id, state: m.state, at: m.timestamp }));
    await this.d.bus.on('events', (m) => m?.job_id && this.mark({ id: m.job_id, event: m.event }));
    await this.d.bus.on('schedules', (m) => this.broadcast('events', msg('schedule_event', m)));
    this.timers.push(setInterval(
      () => void this.tick().catch(ignoreError('a status tick could not read Redis; the next tick sends fresh figures')),
      this.d.statusIntervalMs,
    ));
    this.timers.push(setInterval(() => this.ping(), this.d.pingIntervalMs));
    for (const t of this.timers) t.unref();
  }

  private connected(ws: WebSocket, socket: Duplex, kind: Client['kind'], internal: boolean) {
    const c: Client = { ws, socket, kind, alive: true, pending: new Map(), internal };
    this.clients.add(c);
    ws.on('pong', () => { c.alive = true; });
    ws.on('close', () => this.clients.delete(c));
    ws.on('error', () => this.clients.delete(c));
    ws.on('message', ignoreClientMessage);
    void (async () => {
      if (kind === 'events') {
        this.send(c, msg('jobs', await this.d.firstPage(internal)));
        this.send(c, msg('status', await this.d.status()));
      } else {
        this.send(c, msg('metrics', await this.d.metrics()));
      }
    })().catch(ignoreError('could not send a new client its first page; live updates follow, and the client may reconnect for a fresh one'));
  }

  private send(c: Client, text: Buffer, jobId?: string) {
    if (c.ws.readyState !== WebSocket.OPEN) return;
    if (jobId && c.ws.bufferedAmount > this.d.maxBufferedBytes) { c.pending.set(jobId, text); return; }
    c.ws.send(text, TEXT);
  }

  private broadcast(kind: Client['kind'], text: Buffer) {
    for (const c of this.clients) if (c.kind === kind) this.send(c, text);
  }

  private mark(change: { id: string; state?: string; event?: ProgressEvent; at?: string }) {
    this.changed.push(change);
    if (this.flushing) return;
    this.flushing = true;
    const wait = this.gapLeft();
    if (wait > 0) setTimeout(() => void this.flush(), wait); else setImmediate(() => void this.flush());
  }

  /** Milliseconds until the next batch may start (FLUSH_GAP_MS after the last one started); 0 or less: now. */
  private gapLeft() { return this.lastFlush + FLUSH_GAP_MS - Date.now(); }

  /** The job as it was at this change: its state from the change (or the last one seen), its progress from the
   *  event; everything else from the record. A change into a state that is not final carries no progress of its
   *  own (the record may already be further on): it shows the state's phase at 0, and the events that follow
   *  carry the rest. A final state shows the record's, which can no longer change. */
  private asOf(v: DaemonJob, c: { state?: string; event?: ProgressEvent; at?: string }, state: string | undefined): DaemonJob {
    const out: DaemonJob = { ...v, progress: { ...v.progress } };
    if (state && state !== v.state) {
      Object.assign(out, { state, status: daemonStatus(state), completed_at: null, error: null });
      if (out.status === 'running' && !out.started_at) out.started_at = c.at || v.updated_at;
    }
    if (c.state && !isTerminal(c.state)) {
      const phase = out.status === 'pending' ? 'queued' : out.status;
      out.progress = startOfPhase(phase);
    }
    if (c.event) Object.assign(out.progress, { phase: c.event.phase, stage: c.event.phase, percent_complete: Number(c.event.percentage) });
    return out;
  }

  private async flush() {
    try {
      while (this.changed.length) {
        this.lastFlush = Date.now();
        const batch = this.changed.splice(0, 500);
        if (![...this.clients].some((c) => c.kind === 'events')) continue;
        const ids = [...new Set(batch.map((c) => c.id))];
        const views = new Map((await jobViews(this.d.store, ids)).map((v) => [v.id, v]));
        const corked = this.corkEventClients();
        try { this.fanOut(batch, views); } finally { for (const s of corked) s.uncork(); }
        const wait = this.gapLeft();
        if (this.changed.length && wait > 0) await new Promise((r) => setTimeout(r, wait));
      }
    } catch (e) {
      log.warn('could not send job updates to WebSocket clients (Redis did not answer); the next change or status tick catches up',
        { error: (e as Error).message });
    } finally { this.flushing = false; }
  }

  /** Each /ws client's socket held back until a batch is sent: its messages leave in one write (one writev call)
   *  instead of one each. The sends were the daemon's main cost under a fleet: 250 clients and 40 changes a
   *  second are 10,000 writes a second, 9.8 s of a 2.5-minute profile in `writev` alone, in stretches of
   *  100-160 ms that held every HTTP request back (docs/performance.md). */
  private corkEventClients(): Duplex[] {
    const out: Duplex[] = [];
    for (const c of this.clients) if (c.kind === 'events' && c.ws.readyState === WebSocket.OPEN) { c.socket.cork(); out.push(c.socket); }
    return out;
  }

  private fanOut(batch: typeof this.changed, views: Map<string, DaemonJob>) {
    for (const c of batch) {
      const v = views.get(c.id);
      if (!v) continue;
      const seen = this.seen.get(c.id) || {};
      if (c.state) seen.state = c.state;
      const job = this.asOf(v, c, seen.state);
      const key = JSON.stringify({ ...job, updated_at: undefined });
      if (key !== seen.sent) {
        seen.sent = key;
        const text = msg('job_update', job);
        const brief = !!OPERATIONS[job.definition.operation ?? '']?.brief;
        for (const cl of this.clients) if (cl.kind === 'events' && (!brief || cl.internal)) this.send(cl, text, job.id);
      }
      // A finished job changes no more: forget it (bounded memory).
      if (c.state && isTerminal(c.state)) this.seen.delete(c.id); else this.seen.set(c.id, seen);
      if (this.seen.size > 100_000) this.seen.delete(this.seen.keys().next().value!);
    }
  }

  private async tick() {
    // Slow clients that drained get their latest pending updates first.
    for (const c of this.clients) {
      if (c.pending.size && c.ws.bufferedAmount <= this.d.maxBufferedBytes) {
        const p = [...c.pending.values()];
        c.pending.clear();
        for (const t of p) c.ws.send(t, TEXT);
      }
    }
    const kinds = new Set([...this.clients].map((c) => c.kind));
    if (kinds.has('events')) this.broadcast('events', msg('status', await this.d.status()));
    if (kinds.has('metrics')) this.broadcast('metrics', msg('metrics', await this.d.metrics()));
  }

  private ping() {
    for (const c of this.clients) {
      if (!c.alive) { c.ws.terminate(); this.clients.delete(c); continue; }
      c.alive = false;
      try { c.ws.ping(); } catch { /* closed */ }
    }
  }

  close() {
    for (const t of this.timers) clearInterval(t);
    for (const c of this.clients) c.ws.terminate();
    this.clients.clear();
    this.wss.close();
  }
}
