// The daemon API (port 8080): jobs, schedules, webhooks, health and status. Every route is declared once with
// its joi schemas and answers at /<path> and /api/v1/<path>.
import Joi from 'joi';
import type { ApiKey } from '../../shared/auth';
import { Api } from '../../shared/http';
import { ApiError, fieldError, notFound } from '../../shared/errors';
import { jobId as jobIdSchema } from '../../shared/schemas/common';
import {
  cancelSchema, daemonErrorSchema, jobListQuery, jobQuerySchema, jobRecordSchema, progressSchema, scheduleCreateSchema,
  scheduleSchema, scheduleUpdateSchema, statusSchema, submitBodySchema, webhookCreateSchema, webhookSchema, webhookTestSchema,
} from '../../shared/schemas/daemon';
import { statesForDaemonStatus } from '../../shared/states';
import type { Lifecycle } from '../../queue/lifecycle';
import type { DaemonConfig } from '../../shared/daemon-config';
import { checkInsecure, checkPasswordStorable, storePassword } from '../../shared/vsphere/job-credentials';
import { buildSpec } from '../../shared/daemon-jobs';
import { jobViews, progressView } from '../../queue/daemon-views';
import { ScheduleStore, ownerOf, refusePasswords } from '../../queue/schedules';
import { checkTemplate, runSchedule, RunDeps } from '../../queue/schedule-runs';
import { createdView, publicView, WebhookStore } from '../../queue/webhooks';
import { checkTarget } from '../../shared/targets';
import { addVmRoutes } from './vms';

const err = (description: string) => ({ description, schema: daemonErrorSchema });
const ts = () => new Date().toISOString();
const idParams = Joi.object({ id: jobIdSchema.required() });
const scheduleParams = Joi.object({ id: Joi.string().max(64).required() });

export interface RouteDeps {
  life: Lifecycle; cfg: DaemonConfig; schedules: ScheduleStore; webhooks: WebhookStore; runDeps: RunDeps;
  status: () => Promise<Record<string, unknown>>;
}

