// Operation "export" (daemon API shape A): a VM from a vSphere manager into output_path with its manifest
// (domain/vsphere/export.ts does the work). Before it starts, a job takes one of FERRY_EXPORTS_PER_MANAGER
// slots of its manager (queue/slots.ts); without one it goes back to the queue, saying why.
import { OperationError } from '../../../platform/errors';
import type { JobSpec } from '../../../domain/schemas/job';
import { Slots } from '../../../queue/slots';
import { takeVmGuard } from '../../../orchestration/vm-guard';
import { managerName } from '../../../domain/vsphere/client';
import { jobPassword, resolveCredentials } from '../../../domain/vsphere/credentials';
import { VsphereError } from '../../../domain/vsphere/errors';
import { ExportLedger, exportVm, ExportRequest, ExportResult, removeExportOutput } from '../../../domain/vsphere/export';
import { checkRunPath } from '../../../platform/roots';
import type { JobStore } from '../../../queue/store';
import { config } from '../../../platform/config';
import type { Admit, OpContext, Operation } from './types';
import { dropped } from '../../../platform/log';
import { setting } from '../../../platform/settings';

// A type literal, not an interface, so a job's `parameters` (Record<string, unknown>) can be read as it.
export type ExportParameters = {
  vm_path: string; output_path?: string; manager_url?: string; username?: string; insecure?: boolean; credentials?: string;
  parallel_downloads: number; remove_cdrom?: boolean; show_individual_progress?: boolean; power_off?: 'none' | 'shutdown' | 'force';
  shutdown_timeout_seconds?: number;
};

export const exportsPerManager = () => setting('FERRY_EXPORTS_PER_MANAGER');
export const slotLeaseMs = () => Math.max(3, config.leaseSeconds * 3) * 1000;

function managerOf(p: ExportParameters) {
  try { return managerName(resolveCredentials({ manager_url: p.manager_url }).url); } catch { return null; }
}

/** The VM's source guard (orchestration/vm-guard.ts: no other job exports it meanwhile), then one of the manager's export
 *  slots, or why the job must wait. Both are held until the job ends. */
export const admitExport: Admit = async (spec, store) => {
  const p = spec.parameters as ExportParameters;
  const name = managerOf(p);
  if (!name) return { ok: true, release: async () => { /* no slot was taken */ } }; // the run reports the missing manager
  const guard = await takeVmGuard(store.redis, store.k, name, p.vm_path, spec.job_id, slotLeaseMs());
  if ('holder' in guard) return { ok: false, reason: `waiting: ${p.vm_path} is being exported by job ${guard.holder} (the source guard)` };
  const slots = new Slots(store.redis, store.k);
  const limit = exportsPerManager();
  const slot = await slots.acquire(name, spec.job_id, limit, slotLeaseMs());
  if (slot) return { ok: true, release: async () => { await slot.release(); await guard.slot.release(); } };
  await guard.slot.release();
  return { ok: false, reason: `waiting for an export slot on vSphere manager ${name}: ${limit} of ${limit} in use (FERRY_EXPORTS_PER_MANAGER)` };
};

/** Maps a client error onto the worker's: retryable when the manager was away, final otherwise. */
export function asOperationError(e: unknown): unknown {
  if (e instanceof VsphereError) return new OperationError(e.message, e.retryable);
  return e;
}

/** The files a job's export created, in its own record (`export_files`): what a retry on any worker may
 *  continue and what a cancel removes, never what a file in the output folder claims. */
export function jobLedger(store: JobStore, jobId: string): ExportLedger {
  const read = async () => JSON.parse((await store.redis.hget(store.k.job(jobId), 'export_files')) || '[]') as string[];
  return {
    owned: async () => new Set(await read()),
    add: async (paths) => {
      if (!paths.length) return;
      const all = [...new Set([...(await read()), ...paths])];
      // A VM has a few disks of a few files each; far more is a planning bug, refused before anything is written.
      if (all.length > 4096) throw new OperationError(`the export would create ${all.length} files; at most 4096 are tracked`, false);
      await store.redis.hset(store.k.job(jobId), 'export_files', JSON.stringify(all));
    },
  };
}

const cancelled = (signal: AbortSignal) => signal.aborted && (signal.reason as Error)?.message === 'cancelled';

