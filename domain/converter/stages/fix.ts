// Stage fix: the guest repair, in one appliance for all disks, on the converted outputs (or on qcow2 overlays
// of the sources), never on a source. With convert on, the repair does not wait for the conversion: it runs
// side by side on overlays of the sources (opened read-only by qemu, never written) while qemu-img converts the
// same sources; the overlays then hold exactly the repair's writes and are committed into the converted
// outputs, which have the sources' content. The output ends up as source + repair, as if the repair had run on
// it, and the appliance launch and the guest's own update-initramfs under TCG no longer add to the conversion.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { OperationError } from '../../../platform/errors';
import { expectedError, awaitedLater } from '../../../platform/log';
import { run as runTool, QEMU_IMG } from '../../qemu';
import { GuestDisk, GuestSession } from '../guestfs';
import { fixGuest, inspectAndMount } from '../guest';
import { chooseFirmware } from '../firmware';
import { ConverterError } from '../errors';
import type { Repair, Run, StageReport } from './run';
import type { GuestInfo } from '../types';

/** A qcow2 overlay at `file` whose backing file is the (untouched) source `src`, a file or (the repair beside a
 *  copy, PipelineOptions.sources) an NBD URI Ferry made. */
async function sourceOverlay(file: string, src: string, srcFormat: string) {
  await fs.rm(file, { force: true });
  const r = await runTool(QEMU_IMG, ['create', '-f', 'qcow2', '-b', src.startsWith('nbd+unix:') ? src : path.resolve(src), '-F', srcFormat, file]);
  if (r.code !== 0) throw new OperationError(`qemu-img create overlay: ${r.stderr.trim()}`, false);
}

/** The repair: one appliance on `disks` (the outputs, their overlays, or the read-only sources of a dry run). */
async function repair(run: Run, disks: GuestDisk[], signal?: AbortSignal): Promise<Repair> {
  const s = await GuestSession.open(disks, { readonly: run.dry, signal, nice: run.opts.applianceNice, log: (l) => run.warn(`fix: ${l}`) });
  run.session = s;
  try {
    const gi = await inspectAndMount(s, run.dry, undefined, run.opts.inspection, run.st.fix!.root);
    const nicMacs = (run.m.nics || []).map((n) => n.mac).filter((x): x is string => !!x);
    const firmware = chooseFirmware(run.m.vm?.firmware, gi.boot);
    const res = await fixGuest(s, gi,
      { ...run.st.fix!, dry_run: run.dry, configuration: run.m.configuration, nic_macs: nicMacs, firmware: firmware.firmware },
      (msg) => run.log(1, msg));
    return { guest: gi, res, firmware };
  } finally {
    // Where the appliance's time went (GuestSession.timings), beside the pipeline's own timings.
    for (const [k, v] of Object.entries(s.timings)) run.timings[`appliance: ${k}`] = (run.timings[`appliance: ${k}`] || 0) + v;
    await s.close();
  }
}

/** With convert and fix both on: starts the repair on overlays of the sources, before convert (see above). */
export async function startRepairBesideConvert(run: Run) {
  if (run.dry || !run.st.convert?.enabled || !run.stages.fix.enabled || run.failed) return;
  for (const w of run.work) {
    w.fixOverlay = path.join(path.dirname(w.out), `.${path.basename(w.out)}.fix.qcow2`);
    await sourceOverlay(w.fixOverlay, w.disk.local_path, w.sourceFormat);
  }
  const signal = run.opts.signal ? AbortSignal.any([run.opts.signal, run.stopEarly.signal]) : run.stopEarly.signal;
  run.log(1, 'fix: started side by side with convert, on overlays of the sources');
  run.early = awaitedLater(run.timed('fix_side_by_side', () => repair(run, run.work.map((w) => ({ path: w.fixOverlay!, format: 'qcow2' })), signal)));
}

