// Operation "guest_preflight" (internal: the daemon's plan preflight submits it, orchestration/guest-read.ts): each VM's
// facts read again from the manager (the job names VMs, never disk files, so it reads only what a VM of the
// manager holds), then its disks read in place with nbdkit under a read-only libguestfs appliance
// (domain/plans/guest-preflight.ts), bounded by the daemon's deadline. The result is each VM's guest findings.
import { managerFor } from '../../../domain/vsphere/client';
import { jobPassword, resolveCredentials } from '../../../domain/vsphere/credentials';
import { vmFacts, type VmFacts } from '../../../domain/plans/facts';
import type { Finding } from '../../../domain/plans/rules';
import { readGuests } from '../../../domain/plans/guest-preflight';
import { unreadable } from '../../../domain/plans/guest-rules';
import { asOperationError } from './export';
import type { Operation } from './types';

/** The parameters as domain/operations.ts's guest_preflight schema gives them. */
type GuestPreflightParameters = {
  manager_url?: string; username?: string; insecure?: boolean; credentials?: string; vm_paths: string[]; seconds: number; deadline: number;
};

export const guestPreflightOp: Operation = async (ctx) => {
  const p = ctx.spec.parameters as GuestPreflightParameters;
  const password = await jobPassword(ctx.store.redis, ctx.store.k, ctx.spec.job_id, p.credentials).catch((e) => { throw asOperationError(e); });
  let m;
  try {
    m = managerFor(resolveCredentials({ manager_url: p.manager_url, username: p.username, password, insecure: p.insecure }));
  } catch (e) { throw asOperationError(e); }
  const signal = AbortSignal.any([ctx.signal, AbortSignal.timeout(Math.max(0, p.deadline - Date.now()))]);
  const early = new Map<string, Finding[]>();
  const facts: VmFacts[] = [];
  for (const vm of p.vm_paths) {
    try { facts.push(await vmFacts(m, vm)); } catch (e) { early.set(vm, [unreadable((e as Error).message)]); }
  }
  await ctx.progress('reading', 5, `reading the guests of ${facts.length} VM(s) in place`);
  const read = await readGuests(m, facts, ctx.log, { signal, seconds: p.seconds });
  return { vms: p.vm_paths.map((vm) => ({ vm_path: vm, findings: early.get(vm) ?? read.get(vm) ?? [unreadable('the read gave no answer for it')] })) };
};
