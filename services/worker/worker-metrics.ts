// A worker's own figures (jobs by outcome, run time, bytes converted, running jobs, identity) and the small HTTP
// server that serves them with /health on --metrics-port.
import http from 'node:http';
import client from 'prom-client';
import { config } from '../../platform/config';
import { jobApiEnvelope } from '../../platform/errors';
import { listenHost, processAuth } from '../../platform/auth';
import { guardPlain, plainHeaders, type PlainPort } from '../../platform/http';
import { createRegistry } from '../../platform/metrics';
import { answersWithin } from '../../platform/health';

export interface WorkerIdentity { workerId: string; capabilities: string[]; executionMode: string }

/** `active` is read at scrape time. */
export function workerMetrics(o: WorkerIdentity, active: () => number) {
  const metrics = createRegistry('worker');
  const jobsTotal = new client.Counter({
    name: 'ferry_worker_jobs_total', help: 'Jobs this worker finished, by operation and outcome', labelNames: ['operation', 'outcome'], registers: [metrics],
  });
  const jobSeconds = new client.Histogram({
    name: 'ferry_worker_job_seconds', help: 'Run time of jobs on this worker', labelNames: ['operation'],
    buckets: [1, 5, 15, 60, 300, 600, 1800, 3600], registers: [metrics],
  });
  const bytesTotal = new client.Counter({
    name: 'ferry_worker_bytes_converted_total', help: 'Bytes of source image converted on this worker', registers: [metrics],
  });
  new client.Gauge({ name: 'ferry_worker_active_jobs', help: 'Jobs running on this worker', registers: [metrics], collect() { this.set(active()); } });
  new client.Gauge({
    name: 'ferry_worker_info', help: 'Worker identity and capabilities', labelNames: ['worker_id', 'capabilities', 'execution_mode'], registers: [metrics],
    collect() { this.set({ worker_id: o.workerId, capabilities: o.capabilities.join(','), execution_mode: o.executionMode }, 1); },
  });
  return { metrics, jobsTotal, jobSeconds, bytesTotal };
}
export type WorkerMetrics = ReturnType<typeof workerMetrics>;

/** /metrics (a read key when keys are configured), /health (public: readiness, 503 while Redis does not answer
 *  `redisUp` within 2 s, since the worker can then neither claim nor report) and /livez (public: liveness, the
 *  process answers) on `port`, with the APIs' headers on every answer and refusals counted against the APIs'
 *  refusal budget and audited (`gate`). A port that cannot be opened (in use) rejects, naming the port. */
export async function serveWorkerMetrics(
  o: WorkerIdentity, port: number, metrics: WorkerMetrics['metrics'], active: () => number, gate: Omit<PlainPort, 'auth' | 'envelope'>,
  redisUp: () => Promise<unknown>,
) {
  const { log } = gate;
  const auth = processAuth();
  const host = listenHost(auth, config.host, 'FERRY_HOST');
  const plain: PlainPort = { ...gate, auth, envelope: jobApiEnvelope };
  const answer = async (req: http.IncomingMessage, res: http.ServerResponse) => {
    plainHeaders(res);
    if (req.url === '/metrics' && !(await guardPlain(plain, req, res, 'read'))) return;
    if (req.url === '/metrics') { const text = await metrics.metrics(); res.setHeader('Content-Type', metrics.contentType); res.end(text); return; }
    if (req.url === '/health') {
      const up = await answersWithin(redisUp());
      res.statusCode = up ? 200 : 503;
      res.setHeader('Content-Type', 'application/json');
      res.end(JSON.stringify({ status: up ? 'healthy' : 'unhealthy', worker_id: o.workerId, active_jobs: active(), redis: up ? 'reachable' : 'unreachable' }));
      return;
    }
    if (req.url === '/livez') {
      res.setHeader('Content-Type', 'application/json');
      res.end(JSON.stringify({ status: 'alive', worker_id: o.workerId }));
      return;
    }
    res.statusCode = 404; res.end();
  };
  const server = http.createServer((req, res) => {
    answer(req, res).catch((e: Error) => {
      log.warn('metrics scrape failed; this scrape gets a 500, the next one is computed afresh', { error: e.message });
      if (!res.headersSent) res.statusCode = 500;
      res.end();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (e: Error) => reject(new Error(`metrics port ${port} could not be opened: ${e.message}`)));
    server.listen(port, host, resolve);
  });
  // Once listening an error is not expected; it is logged, and /health stops answering, so the probe restarts us.
  server.on('error', (e: Error) => log.error('the metrics server failed; /health no longer answers, so the orchestrator restarts this worker',
    { error: e.message }));
  return server;
}
