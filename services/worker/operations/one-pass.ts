// One pass for shape B (issue 36, docs/pipeline.md): a disk whose bytes on the datastore are the disk in order (one
// flat extent, no parent) is downloaded straight into its target volume in a local dir pool, a raw file written at
// the ranges' own offsets with zero runs left as holes, under a partial name only this job uses (so a retry
// resumes into the same file). The guest repair then runs on qcow2 overlays over those volumes (the pipeline's
// repair-only mode) and its writes are committed into them, every block checked against the block hash list of
// the bytes as served (commitChecked); a disk one pass cannot take (a snapshot delta, a sparse VMDK, another
// host) goes through the export folder, and its repaired overlay is converted straight into the pool. Before any
// byte moves, the pool and the worker's scratch folder must hold what the job will write.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { OperationError } from '../../../platform/errors';
import { defaultPool, defaultPoolDir, Virsh } from '../../../domain/libvirt';
import { ensureDirPool, findVolume, isLocalUri, poolTarget, type PoolDoc } from '../../../domain/libvirt/volumes';
import { parseXml, sizeBytes } from '../../../domain/libvirt/xml';
import { poolShortfall, sizeText } from '../../../domain/libvirt/space';
import { convert, run as runTool, QEMU_IMG } from '../../../domain/qemu';
import type { PlannedDisk } from '../../../domain/vsphere/export-manifest';
import { blocksWritten, type BlockHashes } from '../../../domain/vsphere/block-hash';
import { checkBlocks } from '../../../domain/vsphere/block-check';
import { validateManifest } from '../../../domain/schemas/manifest';
import { MIGRATION_REPAIR } from '../../../domain/converter/guest';
import type { OpContext } from './types';
import { placeRemote, remoteRefused, unplaceRemote } from './remote-one-pass';

/** Disk i's partial volume in the pool folder: raw (one pass, resumed by a retry) or qcow2 (converted there). */
export const partialName = (jobId: string, i: number, format: 'raw' | 'qcow2') => `.ferry-${jobId}-disk${i}.${format}.ferry-partial`;

/** Bytes a file already takes on its device (0 when it is not there). */
const allocated = (f: string) => fs.stat(f).then((s) => s.blocks * 512, () => 0);

/** What a one-pass volume already holds (an earlier attempt's bytes count as room): on another host, libvirt's
 *  allocation of it. */
const ownBytes = async (v: Virsh, pool: string, target: string, remote: boolean) => (remote
  ? (await findVolume(v, pool, path.basename(target)))?.allocation ?? 0
  : allocated(target));

export interface Placement {
  virtUri: string; pool?: string; exportDir: string;
  /** One pass onto another host (remote-one-pass.ts): the domain's name (its volumes are named after it). Without
   *  it (warm rounds) another host goes through the export folder. */
  remote?: { domain: string };
}

/** ExportRequest.place for a migration job: which disks go straight into the pool, then the space check, then the
 *  partial volumes recorded in the job's ledger (before the download creates them). */
export async function placeForOnePass(ctx: OpContext, o: Placement, disks: PlannedDisk[]): Promise<void> {
  const v = new Virsh(o.virtUri);
  const pool = o.pool || defaultPool();
  if (!o.pool) await ensureDirPool(v, pool, defaultPoolDir());
  const local = isLocalUri(v.uri);
  const t = local || o.remote ? await poolTarget(v, pool) : null;
  const dir = t?.type === 'dir' && t.path ? t.path : null;
  if (!local && o.remote && dir && !remoteRefused(disks)) {
    await placeRemote(ctx, { v, pool, poolDir: dir, domain: o.remote.domain, exportDir: o.exportDir }, disks,
      () => checkSpace(v, pool, disks, o.exportDir));
    return;
  }
  for (const [i, x] of disks.entries()) {
    if (!x.extent) continue;
    if (!dir) {
      x.fallback = fallbackReason(v.uri, pool, local, t, o.remote ? remoteRefused(disks) : undefined);
      continue;
    }
    x.extent.target = path.join(dir, partialName(ctx.spec.job_id, i, 'raw'));
  }
  await checkSpace(v, pool, disks, o.exportDir);
  for (const x of disks) {
    if (x.extent?.target) await ctx.ledger.record({ kind: 'volume', id: x.extent.target, name: path.basename(x.extent.target), virt_uri: v.uri, pool });
  }
}

