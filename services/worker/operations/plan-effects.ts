// A plan's side effects as jobs (domain/operations.ts: rollback_kvm, remove_source), submitted only by the plan
// runner (orchestration/plan-runner.ts) under an id derived from its claim. Each acts on what the job it names (of_job)
// recorded and nothing else: the rollback on that job's ledger (domains by UUID, volumes by key) and its source,
// the removal on that completed migration's source VM, read from its own spec, never from a name given here.
import { OperationError } from '../../../platform/errors';
import { isTerminal } from '../../../domain/states';
import { unseal } from '../../../platform/sensitive';
import { managerFor, managerName, type Manager } from '../../../domain/vsphere/client';
import { jobPassword, resolveCredentials } from '../../../domain/vsphere/credentials';
import { destroyVm } from '../../../domain/vsphere/actions';
import { findVm } from '../../../domain/vsphere/inventory';
import { VsphereError } from '../../../domain/vsphere/errors';
import { rollbackVm } from '../../../domain/plans/rollback';
import { vmGuardHolder } from '../../../orchestration/vm-guard';
import type { JobRecord } from '../../../queue/store';
import { asOperationError } from './export';
import { warmSnapshots } from '../../../orchestration/warm';
import { removeRecordedSnapshots } from './warm-rounds';
import { AuditLog } from '../../../platform/audit';
import type { OpContext, Operation } from './types';

/** The source side of a shape B job's spec, as its schema (migrate_vm) validated it. */
type SourceParameters = { vm_path: string; manager_url?: string; username?: string; insecure?: boolean; credentials?: string };

/** The audit log's record of the effect, once it is done (platform/audit.ts, AuditLog.effect): the key it acted as
 *  comes from the job's meta, written by the plan runner or the rollback route that submitted it. */
async function audited(ctx: OpContext, targets: Record<string, string>): Promise<void> {
  const meta = ctx.job.meta as { acting_as?: { name: string; role: string | null } | null; plan_id?: string };
  await new AuditLog(ctx.store.redis, ctx.store.k.prefix, ctx.log, 'worker').effect({
    operation: ctx.spec.operation, job_id: ctx.spec.job_id, acting_as: meta.acting_as ?? null,
    targets: { ...(meta.plan_id ? { plan_id: meta.plan_id } : {}), ...targets },
  });
}

/** The named job, ended: a rollback or a removal never acts while that job may still make or export something. */
async function namedJob(ctx: OpContext, id: string): Promise<JobRecord> {
  const r = await ctx.store.get(id);
  if (!r) throw new OperationError(`job ${id} is not in the store (removed past its retention): nothing of it is known to act on`, false);
  if (!isTerminal(r.state)) throw new OperationError(`job ${id} is ${r.state}: its side effects wait until it has ended`, false);
  if (r.spec.operation !== 'migrate_vm') throw new OperationError(`job ${id} is a ${r.spec.operation} job, not a plan VM's migrate_vm job`, false);
  return { ...r, spec: unseal(r.spec) };
}

/** The named job's source manager, with the credentials that job had (its own password while it is stored). */
async function sourceOf(ctx: OpContext, job: JobRecord): Promise<{ m: Manager; p: SourceParameters }> {
  const p = job.spec.parameters as SourceParameters;
  const password = await jobPassword(ctx.store.redis, ctx.store.k, job.job_id, p.credentials).catch((e) => { throw asOperationError(e); });
  try {
    return { m: managerFor(resolveCredentials({ manager_url: p.manager_url, username: p.username, password, insecure: p.insecure })), p };
  } catch (e) { throw asOperationError(e); }
}

export const rollbackKvm: Operation = async (ctx) => {
  const { of_job: of, power_on_source: powerOn } = ctx.spec.parameters as { of_job: string; power_on_source: boolean };
  const job = await namedJob(ctx, of);
  await ctx.progress('rollback', 0, `removing what job ${of} recorded it made (${job.ledger.length} ledger entries)`);
  const src = powerOn ? await sourceOf(ctx, job) : null;
  // No manager is contacted when the source stays off (source_was_on false): the target alone is rolled back.
  // A warm job's snapshots still recorded (its worker died before removing them) go first, by their references.
  const snaps = (await warmSnapshots(ctx.store.redis, ctx.store.k, of)).length
    ? await removeRecordedSnapshots({ store: ctx.store, spec: job.spec, log: ctx.log }, (src ?? await sourceOf(ctx, job)).m)
      .catch((e) => { throw asOperationError(e); })
    : [];
  const rolled = await rollbackVm(
    src?.m ?? null, { source_was_on: powerOn, vm_path: (job.spec.parameters as SourceParameters).vm_path }, job.ledger, ctx.store.madeGuard(of),
  ).catch((e) => { throw asOperationError(e); });
  const detail = [...snaps, rolled].join('; ');
  await ctx.progress('rollback', 100, detail);
  await audited(ctx, { of_job: of, vm_path: (job.spec.parameters as SourceParameters).vm_path });
  return { of_job: of, detail, ledger: job.ledger.map((e) => ({ kind: e.kind, id: e.id, name: e.name, virt_uri: e.virt_uri })) };
};

export const removeSource: Operation = async (ctx) => {
  const of = (ctx.spec.parameters as { of_job: string }).of_job;
  const job = await namedJob(ctx, of);
  if (job.state !== 'COMPLETED') throw new OperationError(`job ${of} is ${job.state}: only a completed migration's source is removed`, false);
  const { m, p } = await sourceOf(ctx, job);
  const manager = managerName(m.creds.url);
  const gone = await findVm(m, p.vm_path).then(() => false, (e) => {
    if (e instanceof VsphereError && e.kind === 'not_found') return true;
    throw asOperationError(e);
  });
  // An earlier attempt of this job that deleted it and died before it reported: its work is done.
  if (gone && ctx.attempt > 1) {
    return {
      of_job: of, vm_path: p.vm_path, manager, removed: true,
      detail: `${p.vm_path} was already gone from ${manager} (an earlier attempt of this job deleted it)`,
    };
  }
  if (gone) throw new OperationError(`${p.vm_path} is not on ${manager}: nothing of job ${of}'s to remove`, false);
  const holder = await vmGuardHolder(ctx.store.redis, ctx.store.k, manager, p.vm_path);
  if (holder) throw new OperationError(`${p.vm_path} is being exported by job ${holder}; the source stays`, false);
  await ctx.progress('remove_source', 0, `deleting ${p.vm_path} on ${manager}`);
  await destroyVm(m, p.vm_path, ctx.signal).catch((e) => { throw asOperationError(e); });
  await audited(ctx, { of_job: of, vm_path: p.vm_path, manager });
  const detail = `${p.vm_path} deleted on ${manager} after job ${of} migrated it`;
  await ctx.progress('remove_source', 100, detail);
  return { of_job: of, vm_path: p.vm_path, manager, removed: true, detail };
};
