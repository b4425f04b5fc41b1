// One file of a datastore download on disk: its ranges, the partial file (`<name>.ferry-part`) and the state file
// beside it that lets another process continue, and the sha256 fed in file order. download.ts schedules the ranges.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { setting } from '../../platform/settings';
import { StreamHash, allZero } from './block-hash';
import { directWriter, openDirect, slice } from './direct-sink';

export interface RemoteFile {
  datastore: string;
  /** path inside the datastore */
  path: string;
  dcPath: string;
  size: number;
  /** where it goes (absolute); with `target`, where its resume state is kept */
  local: string;
  /** One pass (docs/pipeline.md): the bytes are written in place into this file (a target volume, already made and
   *  recorded by the caller) at their own offsets, zero runs left as holes, instead of into `<local>.ferry-part`. */
  target?: string;
  /** A delta round of warm migration (cbt.ts): only the ranges of these byte ranges [start, end) are fetched,
   *  into `target`, which already holds the earlier rounds (never truncated); zeros are written, not skipped,
   *  since they replace older data. The sha256 then covers the fetched ranges only, in file order. */
  ranges?: [number, number][];
  /** A target on another host (one pass onto a remote libvirt host): where the bytes go instead of a local file,
   *  opened by the caller (a volume's upload lanes, domain/libvirt/volume-stream.ts). `target` then names the
   *  volume and is never opened here. */
  remote?: { uri: string; open: () => Promise<Sink> };
}

/** Where a file's bytes go: a local file (the partial file, or a target volume in a local pool) or a volume on
 *  another host. */
export interface Sink {
  /** `bufs` back to back from byte `at` */
  writev(bufs: Buffer[], at: number): Promise<void>;
  /** `len` bytes from `start`, handed to `each` in order */
  read(start: number, len: number, each: (b: Buffer) => void): Promise<void>;
  /** flushed and closed: its size in bytes */
  finish(): Promise<number>;
  close(): Promise<void>;
}

/** A local file as a Sink; with `direct` (a one-pass target's O_DIRECT descriptor, direct-sink.ts) its writes go
 *  past the page cache. */
function fileSink(fh: fs.FileHandle, file: string, direct?: fs.FileHandle): Sink {
  const plain = (bufs: Buffer[], at: number) => writeRun(fh, bufs, at);
  const closeAll = async () => { await direct?.close(); await fh.close(); };
  return {
    writev: direct ? directWriter(file, direct, plain) : plain,
    read: (start, len, each) => readRange(fh, start, len, each),
    finish: async () => { await fh.sync(); await closeAll(); return (await fs.stat(file)).size; },
    close: closeAll,
  };
}

/** The file a download writes its bytes into: the target volume, or the partial file renamed at the end. */
export const dataPath = (f: RemoteFile) => f.target ?? f.local + PART;

export const PART = '.ferry-part';
export const STATE = '.ferry-part.json';
export const WRITE_BATCH = 1 << 20;
/** A remote target's write (one `vol-upload` each, about 17 ms of round trips on a local socket): 8 MiB pieces keep
 *  that under a fiftieth of the copy. */
export const REMOTE_WRITE_BATCH = 8 << 20;

export const label = (f: { datastore: string; path: string }) => `[${f.datastore}] ${f.path}`;

export interface FileJob {
  f: RemoteFile;
  name: string;
  chunk: number;
  chunks: number;
  written: number[];
  done: boolean[];
  fh?: Sink;
  /** bytes gathered before each write: a remote target's every write is a round trip, so its pieces are larger */
  batch: number;
  /** with a target, the block hash list (block-hash.ts), and no whole-file sha256 unless it fetches `ranges` */
  hash: StreamHash;
  /** first chunk not yet hashed, and the bytes of it already hashed */
  frontier: number;
  pending: Map<number, Buffer[]>;
  rehash: Set<number>;
  bytes: number;
  resumedFrom: number;
  finished: boolean;
  sha256?: string;
  stateDirty: boolean;
  lock: Promise<void>;
}

/** Continues from a partial file an earlier attempt left, when its state describes the same remote file.
 *  Progress is kept per byte, so a different range size is mapped onto this one's ranges. */
async function resume(j: FileJob) {
  const { f, chunk, chunks } = j;
  let st: { size?: number; source?: string; runs?: [number, number][] };
  try {
    st = JSON.parse(await fs.readFile(f.local + STATE, 'utf8')) as typeof st; // checked field by field below
    // A remote target's volume is made (or found, this job's own) by the caller before the download starts.
    if (!f.remote) await fs.stat(dataPath(f));
  } catch {
    return; // no usable partial file: start from zero
  }
  if (st.size !== f.size || st.source !== label(f) || !Array.isArray(st.runs)) return;
  const runs = st.runs;
  for (let i = 0; i < chunks; i++) {
    const s = i * chunk;
    const run = runs.find(([a, b]) => a <= s && s < b);
    const have = run ? Math.min(run[1], Math.min(f.size, s + chunk)) - s : 0;
    j.written[i] = have;
    if (s + have >= Math.min(f.size, s + chunk)) j.done[i] = true;
    if (have > 0) j.rehash.add(i);
  }
  j.resumedFrom = j.written.reduce((a, b) => a + b, 0);
}

/** A file's ranges, resumed from its partial file when one fits, with the partial file open for writing.
 *  One stream: one range per file (a plain sequential GET). Several: ranges of chunkBytes. */
