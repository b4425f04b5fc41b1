// The simulated fleet of scripts/bench/fleet.ts, all in the bench process: HTTP pull workers that heartbeat at
// their interval (docs/worker-protocol.md), jobs they hold RUNNING and post progress on, and SSE and WebSocket
// clients that watch. `mode`: 'all' sends everything; 'leases' only the heartbeats of the workers that hold a
// job (their leases must not lapse while the bench makes its finished jobs); 'paused' nothing, for a quiet window
// (the clients stay connected).
import http from 'node:http';
import WebSocket from 'ws';
import { performance } from 'node:perf_hooks';
import { pool, request } from './common';

export interface FleetOptions { workers: number; running: number; heartbeatSeconds: number; progressSeconds: number }
interface SimWorker { id: string; token?: string; job?: string }
/** The gateway's answers the fleet reads: POST /queue/dequeue (null when nothing is queued) and a heartbeat. */
type Dequeued = { job_id: string; lease_token: string } | null;
interface HeartbeatAnswer { renewed?: string[] }

const sseAgent = new http.Agent({ keepAlive: false, maxSockets: Infinity });

export class Fleet {
  readonly workers: SimWorker[];
  mode: 'all' | 'leases' | 'paused' = 'all';
  /** Latencies (ms) of what the fleet sent since the last take(). */
  hb: number[] = [];
  progress: number[] = [];
  errors = new Map<string, number>();
  sseFrames = 0;
  /** Heartbeats and progress posts not sent because the worker's previous one was still unanswered. */
  skipped = 0;
  wsMessages = 0;
  private timers: NodeJS.Timeout[] = [];
  private closers: (() => void)[] = [];
  private seq = 0;
  private closing = false;

  constructor(private gw: string, private daemon: string, private o: FleetOptions) {
    this.workers = Array.from({ length: o.workers }, (_, i) => ({ id: `fleet-w${String(i).padStart(4, '0')}` }));
  }

  get holders() { return this.workers.filter((w) => w.job); }

  private fail(what: string, detail: string) {
    this.errors.set(what, (this.errors.get(what) || 0) + 1);
    if (this.errors.get(what) === 1) console.error(`fleet: first ${what} failure: ${detail}`);
  }

  /** Registers every worker, then the first `running` of them each dequeue a job and start it. */
  async setUp() {
    await pool(this.workers.length, 16, async (i) => {
      const r = await request(this.gw, 'POST', '/workers/register', { worker_id: this.workers[i].id, capabilities: [], system_info: { bench: 'fleet' } });
      if (r.status !== 201) throw new Error(`register ${this.workers[i].id}: ${r.status} ${r.text}`);
    });
    await pool(this.o.running, 8, async (i) => {
      const id = `fleet-run-${i}`;
      const s = await request(this.gw, 'POST', '/jobs?queue=true', { job_id: id, operation: 'noop', parameters: {}, execution_policy: { priority: 90 } });
      if (s.status !== 201) throw new Error(`submit ${id}: ${s.status} ${s.text}`);
    });
    for (const w of this.workers.slice(0, this.o.running)) {
      const d = await request<Dequeued>(this.gw, 'POST', '/queue/dequeue', { worker_id: w.id, capabilities: [] });
      if (d.status !== 200 || !d.body?.lease_token) throw new Error(`dequeue by ${w.id}: ${d.status} ${d.text}`);
      w.token = d.body.lease_token;
      w.job = d.body.job_id;
      const st = await request(this.gw, 'POST', `/jobs/${w.job}/start`, { worker_id: w.id, lease_token: w.token });
      if (st.status !== 200) throw new Error(`start ${w.job}: ${st.status} ${st.text}`);
    }
  }

  /** One heartbeat as the worker sends it (a holder lists its lease token); resolves with its latency in ms. */
  async heartbeat(w: SimWorker): Promise<number> {
    const t = performance.now();
    const r = await request<HeartbeatAnswer>(this.gw, 'POST', `/workers/${w.id}/heartbeat`, { lease_tokens: w.token ? [w.token] : [] });
    const ms = performance.now() - t;
    if (r.status !== 200) this.fail('heartbeat', `${r.status} ${r.text}`);
    // a worker with a token holds a job (setUp sets both)
    else if (w.token && !r.body.renewed?.includes(w.job!)) this.fail('lease renewal', `${w.id} did not renew ${w.job}: ${r.text}`);
    return ms;
  }

