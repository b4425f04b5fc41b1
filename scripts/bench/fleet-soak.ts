// The soak of scripts/bench/fleet.ts: the fleet keeps running; at each sample this prints Redis memory and
// keys, each process's RSS, the services' event-loop lag and the fleet's heartbeat latency, then says what grew.
// Redis memory and keys grow without bound when the highest value of the soak's last quarter is above the highest
// of its first half by more than 5% (and by more than `noise`, a few MiB of allocator noise or 100 keys): a
// plateau passes, a steady climb does not. Redis memory is judged after taking out what the running jobs' event
// streams added, which FERRY_EVENTS_PER_JOB caps (10,000 per job). A process's RSS is judged by its floor
// instead (the lowest of the last quarter against the lowest of the first half): its peaks are garbage waiting
// for the collector and swing by a quarter within a minute at this load (gateway 174-229 MiB in one 2-minute soak,
// docs/performance.md), while memory a leak keeps raises the floor, which the collections return to. RSS is read
// every 10 s so each window holds collections.
import os from 'node:os';
import type { RedisClient } from '../../shared/redis';
import { pct } from './common';
import type { Fleet } from './fleet-sim';
import { keysByPattern, loopLag, ms, rssNow, usedMemory, type ProcRef } from './fleet-probe';

interface SoakArgs { rc: RedisClient; fleet: Fleet; procs: ProcRef[]; gw: string; daemon: string; soakMs: number; runningJobs: string[] }
const MiB = (b: number) => `${(b / 1048576).toFixed(1)} MiB`;
const sleep = (t: number) => new Promise((r) => setTimeout(r, t));

async function streamBytes(rc: RedisClient, ids: string[]) {
  const p = rc.pipeline();
  for (const id of ids) p.call('MEMORY', 'USAGE', `fleet:job:${id}:events`, 'SAMPLES', '0');
  return ((await p.exec()) || []).reduce((a, [, v]) => a + Number(v || 0), 0);
}

const firstHalf = (xs: number[]) => xs.slice(0, Math.ceil(xs.length / 2));
const lastQuarter = (xs: number[]) => xs.slice(Math.floor((xs.length * 3) / 4));

/** `by` picks a window's value: its highest (Redis) or its lowest (a garbage-collected process's floor). */
function grewWithoutBound(series: number[], noise: number, by: (...xs: number[]) => number) {
  if (series.length < 4) return false;
  const before = by(...firstHalf(series));
  const after = by(...lastQuarter(series));
  return after > before * 1.05 && after - before > noise;
}

/** Every 10 s a sample of each series; every `every` ms (at most 12 a soak) a printed line. */
export async function runSoak(a: SoakArgs): Promise<boolean> {
  const every = Math.max(10_000, Math.min(60_000, a.soakMs / 12));
  console.log(`\nsoak: ${(a.soakMs / 60000).toFixed(1)} min, a line every ${every / 1000} s, RSS and Redis read every 10 s`);
  const keys0 = await keysByPattern(a.rc);
  const streams0 = await streamBytes(a.rc, a.runningJobs);
  const series: Record<string, number[]> = { 'Redis used_memory less the running jobs\' event streams': [], 'Redis keys': [] };
  for (const p of a.procs) series[`RSS ${p.name}`] = [];
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
    const { hb } = a.fleet.take();
    console.log(`  +${((Date.now() - t0) / 60000).toFixed(1)} min: redis ${MiB(mem)} (event streams of the running jobs ${MiB(streams)}), ${keys} keys; RSS ${a.procs.map((p, i) => `${p.name} ${MiB(rss[i])}`).join(', ')}; event-loop lag p99/max gateway ${ms(lagGw.p99)}/${ms(lagGw.max)}, daemon ${ms(lagD.p99)}/${ms(lagD.max)}; heartbeat p99 ${ms(pct(hb, 99))} (n=${hb.length}); load ${os.loadavg()[0].toFixed(1)}`);
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
    const isProcess = name.startsWith('RSS ');
    const by = isProcess ? Math.min : Math.max;
    const bad = grewWithoutBound(xs, isKeys ? 100 : 4 * 1048576, by); // a few MiB of allocator noise, or keys that come and go (BullMQ's)
    grew ||= bad;
    const f = isKeys ? (n: number) => String(n) : MiB;
    const w = (ys: number[]) => `${f(Math.min(...ys))}-${f(Math.max(...ys))}`;
    const judged = isProcess ? 'judged by the lowest (the floor after collections)' : 'judged by the highest';
    console.log(`  ${name}: first ${f(xs[0] ?? 0)}, first half ${w(firstHalf(xs))}, last quarter ${w(lastQuarter(xs))}, last ${f(xs[xs.length - 1] ?? 0)} (${xs.length} samples, ${judged}): ${xs.length < 4 ? 'too few samples to judge' : bad ? 'GREW' : 'flat'}`);
  }
  return grew;
}