export function buildDaemonApi(d: RouteDeps) {
  const { life, cfg, schedules, webhooks } = d;
  const store = life.store;
  // The daemon accepts fields it does not know, ignores them and lists them in `warnings` (as the seed's
  // reference daemon accepts them); the job API (8000) refuses them.
  // Every body may be JSON or YAML (the daemon seed's config-file style); shared/http.ts reads both.
  const api = new Api({ prefixes: ['', '/api/v1'], unknownFields: 'warn', requestTypes: ['application/json', 'application/x-yaml', 'text/yaml'] });

  async function submitOne(def: unknown, where: string, caller: ApiKey | null, warnings?: string[]) {
    const built = buildSpec(def, { where, jobTimeoutSeconds: cfg.jobTimeoutSeconds, parallelDownloads: cfg.daemon.parallel_downloads, warnings });
    const mp = built.spec.parameters as { manager_url?: string; insecure?: boolean };
    if (built.shape !== 'operation') checkInsecure(caller, mp.manager_url, mp.insecure, [where, built.shape === 'A' ? 'insecure' : 'source.insecure'].filter(Boolean).join('.'));
    checkPasswordStorable(built.passwordField!, built.password);
    if (built.password) await storePassword(store.redis, store.k, built.spec.job_id, built.password, cfg.jobTimeoutSeconds + 86400);
    await life.submit(built.spec, { enqueue: true, meta: built.meta, caller });
    return built;
  }

  /** Cancels every job of a daemon status, page by page (no limit), and names each job it could not cancel. */
  async function cancelAll(status: string) {
    let count = 0;
    const errors: Record<string, string> = {};
    for await (const ids of store.idsIn(statesOf(status) ?? [])) {
      for (const id of ids) {
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

  async function page(states: string[] | undefined, limit: number, offset: number) {
    const { total, ids } = await store.list({ states, limit, offset });
    return { jobs: await jobViews(store, ids), total, limit, offset };
  }
  const statesOf = (status: string | string[] | undefined) => (status === undefined ? undefined : [status].flat().flatMap((s) => statesForDaemonStatus(s)));

  // Remote VMs (services/daemon/vms.ts)
  addVmRoutes(api);

  // Health and status
  api.add({
    method: 'get', role: 'public', path: '/health', summary: 'Liveness', tags: ['status'],
    responses: { 200: { description: 'ok', schema: Joi.object({ status: Joi.string().valid('ok') }) } },
    handler: () => ({ status: 'ok' }),
  });
  api.add({
    method: 'get', role: 'read', path: '/status', summary: 'Daemon status: version, uptime, job counts, workers', tags: ['status'],
    responses: { 200: { description: 'status', schema: statusSchema } },
    handler: () => d.status(),
  });

  // Jobs. /jobs/query and /jobs/cancel come before /jobs/:id.
  api.add({
    method: 'post', role: 'submit', path: '/jobs/submit', summary: 'Submit an export job (shape A), a migration job (shape B) or a batch {jobs}', tags: ['jobs'],
    body: submitBodySchema,
    responses: {
      200: { description: 'shape A or batch: {job_ids, accepted, rejected, errors, timestamp}; shape B: {job_id, message}', schema: Joi.alternatives().try(
        Joi.object({ job_ids: Joi.array().items(Joi.string()), accepted: Joi.number().integer(), rejected: Joi.number().integer(), errors: Joi.array().items(Joi.object({ index: Joi.number().integer(), error: Joi.string() })), timestamp: Joi.string().isoDate() }),
        Joi.object({ job_id: Joi.string(), message: Joi.string() })) },
      400: err('invalid job definition (names the field)'),
    },
    handler: async (ctx, { body, warnings }) => {
      if (Array.isArray(body.jobs)) {
        const job_ids: string[] = [];
        const errors: { index: number; error: string }[] = [];
        for (let i = 0; i < body.jobs.length; i++) {
          try { job_ids.push((await submitOne(body.jobs[i], `jobs[${i}]`, ctx.state.apiKey ?? null, warnings)).spec.job_id); } catch (e) {
            if (!(e instanceof ApiError) || e.status >= 500) throw e;
            errors.push({ index: i, error: e.message });
          }
        }
        return { job_ids, accepted: job_ids.length, rejected: errors.length, errors, timestamp: ts() };
      }
      const b = await submitOne(body, '', ctx.state.apiKey ?? null, warnings);
      if (b.shape === 'B') return { job_id: b.spec.job_id, message: `migration job ${b.spec.job_id} for ${String(b.meta.vm_path)} queued` };
      return { job_ids: [b.spec.job_id], accepted: 1, rejected: 0, errors: [], timestamp: ts() };
    },
  });
  const listResponse = { 200: { description: 'a page of jobs, newest first', schema: Joi.object({ jobs: Joi.array().items(jobRecordSchema), total: Joi.number().integer(), limit: Joi.number().integer(), offset: Joi.number().integer() }) } };
  api.add({
    method: 'post', role: 'read', path: '/jobs/query', summary: 'Query jobs by status or ids (paged with limit/offset)', tags: ['jobs'], body: jobQuerySchema, bodyRequired: false,
    responses: { ...listResponse, 400: err('invalid query') },
    handler: async (_ctx, { body }) => {
      if (body.job_ids) {
        const jobs = await jobViews(store, body.job_ids);
        const want = body.status ? new Set([body.status].flat()) : null;
        const sel = want ? jobs.filter((j) => want.has(j.status)) : jobs;
        return { jobs: sel.slice(body.offset, body.offset + body.limit), total: sel.length, limit: body.limit, offset: body.offset, not_found: body.job_ids.filter((id: string) => !jobs.some((j) => j.id === id)) };
      }
      return page(statesOf(body.status), body.limit, body.offset);
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs/query', summary: 'Jobs with a status (?status=running or a comma list)', tags: ['jobs'], query: jobListQuery,
    responses: { ...listResponse, 400: err('invalid query') },
    handler: (_ctx, { query }) => page(statesOf(query.status?.split(',')), query.limit, query.offset),
  });
  api.add({
    method: 'post', role: 'submit', path: '/jobs/cancel', summary: 'Cancel jobs by id (per-id result) or every job of a status', tags: ['jobs'], body: cancelSchema,
    responses: {
      200: { description: 'form 1 (job_ids): {cancelled, failed, errors, timestamp}; form 2 (status only): every such job, {message, count, failed, errors}', schema: Joi.object({ cancelled: Joi.array().items(Joi.string()), failed: Joi.array().items(Joi.string()), errors: Joi.object().pattern(Joi.string(), Joi.string()), timestamp: Joi.string(), message: Joi.string(), count: Joi.number().integer() }) },
      400: err('neither job_ids nor status'),
    },
    handler: async (_ctx, { body }) => {
      if (!body.job_ids) return cancelAll(body.status);
      const cancelled: string[] = [];
      const failed: string[] = [];
      const errors: Record<string, string> = {};
      for (const id of body.job_ids as string[]) {
        try {
          if (body.status) {
            const [v] = await jobViews(store, [id]);
            if (v && v.status !== body.status) throw new ApiError(400, `job is ${v.status}, not ${body.status}`);
          }
          await life.cancel(id, 'cancelled through the daemon API');
          cancelled.push(id);
        } catch (e) {
          failed.push(id);
          errors[id] = e instanceof ApiError && e.status === 404 ? 'job not found' : (e as Error).message;
        }
      }
      return { cancelled, failed, errors, timestamp: ts() };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/jobs', summary: 'Jobs, newest first, paged (limit, offset, optional status)', tags: ['jobs'], query: jobListQuery,
    responses: listResponse,
    handler: (_ctx, { query }) => page(statesOf(query.status?.split(',')), query.limit, query.offset),
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

  // Schedules. /schedules/stats and /schedules/create come before /schedules/:id.
  const scheduleResponse = { description: 'the schedule', schema: Joi.object({ message: Joi.string(), schedule: scheduleSchema }) };
  async function createSchedule(ctx: any, body: any) {
    const template = body.job_template ?? body.job_definition;
    const field = body.job_template ? 'job_template' : 'job_definition';
    refusePasswords(template, field);
    const caller = ctx.state.apiKey ?? null;
    checkTemplate(d.runDeps, template, caller, field);
    const s = await schedules.create({ id: body.id, name: body.name, description: body.description, schedule: body.schedule ?? body.cron ?? body.cron_expr, timezone: body.timezone, enabled: body.enabled, job_template: template, owner: ownerOf(caller) });
    ctx.status = 201;
    return { message: `schedule ${s.id} created`, schedule: await schedules.view(s) };
  }
  api.add({
    method: 'get', role: 'read', path: '/schedules', summary: 'All schedules', tags: ['schedules'],
    responses: { 200: { description: 'schedules', schema: Joi.object({ schedules: Joi.array().items(scheduleSchema), total: Joi.number().integer(), timestamp: Joi.string() }) } },
    handler: async () => {
      const all = await Promise.all((await schedules.all()).map((s) => schedules.view(s)));
      return { schedules: all, total: all.length, timestamp: ts() };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/schedules/stats', summary: 'Run counts of all schedules, split into successful and failed', tags: ['schedules'],
    responses: { 200: { description: 'stats', schema: Joi.object({
      total_schedules: Joi.number().integer(), enabled_schedules: Joi.number().integer(), disabled_schedules: Joi.number().integer(),
      total_runs: Joi.number().integer(), successful_runs: Joi.number().integer(), failed_runs: Joi.number().integer(),
      schedules: Joi.array().items(Joi.object().unknown(true)), timestamp: Joi.string().isoDate(),
    }) } },
    handler: async () => {
      const all = await Promise.all((await schedules.all()).map((s) => schedules.view(s)));
      const sum = (k: 'run_count' | 'successful_runs' | 'failed_runs') => all.reduce((a, s) => a + s[k], 0);
      return {
        total_schedules: all.length, enabled_schedules: all.filter((s) => s.enabled).length, disabled_schedules: all.filter((s) => !s.enabled).length,
        total_runs: sum('run_count'), successful_runs: sum('successful_runs'), failed_runs: sum('failed_runs'),
        schedules: all.map((s) => ({ id: s.id, name: s.name, enabled: s.enabled, run_count: s.run_count, successful_runs: s.successful_runs, failed_runs: s.failed_runs, last_run: s.last_run, next_run: s.next_run })),
        timestamp: ts(),
      };
    },
  });
  api.add({
    method: 'post', role: 'submit', path: '/schedules', summary: 'Create a schedule (schedule + job_template, or cron + job_definition)', tags: ['schedules'], body: scheduleCreateSchema,
    responses: { 201: scheduleResponse, 400: err('invalid schedule or cron expression'), 409: err('id exists') },
    handler: (ctx, { body }) => createSchedule(ctx, body),
  });
  api.add({
    method: 'post', role: 'submit', path: '/schedules/create', summary: 'Create a schedule ({name, cron_expr} form)', tags: ['schedules'], body: scheduleCreateSchema,
    responses: { 201: scheduleResponse, 400: err('invalid schedule or cron expression') },
    handler: (ctx, { body }) => createSchedule(ctx, body),
  });
  const one = async (id: string) => { const s = await schedules.get(id); if (!s) throw notFound(`schedule ${id} not found`); return s; };
  api.add({
    method: 'get', role: 'read', path: '/schedules/:id', summary: 'One schedule', tags: ['schedules'], params: scheduleParams,
    responses: { 200: { description: 'schedule', schema: scheduleSchema }, 404: err('unknown schedule') },
    handler: async (_ctx, { params }) => schedules.view(await one(params.id)),
  });
  api.add({
    method: 'put', role: 'submit', path: '/schedules/:id', summary: 'Change name, schedule, enabled, description, timezone or job_template', tags: ['schedules'], params: scheduleParams, body: scheduleUpdateSchema,
    responses: { 200: scheduleResponse, 400: err('invalid change'), 404: err('unknown schedule') },
    handler: async (ctx, { params, body }) => {
      refusePasswords(body.job_template, 'job_template');
      const { cron, ...rest } = body;
      // A new template becomes its changer's: the schedule's runs then have the changer's rights, never more.
      const caller = ctx.state.apiKey ?? null;
      checkTemplate(d.runDeps, body.job_template, caller, 'job_template');
      const owner = body.job_template ? ownerOf(caller) : undefined;
      const s = await schedules.update(params.id, { ...rest, schedule: rest.schedule ?? cron, owner });
      return { message: `schedule ${s.id} updated`, schedule: await schedules.view(s) };
    },
  });
  api.add({
    method: 'delete', role: 'submit', path: '/schedules/:id', summary: 'Delete a schedule', tags: ['schedules'], params: scheduleParams,
    responses: { 200: { description: 'deleted', schema: Joi.object({ message: Joi.string() }) }, 404: err('unknown schedule') },
    handler: async (_ctx, { params }) => { await schedules.remove(params.id); return { message: `schedule ${params.id} deleted` }; },
  });
  for (const [action, enabled] of [['enable', true], ['disable', false]] as const) {
    api.add({
      method: 'post', role: 'submit', path: `/schedules/:id/${action}`, summary: `${action[0].toUpperCase()}${action.slice(1)} a schedule`, tags: ['schedules'], params: scheduleParams,
      responses: { 200: scheduleResponse, 404: err('unknown schedule') },
      handler: async (_ctx, { params }) => {
        await one(params.id);
        const s = await schedules.update(params.id, { enabled });
        return { message: `schedule ${s.id} ${enabled ? 'enabled' : 'disabled'}`, schedule: await schedules.view(s) };
      },
    });
  }
  api.add({
    method: 'post', role: 'submit', path: '/schedules/:id/trigger', summary: 'Run the job template once, now', tags: ['schedules'], params: scheduleParams,
    responses: { 200: { description: 'triggered', schema: Joi.object({ message: Joi.string(), job_id: Joi.string().allow(null) }) }, 404: err('unknown schedule') },
    handler: async (_ctx, { params }) => {
      await one(params.id);
      const job_id = await runSchedule(d.runDeps, params.id, { manual: true });
      return { message: job_id ? `schedule ${params.id} triggered: job ${job_id}` : `schedule ${params.id} triggered but created no job (it has no usable job template)`, job_id };
    },
  });

  // Webhooks, addressed by position.
  const hookAt = async (index: number) => {
    const all = await webhooks.list();
    if (!all[index]) throw notFound(`no webhook at index ${index}`);
    return all[index];
  };
  const indexParams = Joi.object({ index: Joi.number().integer().min(0).required() });
  api.add({
    method: 'get', role: 'read', path: '/webhooks', summary: 'Configured webhooks (secrets and sensitive headers never shown)', tags: ['webhooks'],
    responses: { 200: { description: 'webhooks', schema: Joi.object({ webhooks: Joi.array().items(webhookSchema), total: Joi.number().integer(), timestamp: Joi.string().isoDate() }) } },
    handler: async () => { const all = await webhooks.list(); return { webhooks: all.map(publicView), total: all.length, timestamp: ts() }; },
  });
  api.add({
    method: 'post', role: 'submit', path: '/webhooks', summary: 'Add a webhook (private and loopback targets refused unless configured)', tags: ['webhooks'], body: webhookCreateSchema,
    responses: { 201: { description: 'added', schema: Joi.object({ message: Joi.string(), webhook: webhookSchema.keys({ headers: Joi.object().pattern(Joi.string(), Joi.string()).description('sensitive values shown as [redacted]') }) }) }, 400: err('invalid webhook or refused target') },
    handler: async (ctx, { body }) => {
      const refused = await checkTarget(body.url, cfg.webhooks);
      if (refused) throw fieldError(400, 'url', refused, `url refused: ${refused}`);
      const { webhook, index } = await webhooks.add(body);
      ctx.status = 201;
      return { message: `webhook ${webhook.id} added at index ${index}`, webhook: createdView(webhook, index) };
    },
  });
  api.add({
    method: 'post', role: 'submit', path: '/webhooks/test', summary: "Send a webhook.test delivery to every enabled webhook, to one index, or (the seed's {url, event: test}) to the webhooks with that url", tags: ['webhooks'], body: webhookTestSchema, bodyRequired: false,
    responses: { 200: { description: 'queued deliveries', schema: Joi.object({ message: Joi.string(), delivery_ids: Joi.array().items(Joi.string()) }) }, 404: err('no webhook at index, or none with that url') },
    handler: async (_ctx, { body }) => {
      let only = body.index !== undefined ? [await hookAt(body.index)] : (await webhooks.list()).filter((w) => w.enabled);
      if (body.url !== undefined) {
        only = (await webhooks.list()).filter((w) => w.url === body.url);
        if (!only.length) throw fieldError(404, 'url', 'no webhook with this url', `url: no webhook is configured with url ${body.url} (add it with POST /webhooks first)`);
      }
      const ids = await webhooks.enqueue('webhook.test', { message: 'test delivery from the Ferry daemon' }, `t${Date.now()}`, { backoffMs: cfg.webhooks.backoff_ms, only });
      return { message: `queued ${ids.length} test deliveries`, delivery_ids: ids };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/webhooks/:index/deliveries', summary: 'Delivery log of one webhook, newest first', tags: ['webhooks'], params: indexParams,
    responses: { 200: { description: 'deliveries', schema: Joi.object().unknown(true) }, 404: err('no webhook at index') },
    handler: async (_ctx, { params }) => { const w = await hookAt(params.index); return { webhook_id: w.id, deliveries: await webhooks.deliveries(w.id) }; },
  });
  api.add({
    method: 'delete', role: 'submit', path: '/webhooks/:index', summary: 'Delete the webhook at a zero-based index', tags: ['webhooks'], params: indexParams,
    responses: { 200: { description: 'deleted', schema: Joi.object({ message: Joi.string() }) }, 404: err('no webhook at index') },
    handler: async (_ctx, { params }) => { const w = await webhooks.removeAt(params.index); return { message: `webhook ${w.id} at index ${params.index} deleted` }; },
  });
  return api;
}