/** The export stage, shared by "export" and "migrate_vm": progress as the daemon seed's shape A record. */
export async function runExport(
  ctx: OpContext, p: ExportParameters, named: string, phase = 'exporting', field = 'output_path', place?: ExportRequest['place'],
): Promise<ExportResult> {
  // Checked again here, on the resolved path, right before anything is written (the roots may differ from the
  // submitting process's, and the folder may have changed since).
  const outputDir = await checkRunPath({ field, path: named, kind: 'output_dir' });
  const ledger = jobLedger(ctx.store, ctx.spec.job_id);
  const password = await jobPassword(ctx.store.redis, ctx.store.k, ctx.spec.job_id, p.credentials).catch((e) => { throw asOperationError(e); });
  let last = 0;
  let pending: Promise<void> = Promise.resolve();
  try {
    const creds = resolveCredentials({ manager_url: p.manager_url, username: p.username, password, insecure: p.insecure });
    return await exportVm({
      creds, vmPath: p.vm_path, outputDir, exportId: ctx.spec.job_id, ledger, parallel: p.parallel_downloads,
      removeCdrom: p.remove_cdrom, powerOff: p.power_off, shutdownTimeoutSeconds: p.shutdown_timeout_seconds, signal: ctx.signal, place,
      onAction: (msg) => ctx.progress('preparing', 0, msg),
      onProgress: (s) => {
        const now = Date.now();
        // At most two events a second, and every file completion; events are awaited in order.
        if (now - last < 500 && s.phase === 'exporting' && s.files_downloaded !== s.total_files) return;
        last = now;
        const details: Record<string, string | number> = {
          current_file: s.current_file, files_downloaded: s.files_downloaded, total_files: s.total_files,
          bytes_downloaded: s.bytes_downloaded, total_bytes: s.total_bytes, percent_complete: Math.round(s.percent_complete * 10) / 10,
          rate_bytes_per_second: s.rate_bytes_per_second, ...(s.eta_seconds !== null ? { eta_seconds: s.eta_seconds } : {}),
        };
        if (p.show_individual_progress) {
          details.files = JSON.stringify(s.files.map((f) => ({
            ...f, percent_complete: f.total_bytes ? Math.round((f.bytes_downloaded / f.total_bytes) * 1000) / 10 : 100,
          })));
        }
        const msg = s.phase === 'exporting'
          ? `${s.files_downloaded}/${s.total_files} files, ${s.bytes_downloaded} of ${s.total_bytes} bytes${s.current_file ? ` (${s.current_file})` : ''}`
          : s.phase;
        pending = pending.then(() => ctx.progress(s.phase === 'exporting' ? phase : s.phase, Math.min(99, s.percent_complete), msg, details))
          .catch(dropped(ctx.log, 'could not publish a progress event; the next one superseded by the next one', { job_id: ctx.spec.job_id }));
      },
    });
  } catch (e) {
    // Cancelled: every stream has stopped; nothing of this export stays. Other endings keep the partial files
    // (marked .ferry-part) for the next attempt to continue from.
    if (cancelled(ctx.signal)) {
      await removeExportOutput(outputDir, ledger).catch((c) => ctx.log.warn('cancelled export: its partial files could not all be removed',
        { job_id: ctx.spec.job_id, output_dir: outputDir, error: (c as Error).message }));
    }
    throw asOperationError(e);
  } finally {
    await pending;
  }
}

export const runExportOp: Operation = async (ctx) => {
  const p = ctx.spec.parameters as ExportParameters;
  const r = await runExport(ctx, p, p.output_path!);
  return {
    manifest_path: r.manifest_path, manifest: r.manifest, vm_path: r.vm_path, output_path: p.output_path, files: r.files,
    total_bytes: r.total_bytes, streams: r.streams, resumes: r.resumes, bytes_refetched: r.bytes_refetched,
    bytes_rehashed: r.bytes_rehashed, bytes_reused: r.bytes_reused, actions: r.actions, warnings: r.warnings, seconds: r.seconds,
    throughput_bytes_per_second: r.seconds > 0 ? Math.round((r.total_bytes - r.bytes_reused) / r.seconds) : null,
  };
};

/** Output undone (a job cancelled as it completed): the export's files go. Partial files of a failed attempt
 *  stay for the retry. */
export async function cleanupExport(spec: JobSpec, includeOutput: boolean, store: JobStore) {
  const p = spec.parameters as ExportParameters | undefined;
  if (!includeOutput || !p?.output_path) return;
  const out = await checkRunPath({ field: 'output_path', path: p.output_path, kind: 'output_dir' });
  await removeExportOutput(out, jobLedger(store, spec.job_id));
}
