// Wires the gateway: Redis, the job lifecycle, the event hub and the HTTP API. main.ts only runs it.
import http from 'node:http';
import { createApp } from '../../shared/http';
import { jobApiEnvelope } from '../../shared/errors';
import { createLogger } from '../../shared/log';
import { config } from '../../shared/config';
import { createRegistry, HttpMetrics, registerComputed } from '../../shared/metrics';
import { Bus } from '../../queue/bus';
import { registerJobMetrics } from '../../queue/metrics';
import { listenHost, processAuth } from '../../shared/auth';
import { EventHub } from '../../queue/sse';
import { buildApi } from './routes';
import { registerMigrationJobRoute } from './migrationjob';
import { connectQueue } from '../../queue/connect';
import { AuditLog } from '../../shared/audit';
import { RateLimiter } from '../../shared/limits';


export async function startGateway(opts: { port?: number; host?: string } = {}) {
  const log = createLogger('gateway');
  const auth = processAuth();
  const host = listenHost(auth, opts.host ?? config.host, 'FERRY_HOST');
  const { redis, store, router, registry, life } = connectQueue(log, { lockSeconds: config.httpLeaseSeconds });
  const bus = new Bus();
  const hub = new EventHub(bus, store, config.sseHeartbeatSeconds);
  await hub.start();

  const metrics = createRegistry('gateway');
  const httpMetrics = new HttpMetrics(metrics);
  registerJobMetrics(metrics, store, registry);
  registerComputed(metrics, 'svc_sse_clients', 'Open SSE streams on this gateway', 'gauge', async () => [{ value: hub.size }]);

  let doc: object | undefined;
  const api = buildApi({ life, hub, metrics, openapi: () => (doc ||= api.openapi({ title: 'Ferry worker job protocol', version: '1.0', description: 'Jobs, states, progress events, workers and capability-matched dequeue. See docs/worker-protocol.md.' })) });
  registerMigrationJobRoute(api, life); // POST /migrationjobs (Kubernetes MigrationJob documents)
  // Writes the audit log (shared/audit.ts); operators read it on the daemon's GET /audit (docs/security.md).
  const audit = new AuditLog(redis, store.k.prefix, log, 'gateway');
  const app = createApp(api, { log, metrics: httpMetrics, envelope: jobApiEnvelope, auth, audit, listenHost: host, limiter: new RateLimiter(redis, store.k.prefix) });

  // Stale workers give their jobs back; queues of every known requirement set are watched for stalled jobs.
  await router.watchAll().catch((e) => log.warn('could not watch the queues for stalled jobs yet; the sweep below tries again', { error: (e as Error).message }));
  const sweep = setInterval(async () => {
    try {
      await router.watchAll();
      for (const id of await registry.stale()) {
        if ((await registry.heldJobs(id)).length) await life.releaseWorker(id, `no heartbeat for ${config.workerStaleSeconds} s`);
      }
    } catch (e) { log.warn('sweep failed', { error: (e as Error).message }); }
  }, Math.min(30_000, Math.max(1000, (config.workerStaleSeconds * 1000) / 4)));
  sweep.unref();
  // Redis stays bounded: finished jobs leave after FERRY_JOB_RETENTION, silent workers after FERRY_WORKER_PRUNE_AFTER.
  const retentionMs = config.jobRetentionMs;
  await store.indexFinished().catch((e) => log.warn('could not index finished jobs for retention', { error: (e as Error).message }));
  const pruneMs = config.workerPruneMs;
  const housekeeping = setInterval(async () => {
    try {
      const purged = await store.purgeFinished(retentionMs);
      if (purged) log.info('finished jobs past retention removed', { count: purged });
      const pruned = await registry.prune(pruneMs);
      if (pruned.length) log.info('silent workers removed', { worker_ids: pruned.slice(0, 50), count: pruned.length });
    } catch (e) { log.warn('housekeeping failed', { error: (e as Error).message }); }
  }, Math.min(60_000, Math.max(500, Math.min(retentionMs, pruneMs) / 4)));
  housekeeping.unref();
  const reconcile = setInterval(async () => {
    try {
      const restored = await life.reconcileQueued(config.reconcileSeconds * 1000);
      if (restored.length) log.warn('queued jobs were missing from their queue; put back', { job_ids: restored.slice(0, 50), count: restored.length });
    } catch (e) { log.warn('reconcile failed', { error: (e as Error).message }); }
  }, config.reconcileSeconds * 1000);
  reconcile.unref();
  // Pull workers run the operation out of our reach; their attempts end here when timeout_seconds runs out.
  const reaper = setInterval(async () => {
    try {
      const ended = await life.reapTimedOut();
      if (ended.length) log.warn('attempts past their timeout_seconds ended', { job_ids: ended.slice(0, 50), count: ended.length });
    } catch (e) { log.warn('timeout sweep failed', { error: (e as Error).message }); }
  }, config.timeoutSweepSeconds * 1000);
  reaper.unref();

  const server = http.createServer(app.callback());
  server.keepAliveTimeout = 65_000;
  await new Promise<void>((resolve) => server.listen(opts.port ?? config.gatewayPort, host, resolve));
  const port = (server.address() as any).port;
  log.info('gateway listening', { port, host, auth: auth.enabled, redis: config.redisUrl.replace(/\/\/[^@]*@/, '//***@') });

  return {
    port,
    server,
    async close() {
      clearInterval(sweep);
      clearInterval(reconcile);
      clearInterval(reaper);
      clearInterval(housekeeping);
      hub.stop();
      await new Promise((r) => server.close(r));
      server.closeAllConnections?.();
      await router.close();
      await bus.close();
      redis.disconnect();
    },
  };
}
