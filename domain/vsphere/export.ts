// Exports a VM from a vSphere manager into a directory: power state handled as asked, CD-ROMs removed when
// asked, every file of every disk (descriptors, extents, snapshot delta chains) downloaded from the datastore
// with parallel, resumable streams and their sha256, then an artifact manifest (manifest seed, validated by
// domain/schemas/manifest.ts) that a `migrate` job or ferry-convert takes next. Used by the worker's export
// operation, the export stage of a migration job, and `ferry-convert command: manager_export`.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { sha256File } from '../qemu';
import { confineImage, ImageRefused } from '../image-confine';
import { Manager, managerFor, ManagerCredentials } from './client';
import { VsphereError } from './errors';
import { powerOff, removeCdroms, shutdownGuest, waitPoweredOff } from './actions';
import { fingerprint, watchSource } from './source-watch';
import { vmDetail, VmDetail } from './inventory';
import { downloadFiles, DownloadStats, PART, remoteHead, remoteSize, removePartial, RemoteFile } from './download';
import { DescriptorInfo, parseDatastorePath, resolveSibling, SNIFF_BYTES, sniffVmdk } from './vmdk';

import type { PowerOption } from './options';
import { createLogger, ignoreError } from '../../platform/log';
import { resolveReal } from '../../platform/roots';
import { buildManifest, MANIFEST_FILE, PlannedDisk, sha256Of, writeManifest } from './export-manifest';
import type { BlockHashes } from './block-hash';

const log = createLogger('vsphere');

export { osHint, MANIFEST_FILE } from './export-manifest';

export interface ExportRequest {
  creds: ManagerCredentials;
  vmPath: string;
  outputDir: string;
  /** Identifies the export in its state file, so a retry continues and another export does not overwrite it. */
  exportId: string;
  parallel: number;
  removeCdrom?: boolean;
  /** What to do with a running VM: refuse (default), guest shutdown then wait, or a forced power-off. */
  powerOff?: PowerOption;
  shutdownTimeoutSeconds?: number;
  signal: AbortSignal;
  /** Which files this export created, kept where the files themselves cannot rewrite it (a worker: the job's
   *  record). Without one (the command-line tool) the state file on disk is believed. */
  ledger?: ExportLedger;
  onProgress?: (p: ExportProgress) => void;
  /** Changes made to the source VM, as they happen (the job's history records them). */
  onAction?: (message: string) => void | Promise<void>;
  /** One pass (a migration job): after the plan, before any byte moves. Sets `extent.target` on the disks whose
   *  bytes go straight into a volume, `fallback` on the others, and refuses what does not fit (it throws). It gets
   *  the manager and the VM too: the repair beside the copy starts there, reading the source while it is copied. */
  place?: (disks: PlannedDisk[], source: { manager: Manager; vm: VmDetail }) => Promise<void>;
}

export interface ExportProgress extends DownloadStats {
  phase: 'preparing' | 'exporting' | 'writing_manifest';
  percent_complete: number;
  rate_bytes_per_second: number;
  eta_seconds: number | null;
}

export const STATE_FILE = '.ferry-export.json';

/** `planned`: the files the export meant to write (a state file of an older Ferry has none). */
interface ExportState { export_id: string; vm_path: string; files: Record<string, FileSum>; planned?: string[] }
/** A finished file's checksum; a one-pass target's block hash list (block-hash.ts) instead. */
type FileSum = { size: number; sha256?: string; blocks?: BlockHashes };

/** The files an export created (absolute paths): the only ones it resumes, replaces or removes. */
export interface ExportLedger {
  owned(): Promise<Set<string>>;
  /** Called before any of `paths` is written. */
  add(paths: string[]): Promise<void>;
}

const insideDir = (dir: string, p: string) => { const r = path.relative(dir, p); return !!r && !r.startsWith('..') && !path.isAbsolute(r); };

/** The command-line tool's ledger: its own state file (the tool runs with its user's rights, over its own
 *  folder), and only paths inside the output folder. */
