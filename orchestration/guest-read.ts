// The daemon's side of a plan preflight's guest read (domain/plans/guest-preflight.ts): the read is the job of the
// internal operation guest_preflight, run by a worker with nbdkit and libguestfs; the daemon takes the caps, submits
// it as the request's caller, waits up to FERRY_GUEST_PREFLIGHT_SECONDS and turns the job's end into the findings
// the read gives. Caps (docs/security.md, "Limits"): one guest read per request and FERRY_GUEST_APPLIANCES(_PER_CALLER)
// of them, and one nbdkit per disk a round reads at once against FERRY_NBDKIT_PROCESSES(_PER_CALLER), are taken here at submission
// (429/503 before any job exists) and held until the job ends; on the worker its concurrency bounds what runs.
import type { Caller } from '../platform/auth';
import { managerJobFields } from '../domain/daemon-jobs';
import { spawnSlots } from '../platform/limits';
import type { VmFacts } from '../domain/plans/facts';
import type { Finding } from '../domain/plans/rules';
import { guestPreflightSeconds, MAX_DRIVES, timedOut } from '../domain/plans/guest-preflight';
import { noGuestWorker, unreadable } from '../domain/plans/guest-rules';
import type { ReadGuests } from '../domain/plans/preflight';
import { internalSpec, runWorkerJob, type WorkerJobDeps, type WorkerJobEnd } from './worker-jobs';

/** The worker's answer (services/worker/operations/guest-preflight.ts). */
export interface GuestReadResult { vms: { vm_path: string; findings: Finding[] }[] }

/** Time the worker gets past the bound to close its appliance and report what it read. */
const GRACE_SECONDS = 30;

/** Takes one guest-read slot and one nbdkit slot per disk for the current request, or releases what it took and
 *  throws the 429/503 of the cap reached. Outside a request (none here) nothing is counted. */
function takeSlots(disks: number): () => void {
  const held: (() => void)[] = [];
  const release = () => { for (const r of held.splice(0)) r(); };
  try {
    held.push(spawnSlots.appliance.take());
    for (let i = 0; i < disks; i++) held.push(spawnSlots.nbdkit.take());
  } catch (e) { release(); throw e; }
  return release;
}

/** The most nbdkit processes the read runs at once: one per disk of a round, and a round holds at most
 *  MAX_DRIVES disks (or one VM's, when it has more). */
const nbdkitsAtOnce = (facts: VmFacts[]) => Math.min(facts.reduce((n, x) => n + x.disks.length, 0), Math.max(MAX_DRIVES, ...facts.map((x) => x.disks.length)));

/** The guest reader of a request by `caller`: findings for every VM of `facts`. */
export function guestReader(d: WorkerJobDeps, caller: Caller | null): ReadGuests {
  return async (p, facts) => {
    const release = takeSlots(nbdkitsAtOnce(facts));
    try {
      const seconds = guestPreflightSeconds();
      const spec = internalSpec('guest_preflight', {
        ...managerJobFields({ manager_url: p.source.manager_url, insecure: p.source.insecure }),
        vm_paths: facts.map((x) => x.vm_path), seconds, deadline: Date.now() + seconds * 1000,
      }, { timeoutSeconds: seconds + 2 * GRACE_SECONDS });
      const end = await runWorkerJob(d, spec, { caller, waitMs: (seconds + GRACE_SECONDS) * 1000, meta: { plan_id: p.id } });
      return findingsOf(end, facts, seconds);
    } finally { release(); }
  };
}

/** The job's end as each VM's guest findings; a VM the job did not answer for gets why. */
export function findingsOf(end: WorkerJobEnd, facts: VmFacts[], seconds: number): Map<string, Finding[]> {
  const all = (f: Finding) => new Map(facts.map((x) => [x.vm_path, [f]]));
  if (end.outcome === 'unserved') return all(noGuestWorker(end.reason));
  if (end.outcome === 'timeout') return all(
    unreadable(`${timedOut(seconds)}${end.waiting_reason ? `; its job ${end.job_id} was still waiting: ${end.waiting_reason}` : ''}`));
  if (end.state === 'FAILED') return all(unreadable(`its guest read job ${end.job_id} failed: ${end.error ?? 'no reason given'}`));
  if (end.state === 'CANCELLED') return all(unreadable(`its guest read job ${end.job_id} was cancelled`));
  const got = new Map(((end.result as GuestReadResult | null)?.vms ?? []).filter((v) => Array.isArray(v?.findings)).map((v) => [v.vm_path, v.findings]));
  return new Map(facts.map((x) => [x.vm_path, got.get(x.vm_path) ?? [unreadable(`its guest read job ${end.job_id} gave no answer for it`)]]));
}
