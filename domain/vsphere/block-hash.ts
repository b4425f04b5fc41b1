// The block hash list of a one-pass disk (docs/pipeline.md, one pass, "Integrity"): the sha256 of each block of
// FERRY_ONE_PASS_BLOCK_BYTES of the bytes as the datastore served them, fed in disk order while they stream. The
// repair changes some blocks of the volume, so after its merge a whole-disk sha256 could not match by design; the
// list can: every block the repair did not write must still hash as served, and the ones it wrote are checked
// before the merge (the volume then still holds the bytes as served; block-check.ts). A user recomputes any entry
// with `dd if=<source flat extent> bs=<block_bytes> skip=<i> count=1 | sha256sum`.
import { createHash, type Hash } from 'node:crypto';
import { imageMap } from '../qemu';

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

const zeroHashes = new Map<number, string>();
/** The sha256 of `len` zero bytes (a block that is all zeros), computed once per length. */
export function zeroHash(len: number): string {
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
  return blocksMet((await imageMap(overlay, 'qcow2', signal)).filter((e) => e.depth === 0), blockBytes);
}

/** The blocks (of `blockBytes`) that any of `extents` meets. */
export function blocksMet(extents: { start: number; length: number }[], blockBytes: number): Set<number> {
  const out = new Set<number>();
  for (const e of extents) for (let i = Math.floor(e.start / blockBytes); i * blockBytes < e.start + e.length; i++) out.add(i);
  return out;
}