function stateLedger(outputDir: string, exportId: string): ExportLedger {
  return {
    owned: async () => {
      const st = await readState(outputDir);
      if (!st || st.export_id !== exportId) return new Set();
      const listed = [...Object.keys(st.files || {}), ...(st.planned || [])].filter((p) => typeof p === 'string' && insideDir(outputDir, p));
      return new Set([...listed, ...ownFiles(outputDir)]);
    },
    add: () => Promise.resolve(), // the state file written next records them
  };
}

/** The export's own files beside the disks: state file and manifest (with their temporary names). */
const ownFiles = (dir: string) => [STATE_FILE, `${STATE_FILE}.tmp`, MANIFEST_FILE, `${MANIFEST_FILE}.tmp`].map((n) => path.join(dir, n));

/** Refuses a path whose real location (symlinks in its folders followed) is not inside the real output folder. */
async function confined(outputDir: string, p: string): Promise<void> {
  const realDir = await fs.realpath(outputDir);
  const real = (await resolveReal(path.dirname(p))).real;
  if (real !== realDir && !insideDir(realDir, real)) throw new VsphereError('state',
    `${p} would be written outside the output folder ${outputDir} (its folder resolves to ${real})`);
}

async function readState(dir: string): Promise<ExportState | null> {
  // The state file is Ferry's own (written by writeState); owned() still checks each path it lists.
  try { return JSON.parse(await fs.readFile(path.join(dir, STATE_FILE), 'utf8')) as ExportState; } catch { return null; }
}
async function writeState(dir: string, st: ExportState) {
  const tmp = path.join(dir, `${STATE_FILE}.tmp`);
  await fs.writeFile(tmp, JSON.stringify(st, null, 1));
  await fs.rename(tmp, path.join(dir, STATE_FILE));
}

/** Where a datastore file goes: <output>/<datastore>/<path>, so descriptors find their extents and parents by
 *  the same relative names; a path that would leave the output directory is refused. */
function localPath(outputDir: string, ds: string, p: string): string {
  const segs = [ds, ...p.split('/')].filter((s) => s && s !== '.');
  if (segs.some((s) => s === '..' || s.includes('\0'))) throw new VsphereError('state', `datastore path [${ds}] ${p} leaves the output directory`);
  return path.join(outputDir, ...segs);
}

/** Every file each disk needs: the chain from the VM's configuration (top first), extended by parent hints in
 *  the descriptors, and each descriptor's extents. */
async function plan(m: ReturnType<typeof managerFor>, d: VmDetail, outputDir: string, signal: AbortSignal, warnings: string[]): Promise<PlannedDisk[]> {
  const dcPath = d.datacenter;
  const seen = new Map<string, RemoteFile>();
  const add = async (ds: string, p: string): Promise<RemoteFile> => {
    const key = `[${ds}] ${p}`;
    let f = seen.get(key);
    if (!f) {
      f = { datastore: ds, path: p, dcPath, size: await remoteSize(m, { datastore: ds, path: p, dcPath }, signal), local: localPath(outputDir, ds, p) };
      seen.set(key, f);
    }
    return f;
  };
  const out: PlannedDisk[] = [];
  for (const disk of d.disks) {
    const files: RemoteFile[] = [];
    const chain = disk.chain.map(parseDatastorePath);
    let top: RemoteFile | undefined;
    let topInfo: DescriptorInfo | undefined;
    const topExtents: RemoteFile[] = [];
    for (let i = 0; i < chain.length && i < 256; i++) {
      const c = chain[i];
      const f = await add(c.datastore, c.path);
      top ??= f;
      if (!files.includes(f)) files.push(f);
      const info = sniffVmdk(await remoteHead(m, f, Math.min(SNIFF_BYTES, Math.max(1, f.size)), signal));
      topInfo ??= info;
      if (info.kind === 'other') warnings.push(
        `disk ${disk.label}: [${c.datastore}] ${c.path} is neither a VMDK descriptor nor a sparse VMDK; exported as it is`);
      for (const e of info.extents) {
        const x = resolveSibling(c, e.file);
        const xf = await add(x.datastore, x.path);
        if (i === 0) topExtents.push(xf);
        if (!files.includes(xf)) files.push(xf);
      }
      if (info.parentHint) {
        const parent = resolveSibling(c, info.parentHint);
        if (!chain.some((q) => q.datastore === parent.datastore && q.path === parent.path)) chain.push(parent);
      }
    }
    if (!top || !topInfo) throw new VsphereError('state', `disk ${disk.label} of ${d.path} has no backing file`);
    out.push({ disk, top, files, chainLength: chain.length, ...flatExtent(chain.length, topInfo, topExtents, disk.capacity_bytes) });
  }
  return out;
}