export async function openFile(f: RemoteFile, streams: number, chunkBytes: number): Promise<FileJob> {
  if (f.ranges && !f.target) throw new Error(`${label(f)}: a ranged download writes into an existing target`);
  const chunk = streams === 1 && !f.ranges ? Math.max(1, f.size) : Math.max(64 * 1024, chunkBytes);
  const chunks = Math.max(1, Math.ceil(f.size / chunk));
  const j: FileJob = { f, name: path.basename(f.local), chunk, chunks, batch: f.remote ? REMOTE_WRITE_BATCH : WRITE_BATCH,
    written: new Array<number>(chunks).fill(0), done: new Array<boolean>(chunks).fill(false),
    hash: new StreamHash(f.target ? setting('FERRY_ONE_PASS_BLOCK_BYTES') : 0, !f.target || !!f.ranges),
    frontier: 0, pending: new Map(), rehash: new Set(), bytes: 0, resumedFrom: 0,
    finished: false, stateDirty: false, lock: Promise.resolve() };
  await fs.mkdir(path.dirname(f.local), { recursive: true });
  await resume(j);
  j.bytes = j.resumedFrom;
  if (f.ranges) skipOutside(j, f.ranges);
  if (f.remote) { j.fh = await f.remote.open(); return j; }
  const fh = await fs.open(dataPath(f), j.resumedFrom > 0 || f.ranges ? 'r+' : 'w');
  j.fh = fileSink(fh, dataPath(f), f.target ? await openDirect(f.target) : undefined);
  // A target starts at its full size with no block allocated: what the download skips (zeros) stays a hole.
  if (f.target && j.resumedFrom === 0 && !f.ranges) await fh.truncate(f.size);
  return j;
}

/** A ranged download: every range of the file that meets none of `ranges` counts as done, nothing to fetch. */
function skipOutside(j: FileJob, ranges: [number, number][]) {
  for (let i = 0; i < j.chunks; i++) {
    const s = i * j.chunk;
    const e = Math.min(j.f.size, s + j.chunk);
    if (!j.done[i] && !ranges.some(([a, b]) => a < e && s < b)) { j.done[i] = true; j.written[i] = e - s; }
  }
}

/** Contiguous runs of written bytes; written to a temporary name and renamed, so it is never half-written. */
export async function saveState(j: FileJob) {
  const runs: [number, number][] = [];
  for (let i = 0; i < j.chunks; i++) {
    const s = i * j.chunk;
    if (j.written[i] > 0) {
      const last = runs[runs.length - 1];
      if (last && last[1] === s) last[1] = s + j.written[i]; else runs.push([s, s + j.written[i]]);
    }
  }
  const tmp = j.f.local + STATE + '.tmp';
  await fs.writeFile(tmp, JSON.stringify({ source: label(j.f), size: j.f.size, runs }));
  await fs.rename(tmp, j.f.local + STATE);
  j.stateDirty = false;
}

/** Feeds the hash in file order: the frontier range directly, later ranges buffered until it reaches them. */
export function feed(j: FileJob, idx: number, b: Buffer) {
  if (idx === j.frontier) j.hash.update(b);
  else { let p = j.pending.get(idx); if (!p) j.pending.set(idx, (p = [])); p.push(b); }
}

/** `len` bytes of the partial file from `start`, in batches. */
export async function readRange(fh: fs.FileHandle, start: number, len: number, each: (b: Buffer) => void) {
  for (let off = 0; off < len; off += WRITE_BATCH) {
    const n = Math.min(WRITE_BATCH, len - off);
    const b = Buffer.allocUnsafe(n);
    const { bytesRead } = await fh.read(b, 0, n, start + off);
    if (bytesRead !== n) throw new Error('partial file is shorter than its state says');
    each(b);
  }
}

/** Writes `bufs` at `at`; with `holes`, each buffer of zeros is skipped (left a hole in a sparse target).
 *  Each run of buffers between holes goes down in one writev: one call into libuv's pool per run, not per
 *  received piece (TLS hands over 16 KiB at a time; a call each cost the event loop ~10 s per 8 GiB).
 *  Returns the bytes skipped. */
export async function writeAt(fh: Sink, bufs: Buffer[], at: number, holes: boolean): Promise<number> {
  if (!holes) { await fh.writev(bufs, at); return 0; }
  let off = at;
  let skipped = 0;
  let run: Buffer[] = [];
  let runAt = at;
  for (const b of bufs) {
    if (allZero(b)) {
      if (run.length) await fh.writev(run, runAt);
      run = [];
      skipped += b.length;
    } else {
      if (!run.length) runAt = off;
      run.push(b);
    }
    off += b.length;
  }
  if (run.length) await fh.writev(run, runAt);
  return skipped;
}

/** `bufs` written back to back from `at`, continued after a short writev. */
async function writeRun(fh: fs.FileHandle, bufs: Buffer[], at: number) {
  const n = bufs.reduce((a, b) => a + b.length, 0);
  for (let w = 0; w < n;) w += (await fh.writev(w === 0 ? bufs : slice(bufs, w, n - w), at + w)).bytesWritten;
}

/** Removes a file's partial download (part file and state). */
export async function removePartial(local: string) {
  await Promise.all([fs.rm(local + PART, { force: true }), fs.rm(local + STATE, { force: true }), fs.rm(local + STATE + '.tmp', { force: true })]);
}
