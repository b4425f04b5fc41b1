// The daemon API (port 8080): its route table, one file per resource. Every route is declared once with its joi
// schemas and answers at /<path> and /api/v1/<path>. Plans, /virt and the start-up's own routes (OpenAPI, tickets,
// metrics, audit) are added by app.ts, which holds what they need.
import Joi from 'joi';
import { Api } from '../../platform/http';
import { answersWithin } from '../../platform/health';
import { statusSchema } from '../../domain/schemas/daemon';
import type { Lifecycle } from '../../queue/lifecycle';
import type { Bus } from '../../queue/bus';
import type { DaemonConfig } from '../../platform/daemon-config';
import type { ScheduleStore } from '../../orchestration/schedules';
import type { RunDeps } from '../../orchestration/schedule-runs';
import type { WebhookStore } from '../../orchestration/webhooks';
import { addVmRoutes } from './vms';
import { addSubmitRoute } from './jobs-submit';
import { addJobRoutes } from './jobs';
import { addCancelRoute } from './jobs-cancel';
import { addScheduleRoutes } from './schedules';
import { addScheduleChangeRoutes } from './schedule-changes';
import { addWebhookRoutes } from './webhooks';

export interface RouteDeps {
  life: Lifecycle; bus: Bus; cfg: DaemonConfig; schedules: ScheduleStore; webhooks: WebhookStore; runDeps: RunDeps;
  status: () => Promise<Record<string, unknown>>;
  /** The libvirt connection's last known state, for /health's body. */
  libvirt: () => { uri: string; state: 'unknown' | 'reachable' | 'unreachable'; checked_at: string | null };
}

const libvirtStateSchema = Joi.object({
  uri: Joi.string(), state: Joi.string().valid('unknown', 'reachable', 'unreachable'), checked_at: Joi.string().allow(null),
})
  .description('the libvirt connection of /virt, shown and not judged: a daemon without libvirt is still ready');
const healthSchema = Joi.object({
  status: Joi.string().valid('ok', 'unavailable'), redis: Joi.string().valid('reachable', 'unreachable'), libvirt: libvirtStateSchema,
});

function addStatusRoutes(api: Api, d: Pick<RouteDeps, 'status' | 'life' | 'libvirt'>) {
  api.add({
    method: 'get', role: 'public', path: '/health', summary: 'Readiness: 503 while Redis does not answer (platform/health.ts)', tags: ['status'],
    responses: { 200: { description: 'ready', schema: healthSchema }, 503: { description: 'Redis does not answer', schema: healthSchema } },
    handler: async (ctx) => {
      const up = await answersWithin(d.life.store.redis.ping());
      if (!up) ctx.status = 503;
      // Leading the plans is not asked: every replica serves the API, the lease only picks who steps plans.
      return { status: up ? 'ok' : 'unavailable', redis: up ? 'reachable' : 'unreachable', libvirt: d.libvirt() };
    },
  });
  api.add({
    method: 'get', role: 'public', path: '/livez', summary: 'Liveness: the process answers (readiness is /health)', tags: ['status'],
    responses: { 200: { description: 'alive', schema: Joi.object({ status: Joi.string().valid('alive') }) } },
    handler: () => ({ status: 'alive' }),
  });
  const { status } = d;
  api.add({
    method: 'get', role: 'read', path: '/status', summary: 'Daemon status: version, uptime, job counts, workers', tags: ['status'],
    responses: { 200: { description: 'status', schema: statusSchema } },
    handler: () => status(),
  });
}

export function buildDaemonApi(d: RouteDeps) {
  // The daemon accepts fields it does not know, ignores them and lists them in `warnings` (as the seed's
  // reference daemon accepts them); the job API (8000) refuses them.
  // Every body may be JSON or YAML (the daemon seed's config-file style); platform/http.ts reads both.
  const api = new Api({ prefixes: ['', '/api/v1'], unknownFields: 'warn', requestTypes: ['application/json', 'application/x-yaml', 'text/yaml'] });
  addVmRoutes(api, { life: d.life, bus: d.bus });
  addStatusRoutes(api, d);
  addSubmitRoute(api, d);
  addJobRoutes(api, d.life.store);
  addCancelRoute(api, d.life);
  addScheduleRoutes(api, d);
  addScheduleChangeRoutes(api, d);
  addWebhookRoutes(api, d);
  return api;
}
