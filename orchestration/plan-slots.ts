// The limits of plans that span plans and workers: per ESXi host, per datastore, per target host and per plan.
// A plan VM's job carries its slot names and limits (parameters.plan.slots); the worker takes every one of them
// (all or none) before it starts the job, as leases in Redis (queue/slots.ts), and holds them for the whole job.
// A worker that dies stops renewing and its slots free themselves when the lease runs out.
import type { Plan, PlanVm } from './plans';
import { Slot, Slots } from '../queue/slots';
import type { JobStore } from '../queue/store';

export interface PlanSlot { name: string; limit: number; what: string }
export interface PlanParams { id: string; slots: PlanSlot[]; not_after?: number }

export function planSlots(p: Plan, v: PlanVm, manager: string): PlanSlot[] {
  const pl = v.placement;
  const out: PlanSlot[] = [{ name: `plan:${p.id}`, limit: p.limits.per_plan, what: `plan ${p.id} (limits.per_plan)` }];
  if (pl?.esxi_host) {
    out.push({ name: `esxi:${manager}:${pl.esxi_host}`, limit: p.limits.per_esxi_host, what: `ESXi host ${pl.esxi_host} (limits.per_esxi_host)` });
  }
  for (const ds of pl?.datastores ?? []) {
    out.push({ name: `datastore:${manager}:${ds}`, limit: p.limits.per_datastore, what: `datastore ${ds} (limits.per_datastore)` });
  }
  if (pl?.virt_uri) out.push({ name: `target:${pl.virt_uri}`, limit: p.limits.per_target_host, what: `target host ${pl.virt_uri} (limits.per_target_host)` });
  return out;
}

/** Takes every slot of a plan job, or none (what was taken is given back) and says which limit holds it. */
export async function takePlanSlots(
  store: JobStore, jobId: string, plan: PlanParams, leaseMs: number,
): Promise<{ ok: true; release: () => Promise<void> } | { ok: false; reason: string }> {
  if (plan.not_after && Date.now() >= plan.not_after) {
    return { ok: false, reason: `the window of plan ${plan.id} has closed; the plan puts this VM back for its next window` };
  }
  const slots = new Slots(store.redis, store.k);
  const held: Slot[] = [];
  for (const s of plan.slots) {
    const got = await slots.acquire(s.name, jobId, s.limit, leaseMs);
    if (!got) {
      await Promise.all(held.map((h) => h.release()));
      return { ok: false, reason: `waiting for a slot on ${s.what}: ${s.limit} of ${s.limit} in use` };
    }
    held.push(got);
  }
  return { ok: true, release: async () => { await Promise.all(held.map((h) => h.release())); } };
}

