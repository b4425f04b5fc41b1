// Before any stage: where each disk's output goes (its final name and the temporary name it is written under),
// and that nothing there may not be replaced. Sources are never an output.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { OperationError } from '../../../platform/errors';
import { checkOutputFree } from '../../../platform/roots';
import { qemuFormat } from '../../image-format';
import { outputNames, Run } from './run';

export async function planOutputs(run: Run) {
  const { m, st, dir, opts } = run;
  if (!dir) throw new OperationError('$.output.directory is required (or give the tool an output directory)', false);
  const names = outputNames(m, dir);
  for (const d of [...m.disks].sort((a, b) => a.boot_order_hint - b.boot_order_hint)) {
    const out = names.get(d.id)!;
    if (path.resolve(out) === path.resolve(d.local_path)) {
      throw new OperationError(`$.disks: output ${out} is the source of disk ${d.id}; sources are never modified`, false);
    }
    const overlay = !st.convert?.enabled && !!st.fix?.enabled;
    const final = overlay ? out.replace(/\.[^.]+$/, '') + '.overlay.qcow2' : out;
    run.work.push({
      disk: d,
      out: final,
      tmp: path.join(path.dirname(final), `.${path.basename(final)}.partial`),
      overlay,
      sourceFormat: qemuFormat(d.source_format),
      modified: false,
      artifact: {
        disk_id: d.id, path: final, format: overlay ? 'qcow2' : m.output.format, boot_order: d.boot_order_hint,
        source_path: d.local_path, source_format: d.source_format,
      },
    });
  }
  if (run.dry) return;
  await fs.mkdir(dir, { recursive: true });
  for (const w of run.work) await checkOutputFree(w.out, `output of disk ${w.disk.id}`, opts.overwrite !== false, opts.claims);
  if (m.options.report.enabled) await checkOutputFree(path.resolve(dir, m.options.report.path), 'report', opts.overwrite !== false, opts.claims);
}
