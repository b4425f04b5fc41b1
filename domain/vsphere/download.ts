// Datastore downloads (HTTP GET on the manager's /folder/<path>?dcPath=&dsName=) with N parallel streams across
// files and across byte ranges of one file, resumed with HTTP Range from the last byte written when a connection
// drops, and resumable by another process from the partial files (`<name>.ferry-part` plus a small state file
// beside it; download-file.ts). sha256 is computed while the bytes arrive: chunks are fetched in order with a
// bounded window, so the hash follows the stream; only bytes written by an earlier process are read back (counted
// in the result). A Download is one call of downloadFiles: its streams take ranges from one work list.
import { promises as fs } from 'node:fs';
import { request } from 'undici';
import type { Manager } from './client';
import { networkError, VsphereError } from './errors';
import { ignoreError, awaitedLater } from '../../platform/log';
import { feed, FileJob, label, openFile, RemoteFile, saveState, writeAt, PART, STATE } from './download-file';
import { setting } from '../../platform/settings';
import type { BlockHashes } from './block-hash';

export { PART, removePartial } from './download-file';
export type { RemoteFile } from './download-file';

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
  /** `sha256` of the whole file, except a one-pass target's (`blocks` is its record: block-hash.ts) */
  files: { local: string; size: number; sha256?: string; resumed_from: number; target?: string; blocks?: BlockHashes }[];
  /** Range requests made to continue after a dropped connection. */
  resumes: number;
  /** Bytes received twice (a server that ignored a Range). */
  bytes_refetched: number;
  /** Bytes written by an earlier attempt, read back once to carry the checksum on. */
  bytes_rehashed: number;
  /** Bytes of zeros served for a target (RemoteFile.target) and left as holes, never written. */
  bytes_sparse: number;
  /** Bytes received from the manager and written by this call (a ranged delta's cost). */
  bytes_fetched: number;
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
  onFile?: (f: { local: string; size: number; sha256?: string; target?: string; blocks?: BlockHashes }) => Promise<void> | void;
}

export function folderUrl(m: Manager, f: { datastore: string; path: string; dcPath: string }): URL {
  const u = new URL(m.url.origin);
  u.pathname = '/folder/' + f.path.split('/').map(encodeURIComponent).join('/');
  u.searchParams.set('dcPath', f.dcPath);
  u.searchParams.set('dsName', f.datastore);
  return u;
}

/** Size of a datastore file (HEAD); not_found when the manager has no such file. */
export async function remoteSize(m: Manager, f: { datastore: string; path: string; dcPath: string }, signal?: AbortSignal): Promise<number> {
  const cookie = await m.sessionCookie();
  let res;
  try { res = await request(folderUrl(m, f), { method: 'HEAD', dispatcher: m.agent, headers: { cookie }, signal }); } catch (e) {
    throw networkError(e, m.name); }
  await res.body.dump();
  if (res.statusCode === 404) throw new VsphereError('not_found', `${label(f)} does not exist on vSphere manager ${m.name}`);
  if (res.statusCode === 401 || res.statusCode === 403) throw new VsphereError('auth',
    `vSphere manager ${m.name} refused access to ${label(f)} (HTTP ${res.statusCode})`);
  if (res.statusCode !== 200) throw new VsphereError('http', `HEAD ${label(f)} on vSphere manager ${m.name} answered HTTP ${res.statusCode}`);
  const n = Number(res.headers['content-length']);
  if (!Number.isFinite(n)) throw new VsphereError('http', `vSphere manager ${m.name} gave no size for ${label(f)}`);
  return n;
}

/** The first `n` bytes of a datastore file (descriptors are read whole this way). */
export async function remoteHead(m: Manager, f: { datastore: string; path: string; dcPath: string }, n: number, signal?: AbortSignal): Promise<Buffer> {
  const cookie = await m.sessionCookie();
  let res;
  try { res = await request(folderUrl(m, f), { method: 'GET', dispatcher: m.agent, headers: { cookie, range: `bytes=0-${n - 1}` }, signal }); } catch (e) {
    throw networkError(e, m.name); }
  if (res.statusCode === 404) { await res.body.dump(); throw new VsphereError('not_found', `${label(f)} does not exist on vSphere manager ${m.name}`); }
  if (res.statusCode !== 200 && res.statusCode !== 206) { await res.body.dump(); throw new VsphereError('http',
    `GET ${label(f)} on vSphere manager ${m.name} answered HTTP ${res.statusCode}`); }
  const chunks: Buffer[] = [];
  let got = 0;
  try {
    for await (const b of res.body) { chunks.push(b as Buffer); got += (b as Buffer).length; if (got >= n) break; }
  } catch (e) { throw networkError(e, m.name); } finally { res.body.destroy(); }
  return Buffer.concat(chunks).subarray(0, n);
}

