// Wires the daemon: Redis, the shared job lifecycle, schedules, webhooks, the HTTP API (both path forms),
// WebSocket updates, metrics, /openapi.yaml and Swagger UI. main.ts only runs it. `extend` and the returned
// mountStatic/api let other parts (the dashboard) add routes or a static directory.
import http from 'node:http';
import path from 'node:path';
import type Koa from 'koa';
import yaml from 'js-yaml';
import Joi from 'joi';
import { Api, createApp } from '../../shared/http';
import { daemonEnvelope } from '../../shared/errors';
import { createLogger } from '../../shared/log';
import { config } from '../../shared/config';
import { authorize, guardPlain, issueTicket, listenHost, redeemTicket } from '../../shared/auth';
import { createRegistry, HttpMetrics, registerComputed } from '../../shared/metrics';
import { countByDaemonStatus } from '../../shared/states';
import { Lifecycle } from '../../queue/lifecycle';
import { Bus } from '../../queue/bus';
import { registerJobMetrics } from '../../queue/metrics';
import { DaemonConfig, formatDuration } from '../../shared/daemon-config';
import { buildDaemonApi } from './routes';
import { jobViews } from '../../queue/daemon-views';
import { WsHub } from './ws';
import { StaticMount, staticMiddleware, swaggerMount } from './static';
import { ScheduleStore } from '../../queue/schedules';
import { WebhookStore } from '../../queue/webhooks';
import { registerDashboard } from './dashboard';
import { registerVirt } from './virt';
import { consoleEndpoints } from './console';
import { buildSpec } from '../../shared/daemon-jobs';
import { configuredUri, Virsh } from '../../shared/libvirt/virsh';
import { connectQueue } from '../../queue/connect';
import { AuditLog, auditRoute } from '../../shared/audit';
import { daemonErrorSchema } from '../../shared/schemas/daemon';
import { RateLimiter } from '../../shared/limits';
import { browserRule } from '../../shared/browser';
import { PlanStore } from '../../queue/plans';
import { PlanRunner } from '../../queue/plan-runner';
import { registerPlanMetrics } from '../../queue/plan-metrics';
import { addPlanRoutes } from './plans';
import { PlanHub } from '../../queue/plan-events';

export interface DaemonHandle {
  port: number; server: http.Server; api: Api; app: Koa; life: Lifecycle;
  mountStatic(prefix: string, dir: string): void;
  close(): Promise<void>;
}

/** At most one plan_update (and SSE frame) per plan per this many ms: a busy plan does not flood clients. */
const PLAN_UPDATE_INTERVAL_MS = 500;

