// The daemon's schedule reads and creation: GET /schedules, /schedules/stats, /schedules/:id, POST /schedules and
// /schedules/create (the seed's {name, cron_expr} form). Changes are in schedule-changes.ts. Store and runs:
// orchestration/schedules.ts, orchestration/schedule-runs.ts.
import Joi from 'joi';
import type Koa from 'koa';
import type { Api } from '../../platform/http';
import { notFound } from '../../platform/errors';
import { scheduleCreateSchema, scheduleSchema, type ScheduleCreate } from '../../domain/schemas/daemon';
import { ScheduleStore, ownerOf, refusePasswords } from '../../orchestration/schedules';
import { checkTemplate, RunDeps } from '../../orchestration/schedule-runs';
import { callerOf, err, now } from './route-kit';

export const scheduleParams = Joi.object<{ id: string }>({ id: Joi.string().max(64).required() });
export const scheduleResponse = { description: 'the schedule', schema: Joi.object({ message: Joi.string(), schedule: scheduleSchema }) };
const stats = Joi.object({
  total_schedules: Joi.number().integer(), enabled_schedules: Joi.number().integer(), disabled_schedules: Joi.number().integer(),
  total_runs: Joi.number().integer(), successful_runs: Joi.number().integer(), failed_runs: Joi.number().integer(),
  schedules: Joi.array().items(Joi.object().unknown(true)), timestamp: Joi.string().isoDate(),
});

/** The schedule with this id, or a 404 naming it. */
export async function scheduleOr404(schedules: ScheduleStore, id: string) {
  const s = await schedules.get(id);
  if (!s) throw notFound(`schedule ${id} not found`);
  return s;
}

/** /schedules/stats and /schedules/create come before /schedules/:id. */
export function addScheduleRoutes(api: Api, d: { schedules: ScheduleStore; runDeps: RunDeps }) {
  const { schedules } = d;
  const views = async () => Promise.all((await schedules.all()).map((s) => schedules.view(s)));
  async function create(ctx: Koa.Context, body: ScheduleCreate) {
    const template = body.job_template ?? body.job_definition;
    const field = body.job_template ? 'job_template' : 'job_definition';
    refusePasswords(template, field);
    const caller = callerOf(ctx) ?? null;
    checkTemplate(d.runDeps, template, caller, field);
    // scheduleCreateSchema's xor(): exactly one of schedule, cron and cron_expr is given.
    const s = await schedules.create({
      id: body.id, name: body.name, description: body.description, schedule: (body.schedule ?? body.cron ?? body.cron_expr)!,
      timezone: body.timezone, enabled: body.enabled, job_template: template, owner: ownerOf(caller),
    });
    ctx.status = 201;
    return { message: `schedule ${s.id} created`, schedule: await schedules.view(s) };
  }
  api.add({
    method: 'get', role: 'read', path: '/schedules', summary: 'All schedules', tags: ['schedules'],
    responses: {
      200: {
        description: 'schedules',
        schema: Joi.object({ schedules: Joi.array().items(scheduleSchema), total: Joi.number().integer(), timestamp: Joi.string() }),
      },
    },
    handler: async () => { const all = await views(); return { schedules: all, total: all.length, timestamp: now() }; },
  });
  api.add({
    method: 'get', role: 'read', path: '/schedules/stats', summary: 'Run counts of all schedules, split into successful and failed', tags: ['schedules'],
    responses: { 200: { description: 'stats', schema: stats } },
    handler: async () => {
      const all = await views();
      const sum = (k: 'run_count' | 'successful_runs' | 'failed_runs') => all.reduce((a, s) => a + s[k], 0);
      return {
        total_schedules: all.length, enabled_schedules: all.filter((s) => s.enabled).length, disabled_schedules: all.filter((s) => !s.enabled).length,
        total_runs: sum('run_count'), successful_runs: sum('successful_runs'), failed_runs: sum('failed_runs'),
        schedules: all.map((s) => ({
          id: s.id, name: s.name, enabled: s.enabled, run_count: s.run_count, successful_runs: s.successful_runs, failed_runs: s.failed_runs,
          last_run: s.last_run, next_run: s.next_run,
        })),
        timestamp: now(),
      };
    },
  });
  api.add({
    method: 'post', role: 'submit', path: '/schedules', summary: 'Create a schedule (schedule + job_template, or cron + job_definition)', tags: ['schedules'],
    body: scheduleCreateSchema,
    responses: { 201: scheduleResponse, 400: err('invalid schedule or cron expression'), 409: err('id exists') },
    handler: (ctx, { body }) => create(ctx, body),
  });
  api.add({
    method: 'post', role: 'submit', path: '/schedules/create', summary: 'Create a schedule ({name, cron_expr} form)', tags: ['schedules'],
    body: scheduleCreateSchema,
    responses: { 201: scheduleResponse, 400: err('invalid schedule or cron expression') },
    handler: (ctx, { body }) => create(ctx, body),
  });
  api.add({
    method: 'get', role: 'read', path: '/schedules/:id', summary: 'One schedule', tags: ['schedules'], params: scheduleParams,
    responses: { 200: { description: 'schedule', schema: scheduleSchema }, 404: err('unknown schedule') },
    handler: async (_ctx, { params }) => schedules.view(await scheduleOr404(schedules, params.id)),
  });
}
