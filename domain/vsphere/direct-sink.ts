// A one-pass target volume written past the page cache (O_DIRECT), as `qemu-img convert -t none` writes. Each byte
// of a disk is written once and not read again until the block check, so caching it buys nothing, and filling the
// cache costs: on these VMs every new page-cache page is a fault the host serves (8 GiB written through the cache
// took 20-33 core-s of system time; the same bytes written direct, 2: docs/performance.md, "Stop 59"), and on a
// libvirt host a multi-TB copy would push the running guests' cache out. O_DIRECT needs the buffer's address, the
// file offset and the length aligned, so the aligned middle of each write is copied into an aligned slot (a
// WebAssembly memory is page-aligned; a Buffer's address is not known to JavaScript) and its unaligned ends go
// through a second, ordinary descriptor of the same file; Linux keeps the two coherent. A file system that refuses
// O_DIRECT (tmpfs) gets the ordinary descriptor alone.
import { constants, promises as fs } from 'node:fs';
import { createLogger } from '../../platform/log';

const log = createLogger('vsphere');

/** The alignment asked of a direct write: the page size, a multiple of every disk's logical block size here. */
export const ALIGN = 4096;
// The one piece of the WebAssembly API used here (the project's TypeScript libraries leave it out).
declare const WebAssembly: { Memory: new (d: { initial: number }) => { buffer: ArrayBuffer } };

const SLOT = 1 << 20;
const SLOTS = 16;

/** Aligned 1 MiB buffers, one per write in flight (a download has one in flight per stream), in one memory made at
 *  first use. A write waits when all are taken. */
class AlignedSlots {
  private free: Buffer[] | undefined;
  private waiting: ((b: Buffer) => void)[] = [];

  async take(): Promise<Buffer> {
    if (!this.free) {
      const mem = new WebAssembly.Memory({ initial: (SLOT * SLOTS) / 65536 });
      this.free = Array.from({ length: SLOTS }, (_, k) => Buffer.from(mem.buffer, k * SLOT, SLOT));
    }
    return this.free.pop() ?? new Promise((resolve) => this.waiting.push(resolve));
  }

  give(b: Buffer) {
    const next = this.waiting.shift();
    if (next) next(b); else this.free!.push(b);
  }
}
const slots = new AlignedSlots();

/** `file` opened for direct writes beside `plain` (its ordinary descriptor), or undefined where the file system
 *  refuses O_DIRECT. */
export async function openDirect(file: string): Promise<fs.FileHandle | undefined> {
  try {
    return await fs.open(file, constants.O_WRONLY | constants.O_DIRECT);
  } catch (e) {
    log.info('direct writes refused here: the volume is written through the page cache', { file, error: (e as Error).message });
    return undefined;
  }
}

/** Copies `len` bytes from byte `from` of `bufs` (back to back) into `dest`. */
function gather(bufs: Buffer[], from: number, len: number, dest: Buffer) {
  let skip = from;
  let got = 0;
  for (const b of bufs) {
    if (got === len) return;
    if (skip >= b.length) { skip -= b.length; continue; }
    got += b.copy(dest, got, skip, Math.min(b.length, skip + len - got));
    skip = 0;
  }
}

/** The bytes [from, from + len) of `bufs`, back to back, as views (no copy). */
export function slice(bufs: Buffer[], from: number, len: number): Buffer[] {
  const out: Buffer[] = [];
  let skip = from;
  for (const b of bufs) {
    if (len <= 0) break;
    if (skip >= b.length) { skip -= b.length; continue; }
    const part = b.subarray(skip, skip + len);
    out.push(part);
    len -= part.length;
    skip = 0;
  }
  return out;
}

/** A writer of a file through `direct` (O_DIRECT) where it can, and `plainWrite` (the ordinary descriptor, which
 *  continues a short write) otherwise. A direct write the file system refuses (EINVAL: a logical block larger than
 *  ALIGN) is written plain, and so is the rest of the file, said once in the log. */
export function directWriter(file: string, direct: fs.FileHandle, plainWrite: (bufs: Buffer[], at: number) => Promise<void>) {
  let refused = false;
  return async (bufs: Buffer[], at: number) => {
    if (refused) return plainWrite(bufs, at);
    try {
      await writeDirect(direct, plainWrite, bufs, at);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EINVAL') throw e;
      refused = true;
      log.warn('a direct write was refused: the rest of the volume is written through the page cache', { file, error: (e as Error).message });
      await plainWrite(bufs, at);
    }
  };
}

/** Writes `bufs` at `at`: the aligned middle through `direct` from aligned slots, the ends through `plainWrite`. */
async function writeDirect(direct: fs.FileHandle, plainWrite: (bufs: Buffer[], at: number) => Promise<void>, bufs: Buffer[], at: number) {
  const n = bufs.reduce((a, b) => a + b.length, 0);
  const a0 = Math.ceil(at / ALIGN) * ALIGN;
  const a1 = Math.floor((at + n) / ALIGN) * ALIGN;
  if (a1 <= a0) return plainWrite(bufs, at);
  if (a0 > at) await plainWrite(slice(bufs, 0, a0 - at), at);
  const slot = await slots.take();
  try {
    for (let p = a0; p < a1;) {
      const len = Math.min(SLOT, a1 - p);
      gather(bufs, p - at, len, slot);
      for (let w = 0; w < len;) w += (await direct.write(slot, w, len - w, p + w)).bytesWritten;
      p += len;
    }
  } finally {
    slots.give(slot);
  }
  if (at + n > a1) await plainWrite(slice(bufs, a1 - at, at + n - a1), a1);
}
