// Stage convert: qemu-img convert of each source to the output format under its temporary name, with the
// source's checksum computed during the same read.
import { promises as fs } from 'node:fs';
import { convert as qemuConvert, run as runTool, sha256File, QEMU_IMG } from '../../qemu';
import { awaitedLater } from '../../../platform/log';
import type { Run } from './run';

let zstdSupport: Promise<boolean> | undefined;
/** qemu-img >= 5.1 has qcow2 compression_type=zstd; asked once per process. */
function supportsZstd(): Promise<boolean> {
  zstdSupport ??= runTool(QEMU_IMG, ['create', '-f', 'qcow2', '-o', 'help', '/dev/null'])
    .then((r) => /compression_type/.test(r.stdout + r.stderr), () => false);
  return zstdSupport;
}

export async function convert(run: Run): Promise<Record<string, unknown>> {
  const { m, opts, warnings, work } = run;
  const c = run.st.convert!;
  const fmt = m.output.format;
  const notes: string[] = [];
  const options: string[] = [];
  let compress = false;
  if (c.compress && fmt !== 'qcow2') warnings.push(`convert: compress applies to qcow2 output only; ${fmt} output is not compressed`);
  else if (c.compress) {
    compress = true;
    if (await supportsZstd()) options.push('compression_type=zstd');
    else notes.push('qemu-img has no zstd support here; zlib compression used');
  }
  if (c.compress_level !== undefined) {
    warnings.push(`convert: compress_level ${c.compress_level} is not honoured: qemu-img has no compression-level setting`
      + `${compress ? ' (zstd/zlib default level used)' : ''}`);
  }
  const extra = opts.parallelStreams && opts.parallelStreams > 1 ? ['-m', String(Math.min(16, opts.parallelStreams))] : [];
  const total = work.reduce((a, w) => a + (w.sourceVirtual || w.disk.bytes), 0) || 1;
  let doneBytes = 0;
  const files: Record<string, unknown>[] = [];
  for (const w of work) {
    const size = w.sourceVirtual || w.disk.bytes;
    if (run.dry) { files.push({ disk_id: w.disk.id, would_write: w.out, from: w.disk.local_path, format: fmt, compress }); continue; }
    await fs.rm(w.tmp, { force: true });
    const t = Date.now();
    // The checksum is computed while qemu-img reads the same file: one pass through the page cache.
    const sha = w.disk.checksum ? awaitedLater(sha256File(w.disk.local_path, undefined, opts.signal)) : undefined;
    try {
      await run.timed('qemu_img_convert', () => qemuConvert(
        { src: w.disk.local_path, srcFormat: w.sourceFormat, dest: w.tmp, destFormat: fmt, compress, options, extra },
        (pct) => {
          run.progress('convert', (doneBytes + (pct / 100) * size) / total, `converting ${w.disk.id} ${pct.toFixed(1)}%`, {
            disk_id: w.disk.id, bytes_processed: Math.round(doneBytes + (pct / 100) * size), total_bytes: total,
          });
        },
        opts.signal,
      ));
      if (sha) {
        w.sourceSha = await run.timed('source_sha256_wait', () => sha);
        if (`sha256:${w.sourceSha}` !== w.disk.checksum) {
          throw new Error(`disk ${w.disk.id}: checksum mismatch: manifest ${w.disk.checksum}, file sha256:${w.sourceSha}`);
        }
      }
    } catch (e) { await fs.rm(w.tmp, { force: true }); throw e; }
    doneBytes += size;
    Object.assign(w.artifact, { compressed: compress });
    files.push({ disk_id: w.disk.id, output: w.out, format: fmt, compressed: compress, seconds: (Date.now() - t) / 1000, checksum_verified: !!sha });
  }
  return { format: fmt, compression: compress ? (options.length ? 'zstd' : 'zlib') : 'none', files, notes };
}
