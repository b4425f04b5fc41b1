// Wires the daemon: Redis, the shared job lifecycle, schedules, webhooks, the HTTP API (both path forms),
// WebSocket updates, metrics, /openapi.yaml and Swagger UI. main.ts only runs it. `extend` and the returned
// mountStatic/api let other parts (the dashboard) add routes or a static directory. startDaemon is the list of
// start-up steps, each a named function below or in its own file.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import type Koa from 'koa';
import { Api, createApp } from '../../platform/http';
import { daemonEnvelope } from '../../platform/errors';
import { createLogger, Logger } from '../../platform/log';
import { config } from '../../platform/config';
import { listenHost } from '../../platform/auth';
import type { Lifecycle } from '../../queue/lifecycle';
import { Bus } from '../../queue/bus';
import type { DaemonConfig } from '../../platform/daemon-config';
import { buildDaemonApi, type RouteDeps } from './routes';
import { shownUri } from '../../domain/libvirt/uri';
import type { WsHub } from './ws';
import { StaticMount, staticMiddleware, swaggerMount } from './static';
import { ScheduleStore } from '../../orchestration/schedules';
import { WebhookStore } from '../../orchestration/webhooks';
import { registerDashboard } from './dashboard';
import { registerVirt } from './virt';
import { buildSpec } from '../../domain/daemon-jobs';
import { configuredUri, type Virsh } from '../../domain/libvirt/virsh';
import { callRetention, daemonVirsh, JobVirsh } from '../../orchestration/virsh-jobs';
import type { Leader } from '../../queue/leader';
import { connectQueue } from '../../queue/connect';
import { AuditLog } from '../../platform/audit';
import { RateLimiter } from '../../platform/limits';
import { PlanStore } from '../../orchestration/plans';
import { PlanRunner } from '../../orchestration/plan-runner';
import { registerPlanMetrics } from '../../orchestration/plan-metrics';
import { addPlanRoutes } from './plans';
import { PlanHub } from '../../orchestration/plan-events';
import { daemonMetrics, Registry, serveMetricsPort, statusReports } from './daemon-metrics';
import { addOwnRoutes } from './own-routes';
import { createWsHub } from './ws-setup';

export interface DaemonHandle {
  port: number; server: http.Server; api: Api; app: Koa; life: Lifecycle;
  mountStatic(prefix: string, dir: string, overrides?: StaticMount['overrides']): void;
  close(): Promise<void>;
}
type Extend = (d: Omit<DaemonHandle, 'port' | 'server' | 'close'>) => void;

/** At most one plan_update (and SSE frame) per plan per this many ms: a busy plan does not flood clients. */
const PLAN_UPDATE_INTERVAL_MS = 500;

/** The queue layer and the stores the daemon adds on it; `live.hub` is set once the WebSocket hub exists. */
function openStores(log: Logger) {
  const q = connectQueue(log, { stalledCheck: false });
  const live: { hub?: WsHub } = {};
  return { q, live, bus: new Bus(), schedules: new ScheduleStore(q.redis, q.store.k), webhooks: new WebhookStore(q.redis, q.store.k) };
}
type Stores = ReturnType<typeof openStores>;

/** Migration plans (services/daemon/plans.ts); every daemon answers the plan routes, and the one holding the
 *  `plans` lease runs them (orchestration/plan-runner.ts; its writes are compare-and-set, fenced by the lease).
 *  Plan events: plan_update on /ws and GET /plans/{id}/events/stream, from the bus (orchestration/plan-events.ts). */
async function startPlans(api: Api, cfg: DaemonConfig, s: Stores, metrics: Registry, log: Logger) {
  const { q, live } = s;
  const plans = new PlanStore(q.redis, q.store.k);
  const runner = new PlanRunner({
    plans, life: q.life, hooks: s.webhooks, bus: s.bus, log, jobTimeoutSeconds: cfg.jobTimeoutSeconds,
    parallelDownloads: cfg.daemon.parallel_downloads, webhookBackoffMs: cfg.webhooks.backoff_ms, auth: cfg.keys,
  });
  const hub = new PlanHub({
    bus: s.bus, store: q.store, plans, intervalMs: PLAN_UPDATE_INTERVAL_MS, heartbeatSeconds: config.sseHeartbeatSeconds,
    wsWants: () => !!live.hub?.hasEventClients(), toWs: (id, view) => live.hub?.planUpdate(id, view),
  });
  addPlanRoutes(api, { plans, runner, jobs: q.store, events: hub, work: { life: q.life, bus: s.bus } });
  registerPlanMetrics(metrics, plans, q.store);
  await runner.begin();
  return { runner, hub };
}

