// Operation "migrate": runs a manifest through the pipeline on this worker; each stage's progress becomes a
// ProgressEvent (phase = stage name) and report.json is the job's result. A failed stage fails the job
// (retryable only when each of its failures was: report.retryable) with the report still written.
import { jobPattern } from '../../../platform/linear-regex';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { OperationError } from '../../../platform/errors';
import type { Manifest } from '../../../domain/schemas/manifest';
import { outputNames, runPipeline, type PipelineOptions } from '../../../domain/converter/pipeline';
import { OPERATIONS } from '../../../domain/operations';
import { checkRunPath } from '../../../platform/roots';
import { checkRunImage } from '../../../domain/image-confine';
import { throttle, type OpContext, type Operation } from './types';
import type { PipelineReport } from '../../../domain/converter/stages/report';
import type { InspectionHint } from '../../../domain/converter/inspection-hint';
import { dropped } from '../../../platform/log';

/** `inspection`: set only by migrate_vm's stages for a plan's VM (parameters.plan.inspection), never a caller's. */
type MigrateParams = {
  manifest: Manifest; output_dir?: string; overwrite: boolean;
  virt_test?: { expect?: string; timeout_seconds?: number; memory_mib?: number; vcpus?: number };
  inspection?: InspectionHint;
};

export const migrate: Operation = (ctx) => migrateManifest(ctx, new Set());

/** The parameters of a migrate_vm job's own repair (`ctx`: that job's): its exported manifest, and the plan
 *  preflight's inspection the plan runner gave it (parameters.plan.inspection). Its outputs (overlays) are in the
 *  job's private export folder, so an attempt replaces what an earlier attempt of the job left there. */
export const repairParameters = (ctx: OpContext, manifest: Manifest): MigrateParams =>
  ({ manifest, overwrite: true, inspection: (ctx.spec.parameters as { plan?: { inspection?: InspectionHint } }).plan?.inspection });

type Beside = Pick<PipelineOptions, 'sources' | 'applianceNice'>;

/** The migrate operation. `made`: disk paths Ferry made itself for this job (one pass: its partial volumes in the
 *  pool folder, docs/pipeline.md), which are not the job's input and so are not held to the input roots.
 *  `beside` (the repair beside the copy, repair-beside-copy.ts): `sources`, by disk id, the NBD reader of a disk
 *  whose volume the copy is still writing (the pipeline reads that instead, so no header of the volume is read
 *  yet), and the appliance's lower CPU priority. */
export async function migrateManifest(ctx: OpContext, made: Set<string>, beside?: Beside): Promise<PipelineReport> {
  const p = ctx.spec.parameters as MigrateParams;
  // The storage roots again, on the real paths, before the pipeline opens anything; it runs on those paths.
  const real = new Map<string, string>();
  for (const jp of OPERATIONS.migrate.paths!(ctx.spec)) real.set(jp.field, made.has(jp.path) ? jp.path : await checkRunPath(jp));
  // Each disk's header and everything it references (an export's delta chain, extents) before any tool opens it.
  const served = new Set(p.manifest.disks.flatMap((d, i) => (beside?.sources?.[d.id] ? [`parameters.manifest.disks[${i}].local_path`] : [])));
  for (const img of OPERATIONS.migrate.images!(ctx.spec)) {
    if (!served.has(img.field)) await checkRunImage({ ...img, path: real.get(img.field)!, ...(made.has(img.path) ? { selfContained: true } : {}) });
  }
  const m: Manifest = {
    ...p.manifest,
    disks: p.manifest.disks.map((d, i) => ({ ...d, local_path: real.get(`parameters.manifest.disks[${i}].local_path`)! })),
    output: { ...p.manifest.output, ...(p.manifest.output.directory ? { directory: real.get('parameters.manifest.output.directory') } : {}) },
    // The driver tree checked above, by its real path: what the repair copies into the guest comes from there.
    ...(p.manifest.pipeline?.fix?.virtio_win ? {
      pipeline: { ...p.manifest.pipeline, fix: { ...p.manifest.pipeline.fix, virtio_win: real.get('parameters.manifest.pipeline.fix.virtio_win') } },
    } : {}),
  };
  const report = await runManifest(ctx, m, p, p.output_dir && real.get('parameters.output_dir'), beside);
  // Retryable only when every failure said so (a hung or crashed appliance launch), as the report records.
  if (!report.success) {
    throw new OperationError(`migration failed: ${report.errors.join('; ')}${report.report_path ? ` (report ${report.report_path})` : ''}`,
      report.retryable === true);
  }
  return report;
}

/** The pipeline on a checked manifest, its stages' progress published in order. */
async function runManifest(ctx: OpContext, m: Manifest, p: MigrateParams, outputDir: string | undefined, beside?: Beside): Promise<PipelineReport> {
  const vt = p.virt_test;
  const due = throttle(250);
  let last: Promise<void> = Promise.resolve();
  let lastStage = '';
  const report = await runPipeline(m, {
    outputDir,
    ...beside,
    inspection: p.inspection,
    overwrite: p.overwrite,
    claims: ctx.claims,
    signal: ctx.signal,
    tool: `ferry-worker ${ctx.workerId}`,
    testBoot: vt ? {
      name: `ferry-${ctx.spec.job_id}`.slice(0, 64), expect: vt.expect ? jobPattern(vt.expect, 'parameters.virt_test.expect') : undefined,
      timeoutSeconds: vt.timeout_seconds, memoryMiB: vt.memory_mib, vcpus: vt.vcpus,
    } : undefined,
    onProgress: (stage, pct, message, details) => {
      if (stage === lastStage && !due(pct)) return;
      lastStage = stage;
      last = last.then(() => ctx.progress(stage, Math.min(99, pct), message, details))
        .catch(dropped(ctx.log, 'could not publish a progress event; the next one supersedes it', { job_id: ctx.spec.job_id }));
    },
    log: (_l, msg) => ctx.log.info(msg, { job_id: ctx.spec.job_id }),
  });
  await last;
  return report;
}

/** The pipeline removes its own partial files; on cancel after completion the outputs go too. */
export async function cleanupMigrate(spec: { parameters: Record<string, unknown> }, includeOutput: boolean) {
  const p = spec.parameters as { manifest?: Manifest; output_dir?: string } | undefined;
  const m = p?.manifest;
  const dir = m?.output?.directory || p?.output_dir;
  if (!m || !dir) return;
  for (const out of outputNames(m, dir).values()) {
    await fs.rm(path.join(path.dirname(out), `.${path.basename(out)}.partial`), { force: true });
    if (includeOutput) await fs.rm(out, { force: true });
  }
}