/** placeForOnePass undone for another host (the repair beside the copy could not start): the volumes made there
 *  removed (unplaceRemote), the disks taken back to the export folder with `why`, and the space checked again for
 *  these routes, since the folder must now hold each disk's download and its converted copy, which the first check
 *  did not ask of it. */
export async function unplaceForOnePass(o: Placement, disks: PlannedDisk[], why: string): Promise<void> {
  if (!disks.some((x) => x.extent?.remote)) return; // a local one-pass volume stays: the repair runs on it after the copy
  const v = new Virsh(o.virtUri);
  await unplaceRemote(v, disks, why);
  await checkSpace(v, o.pool || defaultPool(), disks, o.exportDir);
}

/** Why a disk with a flat extent still goes through the export folder. */
function fallbackReason(uri: string, pool: string, local: boolean, t: { type: string } | null, refused: string | undefined): string {
  if (refused) return refused;
  if (local) return `pool ${pool} is a ${t?.type} pool; one pass writes into dir pools`;
  if (t) return `pool ${pool} on ${uri} is a ${t.type} pool; one pass writes into dir pools`;
  return `${uri} is another host, and warm rounds write into local dir pools only`;
}

/** Refuses, naming the numbers, a job whose disks do not fit the target pool (domain/libvirt/space.ts, the rule a
 *  plan's preflight applies too) or whose downloads do not fit the worker's scratch folder (the export folder: the
 *  files of the disks one pass does not take, and with no one-pass disk also today's converted copy). What this job's earlier
 *  attempts already wrote there counts as room. */
async function checkSpace(v: Virsh, pool: string, disks: PlannedDisk[], scratch: string): Promise<void> {
  await v.run(['pool-refresh', pool]);
  const free = sizeBytes(parseXml<PoolDoc>(await v.run(['pool-dumpxml', pool])).pool.available) ?? 0;
  let own = 0;
  for (const x of disks) if (x.extent?.target) own += await ownBytes(v, pool, x.extent.target, !!x.extent.remote);
  const short = poolShortfall(pool, disks.map((x) => x.disk), free + own);
  if (short) throw new OperationError(`${short}: refused before any byte moved`, false);
  const onePass = disks.some((x) => x.extent?.target);
  const through = disks.filter((x) => !x.extent?.target);
  let have = 0;
  for (const f of new Set(through.flatMap((x) => x.files))) have += await allocated(f.local) + await allocated(`${f.local}.ferry-part`);
  const want = through.reduce((a, x) => a + x.files.reduce((b, f) => b + f.size, 0) + (onePass ? 0 : x.disk.capacity_bytes), 0);
  const st = await fs.statfs(scratch);
  const room = st.bavail * st.bsize + have;
  if (want > room) {
    const routes = through.map((x) => `${x.disk.label}: ${x.fallback ?? 'export folder'}`).join('; ');
    throw new OperationError(`the export folder ${scratch} (the worker's scratch space) has ${sizeText(room)} free; `
      + `the disks that go through it need ${sizeText(want)} (${routes}): refused before any byte moved`, false);
  }
}

/** What the block check found for one one-pass disk (the job result, report.json, the manifest). */
export interface BlockCheck { block_bytes: number; blocks: number; checked_after_merge: number; repair_written: number[] }

/** The repair's overlay committed into a one-pass volume (`-d` keeps the overlay, the record of exactly what the
 *  repair wrote), with the block check around it (domain/vsphere/block-hash.ts): the blocks the repair wrote are
 *  re-hashed from the volume before the commit (it still holds the bytes as served), every other block after. */
