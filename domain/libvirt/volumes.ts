// Storage volumes and pools: info (vol-dumpxml), create, clone, resize, delete, upload, wipe, download. Sizes are
// bytes everywhere (libvirt's own unit for volumes).
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { convert, imageInfo, noProgress, run } from '../qemu';
import { ApiError, errorText, fieldError } from '../../platform/errors';
import { confineRequestImage } from '../image-confine';
import { confinePath } from './paths';
import { LibvirtError, Virsh } from './virsh';
import { checkName } from './names';
import { buildXml, parseXml, sizeBytes, text, XmlAttrs, XmlValue } from './xml';
import { withXmlFile } from './domains';
import { expectedError, ignoreError } from '../../platform/log';

export const WIPE_ALGORITHMS = ['zero', 'nnsa', 'dod', 'bsi', 'gutmann', 'schneier', 'pfitzner7', 'pfitzner33', 'random'] as const;
export const VOLUME_FORMATS = ['raw', 'qcow2', 'vmdk', 'vdi', 'vpc', 'vhdx', 'qed'] as const;

/** A URI whose libvirtd runs on this machine (no host part): files can then be read and written directly. */
export function isLocalUri(uri: string): boolean {
  try { return !new URL(uri).hostname; } catch { return false; }
}

/** A volume definition (`virsh vol-dumpxml`), as far as Ferry reads it. */
interface VolumeDoc {
  volume: XmlAttrs & {
    name?: XmlValue; key?: XmlValue; target?: { path?: XmlValue; format?: XmlAttrs };
    capacity?: XmlValue; allocation?: XmlValue; physical?: XmlValue;
  };
}
/** A pool definition (`virsh pool-dumpxml`); libvirt always writes the pool's type. */
export interface PoolDoc { pool: XmlAttrs & { '@_type': string; target?: { path?: XmlValue }; available?: XmlValue } }

export async function volumeInfo(v: Virsh, pool: string, volume: string) {
  checkName(pool, 'pool'); checkName(volume, 'volume');
  const x = parseXml<VolumeDoc>(await v.run(['vol-dumpxml', '--pool', pool, volume])).volume;
  return {
    pool, name: text(x.name)!, key: text(x.key) ?? null, path: text(x.target?.path) ?? null, type: x['@_type'] || 'file',
    format: x.target?.format?.['@_type'] ?? null,
    capacity: sizeBytes(x.capacity) ?? null, allocation: sizeBytes(x.allocation) ?? null, physical: sizeBytes(x.physical) ?? null,
  };
}

/** volumeInfo, or null when the pool has no volume of that name. */
export async function findVolume(v: Virsh, pool: string, volume: string) {
  try { return await volumeInfo(v, pool, volume); } catch (e) { if (e instanceof LibvirtError && e.status === 404) return null; throw e; }
}

export async function volumeExists(v: Virsh, pool: string, volume: string): Promise<boolean> {
  try { await v.run(['vol-key', '--pool', pool, volume]); return true; } catch (e) { if (e instanceof LibvirtError && e.status === 404) return false; throw e; }
}

export async function poolTarget(v: Virsh, pool: string): Promise<{ type: string; path: string | null }> {
  const p = parseXml<PoolDoc>(await v.run(['pool-dumpxml', checkName(pool, 'pool')])).pool;
  return { type: p['@_type'], path: text(p.target?.path) ?? null };
}

/** `prealloc`: qcow2 gets its metadata preallocated, raw its whole capacity allocated. */
export async function createVolume(v: Virsh, s: { pool: string; name: string; format: string; capacity: number; prealloc?: boolean }) {
  checkName(s.pool, 'pool'); checkName(s.name, 'name');
  if (await volumeExists(v, s.pool, s.name)) throw new LibvirtError(409, `volume ${s.name} already exists in pool ${s.pool}`, 'exists');
  // Without prealloc the volume is sparse (allocation 0), which also lets it shrink later.
  const pre = !s.prealloc ? ['--allocation', '0'] : s.format === 'qcow2' ? ['--prealloc-metadata'] : ['--allocation', String(s.capacity)];
  await v.run(['vol-create-as', s.pool, s.name, String(s.capacity), '--format', s.format, ...pre]);
  return volumeInfo(v, s.pool, s.name);
}

