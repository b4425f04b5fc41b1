// What several benchmarks share: their redis-server, a keep-alive HTTP client, percentiles, a bounded pool,
// per-process CPU and RSS from /proc, Redis's command statistics, and a finished job made through the real Lua
// scripts (queue.ts, retention.ts, fleet.ts).
import http from 'node:http';
import { readdirSync, readFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import { TestRedis, freePort, waitForPort } from '../../test/helpers/redis';
import type { JobStore } from '../../queue/store';

/** Redis's hash-max-listpack-value as Ferry deploys it (compose.yaml, deploy/k8s/redis.yaml, npm start). */
export const LISTPACK_VALUE = 1024;

/** The benchmarks' redis-server: TestRedis on a free port, but fsync once a second (npm start's policy) rather
 *  than on every write as the crash tests need, and hashes encoded as Ferry deploys Redis. */
export class BenchRedis extends TestRedis {
  override async start() {
    this.port = await freePort();
    this.proc = spawn('redis-server', ['--port', String(this.port), '--bind', '127.0.0.1', '--dir', this.dir,
      '--appendonly', 'yes', '--appendfsync', 'everysec', '--save', '', '--maxmemory-policy', 'noeviction',
      '--hash-max-listpack-value', String(LISTPACK_VALUE)], { stdio: 'ignore' });
    await waitForPort(this.port);
    return this;
  }
}

/** Keep-alive, but an idle socket is dropped after 30 s, before the services' keepAliveTimeout (65 s) closes it
 *  from their side while a request is being written on it (the race shows as ECONNRESET). */
export const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity, timeout: 30_000 });

/** Percentile p (0-100) of xs, nearest rank; NaN for no samples. */
export const pct = (xs: number[], p: number) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};

/** One HTTP request; `body` is the parsed JSON answer (or the text when it is not JSON). T names the fields the
 *  caller reads of an answer it expects (not checked: a bench talks to our own services); unknown otherwise. */
export function request<T = unknown>(base: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: T; text: string }> {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : JSON.stringify(body);
    const h = data ? { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(data)), ...headers } : headers;
    const r = http.request(base + path, { method, agent, headers: h }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (text += d));
      res.on('end', () => {
        let j: unknown;
        try { j = JSON.parse(text); } catch { j = text; } // a body that is not JSON (a page, a script) stays text
        resolve({ status: res.statusCode || 0, body: j as T, text });
      });
    });
    r.on('error', reject);
    r.end(data);
  });
}

/** Runs `total` tasks with at most `width` in flight. */
export async function pool(total: number, width: number, task: (i: number) => Promise<void>) {
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(width, total) }, async () => {
    while (next < total) await task(next++);
  }));
}

/** Ctrl-C or a kill runs `stop` (once, however many signals come: tsx passes a signal it gets on to the script, so a
 *  kill of both processes arrives twice), then exits 130. Returns the same stop for the run's own end. */
export function stopOnSignal(stop: () => Promise<void>): () => Promise<void> {
  let stopping: Promise<void> | undefined;
  const once = () => (stopping ??= stop());
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => { void once().finally(() => process.exit(130)); });
  return once;
}

/** A process as one read of /proc/<pid>/stat gives it: its parent, its CPU seconds so far (user + system) and its
 *  start time in clock ticks (with the pid, what names it: pids are reused, 32768 of them here). */
export interface ProcStat { pid: number; ppid: number; cpu: number; start: number }
function readStat(pid: number): ProcStat | undefined {
  try {
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const rest = f.slice(f.lastIndexOf(')') + 2).split(' ');
    return { pid, ppid: Number(rest[1]), cpu: (Number(rest[11]) + Number(rest[12])) / 100, start: Number(rest[19]) }; // clock ticks
  } catch { return undefined; } // the process has exited
}

/** CPU seconds a process has used so far (user + system), from /proc; 0 once it is gone. */
export const cpuSeconds = (pid: number): number => readStat(pid)?.cpu ?? 0;

/** Every process of the machine, from one scan of /proc (one read of each stat). */
export function procStats(): ProcStat[] {
  return readdirSync('/proc').filter((e) => /^\d+$/.test(e)).map((e) => readStat(Number(e))).filter((p): p is ProcStat => !!p);
}

const cmdlines = new Map<string, string>();
/** A process's command line with NULs as spaces, read once per process (it does not change after its exec);
 *  undefined once it is gone. */
export function cmdlineOf(p: ProcStat): string | undefined {
  const id = `${p.pid}:${p.start}`;
  let c = cmdlines.get(id);
  if (c === undefined) {
    try { c = readFileSync(`/proc/${p.pid}/cmdline`, 'utf8').replace(/\0/g, ' '); } catch { return undefined; } // gone meanwhile
    cmdlines.set(id, c);
  }
  return c;
}

