// POST /jobs/submit: one export job (shape A), one migration job (shape B) or a batch {jobs}. Each definition is
// built by domain/daemon-jobs.ts; a vCenter password is stored sealed apart from the job (job-credentials.ts).
import Joi from 'joi';
import type { ApiKey } from '../../platform/auth';
import type { Api } from '../../platform/http';
import { ApiError } from '../../platform/errors';
import { submitBodySchema } from '../../domain/schemas/daemon';
import type { DaemonConfig } from '../../platform/daemon-config';
import { checkInsecure, checkPasswordStorable, storePassword } from '../../domain/vsphere/job-credentials';
import { buildSpec } from '../../domain/daemon-jobs';
import type { Lifecycle } from '../../queue/lifecycle';
import { callerOf, err, now } from './route-kit';

const submitted = Joi.alternatives().try(
  Joi.object({
    job_ids: Joi.array().items(Joi.string()), accepted: Joi.number().integer(), rejected: Joi.number().integer(),
    errors: Joi.array().items(Joi.object({ index: Joi.number().integer(), error: Joi.string() })), timestamp: Joi.string().isoDate(),
  }),
  Joi.object({ job_id: Joi.string(), message: Joi.string() }));

export function addSubmitRoute(api: Api, d: { life: Lifecycle; cfg: DaemonConfig }) {
  const { life, cfg } = d;
  async function submitOne(def: unknown, where: string, caller: ApiKey | null, warnings?: string[]) {
    const built = buildSpec(def, { where, jobTimeoutSeconds: cfg.jobTimeoutSeconds, parallelDownloads: cfg.daemon.parallel_downloads, warnings });
    const mp = built.spec.parameters as { manager_url?: string; insecure?: boolean };
    if (built.shape !== 'operation') {
      checkInsecure(caller, mp.manager_url, mp.insecure, [where, built.shape === 'A' ? 'insecure' : 'source.insecure'].filter(Boolean).join('.'));
    }
    checkPasswordStorable(built.passwordField!, built.password);
    if (built.password) await storePassword(life.store.redis, life.store.k, built.spec.job_id, built.password, cfg.jobTimeoutSeconds + 86400);
    await life.submit(built.spec, { enqueue: true, meta: built.meta, caller });
    return built;
  }

  api.add({
    method: 'post', role: 'submit', path: '/jobs/submit',
    summary: 'Submit an export job (shape A), a migration job (shape B) or a batch {jobs}', tags: ['jobs'],
    body: submitBodySchema,
    responses: {
      200: { description: 'shape A or batch: {job_ids, accepted, rejected, errors, timestamp}; shape B: {job_id, message}', schema: submitted },
      400: err('invalid job definition (names the field)'),
    },
    handler: async (ctx, { body, warnings }) => {
      if (Array.isArray(body.jobs)) {
        const job_ids: string[] = [];
        const errors: { index: number; error: string }[] = [];
        for (let i = 0; i < body.jobs.length; i++) {
          try { job_ids.push((await submitOne(body.jobs[i], `jobs[${i}]`, callerOf(ctx) ?? null, warnings)).spec.job_id); } catch (e) {
            if (!(e instanceof ApiError) || e.status >= 500) throw e;
            errors.push({ index: i, error: e.message });
          }
        }
        return { job_ids, accepted: job_ids.length, rejected: errors.length, errors, timestamp: now() };
      }
      const b = await submitOne(body, '', callerOf(ctx) ?? null, warnings);
      if (b.shape === 'B') return { job_id: b.spec.job_id, message: `migration job ${b.spec.job_id} for ${String(b.meta.vm_path)} queued` };
      return { job_ids: [b.spec.job_id], accepted: 1, rejected: 0, errors: [], timestamp: now() };
    },
  });
}
