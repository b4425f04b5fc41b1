// Fleet-scale benchmark (`npm run bench:fleet`, issue 22 item 8). Its own redis-server (as Ferry deploys it), a
// gateway and a daemon (real processes, production defaults but for their ports), and in this process a fleet:
// 100,000 finished jobs retained (made through the real Lua scripts), 1,000 HTTP pull workers heartbeating at
// their interval, 200 of them holding a RUNNING job and posting progress, 250 SSE clients on the gateway and 250
// WebSocket clients on the daemon. It prints p50/p99 of the operator's requests under that load (timed from a
// process of their own, fleet-client.ts, not from the fleet's busy one) beside bare
// baselines measured in the same run (Redis PING and HGETALL, an empty Koa route), the cost of a heartbeat at
// 1,000 and at 100,000 retained jobs, CPU per second of each process and Redis memory; where a target is missed,
// what each request costs Redis (commands by name, Redis's time) against its latency. Then it soaks and prints
// what grew. The machine is shared: the load average is printed beside every figure.
//
//   npm run bench:fleet [-- --soak 30m --jobs 100000 --baseline-jobs 1000 --workers 1000 --running 200
//                           --sse 250 --ws 250 --heartbeat 10 --progress 5 --samples 200 --seed-events 1]
import os from 'node:os';
import path from 'node:path';
import { execFileSync, fork, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { startDaemonProc, startGatewayProc } from '../../test/helpers/procs';
import { BenchRedis, pct, pool, stopOnSignal } from './common';
import type { RedisClient } from '../../platform/redis';
import type { JobStore } from '../../queue/store';
import type { JobSpec } from '../../domain/schemas/job';
import { Fleet } from './fleet-sim';
import { cpuNow, cpuRate, expect, resets, ms, p50p99, redisCost, timeSeq, usedMemory, type ProcRef } from './fleet-probe';
import { operatorRoutes, type Route } from './fleet-routes';
import type { ClientAnswer, ClientAsk } from './fleet-client';
import { runSoak } from './fleet-soak';
import { cloneFinished } from './fleet-seed';
import { INSPECT_FLAG, Inspector } from './fleet-heap';

const { values: o } = parseArgs({
  options: {
    soak: { type: 'string', default: '30m' }, jobs: { type: 'string', default: '100000' }, 'baseline-jobs': { type: 'string', default: '1000' },
    workers: { type: 'string', default: '1000' }, running: { type: 'string', default: '200' }, sse: { type: 'string', default: '250' },
    ws: { type: 'string', default: '250' }, heartbeat: { type: 'string', default: '10' }, progress: { type: 'string', default: '5' },
    samples: { type: 'string', default: '200' }, 'seed-events': { type: 'string', default: '1' },
  },
});
const N = (k: keyof typeof o) => Number(o[k]);
const PREFIX = 'fleet';
/** Issue 22's target for every request measured here, at this scale. */
const TARGET_P99_MS = 50;
const load = () => os.loadavg().map((x) => x.toFixed(1)).join(' ');
const sleep = (t: number) => new Promise((r) => setTimeout(r, t));
const verdict = (ok: boolean) => (ok ? 'MET' : 'NOT MET');

async function startServices(redisUrl: string) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-fleet-'));
  const cfg = path.join(dir, 'daemon.yaml');
  writeFileSync(cfg, 'metrics:\n  enabled: true\n');
  const env = { REDIS_URL: redisUrl, FERRY_PREFIX: PREFIX, FERRY_HOST: '127.0.0.1', FERRY_HEARTBEAT_SECONDS: o.heartbeat };
  // Their inspectors, for the soak's live memory (fleet-heap.ts); FERRY_NODE_ARGS is read by startProcess.
  process.env.FERRY_NODE_ARGS = [process.env.FERRY_NODE_ARGS, INSPECT_FLAG].filter(Boolean).join(' ');
  const gw = await startGatewayProc(env);
  const daemon = await startDaemonProc(env, cfg);
  const inspectors = [await Inspector.attach('gateway', gw), await Inspector.attach('daemon', daemon)];
  const bare = spawn(process.execPath, ['--import', 'tsx', path.join(__dirname, 'bare-koa-server.ts')], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise<string>((resolve, reject) => {
    bare.stdout.setEncoding('utf8').once('data', (s: string) => resolve(s.trim()));
    bare.once('exit', (c) => reject(new Error(`bare-koa-server exited ${c}`)));
  });
  return { gw, daemon, bare, bareUrl: `http://127.0.0.1:${port}`, inspectors, dir };
}

/** Finished jobs `from`..`to`-1 through the real Lua scripts (JobStore), 128 at a time (the last is the template
 *  of the copies: fleet-seed.ts). */
async function seed(store: JobStore, makeFinishedJob: typeof import('./common').makeFinishedJob, spec: (id: string) => string, from: number, to: number) {
  const t = Date.now();
  await pool(to - from, 128, (i) => makeFinishedJob(store, `fleet-done-${from + i}`, N('seed-events'), spec(`fleet-done-${from + i}`)));
  console.log(`  made ${to - from} finished jobs (${N('seed-events') + 2} events each) in ${((Date.now() - t) / 1000).toFixed(0)} s; load ${load()}`);
}

async function main() {
  const commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: path.join(__dirname, '..', '..') }).toString().trim();
  console.log(`fleet bench at ${commit}, ${new Date().toISOString()}, node ${process.version}, ${os.cpus().length} cores, load ${load()}`);
  console.log(`  ${N('jobs')} finished jobs, ${N('workers')} HTTP workers (heartbeat every ${o.heartbeat} s), ${N('running')} running (progress every ${o.progress} s), ${N('sse')} SSE + ${N('ws')} WebSocket clients, soak ${o.soak}`);
  const redis = await new BenchRedis().start();
  process.env.REDIS_URL = redis.url;
  process.env.FERRY_PREFIX = PREFIX;
  const { createRedis } = await import('../../platform/redis');
  const { JobStore } = await import('../../queue/store');
  const { jobSpecSchema } = await import('../../domain/schemas/job');
  const { parseDurationMs } = await import('../../platform/config');
  const { makeFinishedJob } = await import('./common');
  const soakMs = parseDurationMs(o.soak);
  if (soakMs === null) throw new Error(`--soak: not a duration: ${o.soak}`);
  const rc = createRedis();
  const store = new JobStore(rc, PREFIX);
  const spec = (id: string) => JSON.stringify(jobSpecSchema.validate({ job_id: id, operation: 'noop', parameters: {} }).value as JobSpec); // Joi's value is untyped
  const s = await startServices(redis.url);
  const procs: ProcRef[] = [
    { name: 'redis', pid: () => redis.proc!.pid! }, { name: 'gateway', pid: () => s.gw.proc.pid! },
    { name: 'daemon', pid: () => s.daemon.proc.pid! }, { name: 'bench (the fleet)', pid: () => process.pid },
  ];
  // Ctrl-C stops the services and the private Redis too, as the end of a run does.
  const stopAll = stopOnSignal(async () => {
    fleet.stop();
    rc.disconnect();
    s.inspectors.forEach((i) => i.close());
    s.bare.kill('SIGTERM');
    await Promise.all([s.gw.stop(), s.daemon.stop()]);
    await redis.stop();
    rmSync(s.dir, { recursive: true, force: true }); // the daemon's configuration folder
  });
  const fleet = new Fleet(s.gw.url, s.daemon.url, { workers: N('workers'), running: N('running'), heartbeatSeconds: N('heartbeat'), progressSeconds: N('progress') });
  try {
    await seed(store, makeFinishedJob, spec, 0, N('baseline-jobs'));
    await fleet.setUp();
    console.log(`  ${N('workers')} workers registered, ${fleet.holders.length} jobs RUNNING; load ${load()}`);
    fleet.mode = 'paused';
    fleet.run();
    const small = await measureQuiet(rc, s.bareUrl, s.gw.url, fleet, `${N('baseline-jobs')} retained jobs`);
    // The rest of the finished jobs, copies of the last one made (fleet-seed.ts); only the lease holders
    // heartbeat meanwhile.
    fleet.mode = 'leases';
    const t = Date.now();
    const where = await cloneFinished(rc, `fleet-done-${N('baseline-jobs') - 1}`, 'fleet-done-', N('baseline-jobs'), N('jobs'));
    console.log(`  copied it ${N('jobs') - N('baseline-jobs')} times in ${((Date.now() - t) / 1000).toFixed(0)} s (its keys ${where.own.join(', ')}; its indexes ${where.idx.join(', ')}); load ${load()}`);
    const listed = (await expect<{ total: number }>(s.gw.url, 'GET', '/jobs?limit=1&state=COMPLETED', 200)).body.total;
    if (listed !== N('jobs')) throw new Error(`the gateway lists ${listed} COMPLETED jobs, not ${N('jobs')}`);
    fleet.mode = 'all';
    await fleet.connectClients(N('sse'), N('ws'));
    console.log(`  ${N('sse')} SSE and ${N('ws')} WebSocket clients connected; load ${load()}`);
    const loaded = await measureLoaded(rc, s, fleet, procs);
    fleet.mode = 'paused';
    await sleep(1000); // what the fleet had in flight lands before the quiet window
    const big = await measureQuiet(rc, s.bareUrl, s.gw.url, fleet, `${N('jobs')} retained jobs`, operatorRoutes(s.gw.url, s.daemon.url, 'fleet-new-quiet'));
    fleet.mode = 'all';
    report(small, big, loaded);
    const grew = await runSoak({ rc, fleet, procs, gw: s.gw.url, daemon: s.daemon.url, soakMs, runningJobs: fleet.holders.map((w) => w.job!), inspectors: s.inspectors });
    console.log(`\nconnections reset under load and retried once by the measuring requests: ${resets.count}`);
    console.log(`fleet ticks skipped because the worker's previous request was still unanswered: ${fleet.skipped}`);
    console.log(`fleet errors over the run: ${fleet.errors.size ? [...fleet.errors].map(([k, v]) => `${k} ${v}`).join(', ') : 'none'}`);
    console.log(`targets: requests p99 <= ${TARGET_P99_MS} ms ${verdict(loaded.allMet)}; heartbeat independent of retained jobs ${verdict(big.hbIndependentOf(small))}; nothing grows without bound ${verdict(!grew)}`);
  } finally {
    await stopAll();
  }
  process.exit(0);
}

