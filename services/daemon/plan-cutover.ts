// POST /plans/{id}/cutover (issue 37): the manual cutover of a warm plan's VMs, all of them or one. It asks each
// VM's running migrate_vm job (orchestration/warm.ts askCutover, the rule POST /jobs/{id}/cutover shares); the job sees it within a second while it waits
// between rounds, or at the end of the round it is copying, then powers the VM off, copies the last delta and
// goes on as a cold migration does.
import type Koa from 'koa';
import { ApiError, conflict } from '../../platform/errors';
import { planCutoverSchema } from '../../domain/schemas/plans';
import { askCutover } from '../../orchestration/warm';
import type { Plan, PlanStore } from '../../orchestration/plans';
import type { JobStore } from '../../queue/store';
import { callerOf } from './route-kit';

type Add = (path: string, summary: string, role: 'submit', extra: { body: typeof planCutoverSchema; bodyRequired: boolean },
  handler: (ctx: Koa.Context, i: { params: { id: string }; body?: { vm_path?: string } }) => Promise<unknown>) => void;

export function addPlanCutoverRoute(d: { plans: PlanStore; jobs: JobStore }, add: Add, view: (p: Plan) => Promise<unknown>,
  vmOf: (p: Plan, vm: string) => Plan['vms'][number]) {
  add('/plans/:id/cutover',
    'Cut a warm plan\'s VMs over now (all of them, or one: {vm_path}): each running warm job powers its VM off as options.power_off says, copies the last ' +
    'delta and repairs, imports and boots it (docs/plans.md, Warm migration)', 'submit', { body: planCutoverSchema, bodyRequired: false },
    async (ctx, { params, body }) => {
      const p = await d.plans.must(params.id);
      if (p.status !== 'running') throw conflict(`plan ${p.id} is ${p.status}: only a running plan's VMs cut over`);
      const chosen = body?.vm_path ? [vmOf(p, body.vm_path)] : p.vms.filter((v) => v.status === 'running' && v.job_id);
      const asked: string[] = [];
      const skipped: string[] = [];
      const by = callerOf(ctx)?.name ?? null;
      for (const v of chosen) {
        // One rule with POST /jobs/{id}/cutover (orchestration/warm.ts askCutover); asked for all, a VM it refuses is skipped.
        const why = v.status === 'running' && v.job_id ? await askCutover(d.jobs, v.job_id, by).then(() => null,
          (e: Error) => e) : conflict(`${v.vm_path} is ${v.status}: only a running warm VM cuts over`);
        if (!why) asked.push(v.vm_path);
        else if (body?.vm_path) throw why instanceof ApiError ? conflict(`${v.vm_path}: ${why.message}`) : why;
        else if (!(why instanceof ApiError)) throw why;
        else skipped.push(`${v.vm_path}: ${why.message}`);
      }
      if (!asked.length) throw conflict(`plan ${p.id} has no warm VM waiting for cutover: ${nothingWaiting(p, skipped)}`);
      return view(await d.plans.must(p.id));
    });
}

/** Why none of a running plan's VMs was asked: each running VM's refusal (the first five), else the VMs' states. */
function nothingWaiting(p: Plan, skipped: string[]) {
  if (skipped.length) return skipped.slice(0, 5).join('; ') + (skipped.length > 5 ? `; and ${skipped.length - 5} more` : '');
  const counts = new Map<string, number>();
  for (const v of p.vms) counts.set(v.status, (counts.get(v.status) ?? 0) + 1);
  return `no VM is running (${[...counts].map(([st, n]) => `${n} ${st}`).join(', ')})`;
}
