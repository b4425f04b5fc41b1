// How long a service's event loop was blocked, read from its own Prometheus metrics: prom-client's
// nodejs_eventloop_lag_max_seconds (perf_hooks.monitorEventLoopDelay) is the longest delay since the previous
// scrape, so one scrape starts a window and the next one reads it.
import { readFileSync } from 'node:fs';
import { req } from './http';

export async function loopLagMaxMs(base: string, headers: Record<string, string> = {}, path = '/metrics'): Promise<number> {
  const r = await req(base, 'GET', path, undefined, headers);
  if (r.status !== 200) throw new Error(`GET ${path} answered ${r.status}: ${r.text.slice(0, 200)}`);
  const m = /^nodejs_eventloop_lag_max_seconds(?:\{[^}]*\})? ([0-9.e+-]+)$/m.exec(r.text);
  if (!m) throw new Error(`no nodejs_eventloop_lag_max_seconds in ${path}`);
  return Number(m[1]) * 1000;
}

/** Milliseconds GET /health took. */
export async function timedHealth(base: string): Promise<number> {
  const t = performance.now();
  const r = await req(base, 'GET', '/health');
  if (r.status !== 200) throw new Error(`/health answered ${r.status}`);
  return performance.now() - t;
}

/** Milliseconds the main thread of process `pid` (the one that runs JavaScript: GC helpers and libuv's pool are
 *  other threads) has spent on a CPU, from the kernel's schedstat (its first field, in nanoseconds). */
export function mainThreadCpuMs(pid: number): number {
  return Number(readFileSync(`/proc/${pid}/task/${pid}/schedstat`, 'utf8').split(' ')[0]) / 1e6;
}

/**
 * The longest event-loop pause of the service (url, pid) that its own work can explain while `action` runs.
 * The loop's longest delay is wall time: on a shared machine (the suite runs two files at once, one of them often
 * an emulated guest on both cores) the kernel can hold the process off its CPU mid-task, and that delay is the
 * machine's, not the handler's. Work on the loop cannot pause it for longer than the CPU time the loop's thread
 * used in the window, so the pause judged is the smaller of the two. A handler that computes for 50 ms shows
 * both every time. (A blocking sleep, a synchronous read of a slow file, would show in the delay alone: these
 * tests judge parsing budgets, which are CPU work.)
 */
export async function pauseDuring<T>(svc: { url: string; pid: number }, headers: Record<string, string>, action: () => Promise<T>): Promise<{ result: T; lag: number; cpu: number; pause: number }> {
  await loopLagMaxMs(svc.url, headers); // starts the window
  const from = mainThreadCpuMs(svc.pid);
  const result = await action();
  const cpu = mainThreadCpuMs(svc.pid) - from;
  const lag = await loopLagMaxMs(svc.url, headers);
  return { result, lag, cpu, pause: Math.min(lag, cpu) };
}
