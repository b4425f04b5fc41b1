// Operation "migrate_vm" (daemon API shape B): the export stage here, then the stages after it through the
// seam in migration-stages.ts. The export goes to FERRY_EXPORT_DIR/<job id> (default <tmp>/ferry-exports),
// storage every worker of the job's stages can reach.
import os from 'node:os';
import path from 'node:path';
import { afterExport } from './migration-stages';
import { ExportParameters, runExport } from './export';
import type { Operation } from './types';
import { jobUri } from '../../../shared/libvirt/uri';

export const exportDirOf = (jobId: string) => path.join(process.env.FERRY_EXPORT_DIR || path.join(os.tmpdir(), 'ferry-exports'), jobId);

export const migrateVm: Operation = async (ctx) => {
  const p = ctx.spec.parameters as ExportParameters & { destination: { type: string; virt_uri?: string }; network_mapping: Record<string, string>; conversion_method?: string; virt_test?: { expect?: string; timeout_seconds?: number } };
  jobUri(p.destination.virt_uri, 'destination.virt_uri'); // refused before the source is touched
  const exported = await runExport(ctx, p, exportDirOf(ctx.spec.job_id), 'export');
  return afterExport(ctx, { exported, destination: p.destination, network_mapping: p.network_mapping, conversion_method: p.conversion_method, virt_test: p.virt_test });
};
