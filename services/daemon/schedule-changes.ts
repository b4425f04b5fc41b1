// The daemon's schedule changes: PUT and DELETE /schedules/:id, POST /schedules/:id/enable, /disable, /trigger.
import Joi from 'joi';
import type { Api } from '../../platform/http';
import { scheduleUpdateSchema } from '../../domain/schemas/daemon';
import { ScheduleStore, ownerOf, refusePasswords } from '../../orchestration/schedules';
import { checkTemplate, runSchedule, RunDeps } from '../../orchestration/schedule-runs';
import { scheduleOr404, scheduleParams, scheduleResponse } from './schedules';
import { callerOf, err } from './route-kit';

export function addScheduleChangeRoutes(api: Api, d: { schedules: ScheduleStore; runDeps: RunDeps }) {
  const { schedules } = d;
  api.add({
    method: 'put', role: 'submit', path: '/schedules/:id', summary: 'Change name, schedule, enabled, description, timezone or job_template',
    tags: ['schedules'], params: scheduleParams, body: scheduleUpdateSchema,
    responses: { 200: scheduleResponse, 400: err('invalid change'), 404: err('unknown schedule') },
    handler: async (ctx, { params, body }) => {
      refusePasswords(body.job_template, 'job_template');
      const { cron, ...rest } = body;
      // A new template becomes its changer's: the schedule's runs then have the changer's rights, never more.
      const caller = callerOf(ctx) ?? null;
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
      method: 'post', role: 'submit', path: `/schedules/:id/${action}`, summary: `${action[0].toUpperCase()}${action.slice(1)} a schedule`, tags: ['schedules'],
      params: scheduleParams,
      responses: { 200: scheduleResponse, 404: err('unknown schedule') },
      handler: async (_ctx, { params }) => {
        await scheduleOr404(schedules, params.id);
        const s = await schedules.update(params.id, { enabled });
        return { message: `schedule ${s.id} ${enabled ? 'enabled' : 'disabled'}`, schedule: await schedules.view(s) };
      },
    });
  }
  api.add({
    method: 'post', role: 'submit', path: '/schedules/:id/trigger', summary: 'Run the job template once, now', tags: ['schedules'], params: scheduleParams,
    responses: {
      200: { description: 'triggered', schema: Joi.object({ message: Joi.string(), job_id: Joi.string().allow(null) }) }, 404: err('unknown schedule'),
    },
    handler: async (_ctx, { params }) => {
      await scheduleOr404(schedules, params.id);
      const job_id = await runSchedule(d.runDeps, params.id, { manual: true });
      return {
        message: job_id
          ? `schedule ${params.id} triggered: job ${job_id}`
          : `schedule ${params.id} triggered but created no job (it has no usable job template)`,
        job_id,
      };
    },
  });
}
