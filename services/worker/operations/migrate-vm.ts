// Operation "migrate_vm" (daemon API shape B): the export stage here, then the stages after it through the
// seam in migration-stages.ts. The export goes to FERRY_EXPORT_DIR/<job id> (default <tmp>/ferry-exports),
// storage every worker of the job's stages can reach.
import os from 'node:os';
import path from 'node:path';
import { afterExport } from './migration-stages';
import { ExportParameters, runExport } from './export';
import type { Admit, Operation } from './types';
import { admitExport, slotLeaseMs } from './export';
import { takePlanSlots, type PlanParams } from '../../../queue/plan-slots';

export const exportDirOf = (jobId: string) => path.join(process.env.FERRY_EXPORT_DIR || path.join(os.tmpdir(), 'ferry-exports'), jobId);

export const migrateVm: Operation = async (ctx) => {
  const p = ctx.spec.parameters as ExportParameters & { destination: { type: string; virt_uri?: string }; network_mapping: Record<string, string>; pool?: string; conversion_method?: string; virt_test?: { expect?: string; timeout_seconds?: number } };
  const exported = await runExport(ctx, p, exportDirOf(ctx.spec.job_id), 'export');
  return afterExport(ctx, { exported, destination: p.destination, network_mapping: p.network_mapping, pool: p.pool, conversion_method: p.conversion_method, virt_test: p.virt_test });
};

/** The manager's export slot, then a plan job's own slots (ESXi host, datastore, target host, plan); all or none. */
export const admitMigration: Admit = async (spec, store) => {
  const plan = (spec.parameters as { plan?: PlanParams }).plan;
  const first = await admitExport(spec, store);
  if (!first.ok || !plan) return first;
  const rest = await takePlanSlots(store, spec.job_id, plan, slotLeaseMs());
  if (rest.ok) return { ok: true, release: async () => { await rest.release(); await first.release(); } };
  await first.release();
  return rest;
};
