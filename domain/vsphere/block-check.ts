// The block check around a one-pass disk's merge (docs/pipeline.md, one pass, "Integrity"): blocks of the volume
// re-hashed from disk and compared with the block hash list taken while the bytes streamed (block-hash.ts).
// The hashing runs in worker threads, one per lane, each reading its blocks in pieces of CHUNK into one buffer:
// a piece still in the CPU's cache when it is hashed costs a fifth of the kernel time a whole block read at once
// did (8 GiB: 1.0-1.3 s of system time against 5.3 s), and the lanes hash on every core, off the event loop.
// The volume was written past the page cache (direct-sink.ts), so it is read past it too (O_DIRECT, into a
// page-aligned WebAssembly memory): read through the cache, every page would be a new one to fill and drop.
import { promises as fs } from 'node:fs';
import os from 'node:os';
import { Worker } from 'node:worker_threads';
import { OperationError } from '../../platform/errors';
import { imageMap } from '../qemu';
import { zeroHash, type BlockHashes } from './block-hash';

const CHUNK = 4 << 20;

/** One lane: hashes its [block, start, length] entries in order, posting [block, sha256] for each, until the
 *  shared stop flag is set (then it closes its file and ends: a terminated thread would leave the fd open). Plain
 *  CommonJS evaluated by the worker (no loader needed, the same under tsx and in the build). */
const LANE = `
const { parentPort, workerData } = require('node:worker_threads');
const fs = require('node:fs');
const { createHash } = require('node:crypto');
const { file, blocks, chunk, stop } = workerData;
let fd;
let align = 1;
try { fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_DIRECT); align = 4096; } catch { fd = fs.openSync(file, 'r'); }
const buf = align > 1 ? Buffer.from(new WebAssembly.Memory({ initial: chunk / 65536 }).buffer) : Buffer.allocUnsafe(chunk);
try {
  lane: for (const [i, start, len] of blocks) {
    const h = createHash('sha256');
    for (let off = 0; off < len;) {
      if (Atomics.load(stop, 0)) break lane;
      const want = Math.min(chunk, len - off);
      const n = Math.min(want, fs.readSync(fd, buf, 0, Math.ceil(want / align) * align, start + off));
      if (!n) break;
      h.update(buf.subarray(0, n));
      off += n;
    }
    parentPort.postMessage([i, h.digest('hex')]);
  }
} finally { fs.closeSync(fd); }
`;

/** Whether any of `ranges` (sorted, apart, as qemu-img map gives them) meets [start, end): a binary search, since a
 *  fragmented thin disk has many thousands of ranges and the check asks once per block. */
function holdsData(ranges: { start: number; end: number }[], start: number, end: number): boolean {
  let lo = 0;
  let hi = ranges.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (ranges[mid].end <= start) lo = mid + 1; else hi = mid; }
  return lo < ranges.length && ranges[lo].start < end;
}

/** The ranges of a raw file that hold data (`qemu-img map`, SEEK_DATA underneath); everything else is a hole and
 *  reads as zeros. */
async function dataRanges(file: string, signal?: AbortSignal): Promise<{ start: number; end: number }[]> {
  return (await imageMap(file, 'raw', signal)).filter((e) => e.data).map((e) => ({ start: e.start, end: e.start + e.length }));
}

type Entry = [block: number, start: number, len: number];

/** The sha256 of each entry of `file`, by block, hashed in `lanes` worker threads; `each` sees every hash as it
 *  comes, and an error it returns stops every lane and is thrown. The signal stops them too. */
async function hashInLanes(file: string, entries: Entry[], each: (block: number, sha256: string) => Error | undefined, signal?: AbortSignal): Promise<void> {
  if (!entries.length) return;
  const lanes = Math.max(1, Math.min(os.availableParallelism(), entries.length));
  const stop = new Int32Array(new SharedArrayBuffer(4));
  const stopAll = () => Atomics.store(stop, 0, 1);
  const workers = Array.from({ length: lanes }, (_, k) => new Worker(LANE, { eval: true,
    workerData: { file, chunk: CHUNK, stop, blocks: entries.filter((_, n) => n % lanes === k) } }));
  const exited = workers.map((w) => new Promise<void>((resolve) => w.once('exit', () => resolve())));
  signal?.addEventListener('abort', stopAll, { once: true });
  try {
    await Promise.all(workers.map((w, k) => new Promise<void>((resolve, reject) => {
      w.on('message', ([i, sha]: [number, string]) => { const bad = each(i, sha); if (bad) { stopAll(); reject(bad); } });
      w.on('error', (e) => { stopAll(); reject(e); });
      void exited[k].then(() => (signal?.aborted ? reject(signal.reason as Error) : resolve()));
    })));
  } finally {
    // Settled, not raced: every lane has closed its file before the caller goes on (a commit, a removal).
    stopAll();
    signal?.removeEventListener('abort', stopAll);
    await Promise.all(exited);
  }
}

/** Re-hashes the given blocks of `volume` (raw, disk order) and fails naming a block that differs from the list. A
 *  block that lies wholly in a hole of the volume is all zeros without reading it (on a thin 2 TB disk most blocks
 *  are), so it is compared with the hash of zeros. Returns how many bytes were read. */
export async function checkBlocks(volume: string, list: BlockHashes, which: number[], when: string, signal?: AbortSignal): Promise<number> {
  const size = (await fs.stat(volume)).size;
  const data = await dataRanges(volume, signal);
  const fail = (i: number, got: string) => {
    const at = `${volume}: block ${i} (bytes ${i * list.block_bytes}-${(i + 1) * list.block_bytes - 1})`;
    return new OperationError(`${at} ${when} has sha256 ${got}, the bytes as served had ${list.sha256[i]}`, false);
  };
  const read: Entry[] = [];
  for (const i of which) {
    const start = i * list.block_bytes;
    const len = Math.max(0, Math.min(list.block_bytes, size - start));
    if (holdsData(data, start, start + len)) read.push([i, start, len]);
    else if (zeroHash(len) !== list.sha256[i]) throw fail(i, zeroHash(len));
  }
  await hashInLanes(volume, read, (i, sha) => (sha !== list.sha256[i] ? fail(i, sha) : undefined), signal);
  return read.reduce((a, [, , len]) => a + len, 0);
}
