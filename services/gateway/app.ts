// Wires the gateway: Redis, the job lifecycle, the event hub and the HTTP API. main.ts only runs it.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { createApp } from '../../platform/http';
import { jobApiEnvelope } from '../../platform/errors';
import { createLogger } from '../../platform/log';
import { config } from '../../platform/config';
import { createRegistry, HttpMetrics, registerComputed } from '../../platform/metrics';
import { Bus } from '../../queue/bus';
import { registerJobMetrics } from '../../queue/metrics';
import { listenHost, processAuth } from '../../platform/auth';
import { EventHub } from '../../queue/sse';
import { buildApi } from './routes';
import { registerMigrationJobRoute } from './migrationjob';
import { connectQueue } from '../../queue/connect';
import { AuditLog } from '../../platform/audit';
import { RateLimiter } from '../../platform/limits';
import { Leader } from '../../queue/leader';
import { gatewaySweeps } from './sweeps';


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
  registerComputed(metrics, 'svc_sse_clients', 'Open SSE streams on this gateway', 'gauge', () => Promise.resolve([{ value: hub.size }]));

  let doc: object | undefined;
  const api = buildApi({ life, hub, metrics, openapi: () => (doc ||= api.openapi(
    { title: 'Ferry worker job protocol', version: '1.0',
    description: 'Jobs, states, progress events, workers and capability-matched dequeue. See docs/worker-protocol.md.' })) });
  registerMigrationJobRoute(api, life); // POST /migrationjobs (Kubernetes MigrationJob documents)
  // Writes the audit log (platform/audit.ts); operators read it on the daemon's GET /audit (docs/security.md).
  const audit = new AuditLog(redis, store.k.prefix, log, 'gateway');
  const app = createApp(api, { log, metrics: httpMetrics, envelope: jobApiEnvelope, auth, audit, listenHost: host,
    limiter: new RateLimiter(redis, store.k.prefix) });

  // Stale workers give their jobs back; queues of every known requirement set are watched for stalled jobs.
  await router.watchAll().catch((e) => log.warn('could not watch the queues for stalled jobs yet; the stale-worker sweep tries again',
    { error: (e as Error).message }));
  await store.indexFinished().catch((e) => log.warn('could not index finished jobs for retention; the retention sweep only sees jobs finished from now on',
    { error: (e as Error).message }));
  const leader = gatewaySweeps(new Leader(redis, store.k, 'gateway', log), { router, registry, life, store, log }).start();
  // eslint-disable-next-line @typescript-eslint/no-misused-promises -- Koa's callback answers its own errors (500 through the app's error handler)
  const server = http.createServer(app.callback());
  server.keepAliveTimeout = 65_000;
  await new Promise<void>((resolve) => server.listen(opts.port ?? config.gatewayPort, host, resolve));
  const port = (server.address() as AddressInfo).port; // a TCP server: an address, not a pipe's name
  log.info('gateway listening', { port, host, auth: auth.enabled, redis: config.redisUrl.replace(/\/\/[^@]*@/, '//***@') });

  return {
    port,
    server,
    async close() {
      await leader.stop();
      hub.stop();
      await new Promise((r) => server.close(r));
      server.closeAllConnections?.();
      await router.close();
      await bus.close();
      redis.disconnect();
    },
  };
}
