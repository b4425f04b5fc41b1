// The soak of scripts/bench/fleet.ts: the fleet keeps running; at each sample this prints Redis memory and
// keys, each process's RSS, the services' live memory, their event-loop lag and the fleet's heartbeat latency, then
// says what grew. A series grows without bound when the highest value of the soak's last quarter is above the
// highest of its first half by more than 5% (and by more than `noise`, a few MiB of allocator noise or 100 keys): a
// plateau passes, a steady climb does not. Judged: Redis memory, after taking out what the running jobs' event
// streams added (FERRY_EVENTS_PER_JOB caps them, 10,000 per job); Redis keys; and the gateway's and the daemon's
// live memory, read after a full garbage collection through their inspectors (fleet-heap.ts) at each printed
// line: what a process keeps after a full collection is what a leak raises. RSS, read every 10 s, is printed
// beside but not judged: its swings are the collector's and the allocator's timing (the daemon's went 231.6 ->
// 257.4 -> 175.8 MiB in one 2-minute soak, and judging its peaks, then its floor, called flat soaks "GREW" in
// two 30-minute runs, docs/performance.md).
import os from 'node:os';
import type { RedisClient } from '../../platform/redis';
import { pct } from './common';
import type { Fleet } from './fleet-sim';
import { keysByPattern, loopLag, ms, rssNow, usedMemory, type ProcRef } from './fleet-probe';
import type { Inspector } from './fleet-heap';

interface SoakArgs { rc: RedisClient; fleet: Fleet; procs: ProcRef[]; gw: string; daemon: string; soakMs: number; runningJobs: string[]; inspectors: Inspector[] }
const MiB = (b: number) => `${(b / 1048576).toFixed(1)} MiB`;
const sleep = (t: number) => new Promise((r) => setTimeout(r, t));

async function streamBytes(rc: RedisClient, ids: string[]) {
  const p = rc.pipeline();
  for (const id of ids) p.call('MEMORY', 'USAGE', `fleet:job:${id}:events`, 'SAMPLES', '0');
  return ((await p.exec()) || []).reduce((a, [, v]) => a + Number(v || 0), 0);
}

const firstHalf = (xs: number[]) => xs.slice(0, Math.ceil(xs.length / 2));
const lastQuarter = (xs: number[]) => xs.slice(Math.floor((xs.length * 3) / 4));

function grewWithoutBound(series: number[], noise: number) {
  if (series.length < 4) return false;
  const before = Math.max(...firstHalf(series));
  const after = Math.max(...lastQuarter(series));
  return after > before * 1.05 && after - before > noise;
}

const live = (name: string) => `live memory ${name} (JS heap + external, after a full collection)`;

/** Every 10 s a sample of Redis and of each RSS; every `every` ms a printed line and a sample of live memory. */
export async function runSoak(a: SoakArgs): Promise<boolean> {
  const every = Math.max(10_000, Math.min(60_000, a.soakMs / 12));
  console.log(`\nsoak: ${(a.soakMs / 60000).toFixed(1)} min, a line every ${every / 1000} s, RSS and Redis read every 10 s`);
  const keys0 = await keysByPattern(a.rc);
  const streams0 = await streamBytes(a.rc, a.runningJobs);
  const series: Record<string, number[]> = { 'Redis used_memory less the running jobs\' event streams': [], 'Redis keys': [] };
  for (const p of a.procs) series[`RSS ${p.name}`] = [];
  for (const i of a.inspectors) series[live(i.name)] = [];
  await Promise.all([a.gw, a.daemon].map((b) => loopLag(b))); // resets their lag histograms
  const t0 = Date.now();
  let printed = t0;
  while (Date.now() - t0 < a.soakMs) {
    await sleep(Math.min(10_000, a.soakMs - (Date.now() - t0)));
    const [mem, streams] = await Promise.all([usedMemory(a.rc), streamBytes(a.rc, a.runningJobs)]);
    series['Redis used_memory less the running jobs\' event streams'].push(mem - (streams - streams0));
    const keys = Number(await a.rc.dbsize());
    series['Redis keys'].push(keys);
    const rss = rssNow(a.procs);
    a.procs.forEach((p, i) => series[`RSS ${p.name}`].push(rss[i]));
    if (Date.now() - printed < every - 1000 && Date.now() - t0 < a.soakMs) continue;
    printed = Date.now();
    const [lagGw, lagD] = await Promise.all([loopLag(a.gw), loopLag(a.daemon)]);
    const mems = await Promise.all(a.inspectors.map((i) => i.liveMemory()));
    a.inspectors.forEach((i, k) => series[live(i.name)].push(mems[k].heapUsed + mems[k].external));
    await Promise.all([a.gw, a.daemon].map((b) => loopLag(b))); // the forced collection's pause stays out of the next line's lag
    const { hb } = a.fleet.take();
    console.log(`  +${((Date.now() - t0) / 60000).toFixed(1)} min: redis ${MiB(mem)} (event streams of the running jobs ${MiB(streams)}), ${keys} keys; RSS ${a.procs.map((p, i) => `${p.name} ${MiB(rss[i])}`).join(', ')}; live ${a.inspectors.map((i, k) => `${i.name} ${MiB(mems[k].heapUsed)} heap + ${MiB(mems[k].external)} external`).join(', ')}; event-loop lag p99/max gateway ${ms(lagGw.p99)}/${ms(lagGw.max)}, daemon ${ms(lagD.p99)}/${ms(lagD.max)}; heartbeat p99 ${ms(pct(hb, 99))} (n=${hb.length}); load ${os.loadavg()[0].toFixed(1)}`);
  }
  return report(keys0, await keysByPattern(a.rc), series);
}

function report(keys0: Map<string, number>, keys1: Map<string, number>, series: Record<string, number[]>) {
  console.log('what grew over the soak:');
  const patterns = [...new Set([...keys0.keys(), ...keys1.keys()])].sort();
  const changed = patterns.filter((p) => (keys0.get(p) || 0) !== (keys1.get(p) || 0));
  console.log(`  keys by pattern: ${patterns.length} patterns, ${changed.length ? changed.map((p) => `${p} ${keys0.get(p) || 0} -> ${keys1.get(p) || 0}`).join(', ') : 'every count unchanged'}`);
  let grew = false;
  for (const [name, xs] of Object.entries(series)) {
    const isKeys = name === 'Redis keys';
    const judged = !name.startsWith('RSS ');
    const bad = judged && grewWithoutBound(xs, isKeys ? 100 : 4 * 1048576); // a few MiB of allocator noise, or keys that come and go (BullMQ's)
    grew ||= bad || (judged && xs.length < 4); // a soak too short to judge does not pass
    const f = isKeys ? (n: number) => String(n) : MiB;
    const w = (ys: number[]) => `${f(Math.min(...ys))}-${f(Math.max(...ys))}`;
    const verdict = !judged ? 'printed, not judged' : xs.length < 4 ? 'too few samples to judge' : bad ? 'GREW' : 'flat';
    console.log(`  ${name}: first ${f(xs[0] ?? 0)}, first half ${w(firstHalf(xs))}, last quarter ${w(lastQuarter(xs))}, last ${f(xs[xs.length - 1] ?? 0)} (${xs.length} samples): ${verdict}`);
  }
  return grew;
}
