// The worker job protocol (port 8000): its route table, one file per resource: every endpoint of the seed, plus
// the report-back endpoints a pull worker needs (start, events, complete, fail) and POST /jobs/{id}/queue.
import Joi from 'joi';
import type client from 'prom-client';
import { Api } from '../../platform/http';
import type { Lifecycle } from '../../queue/lifecycle';
import type { EventHub } from '../../queue/sse';
import { addJobRoutes } from './jobs';
import { addReportRoutes } from './reports';
import { addWorkerRoutes } from './workers';
import { addQueueRoutes } from './queue-routes';

interface ApiDeps { life: Lifecycle; hub: EventHub; metrics: client.Registry; openapi: () => object }

/** Health (503 while Redis does not answer within 2 s), Prometheus metrics and this API's description. */
function addSystemRoutes(api: Api, deps: ApiDeps) {
  const { store, registry } = deps.life;
  api.add({
    method: 'get', role: 'public', path: '/health', summary: 'Health', tags: ['system'],
    responses: { 200: { description: 'healthy', schema: Joi.object({ status: Joi.string(), version: Joi.string(), timestamp: Joi.string(),
      workers: Joi.number().integer(), active_jobs: Joi.number().integer() }) }, 503: { description: 'Redis unreachable' } },
    handler: async (ctx) => {
      try {
        const [active, counts] = await Promise.race([
          Promise.all([registry.counts(), store.stateCounts()]),
          new Promise<never>((_, rej) => setTimeout(() => rej(new Error('redis timeout')), 2000)),
        ]);
        return { status: 'healthy', version: 'v1', timestamp: new Date().toISOString(), workers: active.active, active_jobs: counts.ASSIGNED + counts.RUNNING };
      } catch {
        // Redis did not answer (or not within 2 s): unhealthy, said in the answer; the probe asks again.
        ctx.status = 503;
        return { status: 'unhealthy', version: 'v1', timestamp: new Date().toISOString(), reason: 'redis is unreachable; retry in a few seconds' };
      }
    },
  });
  api.add({
    method: 'get', role: 'public', path: '/livez', summary: 'Liveness: the process answers (readiness is /health)', tags: ['system'],
    responses: { 200: { description: 'alive', schema: Joi.object({ status: Joi.string().valid('alive') }) } },
    handler: () => ({ status: 'alive' }),
  });
  api.add({
    method: 'get', role: 'read', path: '/metrics', summary: 'Prometheus metrics', tags: ['system'],
    responses: { 200: { description: 'text exposition format', type: 'text/plain', schema: { type: 'string' } } },
    handler: async (ctx) => {
      ctx.type = deps.metrics.contentType;
      return deps.metrics.metrics();
    },
  });
  api.add({
    method: 'get', role: 'public', path: '/openapi.json', summary: 'This API description', tags: ['system'],
    responses: { 200: { description: 'OpenAPI 3 document', schema: { type: 'object' } } },
    handler: () => deps.openapi(),
  });
}

export function buildApi(deps: ApiDeps) {
  const api = new Api();
  addJobRoutes(api, deps.life, deps.hub);
  addReportRoutes(api, deps.life);
  addWorkerRoutes(api, deps.life);
  addQueueRoutes(api, deps.life);
  addSystemRoutes(api, deps);
  return api;
}
