// Report-back endpoints for pull workers (the seed has none; see docs/worker-protocol.md): start, progress
// events, complete, fail and lease renewal, each checked against the job's lease token.
import Joi from 'joi';
import type { Api } from '../../platform/http';
import { config } from '../../platform/config';
import { conflict } from '../../platform/errors';
import { workerCompleteSchema, workerEventSchema, workerFailSchema, workerReportSchema } from '../../domain/schemas/job';
import type { Lifecycle } from '../../queue/lifecycle';
import { err, jobParams } from './route-kit';

export function addReportRoutes(api: Api, life: Lifecycle) {
  api.add({
    method: 'post', role: 'worker', path: '/jobs/:job_id/start', summary: 'Worker starts a job it was handed (ASSIGNED -> RUNNING)', tags: ['worker reports'],
    params: jobParams, body: workerReportSchema,
    responses: { 200: { description: 'running', schema: Joi.object({ job_id: Joi.string(), state: Joi.string() }) }, 404: err('unknown job'),
      409: err('not held by this worker') },
    handler: async (_ctx, { params, body }) => {
      const h = await life.held(params.job_id, body.worker_id, body.lease_token);
      if (h.state === 'ASSIGNED' && !(await life.start(params.job_id, body.worker_id, body.lease_token))) throw conflict(
        `job ${params.job_id} could not be started`);
      return { job_id: params.job_id, state: 'RUNNING' };
    },
  });
  api.add({
    method: 'post', role: 'worker', audit: 'refusals', path: '/jobs/:job_id/events', summary: 'Worker reports a progress event', tags: ['worker reports'],
    params: jobParams, body: workerEventSchema,
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
    method: 'post', role: 'worker', path: '/jobs/:job_id/complete', summary: 'Worker reports success', tags: ['worker reports'], params: jobParams,
    body: workerCompleteSchema,
    responses: { 200: { description: 'completed', schema: Joi.object({ job_id: Joi.string(), state: Joi.string() }) }, 404: err('unknown job'),
      409: err('not held by this worker') },
    handler: async (_ctx, { params, body }) => {
      const h = await life.held(params.job_id, body.worker_id, body.lease_token);
      if (h.state === 'ASSIGNED') await life.start(params.job_id, body.worker_id, body.lease_token);
      if (!(await life.complete(params.job_id, body.worker_id, body.lease_token, body.result))) throw conflict(`job ${params.job_id} could not be completed`);
      return { job_id: params.job_id, state: 'COMPLETED' };
    },
  });
  api.add({
    method: 'post', role: 'worker', path: '/jobs/:job_id/fail', summary: 'Worker reports a failed attempt (requeued while retry_count allows)',
    tags: ['worker reports'], params: jobParams, body: workerFailSchema,
    responses: { 200: { description: 'state after the failure', schema: Joi.object({ job_id: Joi.string(), state: Joi.string(), retry_in_ms: Joi.number() }) },
      404: err('unknown job'), 409: err('not held by this worker') },
    handler: async (_ctx, { params, body }) => {
      await life.held(params.job_id, body.worker_id, body.lease_token);
      const r = await life.fail(params.job_id, body.worker_id, body.lease_token, body.error, body.retryable);
      if (!r.ok) throw conflict(`job ${params.job_id} is ${r.state ?? 'gone'}: the failure was not recorded (the job moved on since the lease was checked)`);
      return { job_id: params.job_id, state: r.state, retry_in_ms: r.retry_in_ms };
    },
  });

  api.add({
    method: 'post', role: 'worker', audit: 'refusals', path: '/jobs/:job_id/lease', summary: 'Worker renews the lease of a job it holds',
    tags: ['worker reports'], params: jobParams, body: workerReportSchema,
    responses: { 200: { description: 'renewed', schema: Joi.object({ job_id: Joi.string(), lease_seconds: Joi.number() }) }, 404: err('unknown job'),
      409: err('not held under this lease') },
    handler: async (_ctx, { params, body }) => {
      const h = await life.held(params.job_id, body.worker_id, body.lease_token);
      await life.router.extendLocks(h.queue, [params.job_id], [body.lease_token], config.httpLeaseSeconds);
      return { job_id: params.job_id, lease_seconds: config.httpLeaseSeconds };
    },
  });
}
