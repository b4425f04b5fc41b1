// The repair beside the copy (issue 36 item 2, docs/pipeline.md): when every disk of a migration goes one pass,
// the guest repair does not wait for the copy. Each disk's flat extent is served read-only by nbdkit (the curl
// plugin with its cache and retry filters, as virt-v2v reads a source; the session cookie through a pipe, never
// argv: domain/plans/guest-source.ts), the pipeline's repair-only mode puts its qcow2 overlay over that reader
// and repairs while the download writes the volumes. When both have finished, each overlay's backing becomes
// its volume (`qemu-img rebase -u`: the volume now holds the same bytes as the source, which the block hash list
// proves for every block in mergeIntoPool), and the merge commits it there as before. Nothing writes the source:
// nbdkit runs --readonly, and the overlay is the only file the repair writes.
import { OperationError } from '../../../platform/errors';
import { setting } from '../../../platform/settings';
import { awaitedLater, dropped } from '../../../platform/log';
import { run as runTool, QEMU_IMG } from '../../../domain/qemu';
import { serveDisk, type NbdSource } from '../../../domain/plans/guest-source';
import { repairManifest, type PlannedDisk } from '../../../domain/vsphere/export-manifest';
import type { Manager } from '../../../domain/vsphere/client';
import type { VmDetail } from '../../../domain/vsphere/inventory';
import type { PipelineReport } from '../../../domain/converter/stages/report';
import { migrateManifest, repairParameters } from './migrate';
import { pipelineManifest } from './one-pass';
import type { OpContext } from './types';

/** When the copy and the repair ran (ISO times): the job's result shows they overlapped. */
export interface Span { started_at: string; finished_at?: string }

export interface BesideCopy {
  /** the pipeline's report, once the repair has finished (it rejects as migrateManifest does) */
  report: Promise<PipelineReport>;
  repair: Span;
  copy: Span;
  /** the volume of each disk, by disk id (the overlay's backing at the merge) */
  volumes: Record<string, string>;
  /** stops the repair (the copy failed) and its readers */
  abort: (why: string) => Promise<void>;
  /** stops the readers (after the merge's rebase no file refers to them) */
  stop: () => Promise<void>;
  /** the volumes are on another host (remote-one-pass.ts): the overlays keep the readers as their backing until
   *  the merge has uploaded the repair, and the caller stops them then */
  remote: boolean;
}

/** Why the repair waits for the copy instead, or undefined when it can run beside it. */
export function besideCopyRefused(disks: PlannedDisk[]): string | undefined {
  const other = disks.find((x) => !x.extent?.target);
  if (other) {
    return `disk ${other.disk.label} goes through the export folder (${other.fallback ?? 'not one pass'}): `
      + 'the repair reads every disk of the guest, so it runs after the copy';
  }
  return undefined;
}

/** Starts the repair on overlays over nbdkit readers of the sources (called by the export's place hook, after
 *  the volumes are placed and before any byte moves). */
export async function startRepairBesideCopy(ctx: OpContext, o: { dir: string; manager: Manager; vm: VmDetail; disks: PlannedDisk[] }): Promise<BesideCopy> {
  const readers: NbdSource[] = [];
  const stop = async () => { for (const r of readers.splice(0)) await r.stop(); };
  const raw = repairManifest(o.vm, o.disks, ctx.spec.job_id);
  const sources: Record<string, { qemuUri: string; format: string }> = {};
  const volumes: Record<string, string> = {};
  try {
    for (const [i, x] of o.disks.entries()) {
      const e = x.extent!;
      const r = await serveDisk(o.manager, { datastore: e.datastore, path: e.path, dcPath: e.dcPath, format: 'raw', size: e.size, notes: [] },
        ctx.signal, { retry: true });
      readers.push(r);
      sources[raw.disks[i].id] = r;
      volumes[raw.disks[i].id] = e.target!;
    }
  } catch (e) {
    await stop();
    throw e;
  }
  const manifest = pipelineManifest(raw, o.dir, o.disks.map((x) => x.extent!.target));
  const ac = new AbortController();
  const signal = AbortSignal.any([ctx.signal, ac.signal]);
  const repair: Span = { started_at: new Date().toISOString() };
  const sub: OpContext = {
    ...ctx, signal, spec: { ...ctx.spec, parameters: repairParameters(ctx, manifest) },
    progress: (phase, pct, message, details) => ctx.progress(phase, pct, `${message} (beside the copy)`, details),
  };
  ctx.log.info('the repair starts beside the copy, on overlays over nbdkit readers of the sources', { job_id: ctx.spec.job_id, disks: o.disks.length });
  const beside = { sources, applianceNice: setting('FERRY_REPAIR_BESIDE_COPY_NICE') };
  const report = awaitedLater(migrateManifest(sub, new Set(Object.values(volumes)), beside).finally(() => { repair.finished_at = new Date().toISOString(); }));
  const abort = async (why: string) => {
    ac.abort(new Error(why));
    await report.catch(dropped(ctx.log, `the repair beside the copy was stopped: ${why}`, { job_id: ctx.spec.job_id }));
    await stop();
  };
  return { report, repair, copy: { started_at: new Date().toISOString() }, volumes, abort, stop, remote: o.disks.some((x) => !!x.extent?.remote) };
}

/** Both have finished: the repair's report, each overlay now backed by its volume (the merge commits it). */
export async function finishBesideCopy(ctx: OpContext, b: BesideCopy): Promise<PipelineReport> {
  b.copy.finished_at ??= new Date().toISOString();
  let report: PipelineReport;
  if (b.remote) return b.report;
  try {
    report = await b.report;
    for (const a of report.artifacts as { disk_id: string; path: string }[]) {
      const volume = b.volumes[a.disk_id];
      const r = await runTool(QEMU_IMG, ['rebase', '-u', '-f', 'qcow2', '-b', volume, '-F', 'raw', a.path], { signal: ctx.signal });
      if (r.code !== 0) throw new OperationError(`disk ${a.disk_id}: qemu-img rebase of the repair's overlay onto ${volume}: ${r.stderr.trim()}`, false);
    }
  } finally {
    await b.stop();
  }
  return report;
}

/** What the job's result says of it: both spans, and how long they overlapped. */
export function besideCopyResult(b: BesideCopy | undefined, refused: string | undefined) {
  if (!b) return { ran: false, reason: refused ?? 'not started' };
  const t = (s?: string) => (s ? Date.parse(s) : NaN);
  const overlap = Math.min(t(b.repair.finished_at), t(b.copy.finished_at)) - Math.max(t(b.repair.started_at), t(b.copy.started_at));
  return { ran: true, repair: b.repair, copy: b.copy, overlap_seconds: Math.max(0, Math.round(overlap / 100) / 10) };
}
