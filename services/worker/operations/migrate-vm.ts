// Operation "migrate_vm" (daemon API shape B): the export stage here, then the stages after it through the
// seam in migration-stages.ts. The export goes to <export base>/<job id>, a folder only this worker's user can
// enter (exportBase below), which must lie in FERRY_OUTPUT_ROOTS like any other output.
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { OperationError } from '../../../platform/errors';
import { afterExport } from './migration-stages';
import { ExportParameters, runExport } from './export';
import type { Admit, OpContext, Operation } from './types';
import type { ExportResult } from '../../../domain/vsphere/export';
import type { WarmOptions } from '../../../domain/schemas/warm';
import { measured, migrateWarm } from './warm-rounds';
import { admitExport, slotLeaseMs } from './export';
import { takePlanSlots, type PlanParams } from '../../../orchestration/plan-slots';
import { jobUri } from '../../../domain/libvirt/uri';
import { setting } from '../../../platform/settings';
import type { PlannedDisk } from '../../../domain/vsphere/export-manifest';
import { placeForOnePass, unplaceForOnePass } from './one-pass';
import { besideCopyRefused, besideCopyResult, startRepairBesideCopy, type BesideCopy } from './repair-beside-copy';
import type { Manager } from '../../../domain/vsphere/client';
import type { VmDetail } from '../../../domain/vsphere/inventory';

/** Where migrate_vm exports go: FERRY_EXPORT_DIR when set, else FERRY_DATA_DIR/exports (storage every worker of a
 *  job's stages can reach), else a private <tmp>/ferry-<uid>/exports. Never a shared world-writable folder: there
 *  any local user could plant files or symlinks where the next export writes. */
export function exportBase(env: NodeJS.ProcessEnv = process.env): string {
  const [exportDir, dataDir] = [setting('FERRY_EXPORT_DIR', env), setting('FERRY_DATA_DIR', env)];
  if (exportDir) return path.resolve(exportDir);
  if (dataDir) return path.join(path.resolve(dataDir), 'exports');
  return path.join(os.tmpdir(), `ferry-${process.getuid?.() ?? 'user'}`, 'exports');
}

/** Makes `dir` (0700) or accepts it only when it is a real folder of this user; a looser mode is tightened. */
async function privateDir(dir: string): Promise<void> {
  await fs.mkdir(dir, { mode: 0o700 }).catch((e: NodeJS.ErrnoException) => { if (e.code !== 'EEXIST') throw e; });
  const st = await fs.lstat(dir);
  const uid = process.getuid?.();
  if (!st.isDirectory() || (uid !== undefined && st.uid !== uid)) {
    const what = st.isSymbolicLink() ? 'a symbolic link' : st.isDirectory() ? `owned by uid ${st.uid}` : 'not a folder';
    throw new OperationError(`export folder ${dir} is ${what}; Ferry exports only into a folder of its own (FERRY_DATA_DIR)`, false);
  }
  if (st.mode & 0o077) await fs.chmod(dir, 0o700);
}

/** The job's export folder, every folder Ferry makes on the way private to its user. */
export async function makeExportDir(jobId: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  const base = exportBase(env);
  if (!setting('FERRY_EXPORT_DIR', env) && !setting('FERRY_DATA_DIR', env)) await privateDir(path.dirname(base));
  else await fs.mkdir(path.dirname(base), { recursive: true, mode: 0o700 });
  await privateDir(base);
  const dir = path.join(base, jobId);
  if (path.dirname(dir) !== base) throw new OperationError(`job id ${jobId} cannot name an export folder`, false);
  await privateDir(dir);
  return dir;
}

export const migrateVm: Operation = async (ctx) => {
  const p = ctx.spec.parameters as ExportParameters & {
    destination: { type: string; virt_uri?: string }; network_mapping: Record<string, string>; pool?: string; domain_name?: string;
    conversion_method?: string; virt_test?: { expect?: string; timeout_seconds?: number }; warm?: WarmOptions; plan?: PlanParams;
  };
  const virtUri = jobUri(p.destination.virt_uri, 'destination.virt_uri'); // refused before the source is touched
  const dir = await makeExportDir(ctx.spec.job_id);
  // One pass (docs/pipeline.md): the disks that can go straight into their volumes are chosen, and the space
  // checked, after the export's plan and before any byte moves.
  const target = { virtUri, pool: p.pool, exportDir: dir };
  const stagesAfter = (c: OpContext, exported: ExportResult, beside?: BesideCopy) => afterExport(c, {
    exported, destination: p.destination, network_mapping: p.network_mapping, pool: p.pool, domain_name: p.domain_name,
    conversion_method: p.conversion_method, virt_test: p.virt_test, beside,
  });
  // Warm (issue 37, warm-rounds.ts): rounds of changed areas into the same volumes while the VM runs, then the
  // cold path's stages. The source changes until the last delta, so its repair runs after it, not beside a round.
  if (p.warm) {
    return migrateWarm(ctx, { p: { ...p, warm: p.warm }, dir, place: (disks) => placeForOnePass(ctx, target, disks), after: (c, e) => stagesAfter(c, e) });
  }
  return migrateCold(ctx, p, dir, target, stagesAfter);
};

/** The cold migration: when every disk goes one pass, the repair starts at the placement, beside the copy
 *  (repair-beside-copy.ts); its repair, import and boot times are recorded for warm predictions (`measured`). */
async function migrateCold(ctx: OpContext, p: ExportParameters & { domain_name?: string }, dir: string, target: Parameters<typeof placeForOnePass>[1],
  stagesAfter: (c: OpContext, exported: ExportResult, beside?: BesideCopy) => Promise<Record<string, unknown>>): Promise<Record<string, unknown>> {
  let beside: BesideCopy | undefined;
  let refused: string | undefined;
  const place = async (disks: PlannedDisk[], src: { manager: Manager; vm: VmDetail }) => {
    // Another host's volumes are named after the domain from the start (remote-one-pass.ts).
    const remote = { domain: p.domain_name || src.vm.name };
    await placeForOnePass(ctx, { ...target, remote }, disks);
    refused = besideCopyRefused(disks);
    if (refused) return;
    // A reader that does not start (nbdkit missing, refused by the manager) leaves the repair for after the copy;
    // a copy onto another host then goes through the export folder (its volumes cannot be repaired here), whose
    // space is checked again for it before any byte moves.
    beside = await startRepairBesideCopy(ctx, { dir, manager: src.manager, vm: src.vm, disks }).catch(async (e: Error) => {
      if (ctx.signal.aborted) throw e;
      refused = `the reader of the source did not start (${e.message}): the repair runs after the copy`;
      ctx.log.warn(refused, { job_id: ctx.spec.job_id });
      await unplaceForOnePass(target, disks, refused);
      return undefined;
    });
  };
  const copy = async (c: OpContext) => {
    try {
      return await runExport(c, p, dir, 'export', 'export folder', place);
    } catch (e) {
      await beside?.abort(`the copy failed: ${(e as Error).message}`);
      throw e;
    }
  };
  return measured(ctx, copy, async (c, exported) => {
    if (beside) beside.copy.finished_at = new Date().toISOString();
    try {
      return { ...await stagesAfter(c, exported, beside), repair_beside_copy: besideCopyResult(beside, refused) };
    } catch (e) {
      await beside?.abort(`the migration failed: ${(e as Error).message}`); // a no-op once the repair has finished
      throw e;
    }
  });
}

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