/** Whether one pass can take a disk (docs/pipeline.md): no parent, and one flat extent whose bytes are the
 *  disk's, byte for byte. Anything else (a snapshot delta, a sparse VMDK's grains, several extents) is named. */
function flatExtent(chainLength: number, info: DescriptorInfo, extents: RemoteFile[], capacity: number): { extent: RemoteFile } | { fallback: string } {
  if (chainLength > 1) return { fallback: `a snapshot delta chain of ${chainLength} files: its bytes are the merge of the chain` };
  if (info.kind === 'sparse') return { fallback: 'a sparse VMDK: its bytes are grains behind a grain table, not the disk in order' };
  if (info.kind !== 'text') return { fallback: 'not a VMDK descriptor Ferry reads' };
  const e = info.extents;
  if (e.length !== 1) return { fallback: `${e.length} extents (${info.createType ?? 'unknown createType'})` };
  if (e[0].offset) return { fallback: `its flat extent starts at sector ${e[0].offset} of its file` };
  if (!/^(FLAT|VMFS)$/.test(e[0].type)) return {
    fallback: `a ${e[0].type} extent (${info.createType ?? 'unknown createType'}): only a flat extent is the disk in order` };
  const x = extents[0];
  if (e[0].sectors * 512 !== capacity ||
    x.size !== capacity) return { fallback: `its flat extent holds ${x.size} bytes (${e[0].sectors} sectors) for a disk of ${capacity} bytes` };
  return { extent: x };
}

export interface ExportResult {
  manifest_path: string;
  manifest: Record<string, unknown>;
  vm_path: string;
  /** `target`: the volume a one-pass file was written into (`path` is then where its resume state was kept; no
   *  `sha256`: its record is the manifest's block hash list) */
  files: { path: string; bytes: number; sha256?: string; target?: string }[];
  total_bytes: number;
  streams: number;
  resumes: number;
  bytes_refetched: number;
  bytes_rehashed: number;
  bytes_reused: number;
  /** zeros served for one-pass volumes and left as holes */
  bytes_sparse: number;
  actions: string[];
  warnings: string[];
  seconds: number;
}

/** Removes what an export created (cancel, or output undone): the files its ledger names inside its output
 *  folder, with their partial downloads, then the folders they leave empty. Whatever a file on disk says, nothing
 *  else is touched. */
export async function removeExportOutput(outputDir: string, ledger: ExportLedger) {
  const dirs = new Set<string>();
  for (const local of await ledger.owned()) {
    if (!insideDir(outputDir, local)) continue;
    const ok = await confined(outputDir, local).then(() => true, ignoreError(
      'a downloaded file whose folder now leads out of the output folder is left in place, not removed', { local }));
    if (!ok) continue;
    await fs.rm(local, { force: true });
    await removePartial(local);
    dirs.add(path.dirname(local));
  }
  // Deepest first; a folder still holding anything (another file, another export) stops the climb.
  for (const d of [...dirs].sort((x, y) => y.length - x.length)) {
    for (let x = d; insideDir(outputDir, x); x = path.dirname(x)) if (!(await fs.rmdir(x).then(() => true, () => false))) break;
  }
}