/** Within a pool with vol-clone; into another pool with vol-create-from (the new volume's XML built here). */
export async function cloneVolume(v: Virsh, s: { pool: string; source_volume: string; target_volume: string; target_pool?: string }) {
  const tp = s.target_pool || s.pool;
  checkName(s.pool, 'pool'); checkName(s.source_volume, 'source_volume'); checkName(s.target_volume, 'target_volume'); checkName(tp, 'target_pool');
  const src = await volumeInfo(v, s.pool, s.source_volume);
  if (await volumeExists(v, tp, s.target_volume)) throw new LibvirtError(409, `volume ${s.target_volume} already exists in pool ${tp}`, 'exists');
  if (tp === s.pool) await v.run(['vol-clone', '--pool', s.pool, s.source_volume, s.target_volume]);
  else {
    const doc = { volume: { name: s.target_volume, capacity: { '@_unit': 'bytes', '#text': String(src.capacity) },
      target: src.format ? { format: { '@_type': src.format } } : undefined } };
    await withXmlFile(buildXml(doc), (f) => v.run(['vol-create-from', tp, f, '--inputpool', s.pool, s.source_volume]));
  }
  return volumeInfo(v, tp, s.target_volume);
}

export async function resizeVolume(v: Virsh, s: { pool: string; volume: string; capacity: number; shrink?: boolean }) {
  const before = await volumeInfo(v, s.pool, s.volume);
  if (before.capacity !== null && s.capacity < before.capacity && !s.shrink) {
    throw fieldError(400, 'shrink', 'required to shrink',
      `capacity ${s.capacity} is below the volume's ${before.capacity} bytes: shrinking loses data, set shrink: true to do it`);
  }
  await v.run(['vol-resize', '--pool', s.pool, s.volume, String(s.capacity), ...(s.capacity < (before.capacity ?? 0) ? ['--shrink'] : [])]);
  return { ...(await volumeInfo(v, s.pool, s.volume)), previous_capacity: before.capacity };
}

export async function deleteVolume(v: Virsh, pool: string, volume: string) {
  const info = await volumeInfo(v, pool, volume);
  await v.run(['vol-delete', '--pool', pool, volume]);
  return { pool, volume, deleted: true, path: info.path };
}

export async function wipeVolume(v: Virsh, pool: string, volume: string, algorithm: string) {
  await volumeInfo(v, pool, volume);
  await v.run(['vol-wipe', '--pool', pool, volume, '--algorithm', algorithm], { timeoutMs: 3_600_000 });
  return { ...(await volumeInfo(v, pool, volume)), algorithm };
}

/** Fills a volume from a local image file: converted first (qemu-img, to a private temporary file) when its
 *  format differs from `format`. A missing volume is created with the upload's size. Direct copy into a local dir
 *  pool, `vol-upload` (libvirt's stream, works over any URI) otherwise. */
export async function uploadVolume(v: Virsh, body: { pool: string; volume: string; source_path: string; format?: string }) {
  checkName(body.pool, 'pool'); checkName(body.volume, 'volume');
  // Confined where it runs (the daemon, or a worker's virt_files job): to this machine's input roots.
  const s = { ...body, source_path: await confinePath(body.source_path, 'input', 'source_path') };
  // The header read by Ferry (its references confined, qemu-img told the format); a copy would resolve a
  // reference against the pool's folder, so an image that references files is only taken to be converted.
  const confined = await confineRequestImage({ field: 'source_path', path: s.source_path });
  const format = s.format || confined.format;
  if (confined.references.length && format === confined.format) throw fieldError(400, 'source_path',
    `${s.source_path} references ${confined.references[0]}; upload it into another format (format) or convert it first`);
  const src = await imageInfo(s.source_path, confined.format).catch((e: unknown) => { throw new ApiError(400, `source_path: ${errorText(e)}`); });
  let tmp: string | undefined;
  let file = s.source_path;
  try {
    if (format !== src.format) {
      tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'ferry-upload-'));
      file = path.join(tmp, `image.${format}`);
      await convert({ src: s.source_path, srcFormat: src.format, dest: file, destFormat: format }, noProgress);
    }
    const size = (await fs.stat(file)).size;
    await putFile(v, s.pool, s.volume, file, format, size);
    return { ...(await volumeInfo(v, s.pool, s.volume)), source_format: src.format, converted: format !== src.format };
  } finally {
    if (tmp) await fs.rm(tmp, { recursive: true, force: true });
  }
}

