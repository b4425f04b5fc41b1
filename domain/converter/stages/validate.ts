// Stage validate: each finished output (under its temporary name) checked with qemu-img check, its virtual
// size against the source's, and compared with the source when the repair did not change it. Its sha256 is
// read alongside, so it is not read again after the rename.
import { promises as fs } from 'node:fs';
import { check, compare, imageInfo, sha256File } from '../../qemu';
import { awaitedLater } from '../../../platform/log';
import type { Run } from './run';

export async function validate(run: Run): Promise<Record<string, unknown>> {
  const v = run.st.validate!;
  const checks: Record<string, unknown>[] = [];
  if (run.dry) return { skipped: 'dry_run: no output to validate' };
  for (const [i, w] of run.work.entries()) {
    const file = w.tmp;
    const fmt = run.formatOf(w);
    await fs.access(file).catch(() => { throw new Error(`disk ${w.disk.id}: no output to validate (was convert enabled?)`); });
    const c: Record<string, unknown> = { disk_id: w.disk.id };
    // The output is final from here on (fix ran before): its sha256 is read alongside check and compare,
    // which read the same file, instead of in a second pass after the rename.
    const outSha = awaitedLater(run.timed('output_sha256', () => sha256File(file, undefined, run.opts.signal)));
    if (v.check_image_integrity) {
      const r = await run.timed('qemu_img_check', () => check(file, fmt));
      c.integrity = r.ok ? (/not support/i.test(r.output) ? 'not supported by format' : 'ok') : 'errors';
      if (!r.ok) throw new Error(`disk ${w.disk.id}: qemu-img check found problems: ${r.output.slice(0, 2000)}`);
    }
    const info = await run.timed('qemu_img_info', () => imageInfo(file, fmt));
    w.outInfo = info;
    c.virtual_size = info['virtual-size'];
    if (w.sourceVirtual !== undefined && info['virtual-size'] !== w.sourceVirtual) {
      throw new Error(`disk ${w.disk.id}: output virtual size ${info['virtual-size']} differs from the source's ${w.sourceVirtual}`);
    }
    if (!w.modified && !w.overlay) {
      const cmp = await run.timed('qemu_img_compare', () => compare(w.disk.local_path, w.sourceFormat, file, fmt));
      c.compare = cmp.identical ? 'identical to source' : 'differs';
      if (!cmp.identical) throw new Error(`disk ${w.disk.id}: output content differs from the source: ${cmp.output}`);
    } else c.compare = 'skipped: the fix stage modified the output';
    w.outSha = await outSha;
    checks.push(c);
    run.progress('validate', (i + 0.5) / run.work.length, `validated ${w.disk.id}`);
  }
  return { checks };
}