export async function startDaemon(cfg: DaemonConfig, opts: { port?: number; host?: string; hostSetting?: string; extend?: (d: Omit<DaemonHandle, 'port' | 'server' | 'close'>) => void } = {}): Promise<DaemonHandle> {
  const log = createLogger('daemon');
  const host = listenHost(cfg.keys, opts.host ?? config.host, opts.host ? (opts.hostSetting || 'daemon.addr') : 'FERRY_HOST');
  const started = Date.now();
  const { redis, store, router, registry, life } = connectQueue(log, { stalledCheck: false });
  const bus = new Bus();
  const schedules = new ScheduleStore(redis, store.k);
  const webhooks = new WebhookStore(redis, store.k);

  const metrics = createRegistry('daemon');
  const httpMetrics = new HttpMetrics(metrics);
  registerJobMetrics(metrics, store, registry);
  registerComputed(metrics, 'svc_webhook_deliveries_total', 'Webhook delivery attempts by outcome (delivered, retrying, failed), all notifiers', 'counter', async () => {
    const s = await redis.hgetall(store.k.webhookStats);
    return ['delivered', 'retrying', 'failed'].map((status) => ({ labels: { status }, value: Number(s[status] || 0) }));
  });
  // eslint-disable-next-line prefer-const -- assigned once below, when the app it serves exists; the closures here read it later
  let hub: WsHub | undefined;
  registerComputed(metrics, 'svc_websocket_clients', 'Open WebSocket connections on this daemon', 'gauge', () => Promise.resolve([{ value: hub?.size || 0 }]));

  const counts = async () => {
    return countByDaemonStatus(await store.stateCounts());
  };
  const status = async () => {
    const [by, ws] = await Promise.all([counts(), registry.list()]);
    const up = (Date.now() - started) / 1000;
    return {
      version: config.version, uptime: formatDuration(up), uptime_seconds: Math.round(up),
      total_jobs: Object.values(by).reduce((a, b) => a + b, 0), pending_jobs: by.pending, running_jobs: by.running,
      completed_jobs: by.completed, failed_jobs: by.failed, cancelled_jobs: by.cancelled,
      worker_count: ws.length, active_workers: ws.filter((w) => w.active).length, websocket_clients: hub?.size || 0, timestamp: new Date().toISOString(),
    };
  };

  const runDeps = { life, schedules, jobTimeoutSeconds: cfg.jobTimeoutSeconds, parallelDownloads: cfg.daemon.parallel_downloads, log };
  const api = buildDaemonApi({ life, cfg, schedules, webhooks, runDeps, status });
  // Migration plans (services/daemon/plans.ts); every daemon runs the plan runner, whose writes are compare-and-set.
  const plans = new PlanStore(redis, store.k);
  const planRunner = new PlanRunner({ plans, life, hooks: webhooks, log, jobTimeoutSeconds: cfg.jobTimeoutSeconds, parallelDownloads: cfg.daemon.parallel_downloads, webhookBackoffMs: cfg.webhooks.backoff_ms });
  // Plan events: plan_update on /ws and GET /plans/{id}/events/stream, from the bus (queue/plan-events.ts).
  const planHub = new PlanHub({
    bus, store, plans, intervalMs: PLAN_UPDATE_INTERVAL_MS, heartbeatSeconds: config.sseHeartbeatSeconds,
    wsWants: () => !!hub?.hasEventClients(), toWs: (id, view) => hub?.planUpdate(id, view),
  });
  addPlanRoutes(api, { plans, runner: planRunner, jobs: store, events: planHub });
  registerPlanMetrics(metrics, plans, store);
  planRunner.begin();
  // The virtualization host: one URI (FERRY_LIBVIRT_URI). The daemon starts without it; its /virt routes answer
  // 503 naming the URI while no libvirtd answers there.
  const virsh = new Virsh(configuredUri());
  registerVirt({
    api, virsh,
    submitConvert: async (def) => {
      const b = buildSpec(def, { where: '', jobTimeoutSeconds: cfg.jobTimeoutSeconds, parallelDownloads: cfg.daemon.parallel_downloads });
      await life.submit(b.spec, { enqueue: true, meta: { kind: 'convert', name: 'convert' } });
      return { job_id: b.spec.job_id };
    },
  });
  void virsh.reachable().then((up) => (up ? log.info('libvirt answers', { uri: virsh.uri }) : log.warn(`no libvirtd answers at ${virsh.uri}: /virt routes answer 503 until one does`)));
  api.add({
    method: 'get', role: 'public', path: '/openapi.yaml', summary: 'This API description (OpenAPI 3, generated from the joi schemas)', tags: ['docs'],
    responses: { 200: { description: 'OpenAPI YAML', type: 'application/yaml', schema: { type: 'string' } } },
    handler: (ctx) => {
      ctx.type = 'application/yaml';
      return yaml.dump(api.openapi({ title: 'Ferry daemon API', version: config.version, description: 'Export and migration jobs, schedules, webhooks, WebSocket updates (/ws, /api/v1/ws/metrics). Every path also answers under /api/v1. See docs/daemon.md.' }, ['/', '/api/v1']));
    },
  });
  api.add({
    method: 'post', role: 'read', path: '/ws/ticket', summary: 'A single-use ticket (valid 30 s) for opening /ws or /ws/metrics as ?ticket=...: browsers cannot send a key header on a WebSocket, and keys never go in URLs', tags: ['status'],
    responses: { 200: { description: 'the ticket', schema: Joi.object({ ticket: Joi.string(), expires_in: Joi.number().integer() }) } },
    handler: (ctx) => issueTicket(redis, store.k.prefix, ctx.state.apiKey ?? null),
  });
  if (cfg.metrics.enabled && cfg.metrics.port === undefined) {
    api.add({
      method: 'get', role: 'read', path: '/metrics', summary: 'Prometheus metrics (metrics.enabled)', tags: ['status'],
      responses: { 200: { description: 'text exposition format', type: 'text/plain', schema: { type: 'string' } } },
      handler: async (ctx) => { ctx.type = metrics.contentType; return metrics.metrics(); },
    });
  }

  // The audit log of both APIs (the gateway writes the same one); read here only, by admin keys.
  const audit = new AuditLog(redis, store.k.prefix, log, 'daemon');
  api.add(auditRoute(audit, daemonErrorSchema));
  const app = createApp(api, { log, metrics: httpMetrics, envelope: daemonEnvelope, auth: cfg.keys, audit, listenHost: host, limiter: new RateLimiter(redis, store.k.prefix) });
  const mounts: StaticMount[] = [];
  const mountStatic = (prefix: string, dir: string) => {
    const p = prefix.replace(/\/+$/, '');
    mounts.push({ prefix: p, dir }, { prefix: '/api/v1' + p, dir });
  };
  mounts.push(swaggerMount('/swagger-ui', '/openapi.yaml'), swaggerMount('/api/v1/swagger-ui', '/openapi.yaml'));
  // Runs after createApp's error/metrics and authentication middleware, before its body readers and router. The
  // static mounts (dashboard files, Swagger UI) hold no data and stay public: the dashboard asks for the key.
  app.middleware.splice(2, 0, staticMiddleware(mounts));

  // WebSocket upgrades pass no koa middleware: their refusals, and console writers, go to the audit log here.
  const auditUpgrade = (req: http.IncomingMessage, u: Parameters<AuditLog['upgrade']>[2]) =>
    void audit.upgrade(req, cfg.keys, u).catch((e) => log.warn('audit record of a WebSocket upgrade not stored in Redis; its log line stands', { error: String(e?.message || e) }));
  hub = new WsHub({
    bus, store,
    statusIntervalMs: cfg.websocket.status_interval_seconds * 1000,
    pingIntervalMs: cfg.websocket.ping_interval_seconds * 1000,
    maxBufferedBytes: cfg.websocket.max_buffered_bytes,
    status,
    firstPage: async () => {
      const { total, ids } = await store.list({ limit: 100 });
      return { jobs: await jobViews(store, ids), total, limit: 100 };
    },
    metrics: async () => {
      const [by, st, ws] = await Promise.all([counts(), status(), registry.list()]);
      const queues = await router.knownQueues();
      const perQueue = await store.queueCounts(queues);
      const qc = queues.map((q) => perQueue[q]);
      return {
        jobs: by, workers: { total: ws.length, active: st.active_workers },
        queues: Object.fromEntries(queues.map((q, i) => [q, { queued: Number(qc[i].QUEUED || 0), assigned: Number(qc[i].ASSIGNED || 0), running: Number(qc[i].RUNNING || 0) }])),
        websocket_clients: hub!.size, uptime_seconds: st.uptime_seconds, memory_rss_bytes: process.memoryUsage().rss,
      };
    },
    // A browser's ?ticket= (from POST /ws/ticket), else the key headers; a key in the URL is refused.
    others: consoleEndpoints(virsh, (req, caller, domain, force) => auditUpgrade(req, { path: '/virt/console', status: 101, caller, targets: { domain, ...(force ? { mode: 'write, forced' } : { mode: 'write' }) } })),
    audit: auditUpgrade,
    browser: browserRule(host),
    authorize: async (req) => {
      const q = new URL(req.url || '/', 'http://x').searchParams;
      if (q.has('api_key')) return { status: 401, message: 'API keys are not accepted in URLs; send X-API-Key or Authorization: Bearer, or get a ticket from POST /ws/ticket' };
      const ticket = q.get('ticket');
      if (ticket !== null) {
        if (!cfg.keys.enabled) return { status: 0, message: '', caller: null };
        const t = await redeemTicket(redis, store.k.prefix, ticket);
        return t?.name && t.role ? { status: 0, message: '', caller: { name: t.name, role: t.role }, who: `key:${t.name}` } : { status: 401, message: 'the ticket is unknown, used or expired' };
      }
      const v = authorize(cfg.keys, req.headers, 'read');
      return v.status ? v : { status: 0, message: '', caller: v.key && { name: v.key.name, role: v.key.role }, who: v.key ? `key:${v.key.name}` : undefined };
    },
  });

  // The browser dashboard at /web/dashboard/ and the routes it needs (services/daemon/dashboard.ts).
  // xterm.js for the VM console page, served from node_modules (no CDN); mounted before the dashboard's own
  // folder, which would otherwise claim the path.
  mountStatic('/web/dashboard/vendor/xterm', path.dirname(require.resolve('@xterm/xterm/package.json')));
  const dashboardHub = await registerDashboard({ api, life, bus, jobTimeoutSeconds: cfg.jobTimeoutSeconds, mountStatic });
  opts.extend?.({ api, app, life, mountStatic });

  // eslint-disable-next-line @typescript-eslint/no-misused-promises -- Koa's callback answers its own errors (500 through the app's error handler)
  const server = http.createServer(app.callback());
  server.keepAliveTimeout = 65_000;
  await hub.start(server);
  await planHub.start();
  await new Promise<void>((resolve, reject) => { server.once('error', reject); server.listen(opts.port ?? config.daemonPort, host, resolve); });
  const port = (server.address() as any).port;

  let metricsServer: http.Server | undefined;
  if (cfg.metrics.enabled && cfg.metrics.port !== undefined) {
    metricsServer = http.createServer((req, res) => void (async () => {
      if (!guardPlain(cfg.keys, req, res, 'read', daemonEnvelope)) return;
      if ((req.url || '').split('?')[0] !== '/metrics') { res.writeHead(404, { 'content-type': 'application/json' }); res.end(JSON.stringify(daemonEnvelope(404, 'only /metrics is served here', req.url || ''))); return; }
      res.writeHead(200, { 'content-type': metrics.contentType });
      res.end(await metrics.metrics());
    })().catch((e: Error) => { log.warn('a metrics request failed; answered 500, the next scrape tries again', { error: e.message }); if (!res.headersSent) res.statusCode = 500; res.end(); }));
    await new Promise<void>((resolve) => metricsServer!.listen(cfg.metrics.port, host, resolve));
    log.info('metrics listening', { port: (metricsServer.address() as any).port });
  }
  log.info('daemon listening', { port, host, auth: cfg.auth.enabled, job_timeout: cfg.daemon.job_timeout });

  return {
    port, server, api, app, life, mountStatic,
    async close() {
      hub.close();
      planRunner.stop();
      planHub.stop();
      dashboardHub.stop();
      await new Promise((r) => server.close(r));
      server.closeAllConnections?.();
      if (metricsServer) await new Promise((r) => metricsServer.close(r));
      await schedules.close();
      await webhooks.close();
      await router.close();
      await bus.close();
      redis.disconnect();
    },
  };
}