/** Fix without convert works on a qcow2 overlay of each source, written under the output's temporary name. */
export async function overlaysForRepairOnly(run: Run) {
  if (!run.stages.fix.enabled || run.failed || run.dry || !run.work.some((w) => w.overlay)) return;
  for (const w of run.work) {
    const src = run.opts.sources?.[w.disk.id];
    await sourceOverlay(w.tmp, src?.qemuUri ?? w.disk.local_path, src?.format ?? w.sourceFormat);
  }
}

/** Stops the repair running beside the conversion: `why` says why its outcome no longer matters. */
export async function stopRepairBesideConvert(run: Run, why: string) {
  if (!run.early) return;
  run.stopEarly.abort();
  await run.early.catch(expectedError(`the repair beside the conversion was stopped: ${why}`));
}

/** Into the log and warnings: whose reading of the guest the repair took, and which root it chose among several. */
function sayHowRead(run: Run, gi: GuestInfo) {
  if (gi.inspection?.from === 'preflight') run.log(1, 'fix: the plan preflight\'s inspection of these disks was taken (every UUID and file it read unchanged)');
  // The guest changed since the plan read it: its preflight findings may no longer hold.
  else if (gi.inspection) run.warn(`fix: inspected again: ${gi.inspection.why}; the plan preflight's findings for this VM may no longer hold`);
  if (gi.reading?.by === 'libguestfs') run.log(1, `fix: libguestfs's inspection read the guest: ${gi.reading.why}`);
  if (gi.reading?.roots) run.warn(`fix: the disks hold ${gi.reading.roots.length} systems; ${gi.root_device} was repaired (${gi.reading.root_choice})`);
}

export async function fix(run: Run, fixReport: StageReport): Promise<Record<string, unknown>> {
  const { m, work, early, dry } = run;
  const disksFor = dry ? work.map((w) => ({ path: w.disk.local_path, format: w.sourceFormat })) : work.map((w) => ({ path: w.tmp, format: run.formatOf(w) }));
  if (!early) run.progress('fix', 0.05, `launching the guest appliance for ${work.length} disk(s)`);
  else run.progress('fix', 0.05, 'waiting for the repair running beside the conversion');
  const { guest: gi, res, firmware } = early ? await early : await repair(run, disksFor, run.opts.signal);
  run.guest = gi;
  run.firmware = firmware;
  run.log(1, `firmware: ${firmware.firmware}: ${firmware.reason}`);
  if (run.stages.inspect.result && run.st.inspect?.collect_guest_info) run.stages.inspect.result.guest = gi;
  sayHowRead(run, gi);
  const result = {
    guest: {
      os: gi.os, distro: gi.distro, version: gi.version, root_device: gi.root_device, lvm: gi.lvm, boot: gi.boot,
      reading: gi.reading, inspection: gi.inspection,
    },
    firmware, ...res, dry_run: dry, ...(early ? { side_by_side_with_convert: true } : {}),
  };
  for (const wmsg of res.warnings) run.warnings.push(`fix: ${wmsg}`);
  // A repair the read-back found undone fails the stage; the actions stay in the report for a look.
  if (res.failures.length) { fixReport.result = result; throw new ConverterError(`repairs that did not hold: ${res.failures.join('; ')}`, 'guest', 'verify'); }
  if (early && res.modified) {
    run.progress('fix', 0.8, 'writing the repairs into the outputs');
    for (const w of work) {
      // The overlay's backing becomes the output (same content as the source, so -u is exact), then commit.
      const steps = [
        ['rebase', '-u', '-f', 'qcow2', '-b', path.resolve(w.tmp), '-F', m.output.format, w.fixOverlay!],
        ['commit', '-q', '-f', 'qcow2', w.fixOverlay!],
      ];
      for (const a of steps) {
        const r = await run.timed('qemu_img_commit', () => runTool(QEMU_IMG, a, { signal: run.opts.signal }));
        if (r.code !== 0) throw new ConverterError(`disk ${w.disk.id}: qemu-img ${a[0]} of the repair overlay: ${r.stderr.trim()}`, 'host');
      }
    }
  }
  for (const w of work) { if (w.fixOverlay) await fs.rm(w.fixOverlay, { force: true }); w.modified = res.modified; w.artifact.modified_by_fix = res.modified; }
  return result;
}