const partialExists = async (local: string) => !!(await fs.lstat(local + PART).catch(() => null) || await fs.lstat(`${local}${PART}.json`).catch(() => null));

/** The VM as the export needs it: powered off as options.power_off says (or refused while running), CD-ROMs
 *  removed when asked, with at least one disk. */
async function prepareVm(m: Manager, r: ExportRequest, act: (msg: string) => Promise<void>): Promise<VmDetail> {
  let d = await vmDetail(m, r.vmPath);
  if (d.power_state !== 'poweredOff') {
    const how = r.powerOff ?? 'none';
    if (how === 'none') {
      throw new VsphereError('state',
        `${r.vmPath} is ${d.power_state}: Ferry exports only a powered-off VM, because its disks change while it runs. Power it off first, or set ` +
        `options.power_off to "shutdown" (guest shutdown, then wait) or "force" (immediate power-off)`);
    }
    if (how === 'shutdown' && d.power_state === 'poweredOn') {
      await shutdownGuest(m, r.vmPath);
      await act(`asked the guest of ${r.vmPath} to shut down (options.power_off=shutdown)`);
      await waitPoweredOff(m, d.moref, r.vmPath, (r.shutdownTimeoutSeconds ?? 300) * 1000, r.signal);
      await act(`${r.vmPath} powered off after its guest shutdown`);
    } else {
      await powerOff(m, r.vmPath, r.signal);
      await act(`powered off ${r.vmPath} (options.power_off=${how}; it was ${d.power_state})`);
    }
    d = await vmDetail(m, r.vmPath);
  }
  if (r.removeCdrom) {
    const removed = await removeCdroms(m, r.vmPath, r.signal);
    if (removed.length) await act(`removed CD-ROM device(s) ${removed.join(', ')} from ${r.vmPath} (options.remove_cdrom)`);
  }
  if (!d.disks.length) throw new VsphereError('state', `${r.vmPath} has no virtual disks to export`);
  return d;
}

type Sums = Map<string, FileSum>;

/** What a downloaded file's record keeps: its size, and its sha256 or (one pass) its block hash list. */
const fileSum = (f: { size: number; sha256?: string; blocks?: BlockHashes }): FileSum =>
  ({ size: f.size, ...sha256Of(f), ...(f.blocks ? { blocks: f.blocks } : {}) });

/** A volume on another host is not a local file: complete when this export recorded its block hash list (its size
 *  is libvirt's, checked when its download finished); else it is resumed. */
function remoteClaim(f: RemoteFile, mine: boolean, prev: ExportState | null): FileSum | 'fetch' {
  const rec = prev?.files?.[f.local];
  return mine && rec?.size === f.size && rec.blocks ? rec : 'fetch';
}

/** One planned file against the ledger (`mine`) and the state file: complete (its checksum), to be fetched, or
 *  refused because it belongs to someone else. */
async function claimFile(r: ExportRequest, f: RemoteFile, mine: boolean, prev: ExportState | null): Promise<FileSum | 'fetch'> {
  const rec = prev?.files?.[f.local];
  const st = await fs.lstat(f.target ?? f.local).catch(() => null);
  // A target (one pass) is complete when this export recorded its checksum; else it is resumed or rewritten.
  // (A record of an older Ferry, without the block hash list, is not complete: the target is fetched again.)
  if (f.target && !(mine && rec?.size === f.size && rec.blocks && st?.size === f.size)) return 'fetch';
  if (st && mine && st.isFile() && st.size === f.size) {
    // Complete from an earlier attempt; one that died before recording it has its checksum read back once.
    return rec && rec.size === f.size ? rec : { size: f.size, sha256: await sha256File(f.local, undefined, r.signal) };
  }
  if (st) throw new VsphereError('state', `${f.local} already exists and is not part of this export; remove it or choose another output_path`);
  if (!mine && await partialExists(f.local)) throw new VsphereError('state',
    `${f.local} has a partial download (${PART}) that this export did not start; remove it or choose another output_path`);
  return 'fetch';
}

