// Queue benchmark (`npm run bench:queue`): end-to-end jobs/s through the HTTP API against bare BullMQ, submit
// latency, SSE fan-out delay to 1,000 clients, and Redis memory per queued job, each beside its bare baseline in
// the same run (bare BullMQ in one process; bare BullMQ behind a bare HTTP endpoint; a bare Node SSE server).
// Everything runs on 127.0.0.1 against a private redis-server and real gateway/worker processes, and is stopped
// at the end.
//
// Options: --jobs N (HTTP jobs per throughput run, default 3000), --bare-jobs N (default 6000),
//          --concurrency N (worker slots, also BullMQ Worker concurrency, default 8),
//          --inflight N (client requests in flight, default 32), --clients N (SSE clients, default 1000),
//          --completion bus|sse (how the client sees COMPLETED, default bus; see below),
//          --profile (more Redis commands in the breakdown, per-process CPU of the fan-out, per-round spread).
// Redis commands per job come from INFO commandstats around each throughput run (commands inside Lua scripts
// count under their own names, as they cost Redis the same).
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { Queue, Worker, type ConnectionOptions } from 'bullmq';
import IORedis from 'ioredis';
import { BenchRedis, LISTPACK_VALUE, agent, commandStats, cpuSeconds, pct, pool, request } from './common';
import type { JobStateMessage } from '../../queue/bus';
import { Proc, startGatewayProc, startWorkerProc, testEnv } from '../../test/helpers/procs';

const { values: opt } = parseArgs({
  options: {
    jobs: { type: 'string', default: '3000' }, 'bare-jobs': { type: 'string', default: '6000' },
    concurrency: { type: 'string', default: '8' }, inflight: { type: 'string', default: '32' },
    clients: { type: 'string', default: '1000' }, completion: { type: 'string', default: 'bus' },
    profile: { type: 'boolean', default: false },
  },
});
const JOBS = Number(opt.jobs);
const BARE_JOBS = Number(opt['bare-jobs']);
const CONC = Number(opt.concurrency);
const INFLIGHT = Number(opt.inflight);
const CLIENTS = Number(opt.clients);
const COMPLETION = opt.completion === 'sse' ? 'sse' : 'bus';
const PREFIX = 'ferrybench';
const MEM_JOBS = 2000;
const FANOUT_ROUNDS = 20;
/** Redis's default hash-max-listpack-value, under which memory is measured too (LISTPACK_VALUE: as deployed). */
const LISTPACK_DEFAULT = 64;

const now = () => performance.now();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Opens an SSE stream; `onChunk` sees raw text with the time it arrived. Resolves once the headers are in. */
function openStream(url: string, onChunk: (s: string, t: number) => void): Promise<{ done: Promise<void>; close(): void }> {
  return new Promise((resolve, reject) => {
    const r = http.get(url, { agent, headers: { Accept: 'text/event-stream' } }, (res) => {
      if (res.statusCode !== 200) { reject(new Error(`SSE ${url}: ${res.statusCode}`)); res.resume(); return; }
      res.setEncoding('utf8');
      const done = new Promise<void>((d) => { res.on('end', d); res.on('close', d); });
      res.on('data', (s: string) => onChunk(s, now()));
      resolve({ done, close: () => r.destroy() });
    });
    r.on('error', (e: NodeJS.ErrnoException) => { if (e.code !== 'ECONNRESET') reject(e); /* a reset is how close() ends the stream */ });
  });
}

const cpuOf: { name: string; pid: () => number }[] = [];
function cpuSnapshot(of = cpuOf) { return of.map((p) => (p.name === 'bench client' ? (process.cpuUsage().user + process.cpuUsage().system) / 1e6 : cpuSeconds(p.pid()))); }
function cpuReport(before: number[], jobs: number, of = cpuOf) {
  const after = cpuSnapshot(of);
  return of.map((p, i) => `${p.name} ${(((after[i] - before[i]) * 1e6) / jobs).toFixed(0)} us`).join(', ');
}
/** CPU milliseconds per job summed over every process of the run (redis, gateway, workers, this client). */
function cpuTotalMs(before: number[], jobs: number) {
  const after = cpuSnapshot();
  return (after.reduce((a, x, i) => a + x - before[i], 0) * 1000) / jobs;
}

