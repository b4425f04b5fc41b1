// One pass onto another host (issue 36 item 1, docs/pipeline.md): when the destination is a libvirt host Ferry
// reaches only through libvirt (qemu+ssh://), each disk's bytes go from the datastore straight into its volume
// there, through `vol-upload` pieces at their own offsets (domain/libvirt/volume-stream.ts), zero runs left as
// holes. Nothing lands on the worker but the repair's overlay. The volume has its final name from the start (libvirt
// cannot rename one), is recorded in the job's ledger before it is made, and only this job's own volume is resumed.
// The repair always runs beside the copy, on overlays over nbdkit readers of the source (the volumes cannot be read
// locally); its writes are then uploaded from the overlay, with the block check of the local path around it.
import { createHash } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { OperationError } from '../../../platform/errors';
import { Virsh } from '../../../domain/libvirt';
import { checkDomainName } from '../../../domain/libvirt/names';
import { VolumeStreams, type VolumeRef } from '../../../domain/libvirt/volume-stream';
import { findVolume } from '../../../domain/libvirt/volumes';
import { imageMap, run as runTool, QEMU_IMG } from '../../../domain/qemu';
import { removePartial, type Sink } from '../../../domain/vsphere/download-file';
import type { PlannedDisk } from '../../../domain/vsphere/export-manifest';
import { blocksMet, type BlockHashes } from '../../../domain/vsphere/block-hash';
import type { OpContext } from './types';

/** Disk i's volume on the other host: the name the import would give it (domain/libvirt/import.ts). */
export const remoteVolumeName = (domain: string, i: number) => `${domain}${i ? `-disk${i}` : ''}.raw`;

/** The folder of a volume's stream pipe, in `dir` (the job's private export folder). */
const lanesDir = (dir: string, name: string) => path.join(dir, `.ferry-lanes-${name}`);

/** The download's sink for a volume on another host: its stream, its size read back from libvirt at the end. */
function volumeSink(ref: VolumeRef, dir: string): { uri: string; open: () => Promise<Sink> } {
  return {
    uri: ref.uri,
    open: async () => {
      const s = await VolumeStreams.open(ref, lanesDir(dir, ref.name));
      return {
        writev: (bufs, at) => s.write(at, bufs),
        read: (start, len, each) => s.read(start, len, each),
        finish: async () => { try { return (await findVolume(new Virsh(ref.uri), ref.pool, ref.name))?.capacity ?? -1; } finally { await s.close(); } },
        close: () => s.close(),
      };
    },
  };
}

export interface RemotePlacement { v: Virsh; pool: string; poolDir: string; domain: string; exportDir: string }

/** Why one pass onto another host cannot take this VM (every disk must: the repair reads the guest's disks from
 *  the source while they are copied, and a disk through the export folder is repaired after its copy, locally). */
export function remoteRefused(disks: PlannedDisk[]): string | undefined {
  const other = disks.find((x) => !x.extent);
  return other ? `disk ${other.disk.label} is not one flat extent, so every disk of this VM goes through the export folder` : undefined;
}

/** Each disk's volume on the other host, made (recorded first) or, on a retry, this job's own found again; a volume
 *  of that name Ferry did not make for this job is refused before any byte moves. `check` (the space check) runs
 *  once every volume is named and before any is made. */
export async function placeRemote(ctx: OpContext, o: RemotePlacement, disks: PlannedDisk[], check: () => Promise<void>): Promise<void> {
  // The import refuses the same name; here it is refused before a volume is named after it.
  try { checkDomainName(o.domain, 'the domain name (options.target_name, else the VM\'s)'); } catch (e) {
    throw new OperationError((e as Error).message, false);
  }
  const made = await ctx.store.made(ctx.spec.job_id);
  const todo: { ref: VolumeRef; file: string; size: number; local: string }[] = [];
  for (const [i, x] of disks.entries()) {
    const e = x.extent!;
    const ref = { uri: o.v.uri, pool: o.pool, name: remoteVolumeName(o.domain, i) };
    const file = path.join(o.poolDir, ref.name); // a dir pool's volume key is its path
    const mine = made.some((m) => m.kind === 'volume' && m.id === file && m.virt_uri === o.v.uri);
    const have = await findVolume(o.v, ref.pool, ref.name);
    if (have && !mine) {
      throw new OperationError(`volume ${ref.name} already exists in pool ${o.pool} on ${o.v.uri} and this job did not make it: `
        + 'refused before any byte moved (choose another options.target_name, or remove it)', false);
    }
    if (have && have.capacity !== e.size) {
      throw new OperationError(`volume ${ref.name} on ${o.v.uri}, made by an earlier attempt, holds ${have.capacity} bytes `
        + `where the disk has ${e.size}`, false);
    }
    if (!have) todo.push({ ref, file, size: e.size, local: e.local });
    e.target = file;
    e.remote = volumeSink(ref, o.exportDir);
  }
  await check();
  for (const t of todo) {
    await ctx.ledger.record({ kind: 'volume', id: t.file, name: t.ref.name, virt_uri: o.v.uri, pool: o.pool });
    await o.v.run(['vol-create-as', o.pool, t.ref.name, String(t.size), '--format', 'raw', '--allocation', '0']);
    await removePartial(t.local); // an earlier volume's resume state does not describe this one
  }
}

/** Removes the volumes placeRemote made (the repair beside the copy could not start, so the VM goes through the
 *  export folder instead), and takes the disks back from one pass with `why`. */
export async function unplaceRemote(v: Virsh, disks: PlannedDisk[], why: string): Promise<void> {
  for (const x of disks) {
    if (!x.extent?.remote) continue;
    await v.run(['vol-delete', x.extent.target!]);
    x.extent.target = undefined;
    x.extent.remote = undefined;
    x.fallback = why;
  }
}