/** The virtualization host: one URI (FERRY_LIBVIRT_URI). The daemon starts without it; its /virt routes answer
 *  503 naming the URI while no libvirtd answers there. */
function addVirt(api: Api, cfg: DaemonConfig, life: Lifecycle, virsh: Virsh): Virsh {
  registerVirt({
    api, virsh,
    submitConvert: async (def) => {
      const b = buildSpec(def, { where: '', jobTimeoutSeconds: cfg.jobTimeoutSeconds, parallelDownloads: cfg.daemon.parallel_downloads });
      await life.submit(b.spec, { enqueue: true, meta: { kind: 'convert', name: 'convert' } });
      return { job_id: b.spec.job_id };
    },
  });
  return virsh;
}

/** The libvirt connection's state for /health's body: probed at start, and again in the background when /health
 *  asks and the last answer is over 30 s old (the probe runs virsh, so it is never awaited by the route). */
function libvirtState(virsh: Virsh, log: Logger): RouteDeps['libvirt'] {
  const s: ReturnType<RouteDeps['libvirt']> = { uri: shownUri(virsh.uri), state: 'unknown', checked_at: null };
  let probing = false;
  const probe = () => {
    probing = true;
    // reachable() answers false on any failure; it never rejects
    void virsh.reachable().then((up) => {
      const changed = s.state !== (up ? 'reachable' : 'unreachable');
      s.state = up ? 'reachable' : 'unreachable';
      s.checked_at = new Date().toISOString();
      if (changed && up) log.info('libvirt answers', { uri: s.uri });
      else if (changed) {
        log.warn(`no libvirtd answers at ${s.uri}`
          + `${virsh instanceof JobVirsh ? ' (or no worker with libvirt_access takes its calls: FERRY_LIBVIRT_VIA=worker)' : ''}`
          + ': /virt routes answer 503 until one does');
      }
    }).finally(() => { probing = false; });
  };
  probe();
  return () => {
    if (!probing && (!s.checked_at || Date.now() - Date.parse(s.checked_at) > 30_000)) probe();
    return { ...s };
  };
}

/** Static mounts (Swagger UI now, the dashboard's files later) under both path forms. They hold no data and stay
 *  public (the dashboard asks for the key): createApp runs them before authentication and the rate limit. */
function staticMounts() {
  const mounts: StaticMount[] = [swaggerMount('/swagger-ui', '/openapi.yaml'), swaggerMount('/api/v1/swagger-ui', '/openapi.yaml')];
  const mountStatic = (prefix: string, dir: string, overrides?: StaticMount['overrides']) => {
    const p = prefix.replace(/\/+$/, '');
    mounts.push({ prefix: p, dir, overrides }, { prefix: '/api/v1' + p, dir, overrides });
  };
  return { middleware: staticMiddleware(mounts), mountStatic };
}

/** The browser dashboard at /web/dashboard/ and the routes it needs (services/daemon/dashboard.ts). xterm.js for
 *  the VM console page is served from node_modules (no CDN), mounted before the dashboard's own folder, which
 *  would otherwise claim the path. */
async function addDashboard(api: Api, cfg: DaemonConfig, s: Stores, mountStatic: DaemonHandle['mountStatic']) {
  mountStatic('/web/dashboard/vendor/xterm', path.dirname(require.resolve('@xterm/xterm/package.json')));
  return registerDashboard({ api, life: s.q.life, bus: s.bus, jobTimeoutSeconds: cfg.jobTimeoutSeconds, mountStatic });
}