async function commandReport(redis: IORedis, before: Map<string, [number, number]>, jobs: number) {
  const after = await commandStats(redis);
  const rows = [...after].map(([c, [n, us]]) => [c, (n - (before.get(c)?.[0] || 0)) / jobs, (us - (before.get(c)?.[1] || 0)) / jobs] as [string, number, number]).filter((r) => r[1] > 0.01);
  rows.sort((a, b) => b[2] - a[2]);
  const total = rows.reduce((a, r) => a + r[1], 0);
  return { total, text: `${total.toFixed(1)} commands/job (incl. inside scripts); by Redis time: ${rows.slice(0, opt.profile ? 30 : 10).map((r) => `${r[0]} ${r[1].toFixed(1)}x ${r[2].toFixed(0)}us`).join(', ')}` };
}

/** An SSE stream over a bare TCP socket: the 1,000-client fan-out measures the gateway, so each received chunk
 *  should cost the client as little as possible (no HTTP response parser; the raw bytes are searched). */
function openRawStream(port: number, path: string, onChunk: (s: string, t: number) => void): Promise<{ done: Promise<void>; close(): void }> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    sock.setNoDelay(true);
    sock.setEncoding('latin1');
    let head = true;
    const done = new Promise<void>((d) => sock.once('close', () => d()));
    sock.once('connect', () => sock.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n`));
    sock.on('data', (s: string) => {
      const t = now();
      if (head) {
        head = false;
        if (!s.startsWith('HTTP/1.1 200')) { reject(new Error(`SSE ${path}: ${s.split('\r\n')[0]}`)); sock.destroy(); return; }
        resolve({ done, close: () => sock.destroy() });
      }
      onChunk(s, t);
    });
    sock.on('error', (e) => (head ? reject(e) : undefined));
  });
}

const W = (n: number) => (n > 1 ? 'workers' : 'worker');
let runId = 0;
const spec = (id: string) => ({ job_id: id, operation: 'noop', parameters: {} });

/** End-to-end: submit `n` noop jobs over HTTP (INFLIGHT at a time) and wait until each is seen COMPLETED. */
async function httpThroughput(base: string, redisUrl: string, n: number, submitLat?: number[]) {
  const tag = `r${++runId}`;
  const completed = new Set<string>();
  let sub: IORedis | undefined;
  if (COMPLETION === 'bus') {
    // One shared subscription to the state-change channel the gateway's SSE hub itself listens on.
    sub = new IORedis(redisUrl);
    await sub.subscribe(`${PREFIX}:bus:jobs`);
    sub.on('message', (_c, raw: string) => {
      if (!raw.includes('"COMPLETED"')) return; // most messages are other states: skip the parse
      const m = JSON.parse(raw) as JobStateMessage; // published on the bus by the job store (queue/bus.ts)
      if (m.state === 'COMPLETED' && m.job_id.startsWith(tag + '-')) completed.add(m.job_id);
    });
  }
  const t0 = now();
  await pool(n, INFLIGHT, async (i) => {
    const id = `${tag}-${i}`;
    const s = now();
    const res = await request(base, 'POST', '/jobs?queue=true', spec(id));
    submitLat?.push(now() - s);
    if (res.status !== 201) throw new Error(`submit ${id}: ${res.status} ${JSON.stringify(res.body)}`);
    if (COMPLETION === 'sse') {
      let buf = '';
      let gotComplete = false;
      const st = await openStream(`${base}/jobs/${id}/events/stream`, (c) => { buf += c; if (/event: complete\ndata: \{"state":"COMPLETED"\}/.test(buf)) gotComplete = true; });
      await st.done;
      if (!gotComplete) throw new Error(`job ${id}: stream ended without complete COMPLETED`);
    } // bus: the wait does not hold a submission slot; the client keeps submitting, as REST clients would.
  });
  if (COMPLETION === 'bus') {
    const deadline = Date.now() + 120_000;
    while (completed.size < n && Date.now() < deadline) await sleep(5);
    if (completed.size < n) throw new Error(`only ${completed.size} of ${n} jobs completed`);
  }
  const secs = (now() - t0) / 1000;
  sub?.disconnect();
  return n / secs;
}

/** Bare BullMQ: Queue.add (INFLIGHT at a time) + one Worker with the same no-op and concurrency, same Redis. */
async function bareThroughput(redisUrl: string, n: number) {
  // ioredis takes `url` at run time, but its typed options have no such field: cast at the library's boundary.
  const conn = { url: redisUrl, maxRetriesPerRequest: null } as ConnectionOptions;
  const name = `bare${++runId}`;
  const q = new Queue(name, { connection: conn, prefix: `${PREFIX}-bare` });
  let done = 0;
  let resolveAll!: () => void;
  const all = new Promise<void>((r) => (resolveAll = r));
  const w = new Worker(name, () => Promise.resolve({ ok: true }), { connection: conn, prefix: `${PREFIX}-bare`, concurrency: CONC });
  w.on('completed', () => { if (++done === n) resolveAll(); });
  await w.waitUntilReady();
  await q.waitUntilReady();
  const t0 = now();
  await pool(n, INFLIGHT, async (i) => {
    await q.add('job', { job_id: `b${i}` }, { jobId: `j_b${i}`, priority: 51, removeOnComplete: true, removeOnFail: true, attempts: 1 });
  });
  await Promise.race([all, sleep(120_000).then(() => { throw new Error(`bare BullMQ: only ${done} of ${n} completed`); })]);
  const secs = (now() - t0) / 1000;
  await w.close();
  await q.obliterate({ force: true }).catch((e: Error) => console.warn(`[bench] could not obliterate ${name}; its keys stay in the bench's Redis: ${e.message}`));
  await q.close();
  return n / secs;
}

