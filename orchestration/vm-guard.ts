// The source guard (docs/plans.md, "Guarding the source"): while a job exports a VM, that job holds a lease keyed
// by manager and VM path in Redis (a slot of limit 1, queue/slots.ts), renewed while it works and released when
// the job ends; a worker that dies stops renewing and the lease runs out. Ferry's own operations on the VM (the
// daemon's /vms power and CD-ROM routes, another job's export, a plan removing a source) ask who holds it first
// and refuse, naming that job.
import type { Keys, RedisClient } from '../platform/redis';
import { ApiError } from '../platform/errors';
import { Slot, Slots } from '../queue/slots';

const guardName = (manager: string, vmPath: string) => `vm:${manager}:${vmPath.replace(/\/+$/, '')}`;

/** Takes the guard of `vmPath` for `jobId`; when another job holds it, that job's id. */
export async function takeVmGuard(redis: RedisClient, k: Keys, manager: string, vmPath: string, jobId: string,
  leaseMs: number): Promise<{ slot: Slot } | { holder: string }> {
  const slots = new Slots(redis, k);
  const slot = await slots.acquire(guardName(manager, vmPath), jobId, 1, leaseMs);
  if (slot) return { slot };
  // Released between the two calls: no one is named, and the caller waits for its next turn all the same.
  return { holder: (await slots.holders(guardName(manager, vmPath)))[0] ?? '(a job that just ended)' };
}

/** The job exporting `vmPath` now, or null. */
export async function vmGuardHolder(redis: RedisClient, k: Keys, manager: string, vmPath: string): Promise<string | null> {
  return (await new Slots(redis, k).holders(guardName(manager, vmPath)))[0] ?? null;
}

/** A 409 naming the job when one holds the VM (the daemon's routes call it before they act). */
export async function refuseGuarded(redis: RedisClient, k: Keys, manager: string, vmPath: string, what: string) {
  const holder = await vmGuardHolder(redis, k, manager, vmPath);
  if (holder) throw new ApiError(409, `${vmPath} is being exported by job ${holder}: ${what} is refused until that job ends`, { job_id: holder });
}