/** The HTTP server with the WebSocket hub and the plan events attached, listening. */
async function listenWith(app: Koa, hub: WsHub, planHub: PlanHub, port: number, host: string) {
  // Koa's handler answers its own errors (createApp's first step), so its promise is not awaited here.
  const handle = app.callback();
  const server = http.createServer((req, res) => { void handle(req, res); });
  server.keepAliveTimeout = 65_000;
  await hub.start(server);
  await planHub.start();
  await new Promise<void>((resolve, reject) => { server.once('error', reject); server.listen(port, host, resolve); });
  return server;
}

/** Stops what the steps started, the servers first, Redis last. */
function closer(s: Stores, parts: {
  hub: WsHub; plans: Awaited<ReturnType<typeof startPlans>>; dashboard: { stop(): void }; server: http.Server; metricsServer?: http.Server; calls: Leader;
}) {
  return async () => {
    parts.hub.close();
    await parts.calls.stop();
    await parts.plans.runner.stop();
    parts.plans.hub.stop();
    parts.dashboard.stop();
    await new Promise((r) => parts.server.close(r));
    parts.server.closeAllConnections?.();
    if (parts.metricsServer) await new Promise((r) => parts.metricsServer!.close(r));
    await s.schedules.close();
    await s.webhooks.close();
    await s.q.router.close();
    await s.bus.close();
    s.q.redis.disconnect();
  };
}

export async function startDaemon(
  cfg: DaemonConfig, opts: { port?: number; host?: string; hostSetting?: string; extend?: Extend } = {},
): Promise<DaemonHandle> {
  const log = createLogger('daemon');
  const host = listenHost(cfg.keys, opts.host ?? config.host, opts.host ? (opts.hostSetting || 'daemon.addr') : 'FERRY_HOST');
  const s = openStores(log);
  const { q } = s;
  const wsClients = () => s.live.hub?.size || 0;
  const { metrics, httpMetrics } = daemonMetrics(q, wsClients);
  const reports = statusReports(q, Date.now(), wsClients);
  const runDeps = { life: q.life, schedules: s.schedules, jobTimeoutSeconds: cfg.jobTimeoutSeconds, parallelDownloads: cfg.daemon.parallel_downloads, log };
  const virsh = daemonVirsh({ life: q.life, bus: s.bus }, configuredUri());
  const api = buildDaemonApi({
    life: q.life, bus: s.bus, cfg, schedules: s.schedules, webhooks: s.webhooks, runDeps, status: reports.status, libvirt: libvirtState(virsh, log),
  });
  const plans = await startPlans(api, cfg, s, metrics, log);
  const calls = callRetention(q.store, log); // the call lane's records: minutes, not FERRY_JOB_RETENTION
  addVirt(api, cfg, q.life, virsh);
  const audit = new AuditLog(q.redis, q.store.k.prefix, log, 'daemon');
  addOwnRoutes(api, { cfg, q, metrics, audit });
  const statics = staticMounts();
  const app = createApp(api, {
    log, metrics: httpMetrics, envelope: daemonEnvelope, auth: cfg.keys, audit, listenHost: host,
    limiter: new RateLimiter(q.redis, q.store.k.prefix), publicFiles: [statics.middleware],
  });
  const hub = s.live.hub = createWsHub({ cfg, q, bus: s.bus, audit, virsh, host, log, status: reports.status, metrics: reports.wsMetrics });
  const dashboard = await addDashboard(api, cfg, s, statics.mountStatic);
  opts.extend?.({ api, app, life: q.life, mountStatic: statics.mountStatic });

  const server = await listenWith(app, hub, plans.hub, opts.port ?? config.daemonPort, host);
  const metricsServer = await serveMetricsPort(cfg, metrics, host, { log, audit, refusals: new RateLimiter(q.redis, q.store.k.prefix, 'refusals') });
  const port = (server.address() as AddressInfo).port; // a TCP listener: an address, never a pipe's path
  log.info('daemon listening', { port, host, auth: cfg.auth.enabled, job_timeout: cfg.daemon.job_timeout });
  return { port, server, api, app, life: q.life, mountStatic: statics.mountStatic, close: closer(s, { hub, plans, dashboard, server, metricsServer, calls }) };
}
