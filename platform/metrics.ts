// Prometheus metrics: a registry per process, request metrics by route template, and metrics whose values
// are read from Redis at scrape time (so every replica reports the same cluster-wide truth).
import client from 'prom-client';
import { createLogger } from './log';

const log = createLogger('metrics');

export function createRegistry(service: string) {
  const registry = new client.Registry();
  registry.setDefaultLabels({ service });
  client.collectDefaultMetrics({ register: registry });
  registry.registerMetric(jobWaitSeconds);
  registry.registerMetric(sweepRuns);
  registry.registerMetric(leaderGauge);
  registry.registerMetric(queueErrors);
  return registry;
}

/** Runs of each periodic sweep on this process (queue/leader.ts: only the elected process runs them). */
export const sweepRuns = new client.Counter({
  name: 'svc_sweep_runs_total',
  help: 'Runs of each periodic sweep on this process, by sweep and outcome (ok, error)',
  labelNames: ['sweep', 'outcome'],
  registers: [],
});

/** 1 while this process holds the lease of a group of periodic work. */
export const leaderGauge = new client.Gauge({
  name: 'svc_leader',
  help: '1 while this process is the elected runner of a group of periodic work (gateway, scheduler)',
  labelNames: ['group'],
  registers: [],
});

/** BullMQ reports some failures (its stalled check, a lost connection) only through its `error` events. */
export const queueErrors = new client.Counter({
  name: 'svc_queue_errors_total',
  help: 'error events of BullMQ queues and workers, by source (queue, worker, schedules, webhooks)',
  labelNames: ['source'],
  registers: [],
});

/** Time a job spent QUEUED before a worker claimed it, observed where claims happen (queue/lifecycle.ts): on
 *  worker processes, and on the gateway for HTTP-pull workers. One object shared by the process's registry. */
export const jobWaitSeconds = new client.Histogram({
  name: 'svc_job_wait_seconds',
  help: 'Time jobs waited in the queue before a worker claimed them, by queue (requirement set)',
  labelNames: ['queue'],
  buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600],
  registers: [],
});

export class HttpMetrics {
  private requests: client.Counter<string>;
  private duration: client.Histogram<string>;
  constructor(registry: client.Registry) {
    this.requests = new client.Counter({
      name: 'svc_api_requests_total',
      help: 'HTTP requests by method, route template and status',
      labelNames: ['method', 'path', 'status'],
      registers: [registry],
    });
    this.duration = new client.Histogram({
      name: 'svc_api_request_duration_seconds',
      help: 'HTTP request latency by method and route template',
      labelNames: ['method', 'path'],
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [registry],
    });
  }
  observe(method: string, path: string, status: number, seconds: number) {
    this.requests.inc({ method, path, status: String(status) });
    this.duration.observe({ method, path }, seconds);
  }
}

export interface Sample { labels?: Record<string, string | number>; value: number; metricName?: string }

/** A metric computed when scraped. A computation that fails or takes over COMPUTE_TIMEOUT_MS leaves the metric
 *  without values in that scrape (Prometheus then shows a gap, not a stale figure), and is logged: the first
 *  failure at warn, saying so, the following ones (every scrape while Redis is away) at debug, and the first
 *  success after them at info. */
export function registerComputed(registry: client.Registry, name: string, help: string, type: 'gauge' | 'counter' | 'histogram', get: () => Promise<Sample[]>) {
  let failing = false;
  const values = async (): Promise<Sample[]> => {
    try {
      const v = await withTimeout(get(), COMPUTE_TIMEOUT_MS);
      if (failing) log.info(`metric ${name} is computed again`, { metric: name });
      failing = false;
      return v;
    } catch (e) {
      const next = `metric ${name} could not be computed: this scrape reports it without values, and the next scrape tries again`;
      (failing ? log.debug : log.warn)(next, { metric: name, error: (e as Error).message });
      failing = true;
      return [];
    }
  };
  registry.registerMetric({
    name,
    help,
    type,
    // Bounded: with Redis away a scrape still answers (without these values) instead of hanging until timeout.
    get: async () => ({ name, help, type, aggregator: 'sum', values: await values() }),
    // A collector object: the registry only calls its get() (and reads name); prom-client's type asks for one of
    // its metric classes.
  } as unknown as client.Metric);
}

const COMPUTE_TIMEOUT_MS = 2000;
function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let t: NodeJS.Timeout;
  return Promise.race([p, new Promise<T>((_, reject) => { t = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms); })]).finally(
    () => clearTimeout(t));
}
