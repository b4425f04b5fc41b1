// The daemon's plan routes (/plans and /api/v1/plans, docs/plans.md): wiring of the plan store (orchestration/plans.ts),
// preflight (domain/plans/) and the runner (orchestration/plan-runner.ts). Bodies may be JSON or YAML (the Api's rule).
import Joi from 'joi';
import type Koa from 'koa';
import type { Api, Input, Method, RouteDef } from '../../platform/http';
import { ApiError, conflict, fieldError, notFound } from '../../platform/errors';
import { daemonErrorSchema } from '../../domain/schemas/daemon';
import {
  overrideSchema, planCreateSchema, planIdParams, planListQuery, planSchema, planUpdateSchema, planVmCancelSchema, validateResponseSchema,
} from '../../domain/schemas/plans';
import { checkManager, NOT_OVERRIDABLE, planManager, preflight } from '../../domain/plans/preflight';
import { selectVms } from '../../domain/plans/selectors';
import { applySelection, checkPlanSize, newVm, Plan, planCallerOf, PlanStore } from '../../orchestration/plans';
import { checkPlanCaller } from '../../domain/plans/caller';
import type { PlanRunner } from '../../orchestration/plan-runner';
import { planView } from '../../orchestration/plan-view';
import type { JobStore } from '../../queue/store';
import type { PlanHub } from '../../orchestration/plan-events';
import { callerOf } from './route-kit';
import { guestReader } from '../../orchestration/guest-read';
import type { WorkerJobDeps } from '../../orchestration/worker-jobs';
import { vmMayMove } from '../../domain/plan-states';
import { addPlanCutoverRoute } from './plan-cutover';

const err = (description: string) => ({ description, schema: daemonErrorSchema });
const one = { description: 'the plan', schema: planSchema };
const who = (ctx: Koa.Context) => planCallerOf(callerOf(ctx));
// planIdParams with the VM: its id schema extracted, so the type can name both keys (keys() keeps planIdParams').
const vmParams = Joi.object<{ id: string; vm: string }>({
  id: planIdParams.extract('id'), vm: Joi.string().max(1100).required().description('the VM path, URL-encoded (%2F for /), or its name'),
});

function vmOf(p: Plan, vm: string) {
  const v = p.vms.find((x) => x.vm_path === vm) ?? p.vms.find((x) => x.vm_path.split('/').pop() === vm);
  if (!v) throw notFound(`plan ${p.id} has no VM ${vm}`);
  return v;
}

/** `work`: the lifecycle and bus the guest read's worker job goes through (orchestration/guest-read.ts). */
type PlanDeps = { plans: PlanStore; runner: PlanRunner; jobs: JobStore; events: PlanHub; work: WorkerJobDeps };
type Role = 'read' | 'submit' | 'admin';
type PlanId = { id: string };
/** What a route of the kit may set beside its path; params default to planIdParams. */
interface PlanRouteExtra<P, B> {
  method?: Method; params?: Joi.ObjectSchema<P>; body?: Joi.ObjectSchema<B>; bodyRequired?: boolean; responses?: RouteDef['responses'];
}
type Handler<P, B> = (ctx: Koa.Context, i: Input<P, Record<string, unknown>, B>) => Promise<unknown>;

/** What every plan route uses: the plan view, selectors resolved while not started, and `add` for a route whose
 *  answer is the plan (its error answers named once). */
function planRouteKit(api: Api, d: PlanDeps) {
  const view = async (p: Plan) => planView(d.jobs, p);
  const select = async (p: Plan): Promise<Plan> => {
    if (!p.selectors?.length || p.status !== 'pending') return p;
    const chosen = await selectVms(planManager(p), p.selectors);
    return d.plans.mutate(p.id, (q) => applySelection(q, chosen));
  };
  // Without params of its own a route takes planIdParams, so P is then its default, PlanId (hence the cast).
  const add = <P = PlanId, B = unknown>(path: string, summary: string, role: Role, extra: PlanRouteExtra<P, B>, handler: Handler<P, B>) =>
    api.add<P, Record<string, unknown>, B>({
      method: extra.method ?? 'post', path, summary, tags: ['plans'], role, params: (extra.params ?? planIdParams) as Joi.ObjectSchema<P>,
      body: extra.body, bodyRequired: extra.bodyRequired,
      responses: {
        200: one, 400: err('invalid input (names the field)'), 404: err('unknown plan or VM'), 409: err('the plan is in the wrong state for this'),
        ...(extra.responses ?? {}),
      },
      handler,
    });
  return { view, select, add };
}