const sleep = (ms: number, signal: AbortSignal) => new Promise<void>((resolve, reject) => {
  if (signal.aborted) { reject(signal.reason as Error); return; }
  const t = setTimeout(() => { signal.removeEventListener('abort', ab); resolve(); }, ms);
  const ab = () => { clearTimeout(t); reject(signal.reason as Error); };
  signal.addEventListener('abort', ab, { once: true });
});

interface Settings { streams: number; chunkBytes: number; maxRetries: number; retryDelay: number; window: number }

function settingsOf(o: DownloadOptions): Settings {
  const streams = Math.max(1, o.streams);
  return {
    streams,
    chunkBytes: o.chunkBytes ?? setting('FERRY_EXPORT_CHUNK_BYTES'),
    maxRetries: o.maxRetries ?? setting('FERRY_EXPORT_RETRIES'),
    retryDelay: o.retryDelayMs ?? 500,
    window: streams * 2,
  };
}

/** Where one GET of a range stands: `pos` counts the bytes on disk (a retry starts there). */
interface RangeCursor { j: FileJob; i: number; pos: number; end: number }

class Download {
  readonly result: DownloadResult = { files: [], resumes: 0, bytes_refetched: 0, bytes_rehashed: 0, bytes_sparse: 0, bytes_fetched: 0 };
  jobs: FileJob[] = [];
  /** Work list: ranges in file order; a stream takes the next range within the hash window of its file. */
  private queue: { j: FileJob; i: number }[] = [];
  private waiters: (() => void)[] = [];
  failure: Error | undefined;
  private current = '';
  private total = 0;

  /** `signal` stops every stream: the caller's, relayed, or the first failure's. */
  constructor(private m: Manager, private o: DownloadOptions, private s: Settings, readonly signal: AbortSignal) {}

  async open(files: RemoteFile[]) {
    for (const f of files) this.jobs.push(await openFile(f, this.s.streams, this.s.chunkBytes));
    this.total = files.reduce((a, f) => a + f.size, 0);
    this.current = this.jobs[0]?.name ?? '';
    for (const j of this.jobs) for (let i = 0; i < j.chunks; i++) if (!j.done[i]) this.queue.push({ j, i });
  }

  report() {
    const jobs = this.jobs;
    this.o.onProgress?.({
      bytes_downloaded: jobs.reduce((a, j) => a + j.bytes, 0), total_bytes: this.total,
      files_downloaded: jobs.filter((j) => j.finished).length, total_files: jobs.length, current_file: this.current,
      files: jobs.map((j) => ({ name: j.name, bytes_downloaded: j.bytes, total_bytes: j.f.size, done: j.finished })),
    });
  }

  wakeAll = () => { for (const w of this.waiters.splice(0)) w(); };

  /** Moves the frontier over finished ranges (one caller at a time per file); a range an earlier attempt
   *  finished is read back from disk once. */
  private advance(j: FileJob): Promise<void> {
    j.lock = j.lock.then(async () => {
      while (j.frontier < j.chunks && j.done[j.frontier]) {
        const i = j.frontier;
        if (j.rehash.has(i)) {
          j.rehash.delete(i);
          await j.fh!.read(i * j.chunk, j.written[i], (b) => j.hash.update(b));
          this.result.bytes_rehashed += j.written[i];
        }
        j.frontier++;
        const p = j.pending.get(j.frontier);
        if (p) { for (const b of p) j.hash.update(b); j.pending.delete(j.frontier); }
      }
    });
    return j.lock;
  }

