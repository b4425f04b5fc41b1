// The block hash list of a one-pass disk (docs/pipeline.md, one pass, "Integrity"): besides the sha256 of the whole
// disk, the sha256 of each block of FERRY_ONE_PASS_BLOCK_BYTES of the bytes as the datastore served them, fed in disk
// order while they stream. The repair changes some blocks of the volume, so after its merge the whole-disk sha256
// cannot match by design; the list can: every block the repair did not write must still hash as served, and the
// ones it wrote are checked before the merge (the volume then still holds the bytes as served). A user recomputes
// any entry with `dd if=<source flat extent> bs=<block_bytes> skip=<i> count=1 | sha256sum`.
import { createHash, webcrypto, type Hash } from 'node:crypto';
import { promises as fs } from 'node:fs';
import { OperationError } from '../../platform/errors';
import { run as runTool, QEMU_IMG } from '../qemu';

/** The manifest's record of a disk's blocks: `sha256[i]` covers bytes [i*block_bytes, (i+1)*block_bytes). */
export interface BlockHashes { block_bytes: number; sha256: string[] }

const ZEROS = Buffer.alloc(4 << 20);
/** Whether a buffer holds only zero bytes (memcmp against zeros, a slice at a time). */
export function allZero(b: Buffer): boolean {
  for (let i = 0; i < b.length; i += ZEROS.length) {
    if (!b.subarray(i, i + ZEROS.length).equals(ZEROS.subarray(0, Math.min(ZEROS.length, b.length - i)))) return false;
  }
  return true;
}

/** `len` zero bytes, handed to `each` a slice at a time. */
function eachZeros(len: number, each: (b: Buffer) => void): void {
  for (let i = 0; i < len; i += ZEROS.length) each(ZEROS.subarray(0, Math.min(ZEROS.length, len - i)));
}

/** Whether any of `ranges` (sorted, apart, as qemu-img map gives them) meets [start, end): a binary search, since a
 *  fragmented thin disk has many thousands of ranges and the check asks once per block. */
function holdsData(ranges: { start: number; end: number }[], start: number, end: number): boolean {
  let lo = 0;
  let hi = ranges.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (ranges[mid].end <= start) lo = mid + 1; else hi = mid; }
  return lo < ranges.length && ranges[lo].start < end;
}

const zeroHashes = new Map<number, string>();
/** The sha256 of `len` zero bytes (a block that is all zeros), computed once per length. */
function zeroHash(len: number): string {
  let h = zeroHashes.get(len);
  if (!h) {
    const z = createHash('sha256');
    eachZeros(len, (x) => z.update(x));
    zeroHashes.set(len, (h = z.digest('hex')));
  }
  return h;
}

/** A sha256 of a byte stream (with `whole`), and with `blockBytes` > 0 the sha256 of each block of it (the last
 *  may be short). A one-pass disk keeps the list only: the whole-disk sha256 is one serial pass over every byte,
 *  zeros included (1.7 GB/s with SHA-NI, a third of that without: below a 10 GbE link), and on 2 cores it cost
 *  7 s of CPU per 12 GiB beside the repair; the list proves the same and its blocks hash independently. */
export class StreamHash {
  private whole: Hash | undefined;
  private cur: Hash | undefined;
  private curLen = 0;
  readonly blocks: string[] = [];
  constructor(readonly blockBytes = 0, whole = true) {
    if (whole) this.whole = createHash('sha256');
  }

  update(b: Buffer): this {
    this.whole?.update(b);
    // A block that has been all zeros so far is only counted (a thin disk's holes are most of it): its hash is
    // the hash of zeros, or its zeros are fed once data arrives in it.
    const zero = this.blockBytes > 0 && allZero(b);
    for (let off = 0; this.blockBytes && off < b.length;) {
      const n = Math.min(b.length - off, this.blockBytes - this.curLen);
      if (!zero || this.cur) {
        if (!this.cur) {
          const h = (this.cur = createHash('sha256'));
          eachZeros(this.curLen, (z) => h.update(z));
        }
        this.cur.update(b.subarray(off, off + n));
      }
      this.curLen += n;
      off += n;
      if (this.curLen === this.blockBytes) this.closeBlock();
    }
    return this;
  }

  private closeBlock() {
    this.blocks.push(this.cur ? this.cur.digest('hex') : zeroHash(this.curLen));
    this.cur = undefined;
    this.curLen = 0;
  }