/** Which planned files this export may write, and which are complete already. Only what the ledger says this
 *  export created is continued or replaced: a file, a partial download or a state file it did not create
 *  belongs to someone else and is neither resumed nor removed. New files enter the ledger before any is written. */
async function claimFiles(r: ExportRequest, all: RemoteFile[]) {
  for (const f of all) await confined(r.outputDir, f.local);
  const ledger = r.ledger ?? stateLedger(r.outputDir, r.exportId);
  const owned = await ledger.owned();
  const prev = await readState(r.outputDir);
  if (prev && !owned.has(path.join(r.outputDir, STATE_FILE))) {
    throw new VsphereError('state', `${r.outputDir} holds another export (${STATE_FILE}); remove it or choose another output_path`);
  }
  const state: ExportState & { planned: string[] } = { export_id: r.exportId, vm_path: r.vmPath, files: {}, planned: all.map((f) => f.local) };
  const have: Sums = new Map();
  const fresh: string[] = [];
  for (const f of all) {
    const mine = owned.has(f.local);
    const got = f.remote ? remoteClaim(f, mine, prev) : await claimFile(r, f, mine, prev);
    if (got !== 'fetch') { state.files[f.local] = got; have.set(f.local, got); } else if (!mine) fresh.push(f.local);
  }
  await ledger.add([...fresh, ...ownFiles(r.outputDir).filter((p) => !owned.has(p))]);
  await writeState(r.outputDir, state);
  return { state, have, reused: all.filter((f) => have.has(f.local)).reduce((a, f) => a + f.size, 0) };
}

type Emit = (p: Partial<ExportProgress> & { phase: ExportProgress['phase'] }) => void;

/** Progress over all files (the complete ones included): a rate smoothed with an exponential moving average, and
 *  the ETA from it. */
function exportProgress(emit: Emit, all: RemoteFile[], have: Sums, reused: number) {
  let rate = 0;
  let lastT = Date.now();
  let lastB = 0;
  const totalBytes = all.reduce((a, f) => a + f.size, 0);
  const complete = all.filter((f) => have.has(f.local)).map((f) => ({ name: path.basename(f.local), bytes_downloaded: f.size, total_bytes: f.size,
    done: true }));
  return (s: DownloadStats) => {
    const now = Date.now();
    const b = s.bytes_downloaded + reused;
    if (now - lastT >= 250) {
      const inst = ((b - lastB) * 1000) / (now - lastT);
      rate = rate ? rate * 0.7 + inst * 0.3 : inst;
      lastT = now; lastB = b;
    }
    emit({
      ...s, phase: 'exporting', bytes_downloaded: b, total_bytes: totalBytes, files_downloaded: s.files_downloaded + have.size, total_files: all.length,
      files: [...complete, ...s.files],
      percent_complete: totalBytes ? Math.min(100, (b / totalBytes) * 100) : 100,
      rate_bytes_per_second: Math.round(rate), eta_seconds: rate > 0 ? Math.round((totalBytes - b) / rate) : null,
    });
  };
}

/** Downloads what is missing, each finished file recorded in the state file; the checksums of every file. */
async function download(m: Manager, r: ExportRequest, d: VmDetail, todo: RemoteFile[], claim: Awaited<ReturnType<typeof claimFiles>>,
  onProgress: (s: DownloadStats) => void) {
  const { state } = claim;
  let stateWrite = Promise.resolve();
  // From here the source must stay as it is now (source-watch.ts): a change fails the VM with the reason.
  const watch = watchSource(m, r.vmPath, fingerprint(d), r.signal, log);
  const dl = await downloadFiles(m, todo, {
    streams: r.parallel, signal: watch.signal, onProgress,
    onFile: (f) => {
      state.files[f.local] = fileSum(f);
      stateWrite = stateWrite.then(() => writeState(r.outputDir, state)).catch(
        ignoreError('could not write the export state; it is written again after the next file and at the end (a missed write only costs a longer resume)'));
      return stateWrite;
    },
  }).catch((e) => { watch.stop(); throw watch.changed ? watch.signal.reason : e; });
  await watch.final();
  await stateWrite;
  const sums: Sums = new Map(claim.have);
  for (const f of dl.files) sums.set(f.local, fileSum(f));
  return { dl, sums };
}

