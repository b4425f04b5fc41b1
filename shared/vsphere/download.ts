// Datastore downloads (HTTP GET on the manager's /folder/<path>?dcPath=&dsName=) with N parallel streams across
// files and across byte ranges of one file, resumed with HTTP Range from the last byte written when a connection
// drops, and resumable by another process from the partial files (`<name>.ferry-part` plus a small state file
// beside it). sha256 is computed while the bytes arrive: chunks are fetched in order with a bounded window, so
// the hash follows the stream; only bytes written by an earlier process are read back (counted in the result).
import { createHash, Hash } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { request } from 'undici';
import type { Manager } from './client';
import { networkError, VsphereError } from './errors';
import { expectedError, ignoreError, awaitedLater } from '../log';

export interface RemoteFile {
  datastore: string;
  /** path inside the datastore */
  path: string;
  dcPath: string;
  size: number;
  /** where it goes (absolute) */
  local: string;
}

export interface FileProgress { name: string; bytes_downloaded: number; total_bytes: number; done: boolean }

export interface DownloadStats {
  bytes_downloaded: number;
  total_bytes: number;
  files_downloaded: number;
  total_files: number;
  current_file: string;
  files: FileProgress[];
}

export interface DownloadResult {
  files: { local: string; size: number; sha256: string; resumed_from: number }[];
  /** Range requests made to continue after a dropped connection. */
  resumes: number;
  /** Bytes received twice (a server that ignored a Range). */
  bytes_refetched: number;
  /** Bytes written by an earlier attempt, read back once to carry the checksum on. */
  bytes_rehashed: number;
}

export interface DownloadOptions {
  streams: number;
  /** Range size when a file is split across streams (FERRY_EXPORT_CHUNK_BYTES, default 8 MiB). */
  chunkBytes?: number;
  /** Attempts per range without progress before the download fails. */
  maxRetries?: number;
  retryDelayMs?: number;
  signal: AbortSignal;
  onProgress?: (s: DownloadStats) => void;
  /** Called when a file is complete under its final name (the caller records it for a later attempt). */
  onFile?: (f: { local: string; size: number; sha256: string }) => Promise<void> | void;
}

export const PART = '.ferry-part';
const STATE = '.ferry-part.json';
const WRITE_BATCH = 1 << 20;

export function folderUrl(m: Manager, f: { datastore: string; path: string; dcPath: string }): URL {
  const u = new URL(m.url.origin);
  u.pathname = '/folder/' + f.path.split('/').map(encodeURIComponent).join('/');
  u.searchParams.set('dcPath', f.dcPath);
  u.searchParams.set('dsName', f.datastore);
  return u;
}

const label = (f: { datastore: string; path: string }) => `[${f.datastore}] ${f.path}`;

/** Size of a datastore file (HEAD); not_found when the manager has no such file. */
export async function remoteSize(m: Manager, f: { datastore: string; path: string; dcPath: string }, signal?: AbortSignal): Promise<number> {
  const cookie = await m.sessionCookie();
  let res;
  try { res = await request(folderUrl(m, f), { method: 'HEAD', dispatcher: m.agent, headers: { cookie }, signal }); } catch (e) { throw networkError(e, m.name); }
  await res.body.dump();
  if (res.statusCode === 404) throw new VsphereError('not_found', `${label(f)} does not exist on vSphere manager ${m.name}`);
  if (res.statusCode === 401 || res.statusCode === 403) throw new VsphereError('auth', `vSphere manager ${m.name} refused access to ${label(f)} (HTTP ${res.statusCode})`);
  if (res.statusCode !== 200) throw new VsphereError('http', `HEAD ${label(f)} on vSphere manager ${m.name} answered HTTP ${res.statusCode}`);
  const n = Number(res.headers['content-length']);
  if (!Number.isFinite(n)) throw new VsphereError('http', `vSphere manager ${m.name} gave no size for ${label(f)}`);
  return n;
}

/** The first `n` bytes of a datastore file (descriptors are read whole this way). */
export async function remoteHead(m: Manager, f: { datastore: string; path: string; dcPath: string }, n: number, signal?: AbortSignal): Promise<Buffer> {
  const cookie = await m.sessionCookie();
  let res;
  try { res = await request(folderUrl(m, f), { method: 'GET', dispatcher: m.agent, headers: { cookie, range: `bytes=0-${n - 1}` }, signal }); } catch (e) { throw networkError(e, m.name); }
  if (res.statusCode === 404) { await res.body.dump(); throw new VsphereError('not_found', `${label(f)} does not exist on vSphere manager ${m.name}`); }
  if (res.statusCode !== 200 && res.statusCode !== 206) { await res.body.dump(); throw new VsphereError('http', `GET ${label(f)} on vSphere manager ${m.name} answered HTTP ${res.statusCode}`); }
  const chunks: Buffer[] = [];
  let got = 0;
  try {
    for await (const b of res.body) { chunks.push(b as Buffer); got += (b as Buffer).length; if (got >= n) break; }
  } catch (e) { throw networkError(e, m.name); } finally { res.body.destroy(); }
  return Buffer.concat(chunks).subarray(0, n);
}

