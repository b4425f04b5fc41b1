// The job protocol's worker routes: register, heartbeat (renewing the leases it lists), list, deregister.
import Joi from 'joi';
import type { Api } from '../../platform/http';
import { config } from '../../platform/config';
import { notFound } from '../../platform/errors';
import { normalizeCaps } from '../../platform/capabilities';
import { heartbeatSchema, workerRegistrationSchema } from '../../domain/schemas/job';
import { workerSchema } from '../../domain/schemas/responses';
import { sameLease, type Lifecycle } from '../../queue/lifecycle';
import { workersOverview } from '../../queue/overview';
import { boundKey, checkCapabilities, checkWorkerId } from './worker-keys';
import { err, workerParams } from './route-kit';

export function addWorkerRoutes(api: Api, life: Lifecycle) {
  const { store, registry, router } = life;
  api.add({
    method: 'post', role: 'worker', path: '/workers/register', summary: 'Register a worker', tags: ['workers'], body: workerRegistrationSchema,
    responses: { 201: { description: 'registered', schema: Joi.object({ worker_id: Joi.string(), message: Joi.string(),
      capabilities: Joi.array().items(Joi.string()), registered_at: Joi.string() }) }, 400: err('invalid registration') },
    handler: async (ctx, { body }) => {
      checkCapabilities(ctx, body.capabilities);
      await checkWorkerId(registry, ctx, body.worker_id);
      const registered_at = await registry.register(body, 'http', boundKey(ctx));
      ctx.status = 201;
      return { worker_id: body.worker_id, message: `worker ${body.worker_id} registered`, capabilities: normalizeCaps(body.capabilities), registered_at };
    },
  });
  api.add({
    method: 'post', role: 'worker', audit: 'refusals', path: '/workers/:worker_id/heartbeat',
    summary: 'Worker heartbeat; renews the leases of the jobs whose lease_tokens it lists', tags: ['workers'], params: workerParams, body: heartbeatSchema,
    bodyRequired: false,
    responses: { 200: { description: 'recorded', schema: Joi.object({ worker_id: Joi.string(), message: Joi.string(), timestamp: Joi.string(),
      renewed: Joi.array().items(Joi.string()) }) }, 404: err('unknown worker') },
    handler: async (ctx, { params, body }) => {
      await checkWorkerId(registry, ctx, params.worker_id);
      const ts = await registry.heartbeat(params.worker_id);
      if (!ts) throw notFound(`worker ${params.worker_id} not found`);
      const renewed: string[] = [];
      const tokens: string[] = body?.lease_tokens || [];
      if (tokens.length) {
        for (const id of await registry.heldJobs(params.worker_id)) {
          const h = await store.raw(id);
          const token = h && tokens.find((t) => sameLease(h.lease, t));
          if (h && token && h.worker_id === params.worker_id && await router.extendLocks(h.queue, [id], [token], config.httpLeaseSeconds).then(() => true,
            () => false)) renewed.push(id);
        }
      }
      return { worker_id: params.worker_id, message: 'heartbeat recorded', timestamp: ts, renewed };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/workers', summary: 'Registered workers (active: heartbeat within the stale limit, 300 s)', tags: ['workers'],
    responses: { 200: { description: 'workers', schema: Joi.object({ total: Joi.number().integer(), active: Joi.number().integer(),
      workers: Joi.array().items(workerSchema) }) } },
    handler: () => workersOverview(life),
  });
  api.add({
    role: 'admin', method: 'delete', path: '/workers/:worker_id', summary: 'Deregister a worker; the jobs it holds go back to the queue', tags: ['workers'],
    params: workerParams,
    responses: { 200: { description: 'removed', schema: Joi.object({ worker_id: Joi.string(), message: Joi.string() }) }, 404: err('unknown worker') },
    handler: async (_ctx, { params }) => {
      if (!(await registry.get(params.worker_id))) throw notFound(`worker ${params.worker_id} not found`);
      await life.releaseWorker(params.worker_id, 'worker deregistered');
      await registry.remove(params.worker_id);
      return { worker_id: params.worker_id, message: `worker ${params.worker_id} removed` };
    },
  });
}