/** The second baseline: bare BullMQ behind a bare Node HTTP endpoint, server and worker in their own processes
 *  (scripts/bench/bare-http-bullmq.ts), the client as for Ferry: POST with INFLIGHT in flight, completion seen
 *  through one subscription. What is left between this and Ferry is Ferry's contract, not HTTP or processes. */
async function bareHttpThroughput(redisUrl: string, n: number) {
  const name = `barehttp${++runId}`;
  const prefix = `${PREFIX}-barehttp`;
  const script = path.join(__dirname, 'bare-http-bullmq.ts');
  const start = (args: string[]) => {
    const p = spawn(process.execPath, ['--import', 'tsx', script, ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
    const first = new Promise<string>((resolve, reject) => {
      p.stdout.setEncoding('utf8').once('data', (s: string) => resolve(s.trim()));
      p.once('exit', (c) => reject(new Error(`bare-http-bullmq ${args[0]} exited ${c}`)));
    });
    return { p, first };
  };
  const server = start(['server', redisUrl, name, prefix]);
  const worker = start(['worker', redisUrl, name, prefix, String(CONC)]);
  try {
    const base = `http://127.0.0.1:${await server.first}`;
    await worker.first;
    const cpu = [...cpuOf.filter((c) => c.name === 'redis'), { name: 'bare server', pid: () => server.p.pid! }, { name: 'bare worker', pid: () => worker.p.pid! }, { name: 'bench client', pid: () => process.pid }];
    const sub = new IORedis(redisUrl);
    // Finished jobs counted per run tag as they arrive, so the wait below costs the client nothing.
    const done = new Map<string, number>();
    await sub.subscribe(`${prefix}:done`);
    sub.on('message', (_c, id: string) => { const tag = id.slice(0, id.indexOf('-')); done.set(tag, (done.get(tag) || 0) + 1); });
    const run = async (count: number, tag: string) => {
      const t0 = now();
      await pool(count, INFLIGHT, async (i) => {
        const r = await request(base, 'POST', '/jobs', { job_id: `${tag}-${i}`, operation: 'noop', parameters: {} });
        if (r.status !== 201) throw new Error(`bare HTTP submit: ${r.status}`);
      });
      const deadline = Date.now() + 120_000;
      while ((done.get(tag) || 0) < count && Date.now() < deadline) await sleep(5);
      if ((done.get(tag) || 0) < count) throw new Error(`bare HTTP: only ${done.get(tag) || 0} of ${count} jobs completed`);
      return count / ((now() - t0) / 1000);
    };
    await run(200, 'warm');
    const cpu0 = cpuSnapshot(cpu);
    const rate = await run(n, 'run');
    const cpuMs = (cpuSnapshot(cpu).reduce((a, x, i) => a + x - cpu0[i], 0) * 1000) / n;
    const perProcess = cpuReport(cpu0, n, cpu);
    log(`bare BullMQ behind bare HTTP: ${rate.toFixed(0)} jobs/s; CPU per job: ${perProcess}`);
    sub.disconnect();
    return { rate, cpuMs, perProcess };
  } finally {
    server.p.kill('SIGTERM');
    worker.p.kill('SIGTERM');
  }
}

/** Redis memory per queued job for bare BullMQ (Queue.add, no worker), for comparison. */
async function bareMemory(redis: IORedis, redisUrl: string, n: number) {
  const q = new Queue('barememory', { connection: { url: redisUrl, maxRetriesPerRequest: null }, prefix: `${PREFIX}-bare` });
  await q.add('job', { job_id: 'warm' }, { jobId: 'j_warm', priority: 51, removeOnComplete: true });
  const before = await usedMemory(redis);
  await pool(n, INFLIGHT, async (i) => { await q.add('job', { job_id: `m${i}` }, { jobId: `j_m${i}`, priority: 51, removeOnComplete: true, removeOnFail: true, attempts: 1 }); });
  const per = ((await usedMemory(redis)) - before) / n;
  await q.obliterate({ force: true }).catch((e: Error) => console.warn(`[bench] could not obliterate barememory; its keys stay in the bench's Redis: ${e.message}`));
  await q.close();
  return per;
}

async function usedMemory(redis: IORedis) {
  const info = await redis.info('memory');
  return Number(/used_memory:(\d+)/.exec(info)![1]);
}

async function waitWorkers(base: string, n: number) {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    const r = await request<{ active: number } | null>(base, 'GET', '/workers');
    if (Number(r.body?.active) >= n) return; // as `>=` itself would coerce it: a missing count is NaN, never enough
    await sleep(100);
  }
  throw new Error(`${n} workers did not register`);
}

/** Where the fan-out runs: a stream path on a port, how a round is posted, and how the stream is ended. */
interface FanoutTarget { label: string; port: number; path: string; post(round: number): Promise<{ status: number }>; end(): Promise<unknown>; cpu: { name: string; pid: () => number }[] }

/** The gateway: 1,000 SSE clients on one job; an HTTP pull worker posts progress events. */
async function gatewayTarget(base: string, port: number): Promise<FanoutTarget> {
  const id = `fanout-${Date.now()}`;
  const worker = { worker_id: 'bench-http-worker', capabilities: ['bench_fanout'], execution_mode: 'PROCESS' };
  // The job needs a capability no native worker has, so only this pull worker can take it.
  const sub = await request(base, 'POST', '/jobs?queue=true', { ...spec(id), requirements: { capabilities: ['bench_fanout'] } });
  if (sub.status !== 201) throw new Error(`fan-out submit: ${sub.status} ${JSON.stringify(sub.body)}`);
  const got = await request<{ job_id: string; lease_token: string } | null>(base, 'POST', '/queue/dequeue', worker); // null: nothing for it
  if (got.body?.job_id !== id) throw new Error(`fan-out dequeue returned ${JSON.stringify(got.body)}`);
  const lease = { worker_id: worker.worker_id, lease_token: got.body.lease_token };
  await request(base, 'POST', `/jobs/${id}/start`, lease);
  return {
    label: 'gateway', port, path: `/jobs/${id}/events/stream`, cpu: cpuOf,
    post: (round) => request(base, 'POST', `/jobs/${id}/events`, { ...lease, phase: 'work', percentage: Math.min(100, round), message: `fanout round ${round}`, details: { round: String(round) } }),
    end: () => request(base, 'POST', `/jobs/${id}/complete`, { ...lease, result: {} }),
  };
}

/** The baseline: a bare Node HTTP server (scripts/bench/bare-fanout-server.ts) in its own process. */
async function bareTarget(): Promise<FanoutTarget & { stop(): void }> {
  const proc = spawn(process.execPath, ['--import', 'tsx', path.join(__dirname, 'bare-fanout-server.ts')], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise<number>((resolve, reject) => {
    proc.stdout.setEncoding('utf8').once('data', (s: string) => resolve(Number(s.trim())));
    proc.once('exit', (c) => reject(new Error(`bare fan-out server exited ${c}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  return {
    label: 'bare Node', port, path: '/stream', cpu: [{ name: 'bare server', pid: () => proc.pid! }, { name: 'bench client', pid: () => process.pid }],
    post: (round) => request(base, 'POST', '/fire', { phase: 'work', percentage: Math.min(100, round), message: `fanout round ${round}`, details: { round: String(round) } }),
    end: () => request(base, 'POST', '/end'),
    stop: () => proc.kill('SIGTERM'),
  };
}

/** `clients` raw SSE clients on one stream; each round is posted with its send time and every client's
 *  receive time is taken, so a delay is post sent -> frame read by that client. */
async function fanout(t: FanoutTarget, clients: number) {
  const sentAt = new Map<number, number>();
  const delays: number[] = [];
  const byRound = new Map<number, number[]>();
  const seen: Set<number>[] = [];
  let completes = 0;
  const streams: { done: Promise<void>; close(): void }[] = [];
  for (let c = 0; c < clients; c += 100) {
    streams.push(...(await Promise.all(Array.from({ length: Math.min(100, clients - c) }, () => {
      const mine = new Set<number>();
      seen.push(mine);
      let carry = '';
      let completed = false;
      return openRawStream(t.port, t.path, (chunk, at) => {
        const text = carry + chunk;
        carry = text.slice(-64); // a frame split across reads is found on the next one; `mine` dedups
        for (const m of text.matchAll(/"message":"fanout round (\d+)"/g)) {
          const round = Number(m[1]);
          if (mine.has(round)) continue;
          mine.add(round);
          if (round > 0) { delays.push(at - sentAt.get(round)!); (byRound.get(round) || byRound.set(round, []).get(round)!).push(at - sentAt.get(round)!); }
        }
        if (!completed && text.includes('event: complete')) { completed = true; completes++; }
      });
    }))));
  }
  const post = (round: number) => { sentAt.set(round, now()); return t.post(round); };
  const allHave = async (round: number) => {
    const deadline = Date.now() + 20_000;
    while (seen.filter((s) => s.has(round)).length < clients && Date.now() < deadline) await sleep(2);
    return seen.filter((s) => s.has(round)).length;
  };
  // Round 0 proves every client is live (replay done, subscribed); it is not measured.
  await post(0);
  if ((await allHave(0)) < clients) throw new Error(`${t.label}: not every SSE client became live`);
  let received = 0;
  const cpu0 = cpuSnapshot(t.cpu);
  for (let r = 1; r <= FANOUT_ROUNDS; r++) {
    const res = await post(r);
    if (res.status !== 201) throw new Error(`${t.label}: progress post: ${res.status}`);
    received += await allHave(r);
    await sleep(50);
  }
  await t.end();
  await Promise.race([Promise.all(streams.map((s) => s.done)), sleep(10_000)]);
  for (const s of streams) s.close();
  if (opt.profile) log(`  ${t.label} fan-out CPU per delivered event: ${cpuReport(cpu0, clients * FANOUT_ROUNDS, t.cpu)}`);
  if (opt.profile) for (const [r, d] of byRound) log(`  ${t.label} fan-out round ${r}: first ${Math.min(...d).toFixed(2)} ms, p50 ${pct(d, 50).toFixed(2)}, last ${Math.max(...d).toFixed(2)} ms`);
  return { delays, received, expected: clients * FANOUT_ROUNDS, completes };
}

async function main() {
  const started = Date.now();
  const load0 = os.loadavg()[0].toFixed(2);
  const redis = new BenchRedis();
  const procs: Proc[] = [];
  const cleanup = async () => {
    await Promise.all(procs.map((p) => p.stop('SIGTERM').catch(() => p.kill())));
    await redis.stop();
    agent.destroy();
  };
  process.on('SIGINT', () => void cleanup().finally(() => process.exit(130)));
  try {
    await redis.start();
    const admin = new IORedis(redis.url);
    const env = { ...testEnv(redis.url, PREFIX), FERRY_LEASE_SECONDS: '30', FERRY_HEARTBEAT_SECONDS: '10', FERRY_EXTRA_CAPABILITIES: 'bench_fanout', FERRY_RATE_LIMIT: '0' }; // one client stands in for a fleet: the per-client rate limit would cap it
    const gw = await startGatewayProc(env);
    procs.push(gw);
    const base = gw.url;
    cpuOf.push({ name: 'redis', pid: () => redis.proc!.pid! }, { name: 'gateway', pid: () => gw.proc.pid! }, { name: 'bench client', pid: () => process.pid });
    log(`redis-server :${redis.port}, gateway :${gw.port}, ${CONC} slots per worker, ${INFLIGHT} client requests in flight`);

    // 2 and 4: submit latency (one request at a time) and memory, with no worker running so the jobs stay queued.
    for (let i = 0; i < 100; i++) await request(base, 'POST', '/jobs?queue=true', spec(`warm-${i}`));
    const memBefore = await usedMemory(admin);
    const idleLat: number[] = [];
    for (let i = 0; i < MEM_JOBS; i++) {
      const s = now();
      const r = await request(base, 'POST', '/jobs?queue=true', spec(`mem-${i}`));
      idleLat.push(now() - s);
      if (r.status !== 201) throw new Error(`submit: ${r.status} ${JSON.stringify(r.body)}`);
    }
    const memPerJob = ((await usedMemory(admin)) - memBefore) / MEM_JOBS;
    const bareMemPerJob = await bareMemory(admin, redis.url, MEM_JOBS);
    // The same under Redis's default hash-max-listpack-value (records then use the larger hashtable encoding).
    await admin.config('SET', 'hash-max-listpack-value', String(LISTPACK_DEFAULT));
    const memDefault0 = await usedMemory(admin);
    for (let i = 0; i < MEM_JOBS; i++) await request(base, 'POST', '/jobs?queue=true', spec(`memd-${i}`));
    const memPerJobDefault = ((await usedMemory(admin)) - memDefault0) / MEM_JOBS;
    const bareMemPerJobDefault = await bareMemory(admin, redis.url, MEM_JOBS);
    await admin.config('SET', 'hash-max-listpack-value', String(LISTPACK_VALUE));
    log(`submit latency and memory: ${MEM_JOBS} jobs queued`);

    // 1: throughput. Other work on a shared machine moves the figures, so bare BullMQ is measured right before
    // and right after the HTTP runs, and the ratio is taken against the mean of the two.
    const measureBare = async (label: string) => {
      const cpu0 = cpuSnapshot();
      const cmd0 = await commandStats(admin);
      const rate = await bareThroughput(redis.url, BARE_JOBS);
      const cpu = cpuTotalMs(cpu0, BARE_JOBS);
      log(`bare BullMQ (${label}): ${rate.toFixed(0)} jobs/s; CPU per job: ${cpuReport(cpu0, BARE_JOBS)}`);
      const cmds = await commandReport(admin, cmd0, BARE_JOBS);
      log(`  redis: ${cmds.text}`);
      return { rate, cpu, cmds: cmds.total };
    };
    await bareThroughput(redis.url, 500); // warm-up
    const bareA = await measureBare('before');
    const rates: Record<number, number> = {};
    const cpuMs: Record<number, number> = {};
    const cpuPer: Record<number, string> = {};
    const cmdsPerJob: Record<number, number> = {};
    const loadLat: number[] = [];
    for (const n of [1, 2]) {
      while (procs.length - 1 < n) {
        const w = await startWorkerProc(env, `bench-w${procs.length}`, ['img_tool'], ['--concurrency', String(CONC)]);
        procs.push(w);
        cpuOf.push({ name: `worker ${procs.length - 1}`, pid: () => w.proc.pid! });
      }
      await waitWorkers(base, n);
      const deadline = Date.now() + 60_000; // the jobs queued above drain first: the warm-up
      while (Date.now() < deadline && Number((await request<{ total_jobs: number } | null>(base, 'GET', '/queue')).body?.total_jobs) > 0) await sleep(100);
      await httpThroughput(base, redis.url, 200);
      const cpu0 = cpuSnapshot();
      const cmd0 = await commandStats(admin);
      rates[n] = await httpThroughput(base, redis.url, JOBS, n === 1 ? loadLat : undefined);
      cpuPer[n] = cpuReport(cpu0, JOBS);
      cpuMs[n] = cpuTotalMs(cpu0, JOBS);
      log(`HTTP, ${n} ${W(n)}: ${rates[n].toFixed(0)} jobs/s; CPU per job: ${cpuPer[n]}`);
      const cmds = await commandReport(admin, cmd0, JOBS);
      cmdsPerJob[n] = cmds.total;
      log(`  redis: ${cmds.text}`);
    }
    const bareHttp = await bareHttpThroughput(redis.url, JOBS);
    const bareB = await measureBare('after');
    const bare = (bareA.rate + bareB.rate) / 2;
    const bareCpu = (bareA.cpu + bareB.cpu) / 2;

    // 3: SSE fan-out, through the gateway and, in the same run, through a bare Node server (the floor).
    const fo = await fanout(await gatewayTarget(base, gw.port), CLIENTS);
    log(`fan-out: ${fo.received} of ${fo.expected} deliveries`);
    const bareServer = await bareTarget();
    const fb = await fanout(bareServer, CLIENTS).finally(() => bareServer.stop());
    log(`bare fan-out: ${fb.received} of ${fb.expected} deliveries`);

    const ratio1 = rates[1] / bare;
    const ratio2 = rates[2] / bare;
    const best = Math.max(ratio1, ratio2);
    const p99fan = pct(fo.delays, 99);
    const cmds = Math.max(cmdsPerJob[1], cmdsPerJob[2]);
    const cpuBest = Math.min(cpuMs[1], cpuMs[2]);
    const cpuRatio = cpuBest / bareHttp.cpuMs;
    const rows: [string, string, string][] = [
      [`end-to-end, HTTP API, 1 worker process (concurrency ${CONC})`, `${rates[1].toFixed(0)} jobs/s`, `${(ratio1 * 100).toFixed(0)}% of bare; CPU ${cpuMs[1].toFixed(2)} ms/job, all processes`],
      [`end-to-end, HTTP API, 2 worker processes (concurrency ${CONC} each)`, `${rates[2].toFixed(0)} jobs/s`, `${(ratio2 * 100).toFixed(0)}% of bare; CPU ${cpuMs[2].toFixed(2)} ms/job`],
      [`bare BullMQ, Queue.add + 1 Worker (concurrency ${CONC}), same Redis`, `${bare.toFixed(0)} jobs/s`, `mean of ${bareA.rate.toFixed(0)} before and ${bareB.rate.toFixed(0)} after; CPU ${bareCpu.toFixed(2)} ms/job`],
      [`bare BullMQ behind a bare Node HTTP endpoint (API, worker, client processes)`, `${bareHttp.rate.toFixed(0)} jobs/s`, `${((bareHttp.rate / bare) * 100).toFixed(0)}% of bare; CPU ${bareHttp.cpuMs.toFixed(2)} ms/job; Ferry's HTTP path is ${((Math.max(rates[1], rates[2]) / bareHttp.rate) * 100).toFixed(0)}% of this`],
      ['CPU per job by process, Ferry, 1 worker process', `${cpuMs[1].toFixed(2)} ms`, cpuPer[1]],
      ['CPU per job by process, Ferry, 2 worker processes', `${cpuMs[2].toFixed(2)} ms`, cpuPer[2]],
      ['CPU per job by process, bare BullMQ behind bare HTTP', `${bareHttp.cpuMs.toFixed(2)} ms`, bareHttp.perProcess],
      ['Redis commands per job, incl. inside scripts (Ferry, 1 / 2 workers)', `${cmdsPerJob[1].toFixed(1)} / ${cmdsPerJob[2].toFixed(1)}`, `bare BullMQ ${bareA.cmds.toFixed(1)} / ${bareB.cmds.toFixed(1)}`],
      ['submit latency, 1 request at a time (p50 / p99)', `${pct(idleLat, 50).toFixed(2)} / ${pct(idleLat, 99).toFixed(2)} ms`, ''],
      [`submit latency, ${INFLIGHT} in flight, 1 worker busy (p50 / p99)`, `${pct(loadLat, 50).toFixed(2)} / ${pct(loadLat, 99).toFixed(2)} ms`, ''],
      [`progress event -> ${CLIENTS} SSE clients (p50 / p99)`, `${pct(fo.delays, 50).toFixed(2)} / ${p99fan.toFixed(2)} ms`, `${fo.received}/${fo.expected} delivered, ${fo.completes} got complete`],
      [`bare Node HTTP server, POST -> ${CLIENTS} streams (p50 / p99)`, `${pct(fb.delays, 50).toFixed(2)} / ${pct(fb.delays, 99).toFixed(2)} ms`, `the floor on this machine: same clients, no Redis, no koa; ${fb.received}/${fb.expected} delivered`],
      [`Redis memory per queued job (Ferry), hash-max-listpack-value ${LISTPACK_VALUE} as deployed`, `${(memPerJob / 1024).toFixed(2)} KiB`, `${memPerJob.toFixed(0)} B`],
      [`Redis memory per queued job (bare BullMQ), the same`, `${(bareMemPerJob / 1024).toFixed(2)} KiB`, `${bareMemPerJob.toFixed(0)} B`],
      [`Redis memory per queued job (Ferry), Redis's default ${LISTPACK_DEFAULT}`, `${(memPerJobDefault / 1024).toFixed(2)} KiB`, `${memPerJobDefault.toFixed(0)} B`],
      [`Redis memory per queued job (bare BullMQ), Redis's default`, `${(bareMemPerJobDefault / 1024).toFixed(2)} KiB`, `${bareMemPerJobDefault.toFixed(0)} B`],
    ];
    const w0 = Math.max(...rows.map((r) => r[0].length));
    const w1 = Math.max(...rows.map((r) => r[1].length));
    const out: string[] = [];
    out.push('');
    out.push(`Ferry queue benchmark — ${new Date().toISOString()}, node ${process.version}, ${os.cpus().length} cores, load average ${load0} at start, ${os.loadavg()[0].toFixed(2)} at end`);
    out.push(`jobs: noop; HTTP runs ${JOBS} jobs each, bare BullMQ ${BARE_JOBS}; completion seen via ${COMPLETION === 'bus' ? 'one shared Redis subscription to the gateway\'s state-change channel (ferry bus:jobs), not one SSE stream per job' : 'one SSE stream per job (GET /jobs/{id}/events/stream until complete)'}`);
    out.push('');
    for (const r of rows) out.push(`  ${r[0].padEnd(w0)}  ${r[1].padStart(w1)}  ${r[2]}`);
    out.push('');
    out.push(`  target: HTTP path >= 60% of bare BullMQ ... ${best >= 0.6 ? 'MET' : 'NOT MET'} (best ${(best * 100).toFixed(0)}%)`);
    out.push(`  target: p99 event delivery to ${CLIENTS} clients < 25 ms ... ${p99fan < 25 && fo.received === fo.expected ? 'MET' : 'NOT MET'} (${p99fan.toFixed(2)} ms)`);
    out.push(`  target: Redis commands per no-op job <= 60 ... ${cmds <= 60 ? 'MET' : 'NOT MET'} (${cmds.toFixed(1)})`);
    out.push(`  target: CPU per job, all processes <= 1.5x bare BullMQ behind bare HTTP ... ${cpuRatio <= 1.5 ? 'MET' : 'NOT MET'} (${cpuBest.toFixed(2)} ms against ${bareHttp.cpuMs.toFixed(2)} ms: ${cpuRatio.toFixed(2)}x)`);
    out.push(`  target: Redis memory per queued job <= 1.5 KiB ... ${memPerJob <= 1536 ? 'MET' : 'NOT MET'} (${(memPerJob / 1024).toFixed(2)} KiB as deployed; ${memPerJobDefault <= 1536 ? 'MET' : 'NOT MET'} under Redis's default, ${(memPerJobDefault / 1024).toFixed(2)} KiB)`);
    out.push(`  total run time ${((Date.now() - started) / 1000).toFixed(0)} s`);
    process.stdout.write(out.join('\n') + '\n');
    admin.disconnect();
  } finally {
    await cleanup();
  }
}

function log(s: string) { process.stderr.write(`[bench] ${s}\n`); }

main().then(() => process.exit(0), (e: unknown) => { process.stderr.write(`bench failed: ${(e instanceof Error && e.stack) || String(e)}\n`); process.exit(1); });