/** Each disk as downloaded, read by Ferry before anything converts it: its extents and parent chain must lie in
 *  this export's own folder (docs/security.md, the image rule); a descriptor naming anything else fails here. */
async function checkDisks(outputDir: string, disks: PlannedDisk[]) {
  const own = { input: [await fs.realpath(outputDir)], output: [] };
  // A one-pass disk's descriptor is read by Ferry alone (plan); no tool opens it, its bytes are in the volume.
  for (const x of disks.filter((y) => !y.extent?.target)) {
    await confineImage(x.top.local, undefined, own).catch((e) => { throw e instanceof ImageRefused ? new VsphereError('state',
      `disk ${x.disk.label}: ${e.message}`) : e; });
  }
}

export async function exportVm(r: ExportRequest): Promise<ExportResult> {
  const t0 = Date.now();
  const m = managerFor(r.creds);
  const actions: string[] = [];
  const warnings: string[] = [];
  const act = async (msg: string) => { actions.push(msg); await r.onAction?.(msg); };
  const emit: Emit = (p) => r.onProgress?.({
    bytes_downloaded: 0, total_bytes: 0, files_downloaded: 0, total_files: 0, current_file: '', files: [], percent_complete: 0, rate_bytes_per_second: 0,
    eta_seconds: null, ...p,
  });
  emit({ phase: 'preparing' });
  const d = await prepareVm(m, r, act);
  await fs.mkdir(r.outputDir, { recursive: true });
  const disks = await plan(m, d, r.outputDir, r.signal, warnings);
  await r.place?.(disks, { manager: m, vm: d });
  const all = [...new Set(disks.flatMap((x) => x.files))];
  const claim = await claimFiles(r, all);
  const todo = all.filter((f) => !claim.have.has(f.local));
  const { dl, sums } = await download(m, r, d, todo, claim, exportProgress(emit, all, claim.have, claim.reused));
  await checkDisks(r.outputDir, disks);

  const totalBytes = all.reduce((a, f) => a + f.size, 0);
  emit({ phase: 'writing_manifest', bytes_downloaded: totalBytes, total_bytes: totalBytes, files_downloaded: all.length, total_files: all.length,
    percent_complete: 100 });
  if (d.snapshots.length) warnings.push(
    `${r.vmPath} has snapshots: each disk is exported as its chain of delta files (current state); the conversion flattens the chain`);
  const notes = [
    `exported ${all.length} file(s), ${totalBytes} bytes, from ${r.vmPath} on ${m.name} with ${r.parallel} stream(s)`,
    ...actions,
    ...(dl.resumes ? [`${dl.resumes} dropped connection(s) resumed with HTTP Range`] : []),
    ...(claim.reused ? [`${claim.reused} bytes were complete from an earlier attempt`] : []),
  ];
  const manifest = buildManifest({ d, disks, sums, notes, warnings, exportId: r.exportId });
  const mp = await writeManifest(r.outputDir, manifest);
  return {
    manifest_path: mp, manifest, vm_path: r.vmPath,
    files: all.map((f) => ({ path: f.local, bytes: f.size, ...sha256Of(sums.get(f.local)!), ...(f.target ? { target: f.target } : {}) })),
    total_bytes: totalBytes, streams: r.parallel, resumes: dl.resumes, bytes_refetched: dl.bytes_refetched, bytes_rehashed: dl.bytes_rehashed,
    bytes_reused: claim.reused, bytes_sparse: dl.bytes_sparse, actions, warnings, seconds: (Date.now() - t0) / 1000,
  };
}
