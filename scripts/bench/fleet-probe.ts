// Measurements of scripts/bench/fleet.ts: request latency, what one request costs Redis (commands by name and
// Redis's own time, from INFO commandstats), the dashboard's first load, CPU per second and RSS of each
// process, the services' event-loop lag (their Prometheus metrics), and Redis keys by pattern.
import { performance } from 'node:perf_hooks';
import type { RedisClient } from '../../platform/redis';
import { commandDelta, commandStats, cpuSeconds, pct, request, rssBytes } from './common';
import { moduleImports, pageAssets } from '../../test/helpers/page-assets';

export interface Timed { name: string; samples: number[] }
export const ms = (x: number) => (Number.isFinite(x) ? `${x.toFixed(x < 10 ? 2 : 1)} ms` : 'n/a');
export const p50p99 = (xs: number[]) => `p50 ${ms(pct(xs, 50))}, p99 ${ms(pct(xs, 99))} (n=${xs.length})`;

/** `n` sequential calls of `f`, each timed. */
export async function timeSeq(n: number, f: (i: number) => Promise<void>): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await f(i);
    out.push(performance.now() - t);
  }
  return out;
}

/** Connections the services reset under the shared machine's load, retried once each (printed with the figures). */
export const resets = { count: 0 };

/** A request that must answer `status`; anything else stops the bench (a figure of failed requests means
 *  nothing). A reset connection is retried once, and counted. */
export async function expect<T = unknown>(base: string, method: string, path: string, status: number, body?: unknown) {
  const r = await request<T>(base, method, path, body).catch((e: NodeJS.ErrnoException) => {
    if (e.code !== 'ECONNRESET') throw e;
    resets.count++;
    return request<T>(base, method, path, body);
  });
  if (r.status !== status) throw new Error(`${method} ${path}: ${r.status}, expected ${status}: ${r.text.slice(0, 300)}`);
  return r;
}

/** What `n` sequential calls of `f` cost Redis, per call: commands by name and Redis's time. Run in a quiet
 *  window (the fleet paused), since commandstats counts every client: the calls run in four windows and the one
 *  with the fewest commands is the cost, since the services' own background work (a sweep, a lease renewal)
 *  only ever adds commands to a window (one sweep reading 200 held jobs made a heartbeat look 1.0 command dearer). */
export async function redisCost(redis: RedisClient, n: number, f: (i: number) => Promise<void>) {
  const samples: number[] = [];
  let best: ReturnType<typeof commandDelta> | undefined;
  for (let done = 0, w = 0; w < 4; w++) {
    const size = Math.round((n * (w + 1)) / 4) - done;
    if (size <= 0) continue;
    const before = await commandStats(redis);
    samples.push(...(await timeSeq(size, (i) => f(done + i))));
    const d = commandDelta(before, await commandStats(redis), size);
    d.calls -= 1 / size; // the INFO of the second snapshot itself
    done += size;
    if (!best || d.calls < best.calls) best = d;
  }
  const d = best!;
  const top = d.rows.filter((r) => r.cmd !== 'info').slice(0, 8).map((r) => `${r.cmd} ${r.calls.toFixed(1)}x ${r.usec.toFixed(0)}us`).join(', ');
  return { samples, calls: d.calls, usec: d.usec, text: `${d.calls.toFixed(1)} Redis commands/request (${d.usec.toFixed(0)} us of Redis time; the quietest of 4 windows): ${top}` };
}

/** The dashboard's first load as a browser makes it, in the same rounds: the page; everything the page names
 *  (stylesheet, script, module preloads) at once; any module import not fetched yet, one level at a time; then the
 *  calls the jobs view makes on load (GET /status and the first page of jobs) at once. From the daemon, no cache.
 *  The rounds come from the served files (test/helpers/page-assets.ts), so the bench follows the page's changes. */
export async function dashboardLoad(daemon: string) {
  const root = '/web/dashboard/';
  const get = async (f: string) => (await expect(daemon, 'GET', root + f, 200)).text;
  const page = pageAssets(await get(''));
  const texts = new Map<string, string>();
  let round = [...page.styles, ...page.scripts, ...page.modules, ...page.preloads];
  while (round.length) {
    const got = await Promise.all(round.map(get));
    round.forEach((f, i) => texts.set(f, got[i]));
    round = [...new Set([...texts].filter(([f]) => f.endsWith('.js')).flatMap(([, t]) => moduleImports(t)))].filter((f) => !texts.has(f));
  }
  await Promise.all([expect(daemon, 'GET', '/status', 200), expect(daemon, 'GET', '/jobs?limit=50&offset=0', 200)]);
}

export interface ProcRef { name: string; pid: () => number }
const selfCpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
export const cpuNow = (ps: ProcRef[]) => ps.map((p) => (p.pid() === process.pid ? selfCpu() : cpuSeconds(p.pid())));
/** CPU seconds per wall second of each process between two cpuNow snapshots. */
export function cpuRate(ps: ProcRef[], before: number[], after: number[], seconds: number) {
  return ps.map((p, i) => `${p.name} ${((after[i] - before[i]) / seconds).toFixed(3)}`).join(', ');
}
export const rssNow = (ps: ProcRef[]) => ps.map((p) => rssBytes(p.pid()));

export async function usedMemory(redis: RedisClient) {
  return Number(/^used_memory:(\d+)/m.exec(await redis.info('memory'))![1]);
}

/** p99 and max event-loop lag (ms) since the last scrape, from prom-client's default metrics on /metrics
 *  (prom-client resets its histogram on each collection). */
export async function loopLag(base: string): Promise<{ p99: number; max: number }> {
  const r = await request(base, 'GET', '/metrics');
  const v = (name: string) => Number(new RegExp(`^${name}\\{[^}]*\\} ([0-9.e+-]+)`, 'm').exec(r.text)?.[1]) * 1000;
  return { p99: v('nodejs_eventloop_lag_p99_seconds'), max: v('nodejs_eventloop_lag_max_seconds') };
}

/** Keys by pattern: each key with its ids (the parts after the prefix that hold digits or are long) as `*`. */
export async function keysByPattern(redis: RedisClient): Promise<Map<string, number>> {
  const m = new Map<string, number>();
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'COUNT', 2000);
    cursor = next;
    for (const k of keys) {
      const pattern = k.split(':').map((part, i) => (i > 0 && (/\d/.test(part) || part.length > 24) ? '*' : part)).join(':');
      m.set(pattern, (m.get(pattern) || 0) + 1);
    }
  } while (cursor !== '0');
  return m;
}