/** What the repair wrote, as the overlay's own extents (depth 0: data, or zeros over the source). */
async function overlayExtents(overlay: string, signal: AbortSignal) {
  return (await imageMap(overlay, 'qcow2', signal)).filter((e) => e.depth === 0);
}

/** The given blocks of the volume read back and compared with the list; fails naming a block. */
async function checkRemoteBlocks(s: VolumeStreams, size: number, list: BlockHashes, which: number[], when: string): Promise<void> {
  await Promise.all(which.map(async (i) => {
    const start = i * list.block_bytes;
    const len = Math.max(0, Math.min(list.block_bytes, size - start));
    const h = createHash('sha256');
    await s.read(start, len, (b) => h.update(b));
    const got = h.digest('hex');
    if (got !== list.sha256[i]) {
      throw new OperationError(`${s.ref.name} on ${s.ref.uri}: block ${i} (bytes ${start}-${start + list.block_bytes - 1}) ${when} has sha256 ${got}, `
        + `the bytes as served had ${list.sha256[i]}`, false);
    }
  }));
}

const PIECE = 8 << 20;

/** The repair's extents uploaded into the volume: the overlay detached from the source's reader (its own clusters
 *  hold every byte the repair wrote, whole) and read as raw, each extent in pieces. The raw view is a sparse file
 *  of the repair's size beside the overlay. */
async function uploadRepair(ctx: OpContext, s: VolumeStreams, overlay: string, extents: { start: number; length: number }[]): Promise<number> {
  const raw = `${overlay}.repair.raw`;
  const tool = async (args: string[], what: string) => {
    const r = await runTool(QEMU_IMG, args, { signal: ctx.signal });
    if (r.code !== 0) throw new OperationError(`${what} of ${overlay}: ${r.stderr.trim()}`, false);
  };
  await tool(['rebase', '-u', '-f', 'qcow2', '-b', '', overlay], 'qemu-img rebase (detaching the source)');
  await tool(['convert', '-f', 'qcow2', '-O', 'raw', overlay, raw], 'qemu-img convert (the repair\'s bytes)');
  const fh = await fs.open(raw, 'r');
  let sent = 0;
  try {
    const pieces = extents.flatMap((e) => Array.from({ length: Math.ceil(e.length / PIECE) }, (_, k) =>
      ({ at: e.start + k * PIECE, len: Math.min(PIECE, e.length - k * PIECE) })));
    // One piece at a time (a volume takes one stream at a time), each read just before its upload.
    for (const p of pieces) {
      const b = Buffer.alloc(p.len);
      await fh.read(b, 0, p.len, p.at);
      await s.write(p.at, [b]);
      sent += p.len;
    }
  } finally {
    await fh.close();
    await fs.rm(raw, { force: true });
  }
  return sent;
}

/** What the block check found for one disk (as mergeIntoPool's BlockCheck). */
export interface RemoteCheck { block_bytes: number; blocks: number; checked_after_merge: number; repair_written: number[]; repair_uploaded_bytes: number }

/** The repair of one disk merged into its volume on the other host: the blocks the repair wrote checked against the
 *  list before (the volume still holds the bytes as served), its extents uploaded, every other block checked after. */
export async function mergeRemote(ctx: OpContext, o: { v: Virsh; pool: string; dir: string },
  d: { overlay: string; volume: string; modified: boolean; blocks?: BlockHashes }): Promise<RemoteCheck | undefined> {
  const ref = { uri: o.v.uri, pool: o.pool, name: path.basename(d.volume) };
  const size = (await findVolume(o.v, ref.pool, ref.name))?.capacity;
  if (size == null) throw new OperationError(`volume ${ref.name} is gone from pool ${o.pool} on ${o.v.uri} before the repair was merged`, false);
  const extents = d.modified ? await overlayExtents(d.overlay, ctx.signal) : [];
  const s = await VolumeStreams.open(ref, lanesDir(o.dir, ref.name));
  try {
    const list = d.blocks;
    const written = list ? blocksMet(extents, list.block_bytes) : new Set<number>();
    const all = list ? list.sha256.map((_, k) => k) : [];
    const repaired = all.filter((k) => written.has(k));
    if (list) await checkRemoteBlocks(s, size, list, repaired, 'before the repair was merged');
    const uploaded = extents.length ? await uploadRepair(ctx, s, d.overlay, extents) : 0;
    if (!list) return undefined;
    const kept = all.filter((k) => !written.has(k));
    await checkRemoteBlocks(s, size, list, kept, 'after the repair was merged, a block the repair did not write,');
    return { block_bytes: list.block_bytes, blocks: all.length, checked_after_merge: kept.length, repair_written: repaired, repair_uploaded_bytes: uploaded };
  } finally {
    await s.close();
  }
}

/** Every disk's repair merged into its volume on the other host (mergeRemote), boot order kept, for the import. */
export async function mergeIntoRemotePool(ctx: OpContext, o: { v: Virsh; pool: string; dir: string },
  disks: { overlay: string; volume?: string; modified: boolean; blocks?: BlockHashes }[]) {
  const out: { path: string; format: string; inPool: true; check?: RemoteCheck }[] = [];
  for (const [i, d] of disks.entries()) {
    if (!d.volume) throw new OperationError(`disk ${i} has no volume on ${o.v.uri}: every disk of a VM goes one pass onto another host, or none`, false);
    await ctx.progress('merge', Math.round((i / disks.length) * 100), `uploading the repair of disk ${i} into its volume on ${o.v.uri}, its blocks checked`);
    const check = await mergeRemote(ctx, o, { ...d, volume: d.volume });
    out.push({ path: d.volume, format: 'raw', inPool: true, ...(check ? { check } : {}) });
  }
  return out;
}
