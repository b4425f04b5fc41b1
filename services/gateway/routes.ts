// The worker job protocol (port 8000): every endpoint of the seed, plus the report-back endpoints a pull
// worker needs (start, events, complete, fail) and POST /jobs/{id}/queue.
import Joi from 'joi';
import { randomUUID } from 'node:crypto';
import type client from 'prom-client';
import { Api } from '../../shared/http';
import { config } from '../../shared/config';
import { conflict, fieldError, notFound } from '../../shared/errors';
import { capabilitiesBeyond } from '../../shared/auth';
import { normalizeCaps } from '../../shared/capabilities';
import { redact } from '../../shared/sensitive';
import {
  dequeueSchema, eventsQuery, heartbeatSchema, leaseToken, jobSpecSchema, listJobsQuery, progressEventSchema, submitQuery, workerCompleteSchema,
  workerEventSchema, workerFailSchema, workerRegistrationSchema, workerReportSchema, JobSpec,
} from '../../shared/schemas/job';
import { jobId as jobIdSchema, workerId as workerIdSchema } from '../../shared/schemas/common';
import { errorSchema, jobStatusSchema, jobSummarySchema, queueStatusSchema, submitResponse, workerSchema } from '../../shared/schemas/responses';
import { isTerminal } from '../../shared/states';
import { sameLease, type Lifecycle } from '../../queue/lifecycle';
import type { EventHub } from '../../queue/sse';
import { queueOverview, workersOverview } from '../../queue/overview';
import { ignoreError } from '../../shared/log';

const jobParams = Joi.object({ job_id: jobIdSchema.required() });
const workerParams = Joi.object({ worker_id: workerIdSchema.required() });
const err = (description: string) => ({ description, schema: errorSchema });

