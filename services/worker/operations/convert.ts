// Operation "convert": qemu-img convert of image.path to parameters.output_format, written under a temporary
// name and renamed at the end, with progress events and the output's sha256 in the result.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { OperationError } from '../../../platform/errors';
import { convert as qemuConvert, imageInfo, sha256File } from '../../../domain/qemu';
import { checkOutputFree, checkRunPath, placeOutput } from '../../../platform/roots';
import { checkRunImage } from '../../../domain/image-confine';
import { outputExtension } from '../../../domain/schemas/common';
import { throttle, type Operation } from './types';

export function outputPathOf(jobId: string, p: { output_path?: string; output_dir?: string; output_format: string }) {
  return p.output_path || path.join(p.output_dir!, `${jobId}.${outputExtension(p.output_format)}`);
}

/** A convert job's parameters, as its operation schema (domain/operations.ts) validated them. */
type ConvertParameters = { output_format: string; compress: boolean; output_dir?: string; output_path?: string; overwrite: boolean };

export const convert: Operation = async (ctx) => {
  const { spec } = ctx;
  const p = spec.parameters as ConvertParameters;
  const started = Date.now();
  // The storage roots again, on the real paths, right before anything is opened; the checked paths are used.
  const src = await checkRunPath({ field: 'image.path', path: spec.image!.path, kind: 'input' });
  const named = outputPathOf(spec.job_id, p);
  const outField = p.output_path ? 'parameters.output_path' : 'parameters.output_dir';
  const out = await checkRunPath({ field: outField, path: named, kind: 'output' });
  // Its header and every file it references, read by Ferry; qemu-img then opens it with that format, never probing.
  const { format: srcFormat } = await checkRunImage({ field: 'image.path', path: src, format: spec.image!.format });
  const info = await imageInfo(src, srcFormat);
  const total = info['virtual-size'];
  if (out === src) throw new OperationError('the output path is the source image; sources are never modified', false);
  await fs.mkdir(path.dirname(out), { recursive: true });
  // On every attempt: an existing output is refused unless overwrite, or it is this job's own earlier output.
  await checkOutputFree(out, outField, p.overwrite, ctx.claims);
  const tmp = path.join(path.dirname(out), `.${path.basename(out)}.${spec.job_id}.partial`);
  await ctx.progress('conversion', 0, `converting ${spec.image!.format} to ${p.output_format}`, { bytes_processed: 0, total_bytes: total });
  const due = throttle();
  let lastEvent: Promise<void> = Promise.resolve();
  try {
    await qemuConvert({ src, srcFormat, dest: tmp, destFormat: p.output_format, compress: p.compress }, (pct) => {
      if (!due(pct)) return;
      lastEvent = ctx.progress('conversion', Math.min(99, Math.floor(pct)), `converted ${pct.toFixed(1)}%`, {
        bytes_processed: Math.round((pct / 100) * total), total_bytes: total,
      });
    }, ctx.signal);
    await lastEvent;
    const fh = await fs.open(tmp, 'r+');
    await fh.sync();
    await fh.close();
    await placeOutput(tmp, out, { field: outField, overwrite: p.overwrite, claims: ctx.claims });
  } catch (e) {
    await fs.rm(tmp, { force: true });
    throw e;
  }
  const st = await fs.stat(out);
  await ctx.progress('verification', 99, 'computing sha256 of the output', { bytes_processed: 0, total_bytes: st.size });
  const sha256 = await sha256File(out, undefined, ctx.signal);
  const outInfo = await imageInfo(out, p.output_format);
  return {
    output_path: out,
    format: p.output_format,
    compressed: p.compress,
    virtual_size: outInfo['virtual-size'],
    actual_size: st.blocks * 512,
    file_size: st.size,
    sha256,
    source: { path: src, format: spec.image!.format, virtual_size: total },
    duration_seconds: (Date.now() - started) / 1000,
  };
};

/** Removes what a cancelled or failed convert may have left (the partial file, or a finished output). */
export async function cleanupConvert(spec: { job_id: string; parameters: Record<string, unknown> }, includeOutput: boolean) {
  const out = outputPathOf(spec.job_id, spec.parameters as ConvertParameters);
  await fs.rm(path.join(path.dirname(out), `.${path.basename(out)}.${spec.job_id}.partial`), { force: true });
  if (includeOutput) await fs.rm(out, { force: true });
}
