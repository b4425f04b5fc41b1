// The job protocol's queue routes: the queue's state, and dequeue, which hands a pull worker its next job.
import type { Api } from '../../platform/http';
import { config } from '../../platform/config';
import { ignoreError } from '../../platform/log';
import { dequeueSchema, leaseToken, jobSpecSchema } from '../../domain/schemas/job';
import { queueStatusSchema } from '../../domain/schemas/responses';
import type { Lifecycle } from '../../queue/lifecycle';
import { queueOverview } from '../../queue/overview';
import { boundKey, checkCapabilities, checkWorkerId } from './worker-keys';
import { err } from './route-kit';

export function addQueueRoutes(api: Api, life: Lifecycle) {
  const { registry, router } = life;
  api.add({
    method: 'get', role: 'read', path: '/queue', summary: 'Queued jobs by priority and by requirement set', tags: ['queue'],
    responses: { 200: { description: 'queue status', schema: queueStatusSchema } },
    handler: () => queueOverview(life),
  });
  api.add({
    method: 'post', role: 'worker', path: '/queue/dequeue', summary: 'Hand the caller the next job it can run (ASSIGNED under a lease), or null',
    tags: ['queue'], body: dequeueSchema,
    responses: {
      200: { description: 'the JobSpec with lease_token (also in the X-Lease-Token header), or the JSON value null; every report-back must carry the token',
      schema: jobSpecSchema.keys({ lease_token: leaseToken }).allow(null) }, 400: err('invalid request'), 403: err('capabilities beyond what the key allows') },
    handler: async (ctx, { body }) => {
      checkCapabilities(ctx, body.capabilities);
      await checkWorkerId(registry, ctx, body.worker_id);
      // A pull worker need not register first: dequeue registers (or refreshes) it with what it says it can do.
      const known = await registry.get(body.worker_id);
      if (!known) await registry.register({ ...body, system_info: {} }, 'http', boundKey(ctx));
      else await registry.heartbeat(body.worker_id);
      const lease = await life.claim(body, undefined, { deadline: true }); // timeout_seconds enforced by reapTimedOut
      ctx.type = 'application/json';
      if (!lease) return 'null';
      await router.extendLocks(lease.queue, [lease.job_id], [lease.token],
        config.httpLeaseSeconds).catch(ignoreError('the first heartbeat extends the lock again; a lock that lapses first sends the job back to the queue',
        { job_id: lease.job_id }));
      ctx.set('X-Lease-Token', lease.token);
      return { ...lease.record.spec, lease_token: lease.token };
    },
  });
}