export function addPlanRoutes(api: Api, d: PlanDeps) {
  const kit = planRouteKit(api, d);
  addPlanResourceRoutes(api, d, kit);
  addPlanActionRoutes(api, d, kit);
  addPlanCutoverRoute(d, kit.add, kit.view, vmOf);
}

type PlanKit = ReturnType<typeof planRouteKit>;

/** The plan as a resource: create, list, get, its event stream, change, delete, archive. */
function addPlanResourceRoutes(api: Api, d: PlanDeps, kit: PlanKit) {
  addPlanCreateReadRoutes(api, d, kit);
  addPlanChangeRoutes(api, d, kit);
}

/** Registers create, list, get and the event stream of a plan. */
function addPlanCreateReadRoutes(api: Api, d: PlanDeps, { view, add }: PlanKit) {
  const { plans } = d;
  api.add({
    method: 'post', path: '/plans', summary: 'Create a migration plan (VMs, destination, network_map, storage_map, options, limits, windows)',
    tags: ['plans'], role: 'submit', body: planCreateSchema,
    responses: {
      201: one, 400: err('invalid plan (names the field; more VMs than FERRY_PLAN_MAX_VMS names vms)'),
      403: err('the plan asks for what this key may not (names the field: source.insecure, options.remove_source)'),
      409: err('a plan with this id exists, or FERRY_PLAN_MAX_STORED plans are stored'),
    },
    handler: async (ctx, { body }) => {
      checkManager(body.source);
      checkPlanCaller(body, callerOf(ctx));
      ctx.status = 201;
      return view(await plans.create(body, who(ctx)));
    },
  });
  api.add({
    method: 'get', path: '/plans', summary: 'Plans, oldest first (archived ones with ?archived=true)', tags: ['plans'], role: 'read', query: planListQuery,
    responses: { 200: { description: 'plans', schema: Joi.object({ plans: Joi.array().items(planSchema), total: Joi.number().integer() }) } },
    handler: async (_ctx, { query }) => {
      const all = await Promise.all((await plans.list(query.archived)).map(view));
      return { plans: all, total: all.length };
    },
  });
  add('/plans/:id', 'One plan: status, counts, bytes, rate, ETA, and per VM its status, job, stage, findings and what holds it', 'read', { method: 'get' },
    async (_ctx, { params }) => view(await plans.must(params.id)));
  api.add({
    method: 'get', path: '/plans/:id/events/stream',
    summary: 'The plan as Server-Sent Events: `plan` (the view GET /plans/{id} answers) at once and on each change (at most one per 500 ms), '
      + 'then `complete {status}` when the plan is final',
    tags: ['plans'], role: 'read', params: planIdParams,
    responses: {
      200: { description: 'event stream: plan (the plan view), then complete {status}', type: 'text/event-stream', schema: { type: 'string' } },
      204: { description: 'a reconnect (Last-Event-ID) to a plan that is final: the stream is over' },
      404: err('unknown plan'),
    },
    handler: async (ctx, { params }) => { await d.events.serve(ctx, params.id); return undefined; },
  });
}