export function buildApi(deps: { life: Lifecycle; hub: EventHub; metrics: client.Registry; openapi: () => object }) {
  const { life, hub } = deps;
  const { store, registry, router } = life;
  const api = new Api();

  async function jobStatus(id: string) {
    const rec = await store.get(id);
    if (!rec) throw notFound(`job ${id} not found`);
    const queued = rec.state === 'QUEUED' && rec.queue;
    return {
      job_id: rec.job_id, spec: redact(rec.spec), state: rec.state, state_history: rec.state_history,
      result: redact(rec.result), latest_event: rec.latest_event, created_at: rec.created_at, updated_at: rec.updated_at,
      is_terminal: rec.is_terminal, attempts: rec.attempts, max_attempts: rec.max_attempts, worker_id: rec.worker_id,
      error: rec.error,
      queue: {
        name: rec.queue,
        position: queued ? await router.position(rec.queue!, id) : null,
        waiting_reason: queued ? await life.waitingReason(rec.queue!, id) : null,
      },
    };
  }

  /** A worker id registered with one API key cannot be used with another (admin keys excepted): a worker key
   *  cannot keep another worker's registration alive or claim jobs in its name. */
  async function checkWorkerId(ctx: any, workerId: string) {
    const key = ctx.state.apiKey;
    if (!key || key.role === 'admin') return;
    const owner = await registry.keyOf(workerId);
    if (owner && owner !== key.name) throw fieldError(403, 'worker_id', 'registered with another API key', `worker ${workerId} is registered with another API key`);
  }

  /** The key name a registration binds the worker id to (admin keys act on any worker and bind none). */
  const boundKey = (ctx: any): string | undefined => (ctx.state.apiKey && ctx.state.apiKey.role !== 'admin' ? ctx.state.apiKey.name : undefined);

  /** A worker key limited to some capabilities (keys file) cannot claim more. */
  function checkCapabilities(ctx: any, caps: string[]) {
    const beyond = capabilitiesBeyond(ctx.state.apiKey, caps);
    if (beyond.length) throw fieldError(403, 'capabilities', `not allowed for this key: ${beyond.join(', ')}`, `the API key "${ctx.state.apiKey.name}" does not allow capabilities ${beyond.join(', ')}`);
  }

  api.add({
    method: 'post', role: 'submit', path: '/jobs', summary: 'Submit a job', tags: ['jobs'], query: submitQuery, body: jobSpecSchema,
    responses: { 201: { description: 'registered (and queued with ?queue=true)', schema: submitResponse }, 400: err('invalid specification'), 409: err('job_id already exists') },
    handler: async (ctx, { query, body }) => {
      const spec = body as JobSpec;
      spec.job_id ||= randomUUID();
      const r = await life.submit(spec, { enqueue: query.queue, caller: ctx.state.apiKey ?? null });
      ctx.status = 201;
      const message = !query.queue ? `job ${r.job_id} validated; not queued (submit with ?queue=true or POST /jobs/${r.job_id}/queue)`
        : r.state === 'QUEUED' ? `job ${r.job_id} queued` : `job ${r.job_id} queued and already ${r.state}`;
      return { ...r, message };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs', summary: 'List jobs, newest first', tags: ['jobs'], query: listJobsQuery,
    responses: { 200: { description: 'jobs', schema: Joi.object({ total: Joi.number().integer(), jobs: Joi.array().items(jobSummarySchema) }) } },
    handler: async (_ctx, { query }) => {
      const { total, ids } = await store.list({ state: query.state, limit: query.limit, offset: query.offset });
      const hs = await store.many(ids, ['state', 'created_at']);
      return { total, jobs: ids.map((id, i) => hs[i] && { job_id: id, state: hs[i].state, created_at: hs[i].created_at, is_terminal: isTerminal(hs[i].state) }).filter(Boolean) };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs/:job_id', summary: 'Job status', tags: ['jobs'], params: jobParams,
    responses: { 200: { description: 'the job', schema: jobStatusSchema }, 404: err('unknown job') },
    handler: (_ctx, { params }) => jobStatus(params.job_id),
  });
  api.add({
    method: 'delete', role: 'submit', path: '/jobs/:job_id', summary: 'Cancel a job', tags: ['jobs'], params: jobParams,
    responses: { 200: { description: 'cancelled', schema: Joi.object({ job_id: Joi.string(), state: Joi.string(), message: Joi.string() }) }, 400: err('job already terminal'), 404: err('unknown job') },
    handler: (_ctx, { params }) => life.cancel(params.job_id),
  });
  api.add({
    method: 'post', role: 'submit', path: '/jobs/:job_id/queue', summary: 'Queue a job submitted without ?queue=true', tags: ['jobs'], params: jobParams,
    responses: { 200: { description: 'queued', schema: submitResponse }, 400: err('job is not VALIDATED'), 404: err('unknown job') },
    handler: async (_ctx, { params }) => ({ ...(await life.enqueueExisting(params.job_id)), message: `job ${params.job_id} queued` }),
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs/:job_id/events', summary: 'Progress events, oldest first', tags: ['events'], params: jobParams, query: eventsQuery,
    responses: { 200: { description: 'events', schema: Joi.array().items(progressEventSchema.keys({ id: Joi.string().description('event id, as sent in SSE id:') })) }, 404: err('unknown job') },
    handler: async (_ctx, { params, query }) => {
      if (!(await store.raw(params.job_id))) throw notFound(`job ${params.job_id} not found`);
      return store.events(params.job_id, { since: query.since, afterId: query.after_id });
    },
  });
  api.add(hub.route({ role: 'read', path: '/jobs/:job_id/events/stream', param: 'job_id', params: jobParams, summary: 'Progress events as Server-Sent Events (honours Last-Event-ID)', tags: ['events'], notFound: err('unknown job') }));

  // Report-back endpoints for pull workers (the seed has none; see docs/worker-protocol.md).
  api.add({
    method: 'post', role: 'worker', path: '/jobs/:job_id/start', summary: 'Worker starts a job it was handed (ASSIGNED -> RUNNING)', tags: ['worker reports'], params: jobParams, body: workerReportSchema,
    responses: { 200: { description: 'running', schema: Joi.object({ job_id: Joi.string(), state: Joi.string() }) }, 404: err('unknown job'), 409: err('not held by this worker') },
    handler: async (_ctx, { params, body }) => {
      const h = await life.held(params.job_id, body.worker_id, body.lease_token);
      if (h.state === 'ASSIGNED' && !(await life.start(params.job_id, body.worker_id, body.lease_token))) throw conflict(`job ${params.job_id} could not be started`);
      return { job_id: params.job_id, state: 'RUNNING' };
    },
  });
  api.add({
    method: 'post', role: 'worker', path: '/jobs/:job_id/events', summary: 'Worker reports a progress event', tags: ['worker reports'], params: jobParams, body: workerEventSchema,
    responses: { 201: { description: 'recorded', schema: Joi.object({ id: Joi.string() }) }, 404: err('unknown job'), 409: err('not held by this worker') },
    handler: async (ctx, { params, body }) => {
      const h = await life.held(params.job_id, body.worker_id, body.lease_token);
      if (h.state === 'ASSIGNED') await life.start(params.job_id, body.worker_id, body.lease_token);
      const { worker_id, job_id, lease_token, ...ev } = body;
      const r = await life.progress(params.job_id, body.lease_token, ev);
      if (!r.ok) throw conflict(`job ${params.job_id} is no longer held by worker ${worker_id}`);
      ctx.status = 201;
      return { id: r.id };
    },
  });
  api.add({
    method: 'post', role: 'worker', path: '/jobs/:job_id/complete', summary: 'Worker reports success', tags: ['worker reports'], params: jobParams, body: workerCompleteSchema,
    responses: { 200: { description: 'completed', schema: Joi.object({ job_id: Joi.string(), state: Joi.string() }) }, 404: err('unknown job'), 409: err('not held by this worker') },
    handler: async (_ctx, { params, body }) => {
      const h = await life.held(params.job_id, body.worker_id, body.lease_token);
      if (h.state === 'ASSIGNED') await life.start(params.job_id, body.worker_id, body.lease_token);
      if (!(await life.complete(params.job_id, body.worker_id, body.lease_token, body.result))) throw conflict(`job ${params.job_id} could not be completed`);
      return { job_id: params.job_id, state: 'COMPLETED' };
    },
  });
  api.add({
    method: 'post', role: 'worker', path: '/jobs/:job_id/fail', summary: 'Worker reports a failed attempt (requeued while retry_count allows)', tags: ['worker reports'], params: jobParams, body: workerFailSchema,
    responses: { 200: { description: 'state after the failure', schema: Joi.object({ job_id: Joi.string(), state: Joi.string(), retry_in_ms: Joi.number() }) }, 404: err('unknown job'), 409: err('not held by this worker') },
    handler: async (_ctx, { params, body }) => {
      await life.held(params.job_id, body.worker_id, body.lease_token);
      const r = await life.fail(params.job_id, body.worker_id, body.lease_token, body.error, body.retryable);
      if (!r.ok) throw conflict(`job ${params.job_id} is ${r.state ?? 'gone'}: the failure was not recorded (the job moved on since the lease was checked)`);
      return { job_id: params.job_id, state: r.state, retry_in_ms: r.retry_in_ms };
    },
  });

  api.add({
    method: 'post', role: 'worker', path: '/workers/register', summary: 'Register a worker', tags: ['workers'], body: workerRegistrationSchema,
    responses: { 201: { description: 'registered', schema: Joi.object({ worker_id: Joi.string(), message: Joi.string(), capabilities: Joi.array().items(Joi.string()), registered_at: Joi.string() }) }, 400: err('invalid registration') },
    handler: async (ctx, { body }) => {
      checkCapabilities(ctx, body.capabilities);
      await checkWorkerId(ctx, body.worker_id);
      const registered_at = await registry.register(body, 'http', boundKey(ctx));
      ctx.status = 201;
      return { worker_id: body.worker_id, message: `worker ${body.worker_id} registered`, capabilities: normalizeCaps(body.capabilities), registered_at };
    },
  });
  api.add({
    method: 'post', role: 'worker', path: '/workers/:worker_id/heartbeat', summary: 'Worker heartbeat; renews the leases of the jobs whose lease_tokens it lists', tags: ['workers'], params: workerParams, body: heartbeatSchema, bodyRequired: false,
    responses: { 200: { description: 'recorded', schema: Joi.object({ worker_id: Joi.string(), message: Joi.string(), timestamp: Joi.string(), renewed: Joi.array().items(Joi.string()) }) }, 404: err('unknown worker') },
    handler: async (ctx, { params, body }) => {
      await checkWorkerId(ctx, params.worker_id);
      const ts = await registry.heartbeat(params.worker_id);
      if (!ts) throw notFound(`worker ${params.worker_id} not found`);
      const renewed: string[] = [];
      const tokens: string[] = body?.lease_tokens || [];
      if (tokens.length) {
        for (const id of await registry.heldJobs(params.worker_id)) {
          const h = await store.raw(id);
          const token = h && tokens.find((t) => sameLease(h.lease, t));
          if (h && token && h.worker_id === params.worker_id && await router.extendLocks(h.queue, [id], [token], config.httpLeaseSeconds).then(() => true, () => false)) renewed.push(id);
        }
      }
      return { worker_id: params.worker_id, message: 'heartbeat recorded', timestamp: ts, renewed };
    },
  });
  api.add({
    method: 'post', role: 'worker', path: '/jobs/:job_id/lease', summary: 'Worker renews the lease of a job it holds', tags: ['worker reports'], params: jobParams, body: workerReportSchema,
    responses: { 200: { description: 'renewed', schema: Joi.object({ job_id: Joi.string(), lease_seconds: Joi.number() }) }, 404: err('unknown job'), 409: err('not held under this lease') },
    handler: async (_ctx, { params, body }) => {
      const h = await life.held(params.job_id, body.worker_id, body.lease_token);
      await router.extendLocks(h.queue, [params.job_id], [body.lease_token], config.httpLeaseSeconds);
      return { job_id: params.job_id, lease_seconds: config.httpLeaseSeconds };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/workers', summary: 'Registered workers (active: heartbeat within the stale limit, 300 s)', tags: ['workers'],
    responses: { 200: { description: 'workers', schema: Joi.object({ total: Joi.number().integer(), active: Joi.number().integer(), workers: Joi.array().items(workerSchema) }) } },
    handler: () => workersOverview(life),
  });
  api.add({
    role: 'admin', method: 'delete', path: '/workers/:worker_id', summary: 'Deregister a worker; the jobs it holds go back to the queue', tags: ['workers'], params: workerParams,
    responses: { 200: { description: 'removed', schema: Joi.object({ worker_id: Joi.string(), message: Joi.string() }) }, 404: err('unknown worker') },
    handler: async (_ctx, { params }) => {
      if (!(await registry.get(params.worker_id))) throw notFound(`worker ${params.worker_id} not found`);
      await life.releaseWorker(params.worker_id, 'worker deregistered');
      await registry.remove(params.worker_id);
      return { worker_id: params.worker_id, message: `worker ${params.worker_id} removed` };
    },
  });

  api.add({
    method: 'get', role: 'read', path: '/queue', summary: 'Queued jobs by priority and by requirement set', tags: ['queue'],
    responses: { 200: { description: 'queue status', schema: queueStatusSchema } },
    handler: () => queueOverview(life),
  });
  api.add({
    method: 'post', role: 'worker', path: '/queue/dequeue', summary: 'Hand the caller the next job it can run (ASSIGNED under a lease), or null', tags: ['queue'], body: dequeueSchema,
    responses: { 200: { description: 'the JobSpec with lease_token (also in the X-Lease-Token header), or the JSON value null; every report-back must carry the token', schema: jobSpecSchema.keys({ lease_token: leaseToken }).allow(null) }, 400: err('invalid request'), 403: err('capabilities beyond what the key allows') },
    handler: async (ctx, { body }) => {
      checkCapabilities(ctx, body.capabilities);
      await checkWorkerId(ctx, body.worker_id);
      // A pull worker need not register first: dequeue registers (or refreshes) it with what it says it can do.
      const known = await registry.get(body.worker_id);
      if (!known) await registry.register({ ...body, system_info: {} }, 'http', boundKey(ctx));
      else await registry.heartbeat(body.worker_id);
      const lease = await life.claim(body, undefined, { deadline: true }); // timeout_seconds enforced by reapTimedOut
      ctx.type = 'application/json';
      if (!lease) return 'null';
      await router.extendLocks(lease.queue, [lease.job_id], [lease.token], config.httpLeaseSeconds).catch(ignoreError('could not extend the lock of a job claimed over HTTP; the first heartbeat extends it again, and a lock that lapses first sends the job back to the queue', { job_id: lease.job_id }));
      ctx.set('X-Lease-Token', lease.token);
      return { ...lease.record.spec, lease_token: lease.token };
    },
  });

  api.add({
    method: 'get', role: 'public', path: '/health', summary: 'Health', tags: ['system'],
    responses: { 200: { description: 'healthy', schema: Joi.object({ status: Joi.string(), version: Joi.string(), timestamp: Joi.string(), workers: Joi.number().integer(), active_jobs: Joi.number().integer() }) }, 503: { description: 'Redis unreachable' } },
    handler: async (ctx) => {
      try {
        const [active, counts] = await Promise.race([
          Promise.all([registry.active(), store.stateCounts()]),
          new Promise<never>((_, rej) => setTimeout(() => rej(new Error('redis timeout')), 2000)),
        ]);
        return { status: 'healthy', version: 'v1', timestamp: new Date().toISOString(), workers: active.length, active_jobs: counts.ASSIGNED + counts.RUNNING };
      } catch {
        ctx.status = 503; // the answer says Redis is unreachable: the probe's case, nothing else to log
        return { status: 'unhealthy', version: 'v1', timestamp: new Date().toISOString(), reason: 'redis is unreachable; retry in a few seconds' };
      }
    },
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
  return api;
}
