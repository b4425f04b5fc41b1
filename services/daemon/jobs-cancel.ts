// POST /jobs/cancel: jobs by id (a result per id), or every job of a status, page by page with no limit.
import Joi from 'joi';
import type { Api } from '../../platform/http';
import { ApiError } from '../../platform/errors';
import { cancelSchema } from '../../domain/schemas/daemon';
import type { Lifecycle } from '../../queue/lifecycle';
import { jobViews } from '../../orchestration/daemon-views';
import { statesOf } from './jobs';
import { err, now } from './route-kit';

const cancelled = Joi.object({
  cancelled: Joi.array().items(Joi.string()), failed: Joi.array().items(Joi.string()), errors: Joi.object().pattern(Joi.string(), Joi.string()),
  timestamp: Joi.string(), message: Joi.string(), count: Joi.number().integer(),
});

/** Cancels every job of a daemon status, page by page (no limit), and names each job it could not cancel. */
async function cancelAll(life: Lifecycle, status: string) {
  let count = 0;
  const errors: Record<string, string> = {};
  const calls = await life.store.callIds(); // the daemon's own calls (virsh_call) are not an operator's jobs
  for await (const ids of life.store.idsIn(statesOf(status) ?? [])) {
    for (const id of ids.filter((x) => !calls.has(x))) {
      try {
        await life.cancel(id, `cancelled through the daemon API (all ${status} jobs)`);
        count++;
      } catch (e) {
        // Finished (400) or removed (404) since the page was read: nothing left to cancel.
        if (e instanceof ApiError && (e.status === 400 || e.status === 404)) continue;
        errors[id] = (e as Error).message;
      }
    }
  }
  const failed = Object.keys(errors);
  return { message: `cancelled ${count} ${status} job(s)${failed.length ? `; ${failed.length} could not be cancelled` : ''}`, count, failed, errors };
}

/** Cancels the named jobs (those of `status` only, when given), with a result per id. */
async function cancelEach(life: Lifecycle, ids: string[], status: string | undefined) {
  const done: string[] = [];
  const failed: string[] = [];
  const errors: Record<string, string> = {};
  for (const id of ids) {
    try {
      if (status) {
        const [v] = await jobViews(life.store, [id]);
        if (v && v.status !== status) throw new ApiError(400, `job is ${v.status}, not ${status}`);
      }
      await life.cancel(id, 'cancelled through the daemon API');
      done.push(id);
    } catch (e) {
      failed.push(id);
      errors[id] = e instanceof ApiError && e.status === 404 ? 'job not found' : (e as Error).message;
    }
  }
  return { cancelled: done, failed, errors, timestamp: now() };
}

export function addCancelRoute(api: Api, life: Lifecycle) {
  api.add({
    method: 'post', role: 'submit', path: '/jobs/cancel', summary: 'Cancel jobs by id (per-id result) or every job of a status', tags: ['jobs'],
    body: cancelSchema,
    responses: {
      200: {
        description: 'form 1 (job_ids): {cancelled, failed, errors, timestamp}; form 2 (status only): every such job, {message, count, failed, errors}',
        schema: cancelled,
      },
      400: err('neither job_ids nor status'),
    },
    handler: (_ctx, { body }) => (body.job_ids ? cancelEach(life, body.job_ids, body.status) : cancelAll(life, body.status)),
  });
}