/** Registers change, delete and archive of a plan. */
function addPlanChangeRoutes(api: Api, d: PlanDeps, { view, add }: PlanKit) {
  const { plans } = d;
  add('/plans/:id', 'Change a plan that has not started (any field of the create body)', 'submit',
    { method: 'put', body: planUpdateSchema, responses: { 403: err('the plan would ask for what this key may not (names the field)') } },
    async (ctx, { params, body }) => {
      if (body.source) checkManager(body.source);
      checkPlanCaller(body, callerOf(ctx));
      return view(await plans.mutate(params.id, (p) => {
        if (p.status !== 'pending' || p.started_at) throw conflict(`plan ${p.id} has started (${p.status}); only a plan not started may change`);
        const { vms, start_at, windows, ...rest } = body;
        Object.assign(p, rest);
        if (start_at !== undefined) p.start_at = new Date(start_at).toISOString();
        if (windows) p.windows = windows.map((w) => ({ start: new Date(w.start).toISOString(), end: new Date(w.end).toISOString() }));
        if (vms) {
          const listed = vms.map((e) => ({
            ...newVm(e), overrides: p.vms.find((x) => x.vm_path === (typeof e === 'string' ? e : e.vm_path))?.overrides ?? {},
          }));
          p.vms = [...listed, ...p.vms.filter((x) => x.selected_by && !listed.some((l: { vm_path: string }) => l.vm_path === x.vm_path))];
          checkPlanSize(p.vms.length);
        }
        if (!p.vms.length && !p.selectors?.length) throw fieldError(400, 'vms', 'a plan needs vms or selectors');
        checkPlanCaller(p, callerOf(ctx)); // the plan as changed: what it asks stays what this caller may ask
        p.validated_at = null;
      }));
    });
  api.add({
    method: 'delete', path: '/plans/:id', summary: 'Delete a plan that is not running (migrated VMs stay; their jobs stay in /jobs)',
    tags: ['plans'], role: 'submit', params: planIdParams,
    responses: {
      200: { description: 'deleted', schema: Joi.object({ message: Joi.string() }) }, 404: err('unknown plan'),
      409: err('the plan is running: cancel it first'),
    },
    handler: async (_ctx, { params }) => {
      const p = await plans.must(params.id);
      if (p.status === 'running') throw conflict(`plan ${p.id} is running: cancel it first`);
      await plans.remove(p.id);
      return { message: `plan ${p.id} deleted` };
    },
  });
  add('/plans/:id/archive', 'Archive a plan that is not running (listed with ?archived=true)', 'submit', {}, async (_ctx, { params }) =>
    view(await plans.mutate(params.id, (p) => {
      if (p.status === 'running') throw conflict(`plan ${p.id} is running: cancel it or let it finish first`);
      p.archived = true;
    })));
}

/** What a plan does: preflight, overrides, start, cancel, retry, and one VM's rollback. */
function addPlanActionRoutes(api: Api, d: PlanDeps, kit: PlanKit) {
  // The guest read is a worker's job, submitted as this request's caller.
  const preflightAs = (ctx: Koa.Context, p: Plan) => preflight(p, guestReader(d.work, callerOf(ctx) ?? null));
  addPlanCheckRoutes(api, d, kit, preflightAs);
  addPlanRunRoutes(d, kit, preflightAs);
}

type PreflightAs = (ctx: Koa.Context, p: Plan) => ReturnType<typeof preflight>;

/** Registers preflight (validate) and the overrides of a blocker. */
function addPlanCheckRoutes(api: Api, d: PlanDeps, { view, select, add }: PlanKit, preflightAs: PreflightAs) {
  const { plans } = d;
  api.add({
    method: 'post', path: '/plans/:id/validate',
    summary: 'Preflight: per VM findings {rule, severity blocker|warning|info, message, fix}, before any copy: vSphere properties, the target, '
      + 'and the guest read in place on its datastore (docs/plans.md)',
    tags: ['plans'], role: 'submit', params: planIdParams,
    responses: {
      200: { description: 'findings per VM', schema: validateResponseSchema }, 403: err('the plan asks for what this key may not (names the field)'),
      404: err('unknown plan'), 502: err('the vSphere manager cannot be reached'),
    },
    handler: async (ctx, { params }) => {
      // Preflight reads the VMs with the plan's source settings (insecure): as this caller may.
      const stored = await plans.must(params.id);
      checkPlanCaller(stored, callerOf(ctx));
      const p = await select(stored);
      const results = await preflightAs(ctx, p);
      await plans.mutate(p.id, (q) => {
        for (const r of results) {
          const v = q.vms.find((x) => x.vm_path === r.vm_path);
          if (v && !v.job_id) { v.findings = r.findings; if (r.placement) v.placement = r.placement; }
        }
        q.validated_at = new Date().toISOString();
      });
      const count = (s: string) => results.reduce((n, r) => n + r.findings.filter((f) => f.severity === s && !f.overridden).length, 0);
      return {
        plan_id: p.id, blockers: count('blocker'), warnings: count('warning'),
        vms: results.map((r) => ({ vm_path: r.vm_path, findings: r.findings, ...(r.placement ? { placement: r.placement } : {}) })),
      };
    },
  });
  add('/plans/:id/overrides',
    'Accept a blocker for one VM (recorded with who and why); rules that make the job impossible cannot be overridden',
    'submit', { body: overrideSchema },
    async (ctx, { params, body }) => {
      const by = who(ctx).name;
      if (NOT_OVERRIDABLE.has(body.rule)) {
        throw fieldError(400, 'rule', `${body.rule} cannot be overridden: the migration could not run (or would replace what is on the target)`);
      }
      return view(await plans.mutate(params.id, (p) => {
        const v = vmOf(p, body.vm_path);
        if (v.job_id && v.status === 'running') throw conflict(`${v.vm_path} is running`);
        v.overrides[body.rule] = { by, at: new Date().toISOString(), reason: body.reason };
      }));
    });
}