/** With the fleet quiet: the bare baselines, and what a heartbeat (an idle worker's; a holder's, which lists
 *  its lease token) costs in latency and Redis commands; `routes` also profiles each route's Redis cost. */
async function measureQuiet(rc: RedisClient, bareUrl: string, gw: string, fleet: Fleet, label: string, routes?: Route[]) {
  const n = N('samples');
  const worker = fleet.workers[fleet.workers.length - 1];
  const ping = await timeSeq(n, async () => { await rc.ping(); });
  const hgetall = await timeSeq(n, async () => { await rc.hgetall(`${PREFIX}:worker:${worker.id}`); });
  const koa = await timeSeq(n, async () => { await expect(bareUrl, 'GET', '/empty', 200); });
  const idle = await redisCost(rc, n, async (i) => { await fleet.heartbeat(fleet.workers[fleet.workers.length - 1 - (i % 100)]); });
  const holders = fleet.holders;
  const holder = await redisCost(rc, n, async (i) => { await fleet.heartbeat(holders[i % holders.length]); });
  console.log(`\nquiet window at ${label} (fleet paused; load ${load()}):`);
  console.log(`  bare Redis PING ${p50p99(ping)}; HGETALL of a worker record ${p50p99(hgetall)}; empty Koa route ${p50p99(koa)}`);
  console.log(`  heartbeat, idle worker:  ${p50p99(idle.samples)}; ${idle.text}`);
  console.log(`  heartbeat, with a lease: ${p50p99(holder.samples)}; ${holder.text}`);
  const profiles: string[] = [];
  for (const r of routes || []) {
    const c = await redisCost(rc, 20, r.call);
    profiles.push(`  ${r.name.padEnd(28)} quiet ${p50p99(c.samples)}; ${c.text}`);
  }
  if (profiles.length) console.log(`  what each request costs Redis (20 sequential requests each, fleet paused):\n${profiles.join('\n')}`);
  return {
    idle, holder, ping, koa,
    /** Independent: the same commands per heartbeat (within 0.5) and a p50 within 1.5x of the other run's. */
    hbIndependentOf(other: { idle: typeof idle; holder: typeof holder }) {
      return [[idle, other.idle], [holder, other.holder]].every(([a, b]) => Math.abs(a.calls - b.calls) <= 0.5 && pct(a.samples, 50) <= 1.5 * pct(b.samples, 50));
    },
  };
}

