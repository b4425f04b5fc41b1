// The job protocol's job routes: submit, list, status, cancel, queue, a warm job's cutover, and the progress events
// (JSON and SSE).
import Joi from 'joi';
import { randomUUID } from 'node:crypto';
import type { Api } from '../../platform/http';
import { notFound } from '../../platform/errors';
import { redact } from '../../platform/sensitive';
import { eventsQuery, INTERNAL_JOBS_WHY, jobSpecSchema, listJobsQuery, progressEventSchema, submitQuery, JobSpec } from '../../domain/schemas/job';
import { adminOnly } from '../../platform/admin-only';
import { jobStatusSchema, jobSummarySchema, submitResponse } from '../../domain/schemas/responses';
import { isTerminal } from '../../domain/states';
import type { Lifecycle } from '../../queue/lifecycle';
import type { EventHub } from '../../queue/sse';
import type { StoredEvent } from '../../queue/store';
import { askCutover } from '../../orchestration/warm';
import { apiKeyOf, err, jobParams } from './route-kit';

/** GET /jobs/{id}'s answer. */
export type JobStatus = Awaited<ReturnType<typeof jobStatus>>;

/** GET /jobs/{id}: the record (secrets redacted) with its place in the queue and why it waits. */
async function jobStatus(life: Lifecycle, id: string) {
  const { store, router } = life;
  const rec = await store.get(id);
  if (!rec) throw notFound(`job ${id} not found`);
  const queued = rec.state === 'QUEUED' && rec.queue;
  return {
    job_id: rec.job_id, spec: redact(rec.spec), state: rec.state, state_history: rec.state_history,
    result: redact(rec.result), latest_event: rec.latest_event, created_at: rec.created_at, updated_at: rec.updated_at,
    is_terminal: rec.is_terminal, attempts: rec.attempts, max_attempts: rec.max_attempts, worker_id: rec.worker_id,
    error: rec.error, ledger: rec.ledger,
    queue: {
      name: rec.queue,
      position: queued ? await router.position(rec.queue!, id) : null,
      waiting_reason: queued ? await life.waitingReason(rec.queue!, id) : null,
    },
  };
}

export function addJobRoutes(api: Api, life: Lifecycle, hub: EventHub) {
  const { store } = life;
  api.add({
    method: 'post', role: 'submit', path: '/jobs', summary: 'Submit a job', tags: ['jobs'], query: submitQuery, body: jobSpecSchema,
    responses: { 201: { description: 'registered (and queued with ?queue=true)', schema: submitResponse }, 400: err('invalid specification'),
      409: err('job_id already exists') },
    handler: async (ctx, { query, body }) => {
      const spec = body as JobSpec;
      spec.job_id ||= randomUUID();
      const r = await life.submit(spec, { enqueue: query.queue, caller: apiKeyOf(ctx) ?? null });
      ctx.status = 201;
      const message = !query.queue ? `job ${r.job_id} validated; not queued (submit with ?queue=true or POST /jobs/${r.job_id}/queue)`
        : r.state === 'QUEUED' ? `job ${r.job_id} queued` : `job ${r.job_id} queued and already ${r.state}`;
      return { ...r, message };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs', summary: 'List jobs, newest first', tags: ['jobs'], query: listJobsQuery,
    responses: { 200: { description: 'jobs', schema: Joi.object({ total: Joi.number().integer(), jobs: Joi.array().items(jobSummarySchema) }) } },
    handler: async (ctx, { query }) => {
      if (query.internal) adminOnly(apiKeyOf(ctx), 'internal', INTERNAL_JOBS_WHY);
      const { total, ids } = await store.list({ state: query.state, limit: query.limit, offset: query.offset, internal: query.internal });
      const hs = await store.many(ids, ['state', 'created_at']);
      return { total, jobs: ids.map((id, i) => hs[i] && { job_id: id, state: hs[i].state, created_at: hs[i].created_at,
        is_terminal: isTerminal(hs[i].state) }).filter(Boolean) };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs/:job_id', summary: 'Job status', tags: ['jobs'], params: jobParams,
    responses: { 200: { description: 'the job', schema: jobStatusSchema }, 404: err('unknown job') },
    handler: (_ctx, { params }) => jobStatus(life, params.job_id),
  });
  api.add({
    method: 'delete', role: 'submit', path: '/jobs/:job_id', summary: 'Cancel a job', tags: ['jobs'], params: jobParams,
    responses: { 200: { description: 'cancelled', schema: Joi.object({ job_id: Joi.string(), state: Joi.string(), message: Joi.string() }) },
      400: err('job already terminal'), 404: err('unknown job') },
    handler: (_ctx, { params }) => life.cancel(params.job_id),
  });
  api.add({
    method: 'post', role: 'submit', path: '/jobs/:job_id/queue', summary: 'Queue a job submitted without ?queue=true', tags: ['jobs'], params: jobParams,
    responses: { 200: { description: 'queued', schema: submitResponse }, 400: err('job is not VALIDATED'), 404: err('unknown job') },
    handler: async (_ctx, { params }) => ({ ...(await life.enqueueExisting(params.job_id)), message: `job ${params.job_id} queued` }),
  });
  api.add({
    method: 'post', role: 'submit', path: '/jobs/:job_id/cutover', tags: ['jobs'], params: jobParams,
    summary: 'Cut a running warm migrate_vm job (parameters.warm) over now: power-off, last delta, repair, import, boot '
      + '(extension; the daemon\'s POST /jobs/{id}/cutover)',
    responses: {
      200: { description: 'requested (recorded on the job as warm_cutover)', schema: Joi.object({
        job_id: Joi.string(), state: Joi.string(), cutover_requested: Joi.object({ at: Joi.string(), by: Joi.string().allow(null) }),
        message: Joi.string() }) },
      404: err('unknown job'), 409: err('not a warm job, already terminal, or its cutover already began'),
    },
    handler: async (ctx, { params }) => {
      const r = await askCutover(store, params.job_id, apiKeyOf(ctx)?.name ?? null);
      const state = (await store.raw(params.job_id))?.state ?? null;
      return { job_id: params.job_id, state, cutover_requested: r, message: `cutover of job ${params.job_id} requested${r.by ? ` by ${r.by}` : ''}` };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs/:job_id/events', summary: 'Progress events, oldest first', tags: ['events'], params: jobParams,
    query: eventsQuery,
    responses: { 200: { description: 'events', schema: Joi.array().items(
      progressEventSchema.append<StoredEvent>({ id: Joi.string().description('event id, as sent in SSE id:') })) }, 404: err('unknown job') },
    handler: async (_ctx, { params, query }) => {
      if (!(await store.raw(params.job_id))) throw notFound(`job ${params.job_id} not found`);
      return store.events(params.job_id, { since: query.since, afterId: query.after_id });
    },
  });
  api.add(hub.route({ role: 'read', path: '/jobs/:job_id/events/stream', param: 'job_id', params: jobParams,
    summary: 'Progress events as Server-Sent Events (honours Last-Event-ID)', tags: ['events'], notFound: err('unknown job') }));
}