interface FileJob {
  f: RemoteFile;
  name: string;
  chunk: number;
  chunks: number;
  written: number[];
  done: boolean[];
  fh?: fs.FileHandle;
  hash: Hash;
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

/** The buffers from byte `from` on (after a short writev). */
function sliceFrom(bufs: Buffer[], from: number): Buffer[] {
  const out: Buffer[] = [];
  let skip = from;
  for (const b of bufs) {
    if (skip >= b.length) { skip -= b.length; continue; }
    out.push(skip ? b.subarray(skip) : b);
    skip = 0;
  }
  return out;
}

const sleep = (ms: number, signal: AbortSignal) => new Promise<void>((resolve, reject) => {
  // abort() reasons are Errors here (an AbortError, or the failure that stopped the other streams)
  if (signal.aborted) { reject(signal.reason as Error); return; }
  const t = setTimeout(() => { signal.removeEventListener('abort', ab); resolve(); }, ms);
  const ab = () => { clearTimeout(t); reject(signal.reason as Error); };
  signal.addEventListener('abort', ab, { once: true });
});

async function readRange(fh: fs.FileHandle, start: number, len: number, each: (b: Buffer) => void) {
  for (let off = 0; off < len; off += WRITE_BATCH) {
    const n = Math.min(WRITE_BATCH, len - off);
    const b = Buffer.allocUnsafe(n);
    const { bytesRead } = await fh.read(b, 0, n, start + off);
    if (bytesRead !== n) throw new Error('partial file is shorter than its state says');
    each(b);
  }
}

/** Downloads every file; returns their checksums. Files already complete (same size, state recorded by the
 *  caller) are not passed in. On abort every stream stops; the caller decides whether partial files stay. */
export async function downloadFiles(m: Manager, files: RemoteFile[], opts: DownloadOptions): Promise<DownloadResult> {
  let o = opts;
  const streams = Math.max(1, o.streams);
  const chunkBytes = o.chunkBytes ?? Number(process.env.FERRY_EXPORT_CHUNK_BYTES || 8 * 1024 * 1024);
  const maxRetries = o.maxRetries ?? Number(process.env.FERRY_EXPORT_RETRIES || 5);
  const retryDelay = o.retryDelayMs ?? 500;
  const window = streams * 2;
  // One failed stream stops the others at once; the caller's signal stops them all.
  const ac = new AbortController();
  const outer = o.signal;
  const relay = () => ac.abort(outer.reason);
  if (outer.aborted) relay(); else outer.addEventListener('abort', relay, { once: true });
  o = { ...o, signal: ac.signal };
  const result: DownloadResult = { files: [], resumes: 0, bytes_refetched: 0, bytes_rehashed: 0 };
  const jobs: FileJob[] = [];
  for (const f of files) {
    // One stream: one range per file (a plain sequential GET). Several: ranges of chunkBytes.
    const chunk = streams === 1 ? Math.max(1, f.size) : Math.max(64 * 1024, chunkBytes);
    const chunks = Math.max(1, Math.ceil(f.size / chunk));
    const j: FileJob = { f, name: path.basename(f.local), chunk, chunks, written: new Array(chunks).fill(0), done: new Array(chunks).fill(false), hash: createHash('sha256'), frontier: 0, pending: new Map(), rehash: new Set(), bytes: 0, resumedFrom: 0, finished: false, stateDirty: false, lock: Promise.resolve() };
    await fs.mkdir(path.dirname(f.local), { recursive: true });
    // Continue from a partial file an earlier attempt left, when it describes the same remote file.
    try {
      const st = JSON.parse(await fs.readFile(f.local + STATE, 'utf8'));
      await fs.stat(f.local + PART);
      if (st.size === f.size && st.source === label(f)) {
        // Progress is kept per byte, so a different range size is mapped onto this one's ranges.
        const runs: [number, number][] = st.runs;
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
    } catch { /* no usable partial file: start from zero */ }
    j.bytes = j.resumedFrom;
    j.fh = await fs.open(f.local + PART, j.resumedFrom > 0 ? 'r+' : 'w');
    jobs.push(j);
  }

  const total = files.reduce((a, f) => a + f.size, 0);
  let current = jobs[0]?.name ?? '';
  const stats = (): DownloadStats => ({
    bytes_downloaded: jobs.reduce((a, j) => a + j.bytes, 0), total_bytes: total,
    files_downloaded: jobs.filter((j) => j.finished).length, total_files: jobs.length, current_file: current,
    files: jobs.map((j) => ({ name: j.name, bytes_downloaded: j.bytes, total_bytes: j.f.size, done: j.finished })),
  });
  const report = () => o.onProgress?.(stats());

  async function saveState(j: FileJob) {
    // Contiguous runs of written bytes; written to a temporary name and renamed, so it is never half-written.
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
  const saver = setInterval(() => { for (const j of jobs) if (j.stateDirty && !j.finished) void saveState(j).catch(ignoreError('could not save the download\'s resume state; it is saved again next second and at the end (a missed save only costs a longer resume)')); }, 1000);

  /** Feeds the hash in file order: the frontier range directly, later ranges buffered until it reaches them. */
  function feed(j: FileJob, idx: number, b: Buffer) {
    if (idx === j.frontier) j.hash.update(b);
    else { let p = j.pending.get(idx); if (!p) j.pending.set(idx, (p = [])); p.push(b); }
  }
  /** Moves the frontier over finished ranges (one caller at a time per file); a range an earlier attempt
   *  finished is read back from disk once. */
  function advance(j: FileJob): Promise<void> {
    j.lock = j.lock.then(async () => {
      while (j.frontier < j.chunks && j.done[j.frontier]) {
        const i = j.frontier;
        if (j.rehash.has(i)) {
          j.rehash.delete(i);
          await readRange(j.fh!, i * j.chunk, j.written[i], (b) => j.hash.update(b));
          result.bytes_rehashed += j.written[i];
        }
        j.frontier++;
        const p = j.pending.get(j.frontier);
        if (p) { for (const b of p) j.hash.update(b); j.pending.delete(j.frontier); }
      }
    });
    return j.lock;
  }

  // Work list: ranges in file order; a stream takes the next range within the hash window of its file.
  const queue: { j: FileJob; i: number }[] = [];
  for (const j of jobs) for (let i = 0; i < j.chunks; i++) if (!j.done[i]) queue.push({ j, i });
  let failure: Error | undefined;
  const waiters: (() => void)[] = [];
  const wakeAll = () => { for (const w of waiters.splice(0)) w(); };

  async function finishFile(j: FileJob) {
    await advance(j);
    if (j.finished || j.frontier !== j.chunks) return;
    j.finished = true;
    j.sha256 = j.hash.digest('hex');
    await j.fh!.sync();
    await j.fh!.close();
    j.fh = undefined;
    const st = await fs.stat(j.f.local + PART);
    if (st.size !== j.f.size) throw new VsphereError('http', `${label(j.f)}: wrote ${st.size} bytes, expected ${j.f.size}`);
    await fs.rename(j.f.local + PART, j.f.local);
    await fs.rm(j.f.local + STATE, { force: true });
    result.files.push({ local: j.f.local, size: j.f.size, sha256: j.sha256, resumed_from: j.resumedFrom });
    await o.onFile?.({ local: j.f.local, size: j.f.size, sha256: j.sha256 });
    report();
  }

  async function fetchRange(j: FileJob, i: number) {
    const start = i * j.chunk;
    const end = Math.min(j.f.size, start + j.chunk);
    let pos = start + j.written[i];
    // A range with a prefix from an earlier attempt: that prefix goes into the hash first (read once from disk).
    if (j.rehash.has(i)) {
      j.rehash.delete(i);
      await readRange(j.fh!, start, j.written[i], (b) => feed(j, i, b));
      result.bytes_rehashed += j.written[i];
    }
    let failures = 0;
    while (pos < end) {
      if (o.signal.aborted) throw o.signal.reason;
      const before = pos;
      try {
        const cookie = await m.sessionCookie();
        const res = await request(folderUrl(m, j.f), { method: 'GET', dispatcher: m.agent, headers: { cookie, range: `bytes=${pos}-${end - 1}` }, signal: o.signal });
        if (res.statusCode === 404) { await res.body.dump(); throw new VsphereError('not_found', `${label(j.f)} does not exist on vSphere manager ${m.name}`); }
        if (res.statusCode === 401 || res.statusCode === 403) { await res.body.dump(); throw new VsphereError('auth', `vSphere manager ${m.name} refused access to ${label(j.f)} (HTTP ${res.statusCode})`); }
        let skip = 0;
        if (res.statusCode === 200) skip = pos; // the server ignored the range: drop what we already have
        else if (res.statusCode !== 206) { await res.body.dump(); throw new VsphereError('http', `GET ${label(j.f)} on vSphere manager ${m.name} answered HTTP ${res.statusCode}`); }
        // Received bytes are hashed at once (in order) and written in batches with one write in flight, so the
        // next bytes arrive while the previous batch goes to disk. `pos` counts bytes on disk: a retry starts there.
        let batch: Buffer[] = [];
        let batchLen = 0;
        let queued = pos;
        let inflight: Promise<void> = Promise.resolve();
        const flush = async () => {
          if (!batchLen) return;
          const bufs = batch;
          const n = batchLen;
          const at = queued;
          batch = []; batchLen = 0; queued += n;
          for (const b of bufs) feed(j, i, b);
          await inflight;
          const write = (async () => {
            for (let w = 0; w < n;) w += (await j.fh!.writev(w === 0 ? bufs : sliceFrom(bufs, w), at + w)).bytesWritten;
            pos = at + n;
            j.written[i] += n;
            j.bytes += n;
            j.stateDirty = true;
            current = j.name;
            report();
          })();
          inflight = awaitedLater(write);
        };
        try {
          for await (const raw of res.body) {
            let b = raw as Buffer;
            if (skip) { const s = Math.min(skip, b.length); skip -= s; result.bytes_refetched += s; b = b.subarray(s); if (!b.length) continue; }
            const room = end - queued - batchLen;
            if (b.length > room) b = b.subarray(0, room);
            batch.push(b); batchLen += b.length;
            if (batchLen >= WRITE_BATCH) await flush();
            if (queued + batchLen >= end) break;
          }
        } finally {
          try { await flush(); await inflight; } finally { res.body.destroy(); }
        }
        if (pos < end) throw new VsphereError('http', `the connection to vSphere manager ${m.name} closed ${end - pos} bytes early in ${label(j.f)}`);
      } catch (e) {
        if (o.signal.aborted) throw o.signal.reason;
        const err = e instanceof VsphereError ? e : networkError(e, m.name);
        if (!err.retryable) throw err;
        if (pos > before) failures = 0;
        if (++failures > maxRetries) throw new VsphereError(err.kind, `${err.message} (gave up on ${label(j.f)} after ${maxRetries} retries at byte ${pos} of ${j.f.size})`);
        if (pos < end) result.resumes++;
        await sleep(retryDelay * Math.min(8, failures), o.signal);
      }
    }
    j.done[i] = true;
    j.stateDirty = true;
    await finishFile(j);
  }

  async function stream() {
    while (!failure) {
      if (o.signal.aborted) throw o.signal.reason;
      const k = queue.findIndex((q) => q.i < q.j.frontier + window);
      if (k < 0) {
        if (!queue.length) return;
        await new Promise<void>((r) => waiters.push(r)); // every runnable range is beyond its hash window
        continue;
      }
      const [{ j, i }] = queue.splice(k, 1);
      try { await fetchRange(j, i); } finally { wakeAll(); }
    }
  }

  try {
    // Files with nothing left to fetch (all ranges done earlier) are finished at once.
    for (const j of jobs) await finishFile(j);
    o.signal.addEventListener('abort', wakeAll, { once: true });
    const runners = Array.from({ length: streams }, () => stream().catch((e) => {
      if (!failure && !outer.aborted) { failure = e instanceof Error ? e : new Error(String(e)); ac.abort(failure); }
      wakeAll();
    }));
    await Promise.all(runners);
    if (outer.aborted) throw outer.reason;
    if (failure) throw failure;
    return result;
  } finally {
    outer.removeEventListener('abort', relay);
    clearInterval(saver);
    for (const j of jobs) {
      if (j.fh) {
        if (!j.finished) await saveState(j).catch(ignoreError('could not save the resume state of an unfinished file; the next attempt downloads that file again'));
        await j.fh.close().catch(expectedError('closing after a failed download: the download error is the one reported'));
      }
    }
  }
}

/** Removes a file's partial download (part file and state). */
export async function removePartial(local: string) {
  await Promise.all([fs.rm(local + PART, { force: true }), fs.rm(local + STATE, { force: true }), fs.rm(local + STATE + '.tmp', { force: true })]);
}