async function measureLoaded(rc: RedisClient, s: Awaited<ReturnType<typeof startServices>>, fleet: Fleet, procs: ProcRef[]) {
  await sleep(N('heartbeat') * 1000); // one full heartbeat round of the fleet with every client connected
  fleet.take();
  const c0 = cpuNow(procs);
  const t0 = Date.now();
  await sleep(30_000);
  const idleCpu = cpuRate(procs, c0, cpuNow(procs), (Date.now() - t0) / 1000);
  const steady = fleet.take();
  const c1 = cpuNow(procs);
  const t1 = Date.now();
  const { results, resets: clientResets } = await measureFromClient({ gw: s.gw.url, daemon: s.daemon.url, samples: N('samples') });
  resets.count += clientResets;
  const measCpu = cpuRate(procs, c1, cpuNow(procs), (Date.now() - t1) / 1000);
  const during = fleet.take();
  const mem = await usedMemory(rc);
  const keys = Number(await rc.dbsize());
  return { results, idleCpu, measCpu, steady, during, mem, keys, allMet: results.every((r) => pct(r.samples, 99) <= TARGET_P99_MS) };
}

/** The requests under load, timed by fleet-client.ts in its own process (why: that file's header). */
function measureFromClient(ask: ClientAsk): Promise<Extract<ClientAnswer, { results: unknown }>> {
  const child = fork(path.join(__dirname, 'fleet-client.ts'), [], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  return new Promise((resolve, reject) => {
    child.once('message', (a: ClientAnswer) => ('error' in a ? reject(new Error(`measuring client: ${a.error}`)) : resolve(a)));
    child.once('exit', (code) => reject(new Error(`measuring client exited ${code} without an answer`)));
    child.send(ask);
  });
}

function report(small: Awaited<ReturnType<typeof measureQuiet>>, big: typeof small, l: Awaited<ReturnType<typeof measureLoaded>>) {
  console.log(`\nunder the fleet's load at ${N('jobs')} retained jobs (${N('samples')} sequential requests each; load ${load()}):`);
  for (const r of l.results) console.log(`  ${r.name.padEnd(28)} ${p50p99(r.samples)}  target p99 <= ${TARGET_P99_MS} ms: ${verdict(pct(r.samples, 99) <= TARGET_P99_MS)}`);
  console.log(`  baselines (quiet, same run): Redis PING p50 ${ms(pct(big.ping, 50))} p99 ${ms(pct(big.ping, 99))}; empty Koa route p50 ${ms(pct(big.koa, 50))} p99 ${ms(pct(big.koa, 99))}`);
  console.log(`  the fleet's own requests meanwhile: heartbeat ${p50p99(l.during.hb)}; progress POST ${p50p99(l.during.progress)}`);
  console.log(`  the fleet alone for 30 s: heartbeat ${p50p99(l.steady.hb)}; progress POST ${p50p99(l.steady.progress)}`);
  console.log(`  CPU seconds per second, the fleet alone: ${l.idleCpu}`);
  console.log(`  CPU seconds per second, while measuring: ${l.measCpu}`);
  console.log(`  Redis used_memory ${(l.mem / 1048576).toFixed(1)} MiB, ${l.keys} keys`);
  const hbOk = big.hbIndependentOf(small);
  console.log(`heartbeat at ${N('baseline-jobs')} against ${N('jobs')} retained jobs (quiet): idle ${ms(pct(small.idle.samples, 50))} / ${small.idle.calls.toFixed(1)} commands -> ${ms(pct(big.idle.samples, 50))} / ${big.idle.calls.toFixed(1)}; with a lease ${ms(pct(small.holder.samples, 50))} / ${small.holder.calls.toFixed(1)} -> ${ms(pct(big.holder.samples, 50))} / ${big.holder.calls.toFixed(1)} (p50 / commands): independent of the number of jobs ${verdict(hbOk)}`);
}

main().catch((e) => { console.error(e); process.exit(1); });