/** Registers start, cancel, retry and one VM's rollback. */
function addPlanRunRoutes(d: PlanDeps, { view, select, add }: PlanKit, preflightAs: PreflightAs) {
  const { plans, runner } = d;
  add('/plans/:id/start',
    'Start: preflight again, then each VM without an unaccepted blocker runs as a shape B job, paced by the limits and windows; '
      + 'the jobs act as the caller (started_by), so what the plan asks needs the role its direct request needs',
    'submit', { responses: { 403: err('the plan asks for what this key may not (names the field: source.insecure, options.remove_source)') } },
    async (ctx, { params }) => {
      const p = await plans.must(params.id);
      if (p.status === 'running') throw conflict(`plan ${p.id} is already running`);
      if (p.status !== 'pending') throw conflict(`plan ${p.id} is ${p.status}; retry its failed VMs instead`);
      checkPlanCaller(p, callerOf(ctx));
      const q = await select(p);
      if (!q.vms.length) throw conflict(`plan ${p.id} has no VM: its selectors match none and it lists none`);
      return view(await runner.start(q.id, await preflightAs(ctx, q), who(ctx)));
    });
  add('/plans/:id/cancel', 'Cancel the whole plan, or one VM ({vm_path}); what a cancelled VM made on the target is removed', 'submit',
    { body: planVmCancelSchema, bodyRequired: false },
    async (_ctx, { params, body }) => view(await runner.cancel(params.id, body?.vm_path)));
  add('/plans/:id/retry',
    'Run the failed and cancelled VMs again (preflight again for them); their jobs act as the caller, who becomes started_by',
    'submit', { responses: { 403: err('the plan asks for what this key may not (names the field)') } },
    async (ctx, { params }) => {
      const p = await plans.must(params.id);
      if (p.status === 'pending') throw conflict(`plan ${p.id} has not started`);
      checkPlanCaller(p, callerOf(ctx));
      return view(await runner.retry(p.id, await preflightAs(ctx, p), who(ctx)));
    });
  add('/plans/:id/vms/:vm/rollback',
    'Roll one VM back: a rollback_kvm job removes the domain, volumes and NVRAM its last job recorded it created on the target '
      + 'and powers the source on (idempotent); 202 when the job has not ended within two minutes '
      + '(the VM\'s actions name it; calling again records its end)',
    'admin',
    {
      params: vmParams,
      responses: {
        202: { description: 'the rollback job is queued or running (the VM\'s rollback claim names it)', schema: planSchema },
        502: err('the rollback job failed (its error)'),
      },
    },
    async (ctx, { params }) => {
      const p = await plans.must(params.id);
      const v = vmOf(p, decodeURIComponent(params.vm));
      if (!vmMayMove(v.status, 'rolled_back')) throw conflict(`${v.vm_path} is ${v.status}; cancel it first`);
      if (!v.job_id) throw new ApiError(409, `${v.vm_path} never ran: nothing to roll back`);
      const r = await runner.rollback(p.id, v.vm_path, 'rolled back through the API', callerOf(ctx) ?? null);
      if (r.pending) ctx.status = 202;
      return view(r.plan);
    });
}
