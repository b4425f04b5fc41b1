// import_kvm: disks into a libvirt storage pool and a domain around them, on the job's virt_uri or the worker's
// FERRY_LIBVIRT_URI, each recorded in the job's ledger as it is made. The result names the domain and its UUID.
import { importDisk, Virsh } from '../../../domain/libvirt';
import { removeMade } from '../../../domain/libvirt/ledger';
import { jobUri } from '../../../domain/libvirt/uri';
import { checkRunPath } from '../../../platform/roots';
import { checkRunImage } from '../../../domain/image-confine';
import type { OpContext, Operation } from './types';
import type { JobSpec } from '../../../domain/schemas/job';
import type { JobStore } from '../../../queue/store';
import { ignoreError } from '../../../platform/log';
import { ApiError, OperationError } from '../../../platform/errors';

/** An import_kvm job's parameters, as its schema (domain/operations.ts) validated them (defaults filled in). */
type ImportParameters = {
  disks: { path: string; format?: string }[]; name: string; memory: number; cpus: number; networks: string[];
  pool?: string; firmware: 'bios' | 'uefi'; virt_uri?: string;
};

/** Before an import, what the job's earlier attempts recorded they made (a worker that died or was stopped
 *  half-way) is removed, found by UUID and key, and nothing else: the import then starts afresh and still refuses
 *  any name that is taken. Nothing of this attempt is in the ledger yet when this runs, except the one-pass
 *  volumes it keeps. */
export async function clearEarlierAttempts(ctx: OpContext, phase: string, keep: Set<string> = new Set()): Promise<void> {
  // `keep`: volumes this attempt has resumed into (one pass's partial volumes, by path), made by this job.
  const earlier = (await ctx.store.made(ctx.spec.job_id)).filter((e) => !(e.kind === 'volume' && keep.has(e.id)));
  if (!earlier.length) return;
  const did = await removeMade(earlier, ctx.store.madeGuard(ctx.spec.job_id));
  await ctx.progress(phase, 0, did.length ? `removed what an earlier attempt made: ${did.join('; ')}` : 'nothing an earlier attempt made is left');
}

/** An import's refusal (a name taken by a domain or volume Ferry did not make, a bad disk or mapping) stays one on
 *  a retry: the job fails at once instead of trying again. */
export function finalRefusal(e: unknown): never {
  throw e instanceof ApiError && e.status < 500 ? new OperationError(e.message, false) : e;
}

export const importKvm: Operation = async (ctx) => {
  const p = ctx.spec.parameters as ImportParameters;
  const v = new Virsh(jobUri(p.virt_uri, 'parameters.virt_uri'));
  // The disks are read here: checked against this worker's input roots right before.
  const disks = [];
  for (const [i, d] of p.disks.entries()) {
    const field = `parameters.disks[${i}].path`;
    const real = await checkRunPath({ field, path: d.path, kind: 'input' });
    // The header's format goes to qemu-img and libvirt, so neither probes; a disk referencing others is refused.
    const { format } = await checkRunImage({ field, path: real, format: d.format, selfContained: true });
    disks.push({ ...d, path: real, format });
  }
  await clearEarlierAttempts(ctx, 'importing');
  await ctx.progress('importing', 0, `importing into ${v.uri}`);
  const r = await importDisk(v, {
    disks, name: p.name, memoryMiB: p.memory, cpus: p.cpus, networks: p.networks, networkField: (i) => `parameters.networks[${i}]`,
    pool: p.pool, firmware: p.firmware,
    onProgress: (stage, pct) => void ctx.progress('importing', pct, stage), ledger: ctx.ledger,
  }).catch(finalRefusal);
  await ctx.progress('importing', 100, `domain ${r.domain} defined`);
  return { ...r, virt_uri: v.uri };
};

/** A cancelled import_kvm or migrate_vm job leaves nothing on the target: what its ledger lists goes, found by UUID
 *  and key, and nothing else. A failed one keeps what it made (a failed boot is left for a look; a plan's rollback
 *  removes it), and its import already removed what it had made when it failed. */
export async function cleanupImport(spec: JobSpec, _includeOutput: boolean, store: JobStore): Promise<void> {
  if ((await store.raw(spec.job_id))?.state !== 'CANCELLED') return;
  await removeMade(await store.made(spec.job_id), store.madeGuard(spec.job_id)).catch(ignoreError(
    'what the cancelled job made stays on the target; its ledger (GET /jobs/{id}) lists it, and a plan rollback or an operator removes it',
    { job_id: spec.job_id },
  ));
}
