// The daemon's job reads: GET /jobs, GET and POST /jobs/query, GET /jobs/:id and /jobs/:id/progress; and a warm
// job's manual cutover, POST /jobs/:id/cutover. Records
// come from orchestration/daemon-views.ts, one schema for every operation (docs/daemon.md).
import Joi from 'joi';
import type { Api } from '../../platform/http';
import { notFound } from '../../platform/errors';
import { jobId as jobIdSchema } from '../../domain/schemas/common';
import { jobListQuery, jobQuerySchema, jobRecordSchema, progressSchema } from '../../domain/schemas/daemon';
import { statesForDaemonStatus } from '../../domain/states';
import type { JobStore } from '../../queue/store';
import { jobViews, progressView } from '../../orchestration/daemon-views';
import { callerOf, err } from './route-kit';
import { adminOnly } from '../../platform/admin-only';
import { INTERNAL_JOBS_WHY } from '../../domain/schemas/job';
import type Koa from 'koa';
import { askCutover } from '../../orchestration/warm';

const idParams = Joi.object<{ id: string }>({ id: jobIdSchema.required() });
const listResponse = { 200: { description: 'a page of jobs, newest first',
  schema: Joi.object({ jobs: Joi.array().items(jobRecordSchema), total: Joi.number().integer(), limit: Joi.number().integer(),
  offset: Joi.number().integer() }) } };

/** The queue states of one daemon status or a list of them (undefined: every state). */
export const statesOf = (status: string | string[] | undefined) => (status === undefined ? undefined : [status].flat().flatMap(
  (s) => statesForDaemonStatus(s)));

const cutoverAnswer = Joi.object({
  job_id: Joi.string(), cutover_requested: Joi.object({ at: Joi.string().isoDate(),
    by: Joi.string().allow(null).description('the caller\'s key name (null without keys)') }), message: Joi.string(),
});

/** A warm shape B job submitted on its own (not by a plan): the same request and rule as POST /plans/{id}/cutover. */
function addCutoverRoute(api: Api, store: JobStore) {
  api.add({
    method: 'post', role: 'submit', path: '/jobs/:id/cutover',
    summary: 'Cut a running warm migration (options.warm) over now: the job powers its VM off as options.power_off says, copies the last delta, then ' +
             'repairs, imports and boots it (docs/plans.md, Warm migration)', tags: ['jobs'], params: idParams,
    responses: {
      200: { description: 'the request, recorded on the job (warm_cutover); the job acts on it within a second between rounds, or when its round ends',
      schema: cutoverAnswer }, 404: err('unknown job'), 409: err('not a warm job, already ended, or its cutover already began') },
    handler: async (ctx, { params }) => {
      const r = await askCutover(store, params.id, callerOf(ctx)?.name ?? null);
      return { job_id: params.id, cutover_requested: r, message: `cutover of job ${params.id} requested${r.by ? ` by ${r.by}` : ''}` };
    },
  });
}

/** Query routes come before /jobs/:id, which would otherwise claim /jobs/query. */
export function addJobRoutes(api: Api, store: JobStore) {
  /** A page of the job lists; `internal` (admin only) includes the daemon's calls (store.list). */
  async function page(ctx: Koa.Context, states: string[] | undefined, q: { limit: number; offset: number; internal: boolean }) {
    if (q.internal) adminOnly(callerOf(ctx), 'internal', INTERNAL_JOBS_WHY);
    const { limit, offset } = q;
    const { total, ids } = await store.list({ states, limit, offset, internal: q.internal });
    return { jobs: await jobViews(store, ids), total, limit, offset };
  }
  api.add({
    method: 'post', role: 'read', path: '/jobs/query', summary: 'Query jobs by status or ids (paged with limit/offset)', tags: ['jobs'], body: jobQuerySchema,
    bodyRequired: false,
    responses: { ...listResponse, 400: err('invalid query') },
    handler: async (ctx, { body }) => {
      if (body.job_ids) {
        const jobs = await jobViews(store, body.job_ids);
        const want = body.status ? new Set([body.status].flat()) : null;
        const sel = want ? jobs.filter((j) => want.has(j.status)) : jobs;
        return { jobs: sel.slice(body.offset, body.offset + body.limit), total: sel.length, limit: body.limit, offset: body.offset,
          not_found: body.job_ids.filter((id: string) => !jobs.some((j) => j.id === id)) };
      }
      return page(ctx, statesOf(body.status), body);
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs/query', summary: 'Jobs with a status (?status=running or a comma list)', tags: ['jobs'], query: jobListQuery,
    responses: { ...listResponse, 400: err('invalid query') },
    handler: (ctx, { query }) => page(ctx, statesOf(query.status?.split(',')), query),
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs', summary: 'Jobs, newest first, paged (limit, offset, optional status)', tags: ['jobs'], query: jobListQuery,
    responses: listResponse,
    handler: (ctx, { query }) => page(ctx, statesOf(query.status?.split(',')), query),
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs/:id', summary: 'One job', tags: ['jobs'], params: idParams,
    responses: { 200: { description: 'the job', schema: jobRecordSchema }, 404: err('unknown job') },
    handler: async (_ctx, { params }) => {
      const [v] = await jobViews(store, [params.id]);
      if (!v) throw notFound(`job ${params.id} not found`);
      return v;
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs/:id/progress', summary: 'Progress with a smoothed rate and an ETA', tags: ['jobs'], params: idParams,
    responses: { 200: { description: 'progress', schema: progressSchema }, 404: err('unknown job') },
    handler: async (_ctx, { params }) => {
      const h = await store.raw(params.id);
      if (!h) throw notFound(`job ${params.id} not found`);
      return progressView(store, params.id, h);
    },
  });
  addCutoverRoute(api, store);
}
