// How long a service's event loop was blocked, read from its own Prometheus metrics: prom-client's
// nodejs_eventloop_lag_max_seconds (perf_hooks.monitorEventLoopDelay) is the longest delay since the previous
// scrape, so one scrape starts a window and the next one reads it.
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
