// Operations "export" and "migrate_vm" (daemon API shapes A and B) need a client for the remote
// virtualization manager, which is a later issue. Until then they fail at once with a clear, non-retryable
// reason instead of pretending to succeed.
import { OperationError } from '../../../shared/errors';
import type { Operation } from './types';

export const REMOTE_UNAVAILABLE = 'remote manager support is not available yet';

export const remoteUnavailable: Operation = async (ctx) => {
  const p = ctx.spec.parameters as { vm_path?: string; manager_url?: string };
  await ctx.progress('initialization', 0, `${ctx.spec.operation} of ${p.vm_path} needs a remote manager client`);
  throw new OperationError(`${REMOTE_UNAVAILABLE}: ${ctx.spec.operation} of ${p.vm_path} needs a client for the remote virtualization manager${p.manager_url ? ` at ${p.manager_url}` : ''}`, false);
};
