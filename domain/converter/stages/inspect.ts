// Stage inspect: each source as qemu-img sees it (format, sizes, backing file, snapshots), its checksum (unless
// convert verifies it during the same read), and the guest's facts when asked and no repair will gather them.
import { promises as fs } from 'node:fs';
import { imageInfo, sha256File } from '../../qemu';
import { inspectImage } from '../../image-format';
import { GuestSession } from '../guestfs';
import { inspectAndMount } from '../guest';
import { chooseFirmware } from '../firmware';
import type { PipelineOptions, Run, Work } from './run';

type Source = NonNullable<PipelineOptions['sources']>[string];

export async function inspect(run: Run): Promise<Record<string, unknown>> {
  const { st, opts } = run;
  const verifyDuringConvert = !!st.convert?.enabled && !run.dry;
  const disksOut: Record<string, unknown>[] = [];
  for (const [i, w] of run.work.entries()) {
    const d = w.disk;
    const src = opts.sources?.[d.id];
    if (src) {
      disksOut.push(await inspectStreamedSource(run, w, src));
      continue;
    }
    disksOut.push(await inspectLocalDisk(run, w, verifyDuringConvert));
    run.progress('inspect', (i + 1) / run.work.length, `inspected ${d.id}`);
  }
  const r: Record<string, unknown> = { disks: disksOut };
  if (st.inspect?.collect_guest_info && !st.fix?.enabled) await collectGuestInfo(run, r);
  return r;
}

/** The report entry of a disk still being copied into local_path, as qemu-img reads it from the source. */
async function inspectStreamedSource(run: Run, w: Work, src: Source): Promise<Record<string, unknown>> {
  const d = w.disk;
  // Still being copied into local_path: qemu reads the source through its NBD reader; the copy hashes it.
  const info = await run.timed('qemu_img_info', () => imageInfo(src.qemuUri, src.format));
  w.sourceVirtual = info['virtual-size'];
  return {
    disk_id: d.id,
    detected_format: info.format,
    virtual_size: info['virtual-size'],
    read_from: 'the source through nbdkit, while the copy writes local_path',
  };
}

/** The report entry of a local disk: its format checked against the header, sizes, backing file, snapshots and checksum. */
async function inspectLocalDisk(run: Run, w: Work, verifyDuringConvert: boolean): Promise<Record<string, unknown>> {
  const { opts, warnings } = run;
  const d = w.disk;
  await fs.access(d.local_path).catch(() => { throw new Error(`disk ${d.id}: ${d.local_path} does not exist or cannot be read`); });
  // The format from the header, read by Ferry: qemu-img is never left to probe (docs/security.md).
  const header = await inspectImage(d.local_path);
  if (header.format !== w.sourceFormat) throw new Error(`disk ${d.id}: source_format is ${d.source_format} but ${d.local_path} is ${header.format}`);
  const detected = await run.timed('qemu_img_info', () => imageInfo(d.local_path, w.sourceFormat));
  const entry: Record<string, unknown> = {
    disk_id: d.id, detected_format: detected.format, virtual_size: detected['virtual-size'], actual_size: detected['actual-size'],
  };
  w.sourceVirtual = detected['virtual-size'];
  if (detected['virtual-size'] !== d.bytes) {
    warnings.push(`inspect: disk ${d.id}: bytes ${d.bytes} differs from the image's virtual size ${detected['virtual-size']}`);
  }
  if (detected['backing-filename']) {
    entry.backing_chain = detected['full-backing-filename'] || detected['backing-filename'];
    warnings.push(`inspect: disk ${d.id} has a backing file ${String(entry.backing_chain)}; the output is flattened`);
  }
  const snaps = detected.snapshots;
  if (snaps?.length) {
    entry.snapshots = snaps.length;
    warnings.push(`inspect: disk ${d.id} has ${snaps.length} internal snapshot(s); only the active layer is converted`);
  }
  if (d.checksum && !verifyDuringConvert) {
    const sha = await sha256File(d.local_path, undefined, opts.signal);
    if (`sha256:${sha}` !== d.checksum) throw new Error(`disk ${d.id}: checksum mismatch: manifest ${d.checksum}, file sha256:${sha}`);
    w.sourceSha = sha;
    entry.checksum = 'verified';
  } else if (d.checksum) entry.checksum = 'verified during convert (same read)';
  return entry;
}

/** Inspects the guest on a read-only appliance, sets run.guest and run.firmware, and adds the guest to the report `r`. */
async function collectGuestInfo(run: Run, r: Record<string, unknown>): Promise<void> {
  const { st, opts } = run;
  // No fix session to share: a read-only appliance on the sources.
  const session = run.session = await GuestSession.open(
    run.work.map((w) => ({ path: w.disk.local_path, format: w.sourceFormat })),
    { readonly: true, signal: opts.signal, nice: opts.applianceNice, log: (l) => run.warn(`inspect: ${l}`) },
  );
  run.guest = await inspectAndMount(session, true, undefined, undefined, st.fix?.root);
  r.guest = run.guest;
  run.firmware = chooseFirmware(run.m.vm?.firmware, run.guest.boot);
  await session.close();
}