  /** The whole stream's sha256, when it was kept; closes the last block. */
  digest(enc: 'hex'): string | undefined {
    if (this.curLen) this.closeBlock();
    return this.whole?.digest(enc);
  }
}

/** The blocks an overlay (qcow2 over the volume) holds data or zeros for: exactly what the repair wrote, from
 *  `qemu-img map` (depth 0 is the overlay itself; deeper entries are its backing file). */
export async function blocksWritten(overlay: string, blockBytes: number, signal?: AbortSignal): Promise<Set<number>> {
  const r = await runTool(QEMU_IMG, ['map', '--output=json', '-f', 'qcow2', overlay], { signal });
  if (r.code !== 0) throw new OperationError(`qemu-img map of the repair's overlay ${overlay}: ${r.stderr.trim()}`, false);
  const out = new Set<number>();
  for (const e of JSON.parse(r.stdout) as { start: number; length: number; depth: number }[]) {
    if (e.depth !== 0) continue;
    for (let i = Math.floor(e.start / blockBytes); i * blockBytes < e.start + e.length; i++) out.add(i);
  }
  return out;
}

/** The ranges of a raw file that hold data (`qemu-img map`, SEEK_DATA underneath); everything else is a hole and
 *  reads as zeros. */
async function dataRanges(file: string, signal?: AbortSignal): Promise<{ start: number; end: number }[]> {
  const r = await runTool(QEMU_IMG, ['map', '--output=json', '-f', 'raw', file], { signal });
  if (r.code !== 0) throw new OperationError(`qemu-img map of ${file}: ${r.stderr.trim()}`, false);
  const map = JSON.parse(r.stdout) as { start: number; length: number; data: boolean }[];
  return map.filter((e) => e.data).map((e) => ({ start: e.start, end: e.start + e.length }));
}


/** sha256 of `len` bytes at `start`, read into `buf`; the digest runs in libuv's pool (WebCrypto), off this thread,
 *  so two blocks hash on two cores. */
async function hashAt(fh: fs.FileHandle, buf: Buffer, start: number, len: number): Promise<string> {
  let off = 0;
  while (off < len) {
    const { bytesRead } = await fh.read(buf, off, len - off, start + off);
    if (!bytesRead) break;
    off += bytesRead;
  }
  return Buffer.from(await webcrypto.subtle.digest('SHA-256', buf.subarray(0, off))).toString('hex');
}

/** Blocks hashed at once: two cores' worth, each with a buffer of one block. */
const LANES = 2;

/** Re-hashes the given blocks of `volume` (raw, disk order) and fails naming a block that differs from the list. A
 *  block that lies wholly in a hole of the volume is all zeros without reading it (on a thin 2 TB disk most blocks
 *  are), so it is compared with the hash of zeros. Returns how many bytes were read. */
export async function checkBlocks(volume: string, list: BlockHashes, which: number[], when: string, signal?: AbortSignal): Promise<number> {
  const fh = await fs.open(volume, 'r');
  let read = 0;
  try {
    const size = (await fh.stat()).size;
    const data = await dataRanges(volume, signal);
    const todo = [...which];
    const lane = async () => {
      const buf = Buffer.allocUnsafe(Math.max(1, Math.min(list.block_bytes, size)));
      for (let i = todo.shift(); i !== undefined; i = todo.shift()) {
        signal?.throwIfAborted();
        const start = i * list.block_bytes;
        const len = Math.max(0, Math.min(list.block_bytes, size - start));
        const holds = holdsData(data, start, start + len);
        const got = holds ? await hashAt(fh, buf, start, len) : zeroHash(len);
        if (holds) read += len;
        if (got !== list.sha256[i]) {
          const at = `${volume}: block ${i} (bytes ${start}-${start + list.block_bytes - 1})`;
          throw new OperationError(`${at} ${when} has sha256 ${got}, the bytes as served had ${list.sha256[i]}`, false);
        }
      }
    };
    // Settled, not raced: a lane still reading when the other fails must finish before the file is closed.
    const failed = (await Promise.allSettled(Array.from({ length: LANES }, lane))).find((x): x is PromiseRejectedResult => x.status === 'rejected');
    if (failed) throw failed.reason;
  } finally {
    await fh.close();
  }
  return read;
}
