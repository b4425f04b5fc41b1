// Operation "virsh_call" (internal: the daemon's libvirt calls when FERRY_LIBVIRT_VIA=worker, orchestration/virsh-jobs.ts):
// one virsh command against one of the operator's URIs, its stdout the result. libvirt's refusal fails the job and
// its HTTP status, message and libvirt's own text are kept in the record (`libvirt_error`), so the daemon answers
// exactly what it answered when it ran virsh itself (404, 400, 409, 503, 500).
import { jobUri } from '../../../domain/libvirt/uri';
import { LibvirtError, Virsh } from '../../../domain/libvirt/virsh';
import { OperationError } from '../../../platform/errors';
import { LIBVIRT_ERROR_FIELD, NOT_CALLS } from '../../../orchestration/virsh-jobs';
import type { Operation } from './types';

/** The parameters as domain/operations.ts's virsh_call schema gives them. */
type VirshCallParameters = { uri: string; args: string[]; input?: string; timeout_ms: number };

export const virshCall: Operation = async (ctx) => {
  const p = ctx.spec.parameters as VirshCallParameters;
  const uri = jobUri(p.uri, 'parameters.uri'); // again here: the worker's own FERRY_LIBVIRT_URIS decide
  // A command reading or writing a local file would do it on this worker's disk, not where its route checked it.
  if (NOT_CALLS.has(p.args[0])) throw new OperationError(`virsh ${p.args[0]} reads or writes a local file and is never run as a virsh_call`, false);
  try {
    return { stdout: await new Virsh(uri).run(p.args, { input: p.input, timeoutMs: p.timeout_ms }) };
  } catch (e) {
    if (!(e instanceof LibvirtError)) throw e;
    const kept = JSON.stringify({ status: e.status, message: e.message, libvirt: e.libvirtMessage });
    await ctx.store.redis.hset(ctx.store.k.job(ctx.spec.job_id), LIBVIRT_ERROR_FIELD, kept);
    throw new OperationError(e.message, false);
  }
};
