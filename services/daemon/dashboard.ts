// What the browser dashboard (services/daemon/web, served at /web/dashboard/) needs beyond the daemon API:
// submitting a job that names an operation (the conversion form), a job's full record with its state history,
// its progress events as Server-Sent Events (the gateway's EventHub, fed by the same Redis pub/sub), and the
// workers and queues views the gateway has (queue/overview.ts, so both answer the same).
import path from 'node:path';
import Joi from 'joi';
import { redact } from '../../platform/sensitive';
import type { Api } from '../../platform/http';
import { notFound } from '../../platform/errors';
import { jobId as jobIdSchema } from '../../domain/schemas/common';
import { daemonErrorSchema, jobRecordSchema, operationTemplateSchema } from '../../domain/schemas/daemon';
import { queueStatusSchema, workerSchema } from '../../domain/schemas/responses';
import { madeEntrySchema } from '../../domain/libvirt/ledger';
import type { Lifecycle } from '../../queue/lifecycle';
import type { Bus } from '../../queue/bus';
import { queueOverview, workersOverview } from '../../queue/overview';
import { config } from '../../platform/config';
import { EventHub } from '../../queue/sse';
import { buildSpec } from '../../domain/daemon-jobs';
import { jobViews } from '../../orchestration/daemon-views';
import { grants, ROLES } from '../../platform/auth';
import { callerOf } from './route-kit';
import type { StaticMount } from './static';
import { planStatesModule } from '../../domain/plan-states';

export const DASHBOARD_DIR = path.join(__dirname, 'web');

const err = (description: string) => ({ description, schema: daemonErrorSchema });
const idParams = Joi.object<{ id: string }>({ id: jobIdSchema.required() });

/** Adds the dashboard's routes and mounts its files; returns the SSE hub so the daemon can stop it. */
export async function registerDashboard(d: {
  api: Api; life: Lifecycle; bus: Bus; jobTimeoutSeconds: number; mountStatic(prefix: string, dir: string, overrides?: StaticMount['overrides']): void;
}) {
  const { api, life } = d;
  const store = life.store;
  const hub = new EventHub(d.bus, store, config.sseHeartbeatSeconds);
  await hub.start();

  addDashboardJobRoutes(d, hub);
  addDashboardWorkerRoutes(api, life);

  // plan-states.js: the plan state table (domain/plan-states.ts) as a module, generated rather than copied.
  d.mountStatic('/web/dashboard', DASHBOARD_DIR, { 'plan-states.js': { type: 'text/javascript; charset=utf-8', body: planStatesModule() } });
  return hub;
}

/** Registers the job routes: POST /jobs/operation, GET /jobs/:id/record and the SSE /jobs/:id/events/stream, in that order. */
function addDashboardJobRoutes(d: { api: Api; life: Lifecycle; jobTimeoutSeconds: number }, hub: EventHub) {
  const { api, life } = d;
  const store = life.store;
  api.add({
    method: 'post', role: 'submit', path: '/jobs/operation',
    summary: 'Submit a job naming an operation of the 8000 API (for example convert: image, parameters, execution_policy.priority)', tags: ['jobs'],
    body: operationTemplateSchema,
    responses: {
      201: { description: 'queued', schema: Joi.object({ job_id: Joi.string(), state: Joi.string(), message: Joi.string() }) },
      400: err('invalid job (names the field)'),
    },
    handler: async (ctx, { body, warnings }) => {
      const built = buildSpec(body, { where: '', jobTimeoutSeconds: d.jobTimeoutSeconds, parallelDownloads: 1, warnings });
      const r = await life.submit(built.spec, { enqueue: true, meta: built.meta, caller: callerOf(ctx) ?? null });
      ctx.status = 201;
      return { job_id: r.job_id, state: r.state, message: `${built.spec.operation} job ${r.job_id} queued` };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs/:id/record', summary: 'One job with its specification, state history, attempts and result', tags: ['jobs'],
    params: idParams,
    responses: {
      200: {
        description: 'the job and its history',
        schema: jobRecordSchema.keys({
          spec: Joi.object().unknown(true), state_history: Joi.array().items(Joi.object().unknown(true)), result: Joi.any(),
          attempts: Joi.number(), max_attempts: Joi.number(), worker_id: Joi.string().allow(null), queue: Joi.string().allow(null),
          priority: Joi.number(), ledger: Joi.array().items(madeEntrySchema),
        }),
      },
      404: err('unknown job'),
    },
    handler: async (_ctx, { params }) => {
      const [rec, [view]] = await Promise.all([store.get(params.id), jobViews(store, [params.id])]);
      if (!rec || !view) throw notFound(`job ${params.id} not found`);
      return {
        ...view, spec: redact(rec.spec), state_history: rec.state_history, result: redact(rec.result), attempts: rec.attempts,
        max_attempts: rec.max_attempts, worker_id: rec.worker_id, queue: rec.queue, priority: rec.priority, ledger: rec.ledger,
      };
    },
  });
  api.add(hub.route({
    role: 'read', path: '/jobs/:id/events/stream', param: 'id', params: idParams,
    summary: 'Progress events as Server-Sent Events (as on the 8000 API; honours Last-Event-ID)', tags: ['jobs'], notFound: err('unknown job'),
  }));
}

/** Registers GET /workers, GET /queue and GET /whoami, in that order. */
function addDashboardWorkerRoutes(api: Api, life: Lifecycle) {
  api.add({
    method: 'get', role: 'read', path: '/workers',
    summary: 'Registered workers with capabilities and last heartbeat (as GET /workers on the 8000 API)', tags: ['workers'],
    responses: {
      200: {
        description: 'workers',
        schema: Joi.object({ total: Joi.number().integer(), active: Joi.number().integer(), workers: Joi.array().items(workerSchema) }),
      },
    },
    handler: () => workersOverview(life),
  });
  api.add({
    method: 'get', role: 'read', path: '/queue',
    summary: 'Queues by requirement set with counts per state, and queued jobs by priority (as GET /queue on the 8000 API)', tags: ['workers'],
    responses: { 200: { description: 'queue status', schema: queueStatusSchema } },
    handler: () => queueOverview(life),
  });

  // The page disables what the key may not do (the API refuses it anyway): it asks once which roles it has.
  api.add({
    method: 'get', role: 'read', path: '/whoami',
    summary: 'The calling API key: its name, role and the roles it reaches (auth off: null key, every role)', tags: ['jobs'],
    responses: {
      200: {
        description: 'the caller',
        schema: Joi.object({ auth: Joi.boolean(), name: Joi.string().allow(null), role: Joi.string().allow(null), roles: Joi.array().items(Joi.string()) }),
      },
    },
    handler: (ctx) => {
      const key = callerOf(ctx);
      return { auth: !!key, name: key?.name ?? null, role: key?.role ?? null, roles: ROLES.filter((r) => !key || grants(key, r)) };
    },
  });
}
