// The daemon's figures: its Prometheus registry (HTTP, jobs, webhook deliveries, WebSocket clients), the /status
// answer, the /ws/metrics frame, and /metrics on a port of its own when metrics.port is set.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { config } from '../../platform/config';
import { guardPlain, type PlainPort } from '../../platform/http';
import { daemonEnvelope } from '../../platform/errors';
import { createRegistry, HttpMetrics, registerComputed } from '../../platform/metrics';
import { countByDaemonStatus } from '../../domain/states';
import { DaemonConfig, formatDuration } from '../../platform/daemon-config';
import type { QueueLayer } from '../../queue/connect';
import { registerJobMetrics } from '../../queue/metrics';

export type Registry = ReturnType<typeof createRegistry>;

/** The registry with every daemon metric; `wsClients` is read at scrape time (the hub starts later). */
export function daemonMetrics(q: QueueLayer, wsClients: () => number) {
  const metrics = createRegistry('daemon');
  const httpMetrics = new HttpMetrics(metrics);
  registerJobMetrics(metrics, q.store, q.registry);
  registerComputed(metrics, 'svc_webhook_deliveries_total',
    'Webhook delivery attempts by outcome (delivered, retrying, failed), all notifiers', 'counter', async () => {
    const s = await q.redis.hgetall(q.store.k.webhookStats);
    return ['delivered', 'retrying', 'failed'].map((status) => ({ labels: { status }, value: Number(s[status] || 0) }));
  });
  registerComputed(metrics, 'svc_websocket_clients', 'Open WebSocket connections on this daemon', 'gauge', () => Promise.resolve([{ value: wsClients() }]));
  return { metrics, httpMetrics };
}

/** GET /status and the /ws/metrics frame, from Redis at the time of asking. */
export function statusReports(q: QueueLayer, started: number, wsClients: () => number) {
  const counts = async () => countByDaemonStatus(await q.store.stateCounts());
  const status = async () => {
    const [by, ws] = await Promise.all([counts(), q.registry.counts()]);
    const up = (Date.now() - started) / 1000;
    return {
      version: config.version, uptime: formatDuration(up), uptime_seconds: Math.round(up),
      total_jobs: Object.values(by).reduce((a, b) => a + b, 0), pending_jobs: by.pending, running_jobs: by.running,
      completed_jobs: by.completed, failed_jobs: by.failed, cancelled_jobs: by.cancelled,
      worker_count: ws.total, active_workers: ws.active, websocket_clients: wsClients(), timestamp: new Date().toISOString(),
    };
  };
  const wsMetrics = async () => {
    const [by, st] = await Promise.all([counts(), status()]);
    const queues = await q.router.knownQueues();
    const perQueue = await q.store.queueCounts(queues);
    const qc = queues.map((name) => perQueue[name]);
    return {
      jobs: by, workers: { total: st.worker_count, active: st.active_workers },
      queues: Object.fromEntries(queues.map((name, i) => [name, {
        queued: Number(qc[i].QUEUED || 0), assigned: Number(qc[i].ASSIGNED || 0), running: Number(qc[i].RUNNING || 0),
      }])),
      websocket_clients: wsClients(), uptime_seconds: st.uptime_seconds, memory_rss_bytes: process.memoryUsage().rss,
    };
  };
  return { status, wsMetrics };
}

/** /metrics alone on metrics.port (same keys, headers and refusal budget as the API, refusals audited with its
 *  own: `gate`); undefined when metrics are off or served by the API. */
export async function serveMetricsPort(
  cfg: DaemonConfig, metrics: Registry, host: string, gate: Omit<PlainPort, 'auth' | 'envelope'>,
): Promise<http.Server | undefined> {
  if (!cfg.metrics.enabled || cfg.metrics.port === undefined) return undefined;
  const { log } = gate;
  const port: PlainPort = { ...gate, auth: cfg.keys, envelope: daemonEnvelope };
  const answer = async (req: http.IncomingMessage, res: http.ServerResponse) => {
    if (!(await guardPlain(port, req, res, 'read'))) return;
    if ((req.url || '').split('?')[0] !== '/metrics') {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify(daemonEnvelope(404, 'only /metrics is served here', req.url || '')));
      return;
    }
    const text = await metrics.metrics();
    res.writeHead(200, { 'content-type': metrics.contentType });
    res.end(text);
  };
  const server = http.createServer((req, res) => {
    answer(req, res).catch((e: Error) => {
      log.warn('metrics scrape failed; this scrape gets a 500, the next one is computed afresh', { error: e.message });
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'application/json' });
      res.end(JSON.stringify(daemonEnvelope(500, 'metrics could not be computed', '/metrics')));
    });
  });
  await new Promise<void>((resolve) => server.listen(cfg.metrics.port, host, resolve));
  log.info('metrics listening', { port: (server.address() as AddressInfo).port }); // a TCP listener, not a pipe
  return server;
}
