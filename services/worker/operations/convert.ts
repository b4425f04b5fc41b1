// Operation "convert": qemu-img convert of image.path to parameters.output_format, written under a temporary
// name and renamed at the end, with progress events and the output's sha256 in the result.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { OperationError } from '../../../shared/errors';
import { convert as qemuConvert, imageInfo, sha256File } from '../../../shared/qemu';
import { throttle, type Operation } from './types';

const EXT: Record<string, string> = { qcow2: 'qcow2', raw: 'raw', vdi: 'vdi' };

export function outputPathOf(jobId: string, p: { output_path?: string; output_dir?: string; output_format: string }) {
  return p.output_path || path.join(p.output_dir!, `${jobId}.${EXT[p.output_format]}`);
}

export const convert: Operation = async (ctx) => {
  const { spec } = ctx;
  const p = spec.parameters as { output_format: string; compress: boolean; output_dir?: string; output_path?: string; overwrite: boolean };
  const src = spec.image!.path;
  const started = Date.now();
  await fs.stat(src).catch(() => { throw new OperationError(`image.path ${src} does not exist or cannot be read`, false); });
  const info = await imageInfo(src, spec.image!.format);
  const total = info['virtual-size'];
  const out = outputPathOf(spec.job_id, p);
  if (path.resolve(out) === path.resolve(src)) throw new OperationError('the output path is the source image; sources are never modified', false);
  await fs.mkdir(path.dirname(out), { recursive: true });
  // A retry may find the file its own earlier attempt renamed into place; only a first attempt refuses.
  if (!p.overwrite && ctx.attempt <= 1 && (await fs.stat(out).then(() => true, () => false))) {
    throw new OperationError(`output ${out} already exists (set parameters.overwrite to replace it)`, false);
  }
  const tmp = path.join(path.dirname(out), `.${path.basename(out)}.${spec.job_id}.partial`);
  await ctx.progress('conversion', 0, `converting ${spec.image!.format} to ${p.output_format}`, { bytes_processed: 0, total_bytes: total });
  const due = throttle();
  let lastEvent: Promise<void> = Promise.resolve();
  try {
    await qemuConvert({ src, srcFormat: spec.image!.format, dest: tmp, destFormat: p.output_format, compress: p.compress }, (pct) => {
      if (!due(pct)) return;
      lastEvent = ctx.progress('conversion', Math.min(99, Math.floor(pct)), `converted ${pct.toFixed(1)}%`, {
        bytes_processed: Math.round((pct / 100) * total), total_bytes: total,
      });
    }, ctx.signal);
    await lastEvent;
    const fh = await fs.open(tmp, 'r+');
    await fh.sync();
    await fh.close();
    await fs.rename(tmp, out);
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
export async function cleanupConvert(spec: { job_id: string; parameters: any }, includeOutput: boolean) {
  const out = outputPathOf(spec.job_id, spec.parameters);
  await fs.rm(path.join(path.dirname(out), `.${path.basename(out)}.${spec.job_id}.partial`), { force: true });
  if (includeOutput) await fs.rm(out, { force: true });
}