  private async postProgress(w: SimWorker) {
    const n = ++this.seq;
    const t = performance.now();
    const r = await request(this.gw, 'POST', `/jobs/${w.job}/events`, { worker_id: w.id, lease_token: w.token, phase: 'transfer', percentage: n % 100, message: `step ${n}`, details: { bytes_processed: String(n * 1048576), total_bytes: String(1e12) } });
    this.progress.push(performance.now() - t);
    if (r.status !== 201) this.fail('progress', `${r.status} ${r.text}`);
  }

  /** Every worker heartbeats every heartbeatSeconds and every holder posts progress every progressSeconds,
   *  each at its own phase so the load is even. */
  run() {
    const every = (ms: number, f: () => Promise<void>, holder: boolean) => {
      const start = setTimeout(() => {
        // As a real worker does, one request of a kind at a time: a tick whose previous request has not been
        // answered yet is skipped (and counted), so an overloaded gateway is not also flooded with connections.
        let busy = false;
        const go = () => {
          if (!(this.mode === 'all' || (this.mode === 'leases' && holder))) return;
          if (busy) { this.skipped++; return; }
          busy = true;
          f().catch((e) => this.fail('request', (e as Error).message)).finally(() => { busy = false; });
        };
        go();
        this.timers.push(setInterval(go, ms));
      }, Math.random() * ms);
      this.timers.push(start);
    };
    for (const w of this.workers) every(this.o.heartbeatSeconds * 1000, async () => { this.hb.push(await this.heartbeat(w)); }, !!w.job);
    for (const w of this.holders) every(this.o.progressSeconds * 1000, () => this.postProgress(w), false);
  }

  /** `sse` streams on the gateway (GET /jobs/{id}/events/stream of the running jobs, round robin) and `ws`
   *  WebSocket clients of the daemon's /ws. */
  async connectClients(sse: number, ws: number) {
    const jobs = this.holders.map((w) => w.job!);
    await pool(sse, 32, async (i) => {
      for (let attempt = 1; ; attempt++) { // a connection reset under the machine's load is tried again, twice
        try { return await this.openSse(jobs[i % jobs.length]); } catch (e) { if (attempt === 3) throw e; }
      }
    });
    const openWs = () => new Promise<void>((resolve, reject) => {
      const s = new WebSocket(`${this.daemon.replace('http', 'ws')}/ws`);
      s.on('message', () => { this.wsMessages++; });
      s.once('open', () => { this.closers.push(() => s.terminate()); resolve(); });
      s.on('error', (e) => { if (!this.closing) this.fail('websocket', e.message); reject(e); });
    });
    await pool(ws, 32, async () => {
      for (let attempt = 1; ; attempt++) { // as for SSE
        try { return await openWs(); } catch (e) { if (attempt === 3) throw e; }
      }
    });
  }

  private openSse(job: string) {
    return new Promise<void>((resolve, reject) => {
      const r = http.get(`${this.gw}/jobs/${job}/events/stream`, { agent: sseAgent, headers: { Accept: 'text/event-stream' } }, (res) => {
        if (res.statusCode !== 200) { reject(new Error(`SSE: ${res.statusCode}`)); res.resume(); return; }
        res.setEncoding('utf8');
        res.on('data', (s: string) => { this.sseFrames += s.split('event: progress').length - 1; });
        res.on('error', (e) => { if (!this.closing) this.fail('sse stream', e.message); });
        this.closers.push(() => r.destroy());
        resolve();
      });
      r.on('error', (e) => { if (!this.closing) this.fail('sse connection', e.message); reject(e); }); // after stop(), the reset is our own
    });
  }

  /** The latencies collected since the last call, and clears them. */
  take() {
    const out = { hb: this.hb, progress: this.progress };
    this.hb = [];
    this.progress = [];
    return out;
  }

  stop() {
    this.closing = true;
    for (const t of this.timers) clearTimeout(t);
    for (const c of this.closers) c();
  }
}