async function commitChecked(
  ctx: OpContext, i: number, d: { overlay: string; volume: string; modified: boolean; blocks?: BlockHashes },
): Promise<BlockCheck | undefined> {
  const list = d.blocks;
  const written = list && d.modified ? await blocksWritten(d.overlay, list.block_bytes, ctx.signal) : new Set<number>();
  const all = list ? list.sha256.map((_, k) => k) : [];
  const repaired = all.filter((k) => written.has(k));
  if (list) await checkBlocks(d.volume, list, repaired, 'before the repair was merged', ctx.signal);
  if (d.modified) {
    const r = await runTool(QEMU_IMG, ['commit', '-q', '-d', '-f', 'qcow2', d.overlay], { signal: ctx.signal });
    if (r.code !== 0) throw new OperationError(`disk ${i}: qemu-img commit of the repair into ${d.volume}: ${r.stderr.trim()}`, false);
  }
  if (!list) return undefined;
  const kept = all.filter((k) => !written.has(k));
  await checkBlocks(d.volume, list, kept, 'after the repair was merged, a block the repair did not write,', ctx.signal);
  return { block_bytes: list.block_bytes, blocks: all.length, checked_after_merge: kept.length, repair_written: repaired };
}

/** What the repair left in each disk's overlay, merged into the pool: committed into a one-pass volume
 *  (commitChecked), converted into a new qcow2 partial volume otherwise. Returns each disk for the import, boot
 *  order kept, with a one-pass disk's block check. */
export async function mergeIntoPool(
  ctx: OpContext, o: { virtUri: string; pool: string; poolDir: string },
  disks: { overlay: string; volume?: string; modified: boolean; blocks?: BlockHashes }[],
) {
  const out: { path: string; format: string; inPool: true; check?: BlockCheck }[] = [];
  for (const [i, d] of disks.entries()) {
    await ctx.progress('merge', Math.round((i / disks.length) * 100),
      d.volume ? `committing the repair of disk ${i} into its volume, its blocks checked` : `converting disk ${i} with its repair into the pool`);
    if (d.volume) {
      const check = await commitChecked(ctx, i, { ...d, volume: d.volume });
      out.push({ path: d.volume, format: 'raw', inPool: true, ...(check ? { check } : {}) });
      continue;
    }
    const part = path.join(o.poolDir, partialName(ctx.spec.job_id, i, 'qcow2'));
    await ctx.ledger.record({ kind: 'volume', id: part, name: path.basename(part), virt_uri: o.virtUri, pool: o.pool });
    await fs.rm(part, { force: true });
    await convert({ src: d.overlay, srcFormat: 'qcow2', dest: part, destFormat: 'qcow2' },
      (pct) => void ctx.progress('merge', Math.round(((i + pct / 100) / disks.length) * 100), `converting disk ${i} into the pool`), ctx.signal);
    out.push({ path: part, format: 'qcow2', inPool: true });
  }
  return out;
}

/** The pipeline's manifest for the exported disks: every repair a VMware guest needs on KVM, the outputs beside the
 *  export. One pass: the repair-only mode (qcow2 overlays, no conversion) with each one-pass disk read from its
 *  volume (raw, no checksum for the inspect stage to read it whole for: the block check around the merge re-hashes
 *  every block once, mergeIntoPool). */
export function pipelineManifest(exported: Record<string, unknown>, dir: string, volumes: (string | undefined)[]) {
  const raw = exported as { disks: ({ data_path?: { mode: string } } & Record<string, unknown>)[] };
  const onePass = volumes.some(Boolean);
  return validateManifest({
    ...raw,
    disks: raw.disks.map((d, i) => (volumes[i] && d.data_path?.mode === 'one_pass'
      ? { ...d, local_path: volumes[i], source_format: 'raw', checksum: undefined }
      : d)),
    pipeline: { inspect: { enabled: true }, convert: { enabled: !onePass }, validate: { enabled: true }, fix: MIGRATION_REPAIR },
    output: { directory: path.join(dir, 'converted'), format: 'qcow2' },
  });
}
