// Operation "virt_clone" (internal: the daemon's clone and template routes when FERRY_LIBVIRT_VIA=worker,
// orchestration/virsh-jobs.ts): the route's work run whole here, where virt-clone and virsh are, against one of the
// operator's URIs. The body is validated again with the route's own schema, and the files a clone names are
// confined to this worker's output roots. A refusal (libvirt's, or the route's own: 400, 404, 409) fails the job
// and its status and message are kept in the record (`libvirt_error`), so the daemon answers what it answered
// when it ran virt-clone itself. Sealing and customizing run virt-sysprep and virt-customize here too (this job
// then needs mount_operations: domain/operations.ts).
import type Joi from 'joi';
import { jobUri } from '../../../domain/libvirt/uri';
import { Virsh } from '../../../domain/libvirt/virsh';
import { cloneDomain, cloneMany } from '../../../domain/libvirt/clone';
import { createTemplate, deployTemplate } from '../../../domain/libvirt/templates';
import { confinePath } from '../../../domain/libvirt/paths';
import { cloneBody, cloneMultipleBody, templateCreateBody, templateDeployBody } from '../../../domain/schemas/virt';
import { ApiError, OperationError } from '../../../platform/errors';
import { validate } from '../../../platform/http';
import { LIBVIRT_ERROR_FIELD } from '../../../orchestration/virsh-jobs';
import type { OpContext, Operation } from './types';

/** The parameters as domain/operations.ts's virt_clone schema gives them. */
type VirtCloneParameters = { uri: string; action: 'clone' | 'clone_multiple' | 'template_create' | 'template_deploy'; body: Record<string, unknown> };

const SCHEMAS: Record<VirtCloneParameters['action'], Joi.ObjectSchema> = { clone: cloneBody, clone_multiple: cloneMultipleBody,
  template_create: templateCreateBody, template_deploy: templateDeployBody };

/** The route's work for `action` on `v`; what the route answers as data. */
async function act(v: Virsh, action: VirtCloneParameters['action'], raw: Record<string, unknown>): Promise<Record<string, unknown>> {
  const body = validate<Record<string, unknown>>(SCHEMAS[action], raw, 'body');
  if (action === 'clone') {
    const b = body as unknown as Parameters<typeof cloneDomain>[1];
    for (const [i, f] of (b.files || []).entries()) await confinePath(f, 'output', `files[${i}]`); // this machine's roots
    return cloneDomain(v, b);
  }
  if (action === 'clone_multiple') return cloneMany(v, body as unknown as Parameters<typeof cloneMany>[1]);
  if (action === 'template_create') return createTemplate(v, body as unknown as Parameters<typeof createTemplate>[1]);
  return deployTemplate(v, body as unknown as Parameters<typeof deployTemplate>[1]);
}

/** A daemon route's work run here (virt_clone, virt_files): its answer, or its refusal (an ApiError) kept in the
 *  record with its status, message and named fields, the job failing without a retry. */
export async function routeWork<T>(ctx: OpContext, work: () => Promise<T>): Promise<T> {
  try {
    return await work();
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    const fields = (e.details as { fields?: unknown } | undefined)?.fields;
    const kept = JSON.stringify({ status: e.status, message: e.message, libvirt: (e as { libvirtMessage?: string }).libvirtMessage ?? '',
      ...(fields ? { fields } : {}) });
    await ctx.store.redis.hset(ctx.store.k.job(ctx.spec.job_id), LIBVIRT_ERROR_FIELD, kept);
    throw new OperationError(e.message, false);
  }
}

export const virtClone: Operation = async (ctx) => {
  const p = ctx.spec.parameters as VirtCloneParameters;
  const uri = jobUri(p.uri, 'parameters.uri'); // again here: the worker's own FERRY_LIBVIRT_URIS decide
  return routeWork(ctx, () => act(new Virsh(uri), p.action, p.body));
};
