// Operation "vm_power" (internal: POST /vms/shutdown and /vms/poweroff submit it for an admin, services/daemon/vms.ts):
// the guest asked to shut down, or the VM powered off (the task waited on). A refusal by vSphere (wrong power state,
// no VMware Tools, unknown VM, wrong login) fails the job with vSphere's words, and its kind is kept in the record
// (`vsphere_error`) so the daemon answers the status it answered when it acted itself (409, 404, 401, 502).
import { managerFor } from '../../../domain/vsphere/client';
import { jobPassword, resolveCredentials } from '../../../domain/vsphere/credentials';
import { VsphereError } from '../../../domain/vsphere/errors';
import { powerOff, shutdownGuest } from '../../../domain/vsphere/actions';
import { asOperationError } from './export';
import { VSPHERE_ERROR_FIELD } from '../../../orchestration/worker-jobs';
import { vmGuardHolder } from '../../../orchestration/vm-guard';
import type { Operation } from './types';

/** The parameters as domain/operations.ts's vm_power schema gives them. */
type VmPowerParameters = {
  manager_url?: string; username?: string; insecure?: boolean; credentials?: string; vm_path: string; action: 'shutdown' | 'poweroff';
};


export const vmPower: Operation = async (ctx) => {
  const p = ctx.spec.parameters as VmPowerParameters;
  try {
    const password = await jobPassword(ctx.store.redis, ctx.store.k, ctx.spec.job_id, p.credentials);
    const m = managerFor(resolveCredentials({ manager_url: p.manager_url, username: p.username, password, insecure: p.insecure }));
    // The guard again, here, right before acting: an export may have started since the route checked it.
    const holder = await vmGuardHolder(ctx.store.redis, ctx.store.k, m.name, p.vm_path);
    if (holder) throw new VsphereError('state', `${p.vm_path} is being exported by job ${holder}: ${p.action} of ${p.vm_path} is refused until that job ends`);
    if (p.action === 'shutdown') await shutdownGuest(m, p.vm_path);
    else await powerOff(m, p.vm_path, ctx.signal);
    return { vm_path: p.vm_path, action: p.action, message: p.action === 'shutdown' ? `guest shutdown of ${p.vm_path} initiated` : `${p.vm_path} powered off` };
  } catch (e) {
    if (e instanceof VsphereError) await ctx.store.redis.hset(ctx.store.k.job(ctx.spec.job_id), VSPHERE_ERROR_FIELD, e.kind);
    throw asOperationError(e);
  }
};
