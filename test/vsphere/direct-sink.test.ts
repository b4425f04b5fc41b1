// Issue 36: a one-pass volume is written past the page cache (domain/vsphere/direct-sink.ts). What a user checks:
// the file holds exactly the bytes written, whatever the pieces' sizes and offsets, and `fincore` finds next to
// none of it in the page cache (only the unaligned ends of each write go through it).
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import { promises as fs, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ALIGN, directWriter, openDirect } from '../../domain/vsphere/direct-sink';

const MIB = 1 << 20;

/** Resident bytes of `file` in the page cache, as util-linux's fincore counts them. */
const resident = (file: string) => Number(execFileSync('fincore', ['--bytes', '--noheadings', '--output', 'RES', file], { encoding: 'utf8' }).trim());

/** `len` bytes cut into pieces of 1-20,000 bytes, as TLS and HTTP hand them over. */
function pieces(b: Buffer): Buffer[] {
  const out: Buffer[] = [];
  for (let at = 0; at < b.length;) { const n = Math.min(b.length - at, 1 + Math.floor(Math.random() * 20_000)); out.push(b.subarray(at, at + n)); at += n; }
  return out;
}

describe('one pass: the target volume written past the page cache (issue 36)', () => {
  let dir: string;
  before(() => { dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-direct-')); });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('writes runs of any size at any offset byte for byte, and leaves next to none of them in the page cache', async () => {
    const file = path.join(dir, 'volume.raw');
    const size = 24 * MIB + 777;
    const want = Buffer.alloc(size);
    const plain = await fs.open(file, 'w');
    await plain.truncate(size);
    const direct = await openDirect(file);
    expect(direct, 'O_DIRECT on the temp folder').to.not.equal(undefined);
    const write = directWriter(file, direct!, async (bufs, at) => { await plain.writev(bufs, at); });
    // Four lanes at once, as the download's streams write: runs starting and ending off the alignment, a run
    // shorter than one aligned block, a run at the file's unaligned end; what lies between stays a hole.
    const runs: [number, number][] = [[5, 3 * MIB + 11], [4 * MIB, 100], [6 * MIB + 4095, 9 * MIB + 3], [16 * MIB - 1, 8 * MIB + 778]];
    await Promise.all(runs.map(async ([at, len]) => {
      const b = randomFillSync(Buffer.alloc(len));
      b.copy(want, at);
      let off = at;
      for (const batch of [pieces(b.subarray(0, len >> 1)), pieces(b.subarray(len >> 1))]) {
        await write(batch, off);
        off += batch.reduce((a, x) => a + x.length, 0);
      }
    }));
    await plain.sync();
    await direct!.close();
    await plain.close();
    const got = readFileSync(file);
    expect(got.length).to.equal(size);
    expect(got.equals(want), 'the file holds exactly the bytes written').to.equal(true);
    // Read back above, so drop that and count again: what the writes themselves left cached.
    rmSync(file);
    const again = path.join(dir, 'again.raw');
    const p2 = await fs.open(again, 'w');
    const d2 = await openDirect(again);
    const w2 = directWriter(again, d2!, async (bufs, at) => { await p2.writev(bufs, at); });
    for (let at = 3; at < 32 * MIB; at += MIB) await w2(pieces(randomFillSync(Buffer.alloc(MIB))), at);
    await p2.sync();
    expect(resident(again), 'bytes of 32 MiB written that fincore finds cached').to.be.at.most(2 * 32 * ALIGN);
    await d2!.close();
    await p2.close();
  });
});