/** CPU seconds by kind of process over a phase: every process of the machine sampled from /proc (every 250 ms, or
 *  from the caller's own scans with `{ timer: false }`, so a benchmark that scans /proc for more scans it once),
 *  named once by `kind` (its pid and command line), its use since the phase began (all of it when it started during
 *  the phase). A process that lives less than a sample apart is missed: the caller prints the machine's busy time
 *  beside the sum, so what was missed shows. `stop()` ends the sampling and gives the sums. */
export function cpuByKind(kind: (pid: number, cmd: string) => string, opts: { timer?: boolean } = {}) {
  const base = new Map<number, number>();
  const last = new Map<number, { kind: string; cpu: number }>();
  const sample = (first: boolean, table = procStats()) => {
    for (const p of table) {
      if (!base.has(p.pid)) base.set(p.pid, first ? p.cpu : 0);
      let k = last.get(p.pid)?.kind;
      if (k === undefined) {
        const cmd = cmdlineOf(p);
        if (cmd === undefined) continue;
        k = kind(p.pid, cmd);
      }
      if (p.cpu > 0) last.set(p.pid, { kind: k, cpu: p.cpu });
    }
  };
  sample(true);
  const timer = opts.timer === false ? undefined : setInterval(() => sample(false), 250);
  return {
    /** One sample from a scan the caller made. */
    sample: (table: ProcStat[]) => sample(false, table),
    stop(): Record<string, number> {
      clearInterval(timer);
      sample(false);
      const out: Record<string, number> = {};
      for (const [pid, x] of last) out[x.kind] = (out[x.kind] ?? 0) + x.cpu - (base.get(pid) ?? 0);
      return out;
    },
  };
}

/** Resident set size of a process in bytes, from /proc; 0 once it is gone. */
export function rssBytes(pid: number): number {
  try {
    return Number(/^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] || 0) * 1024;
  } catch { return 0; } // the process has exited: it holds no memory
}

/** INFO commandstats as {command: [calls, usec]}; calls made inside Lua scripts count under their own names. */
export async function commandStats(redis: { info(section: string): Promise<string> }): Promise<Map<string, [number, number]>> {
  const m = new Map<string, [number, number]>();
  for (const line of (await redis.info('commandstats')).split('\n')) {
    const x = /^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/.exec(line);
    if (x) m.set(x[1], [Number(x[2]), Number(x[3])]);
  }
  return m;
}

/** Commands (and Redis microseconds) per unit between two commandStats snapshots, most expensive first. */
export function commandDelta(before: Map<string, [number, number]>, after: Map<string, [number, number]>, units: number) {
  const rows = [...after].map(([c, [n, us]]) => ({ cmd: c, calls: (n - (before.get(c)?.[0] || 0)) / units, usec: (us - (before.get(c)?.[1] || 0)) / units })).filter((r) => r.calls > 0.01);
  rows.sort((a, b) => b.usec - a.usec);
  return { calls: rows.reduce((a, r) => a + r.calls, 0), usec: rows.reduce((a, r) => a + r.usec, 0), rows };
}

/** One finished (COMPLETED) job through the same Lua scripts every service uses: created and queued, assigned,
 *  running with its first event, `events` progress events, completed with its last event. */
export async function makeFinishedJob(store: JobStore, id: string, events: number, spec: string) {
  const lease = `bench-worker:${id}`;
  await store.create(id, { spec, operation: 'noop', queue: 'jobs.any', priority: 50, attempts: 0, max_attempts: 4, meta: '{}' }, [{ to: 'VALIDATED', reason: 'specification validated' }, { to: 'QUEUED', reason: 'queued on jobs.any with priority 50' }]);
  await store.transition(id, [{ to: 'ASSIGNED', reason: 'assigned to worker bench-worker (attempt 1 of 4)', worker_id: 'bench-worker' }], { fields: { worker_id: 'bench-worker', lease, attempts: 1 } });
  await store.transition(id, [{ to: 'RUNNING', reason: 'worker bench-worker started attempt 1', worker_id: 'bench-worker' }], { lease, event: { ev: { job_id: id, timestamp: new Date().toISOString(), phase: 'initialization', percentage: 0, message: 'started on worker bench-worker', details: {} }, before: false } });
  for (let e = 1; e <= events; e++) await store.appendEvent(id, { job_id: id, timestamp: new Date().toISOString(), phase: 'work', percentage: Math.round((e / events) * 100), message: `step ${e} of ${events}`, details: {} }, lease);
  await store.transition(id, [{ to: 'COMPLETED', reason: 'completed by worker bench-worker', worker_id: 'bench-worker' }], { lease, fields: { result: JSON.stringify({ ok: true }), lease: null, error: null }, event: { ev: { job_id: id, timestamp: new Date().toISOString(), phase: 'completed', percentage: 100, message: 'job completed', details: {} }, before: true } });
}