  /** A file whose every range is hashed: checked for size, renamed to its final name, reported. */
  async finishFile(j: FileJob) {
    await this.advance(j);
    if (j.finished || j.frontier !== j.chunks) return;
    j.finished = true;
    j.sha256 = j.hash.digest('hex');
    const size = await j.fh!.finish();
    j.fh = undefined;
    if (size !== j.f.size) throw new VsphereError('http', `${label(j.f)}: wrote ${size} bytes, expected ${j.f.size}`);
    // A target is already where it belongs; a partial file takes its final name.
    if (!j.f.target) await fs.rename(j.f.local + PART, j.f.local);
    await fs.rm(j.f.local + STATE, { force: true });
    const target = j.f.target ? { target: j.f.target, blocks: { block_bytes: j.hash.blockBytes, sha256: j.hash.blocks } } : {};
    const sum = j.sha256 ? { sha256: j.sha256 } : {};
    this.result.files.push({ local: j.f.local, size: j.f.size, ...sum, resumed_from: j.resumedFrom, ...target });
    await this.o.onFile?.({ local: j.f.local, size: j.f.size, ...sum, ...target });
    this.report();
  }

  /** One range, retried from the last byte on disk while the failure is retryable and bytes keep coming. */
  private async fetchRange(j: FileJob, i: number) {
    const start = i * j.chunk;
    const c: RangeCursor = { j, i, pos: start + j.written[i], end: Math.min(j.f.size, start + j.chunk) };
    // A range with a prefix from an earlier attempt: that prefix goes into the hash first (read once from disk).
    if (j.rehash.has(i)) {
      j.rehash.delete(i);
      await j.fh!.read(start, j.written[i], (b) => feed(j, i, b));
      this.result.bytes_rehashed += j.written[i];
    }
    let failures = 0;
    while (c.pos < c.end) {
      if (this.signal.aborted) throw this.signal.reason;
      const before = c.pos;
      try {
        await this.getOnce(c);
      } catch (e) {
        if (this.signal.aborted) throw this.signal.reason;
        const err = e instanceof VsphereError ? e : networkError(e, this.m.name);
        if (!err.retryable) throw err;
        if (c.pos > before) failures = 0;
        if (++failures > this.s.maxRetries) throw new VsphereError(err.kind,
          `${err.message} (gave up on ${label(j.f)} after ${this.s.maxRetries} retries at byte ${c.pos} of ${j.f.size})`);
        if (c.pos < c.end) this.result.resumes++;
        await sleep(this.s.retryDelay * Math.min(8, failures), this.signal);
      }
    }
    j.done[i] = true;
    j.stateDirty = true;
    await this.finishFile(j);
  }

  /** One GET of the rest of a range; an answer other than 206 (or 200, a server that ignored the range) fails. */
  private async getOnce(c: RangeCursor) {
    const { m } = this;
    const f = c.j.f;
    const cookie = await m.sessionCookie();
    const res = await request(folderUrl(m, f), { method: 'GET', dispatcher: m.agent, headers: { cookie, range: `bytes=${c.pos}-${c.end - 1}` },
      signal: this.signal });
    if (res.statusCode === 404) { await res.body.dump(); throw new VsphereError('not_found', `${label(f)} does not exist on vSphere manager ${m.name}`); }
    if (res.statusCode === 401 || res.statusCode === 403) { await res.body.dump(); throw new VsphereError('auth',
      `vSphere manager ${m.name} refused access to ${label(f)} (HTTP ${res.statusCode})`); }
    if (res.statusCode !== 200 && res.statusCode !== 206) { await res.body.dump(); throw new VsphereError('http',
      `GET ${label(f)} on vSphere manager ${m.name} answered HTTP ${res.statusCode}`); }
    // 200: the server ignored the range: drop what we already have.
    await this.write(c, res.body, res.statusCode === 200 ? c.pos : 0);
    if (c.pos < c.end) throw new VsphereError('http', `the connection to vSphere manager ${m.name} closed ${c.end - c.pos} bytes early in ${label(f)}`);
  }

