// A worker process: registers with its capabilities, claims only jobs it can run (most specific queue first),
// runs them with a lease it keeps renewing, reports progress, and obeys cancel, timeout and shutdown.
import http from 'node:http';
import os from 'node:os';
import client from 'prom-client';
import { config } from '../../shared/config';
import { createLogger, dropped } from '../../shared/log';
import { jobApiEnvelope, OperationError } from '../../shared/errors';
import { guardPlain, listenHost, processAuth } from '../../shared/auth';
import { outputId, type OutputClaims } from '../../shared/roots';
import { createRegistry } from '../../shared/metrics';
import { servedQueues } from '../../shared/capabilities';
import { Lease } from '../../queue/lifecycle';
import { Bus } from '../../queue/bus';
import { IMPLEMENTATIONS } from './operations';
import { connectQueue } from '../../queue/connect';

export interface WorkerOptions {
  workerId: string;
  capabilities: string[];
  executionMode: string;
  concurrency: number;
  metricsPort?: number;
}

interface Running { lease: Lease; abort: AbortController; why?: 'cancel' | 'timeout' | 'shutdown' }

export async function startWorker(o: WorkerOptions) {
  const log = createLogger(`worker:${o.workerId}`);
  const { redis, store, router, registry, life } = connectQueue(log, { lockSeconds: config.leaseSeconds }, 'debug');
  const bus = new Bus();
  const me = { worker_id: o.workerId, capabilities: o.capabilities, execution_mode: o.executionMode };
  const running = new Map<string, Running>();
  let stopping = false;
  // Idle slots wait here (they also poll every second). Each `enqueued` message (one per job) wakes the slot
  // that has slept longest: every slot gets its turn, and one job does not send every idle slot to Redis for
  // nothing. Shutdown wakes them all.
  const sleepers = new Set<() => void>();
  const wakeOne = () => { const w = sleepers.values().next().value; w?.(); };
  const wake = () => { for (const w of [...sleepers]) w(); };

  const metrics = createRegistry('worker');
  const jobsTotal = new client.Counter({ name: 'ferry_worker_jobs_total', help: 'Jobs this worker finished, by operation and outcome', labelNames: ['operation', 'outcome'], registers: [metrics] });
  const jobSeconds = new client.Histogram({ name: 'ferry_worker_job_seconds', help: 'Run time of jobs on this worker', labelNames: ['operation'], buckets: [1, 5, 15, 60, 300, 600, 1800, 3600], registers: [metrics] });
  const bytesTotal = new client.Counter({ name: 'ferry_worker_bytes_converted_total', help: 'Bytes of source image converted on this worker', registers: [metrics] });
  new client.Gauge({ name: 'ferry_worker_active_jobs', help: 'Jobs running on this worker', registers: [metrics], collect() { this.set(running.size); } });
  new client.Gauge({ name: 'ferry_worker_info', help: 'Worker identity and capabilities', labelNames: ['worker_id', 'capabilities', 'execution_mode'], registers: [metrics], collect() { this.set({ worker_id: o.workerId, capabilities: o.capabilities.join(','), execution_mode: o.executionMode }, 1); } });

  const register = () => registry.register({ ...me, system_info: { hostname: os.hostname(), os: `${os.type()} ${os.release()}`, kernel: os.release(), architecture: os.arch(), memory_mb: Math.round(os.totalmem() / 1048576), disk_space_mb: 0, pid: process.pid } }, 'native');
  await register();

  // Each tick's body catches its own failures (logged at warn), so nothing rejects unhandled.
  const heartbeat = setInterval(() => void (async () => {
    try { if (!(await registry.heartbeat(o.workerId))) await register(); } catch (e) {
      log.warn('heartbeat failed; the next beat tries again, and a worker silent for FERRY_WORKER_STALE_SECONDS loses its HTTP-claimed jobs', { error: (e as Error).message });
    }
  })(), config.heartbeatSeconds * 1000);
  const renew = setInterval(() => void (async () => {
    for (const r of running.values()) await router.extendLocks(r.lease.queue, [r.lease.job_id], [r.lease.token], config.leaseSeconds).catch(dropped(log, 'could not renew a running job\'s lock; renewed again within a third of its time, and a lock that lapses hands the job back', { job_id: r.lease.job_id }));
  })(), Math.max(500, (config.leaseSeconds * 1000) / 3));

  await bus.on('cancel', (id) => {
    const r = running.get(String(id));
    if (r) { r.why = 'cancel'; r.abort.abort(new Error('cancelled')); }
  });
  await bus.on('enqueued', () => wakeOne());

  let queues: string[] = [];
  let queuesAt = 0;
  const myQueues = async () => {
    if (Date.now() - queuesAt > 1000) { queues = servedQueues(me, await router.knownQueues()); queuesAt = Date.now(); }
    return queues;
  };

  // Outputs a job wrote (outputId), kept in its record so any worker's retry recognises them.
  // Recorded under the attempt's lease (addOutput-1.lua): an attempt that lost its lease claims nothing.
  const claimsOf = (id: string, lease: string): OutputClaims => ({
    record: async (st) => {
      if (!(await store.recordOutput(id, lease, outputId(st)))) throw new OperationError(`job ${id}: the lease of this attempt is gone; its output is not recorded as the job's`, false);
    },
    owns: async (st) => (await store.ownedOutputs(id)).includes(outputId(st)),
  });

  async function execute(lease: Lease) {
    const { record } = lease;
    const spec = record.spec;
    const impl = IMPLEMENTATIONS[spec.operation];
    const r: Running = { lease, abort: new AbortController() };
    running.set(lease.job_id, r);
    const t0 = Date.now();
    const timer = setTimeout(() => { r.why = 'timeout'; r.abort.abort(new Error('timeout')); }, spec.execution_policy.timeout_seconds * 1000);
    let outcome = 'completed';
    let admitted: { release: () => Promise<void> } | undefined;
    try {
      if (!impl) throw new OperationError(`this worker has no implementation of operation ${spec.operation}`, true);
      if (impl.admit) {
        const a = await impl.admit(spec, store);
        if (!a.ok) {
          // Not now (a shared limit is full): back to the queue without using an attempt, saying why.
          outcome = 'deferred';
          await life.handBack(lease.job_id, o.workerId, lease.token, a.reason, { delayMs: 500 + Math.round(Math.random() * 1000), waitingReason: a.reason });
          return;
        }
        admitted = a;
      }
      if (!(await life.start(lease.job_id, o.workerId, lease.token, record.attempts))) { outcome = 'lost'; return; }
      let lastBytes = 0;
      const result = await impl.run({
        job: record, spec, workerId: o.workerId, attempt: record.attempts, signal: r.abort.signal, log, claims: claimsOf(lease.job_id, lease.token), store,
        progress: async (phase, percentage, message, details = {}) => {
          const d = Object.fromEntries(Object.entries(details).map(([k, v]) => [k, String(v)]));
          if (phase === 'conversion' && d.bytes_processed) { const b = Number(d.bytes_processed); if (b > lastBytes) { bytesTotal.inc(b - lastBytes); lastBytes = b; } }
          const ok = await life.progress(lease.job_id, lease.token, { phase, percentage, message, details: d });
          if (!ok.ok && !r.abort.signal.aborted) { r.why = 'cancel'; r.abort.abort(new Error('lease lost')); }
        },
      });
      if (!(await life.complete(lease.job_id, o.workerId, lease.token, result, lease.queue))) {
        // Cancelled as it finished: leave nothing behind. Taken over by another worker (this one lost its
        // lease): the output is that attempt's too, so it stays.
        const now = await store.raw(lease.job_id);
        outcome = now?.state === 'CANCELLED' ? 'cancelled' : 'lost';
        if (outcome === 'cancelled') await impl.cleanup?.(spec, true, store);
      }
    } catch (e) {
      const err = e as Error;
      if (r.why === 'cancel') {
        outcome = 'cancelled';
        await impl?.cleanup?.(spec, false, store);
        log.info('job cancelled; process stopped and partial output removed', { job_id: lease.job_id });
      } else if (r.why === 'shutdown') {
        outcome = 'handed_back';
        await impl?.cleanup?.(spec, false, store);
        await life.handBack(lease.job_id, o.workerId, lease.token, 'worker shutting down');
      } else {
        outcome = 'failed';
        await impl?.cleanup?.(spec, false, store);
        const msg = r.why === 'timeout' ? `timed out after ${spec.execution_policy.timeout_seconds} s` : err.message;
        const retryable = r.why === 'timeout' || !(err instanceof OperationError) || err.retryable;
        await life.fail(lease.job_id, o.workerId, lease.token, msg, retryable);
        log.warn('attempt failed', { job_id: lease.job_id, error: msg, retryable });
      }
    } finally {
      clearTimeout(timer);
      await admitted?.release().catch(dropped(log, 'could not release a concurrency slot; it expires with its own time limit', { job_id: lease.job_id }));
      running.delete(lease.job_id);
      jobsTotal.inc({ operation: spec.operation, outcome });
      jobSeconds.observe({ operation: spec.operation }, (Date.now() - t0) / 1000);
    }
  }

  async function slot() {
    while (!stopping) {
      let lease: Lease | null = null;
      try {
        lease = await life.claim(me, await myQueues());
      } catch (e) {
        log.warn('could not claim a job; this slot polls again after its interval', { error: (e as Error).message });
      }
      if (lease) {
        // Reporting the outcome can fail if Redis is gone longer than the client's retry budget; the lease then
        // expires and the job is requeued, so the worker carries on rather than exiting.
        await execute(lease).catch((e) => log.warn('could not report a job outcome; its lease will expire and it will be requeued', { job_id: lease.job_id, error: (e as Error).message }));
        continue;
      }
      if (stopping) break;
      await new Promise<void>((resolve) => {
        const done = () => { clearTimeout(t); sleepers.delete(done); resolve(); };
        const t = setTimeout(done, 1000);
        sleepers.add(done);
      });
    }
  }
  const slots = Array.from({ length: o.concurrency }, () => slot());

  let metricsServer: http.Server | undefined;
  if (o.metricsPort !== undefined && o.metricsPort >= 0) {
    const auth = processAuth();
    const host = listenHost(auth, config.host, 'FERRY_HOST');
    metricsServer = http.createServer((req, res) => void (async () => {
      // /health stays public (liveness probes); /metrics needs a read key when keys are configured.
      if (req.url === '/metrics' && !guardPlain(auth, req, res, 'read', jobApiEnvelope)) return;
      if (req.url === '/metrics') { res.setHeader('Content-Type', metrics.contentType); res.end(await metrics.metrics()); return; }
      if (req.url === '/health') { res.setHeader('Content-Type', 'application/json'); res.end(JSON.stringify({ status: 'healthy', worker_id: o.workerId, active_jobs: running.size })); return; }
      res.statusCode = 404; res.end();
    })().catch((e: Error) => { log.warn('a metrics request failed; answered 500, the next scrape tries again', { error: e.message }); if (!res.headersSent) res.statusCode = 500; res.end(); }));
    await new Promise<void>((r) => metricsServer!.listen(o.metricsPort, host, r));
  }
  log.info('worker started', { capabilities: o.capabilities, execution_mode: o.executionMode, concurrency: o.concurrency, metrics_port: metricsServer ? (metricsServer.address() as any).port : null });

  return {
    metricsPort: metricsServer ? (metricsServer.address() as any).port as number : undefined,
    get active() { return running.size; },
    /** Stops taking jobs, lets running ones finish within the grace period, hands the rest back. */
    async stop(graceSeconds = config.shutdownGraceSeconds) {
      stopping = true;
      wake();
      const deadline = Date.now() + graceSeconds * 1000;
      while (running.size && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      for (const r of running.values()) { r.why = 'shutdown'; r.abort.abort(new Error('shutdown')); }
      await Promise.all(slots);
      clearInterval(heartbeat);
      clearInterval(renew);
      await registry.remove(o.workerId).catch((e) => log.warn('shutting down: the registration stays until it is pruned as stale', { error: (e as Error).message }));
      metricsServer?.close();
      await router.close();
      await bus.close();
      redis.disconnect();
      log.info('worker stopped');
    },
  };
}
