// After the stages: the outputs renamed into place (durable before visible) with their artifact facts, then
// virt_test's one boot of them when asked.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { placeOutput } from '../../../platform/roots';
import { imageInfo, sha256File } from '../../qemu';
import { testBoot } from '../testboot';
import { chooseFirmware } from '../firmware';
import type { Run } from './run';

export async function placeOutputs(run: Run) {
  if (run.failed || run.dry) return;
  const { opts } = run;
  for (const w of run.work) {
    // Durable before visible: the data reaches the disk, then the name, then the directory entry.
    await run.timed('fsync_rename', async () => {
      const h = await fs.open(w.tmp, 'r');
      try { await h.sync(); } finally { await h.close(); }
      await placeOutput(w.tmp, w.out, { field: `output of disk ${w.disk.id}`, overwrite: opts.overwrite !== false, claims: opts.claims });
      const d = await fs.open(path.dirname(w.out), 'r');
      try { await d.sync(); } finally { await d.close(); }
    });
    const s = await fs.stat(w.out);
    const info = w.outInfo || await run.timed('qemu_img_info', () => imageInfo(w.out, run.formatOf(w)));
    const sha = w.outSha || await run.timed('output_sha256', () => sha256File(w.out, undefined, opts.signal));
    Object.assign(w.artifact, { virtual_size: info['virtual-size'], file_size: s.size, actual_size: s.blocks * 512, sha256: sha });
    if (w.sourceSha) w.artifact.source_sha256 = w.sourceSha;
  }
  run.written = true;
}

/** virt_test: a failed boot fails the run (the outputs stay for a look); an inconclusive one is a warning. */
export async function testBootOutputs(run: Run) {
  const { m, opts, work } = run;
  if (run.failed || run.dry || !opts.testBoot) return;
  run.progress('validate', 1, 'test boot of the outputs');
  // The whole serial console is kept beside the outputs (the report has its tail), for a look after a failure.
  const consoleLog = path.join(path.dirname(work[0].out), `${path.basename(work[0].out)}.virt-test.log`);
  const mac = opts.testBoot.mac ?? (m.nics?.length === 1 ? m.nics[0].mac?.toLowerCase().replace(/-/g, ':') : undefined);
  // The firmware the import gives the domain: the guest's (inspected by fix or inspect), else the manifest's.
  run.firmware ??= chooseFirmware(m.vm?.firmware, undefined);
  const firmware = run.firmware.firmware;
  const tb = await run.timed('test_boot', () => testBoot({
    ...opts.testBoot, mac, consoleLog, firmware, disks: work.map((w) => ({ path: w.out, format: run.formatOf(w) })), signal: opts.signal,
  }));
  run.testBootResult = { ...tb, console_log: consoleLog };
  run.log(1, `test boot (${tb.accelerator}, ${tb.firmware}): ${tb.status}: ${tb.detail}`);
  if (tb.status === 'inconclusive') run.warnings.push(`virt_test: inconclusive: ${tb.detail}`);
  if (tb.status === 'failed') run.fail(`virt_test: the test boot failed: ${tb.detail}`);
}