  /** Received bytes are written in batches with one write in flight, so the next bytes arrive while the previous
   *  batch goes to disk, and each batch is hashed (in order) once it is written. `c.pos` moves as each batch is on
   *  disk. */
  private async write(c: RangeCursor, body: AsyncIterable<unknown> & { destroy(): void }, skip: number) {
    const { j, i, end } = c;
    let batch: Buffer[] = [];
    let batchLen = 0;
    let queued = c.pos;
    let inflight: Promise<void> = Promise.resolve();
    const flush = async () => {
      if (!batchLen) return;
      const bufs = batch;
      const n = batchLen;
      const at = queued;
      batch = []; batchLen = 0; queued += n;
      await inflight;
      const write = (async () => {
        this.result.bytes_sparse += await writeAt(j.fh!, bufs, at, !!j.f.target && !j.f.ranges);
        // Hashed once written: a write that fails is fetched again from c.pos, and must not be hashed twice.
        for (const b of bufs) feed(j, i, b);
        this.result.bytes_fetched += n;
        c.pos = at + n;
        j.written[i] += n;
        j.bytes += n;
        j.stateDirty = true;
        this.current = j.name;
        this.report();
      })();
      void awaitedLater(write);
      inflight = write;
    };
    try {
      for await (const raw of body) {
        let b = raw as Buffer;
        if (skip) { const s = Math.min(skip, b.length); skip -= s; this.result.bytes_refetched += s; b = b.subarray(s); if (!b.length) continue; }
        const room = end - queued - batchLen;
        if (b.length > room) b = b.subarray(0, room);
        batch.push(b); batchLen += b.length;
        if (batchLen >= j.batch) await flush();
        if (queued + batchLen >= end) break;
      }
    } finally {
      try { await flush(); await inflight; } finally { body.destroy(); }
    }
  }

  /** One stream: takes ranges until none is left or another stream failed. */
  async stream() {
    while (!this.failure) {
      if (this.signal.aborted) throw this.signal.reason;
      const k = this.queue.findIndex((q) => q.i < q.j.frontier + this.s.window);
      if (k < 0) {
        if (!this.queue.length) return;
        await new Promise<void>((r) => this.waiters.push(r)); // every runnable range is beyond its hash window
        continue;
      }
      const [{ j, i }] = this.queue.splice(k, 1);
      try { await this.fetchRange(j, i); } finally { this.wakeAll(); }
    }
  }

  /** Every few moments the state of unfinished files, so another process can continue them. */
  saveStates() {
    for (const j of this.jobs) if (j.stateDirty && !j.finished) void saveState(j).catch(
      ignoreError('resume state is saved again next second and at the end; a missed save only costs a longer resume'));
  }

  /** After success or failure: the state of each unfinished file saved, every file closed. */
  async closeFiles() {
    for (const j of this.jobs) {
      if (!j.fh) continue;
      if (!j.finished) await saveState(j).catch(ignoreError('resume state of an unfinished file: without it the next attempt downloads the file again'));
      await j.fh.close().catch(ignoreError('closing after a failed download: the download error is the one reported'));
    }
  }
}

/** Downloads every file; returns their checksums. Files already complete (same size, state recorded by the
 *  caller) are not passed in. On abort every stream stops; the caller decides whether partial files stay. */
export async function downloadFiles(m: Manager, files: RemoteFile[], opts: DownloadOptions): Promise<DownloadResult> {
  const s = settingsOf(opts);
  // One failed stream stops the others at once; the caller's signal stops them all.
  const ac = new AbortController();
  const outer = opts.signal;
  const relay = () => ac.abort(outer.reason);
  if (outer.aborted) relay(); else outer.addEventListener('abort', relay, { once: true });
  const d = new Download(m, opts, s, ac.signal);
  const saver = setInterval(() => d.saveStates(), 1000);
  try {
    await d.open(files);
    // Files with nothing left to fetch (all ranges done earlier) are finished at once.
    for (const j of d.jobs) await d.finishFile(j);
    ac.signal.addEventListener('abort', d.wakeAll, { once: true });
    const runners = Array.from({ length: s.streams }, () => d.stream().catch((e: unknown) => {
      // stream() fails with Errors only (VsphereErrors, fs and network errors)
      if (!d.failure && !outer.aborted) { d.failure = e as Error; ac.abort(e); }
      d.wakeAll();
    }));
    await Promise.all(runners);
    if (outer.aborted) throw outer.reason as Error;
    if (d.failure) throw d.failure;
    return d.result;
  } finally {
    outer.removeEventListener('abort', relay);
    clearInterval(saver);
    await d.closeFiles();
  }
}