/** Copies `file` to `dest` in a local pool folder with cp itself (a reflink where the filesystem can, else
 *  copy_file_range, holes kept): Node's fs.copyFile took about 1.5x cp's time for the same 1 GiB here (bench:virt
 *  compares the whole import with a bare cp). A failed or aborted copy leaves no file behind. */
export async function copyIntoPool(file: string, dest: string, pool: string, signal?: AbortSignal) {
  let r;
  try { r = await run('cp', ['--reflink=auto', '--sparse=auto', '--', file, dest], { signal }); } catch (e) { await fs.rm(dest, { force: true }); throw e; }
  if (r.code !== 0) { await fs.rm(dest, { force: true }); throw new ApiError(500, `copying ${file} into pool ${pool} failed: ${r.stderr.trim()}`); }
}

/** Puts a file's bytes into a volume (created when missing). `known` saves round trips the caller has made:
 *  whether the volume exists, the pool's target (null: not a local one), and `refresh: false` when the caller
 *  refreshes the pool itself. */
export async function putFile(v: Virsh, pool: string, volume: string, file: string, format: string, size: number,
  known?: { exists: boolean; target?: { type: string; path: string | null } | null; refresh?: boolean }) {
  const target = known?.target !== undefined ? known.target : isLocalUri(v.uri) ? await poolTarget(v, pool) : undefined;
  const exists = known ? known.exists : await volumeExists(v, pool, volume);
  const refresh = known?.refresh !== false;
  if (target?.type === 'dir' && target.path) {
    // Copied straight into the pool folder, then the pool is refreshed.
    const dest = exists ? (await volumeInfo(v, pool, volume)).path! : path.join(target.path, volume);
    const part = path.join(path.dirname(dest), `.${volume}.ferry-partial`);
    await copyIntoPool(file, part, pool);
    await fs.rename(part, dest);
    if (refresh) await v.run(['pool-refresh', pool]);
    return;
  }
  if (!exists) await v.run(['vol-create-as', pool, volume, String(size), '--format', format]);
  await v.run(['vol-upload', '--pool', pool, volume, file], { timeoutMs: 6 * 3_600_000 });
  if (refresh) await v.run(['pool-refresh', pool]);
}

/** Copies a volume's bytes into a local file (vol-download: works over any URI). Without `pool`, `volume` is
 *  the volume's path or key. */
export async function downloadVolume(v: Virsh, pool: string, volume: string, file: string) {
  await v.run(['vol-download', ...(pool ? ['--pool', pool] : []), volume, file], { timeoutMs: 6 * 3_600_000 });
}

/** Makes sure a dir pool exists and is active (the pool Ferry manages for imports). */
export async function ensureDirPool(v: Virsh, pool: string, dir: string) {
  try { await v.run(['pool-uuid', checkName(pool, 'pool')]); } catch (e) {
    if (!(e instanceof LibvirtError && e.status === 404)) throw e;
    await withXmlFile(buildXml({ pool: { '@_type': 'dir', name: pool, target: { path: dir } } }), (f) => v.run(['pool-define', f]));
    await v.run(['pool-build', pool]).catch(expectedError('pool-build fails when the directory exists already; pool-start below says if the pool is unusable',
      { pool }));
    await v.run(['pool-autostart', pool]).catch(
      ignoreError('could not mark the pool autostart; Ferry starts it whenever it needs it, so only a libvirtd restart without Ferry leaves it stopped',
      { pool }));
  }
  const active = (await v.run(['pool-list', '--name'])).split('\n').map((s) => s.trim()).includes(pool);
  if (!active) await v.run(['pool-start', pool]);
}
