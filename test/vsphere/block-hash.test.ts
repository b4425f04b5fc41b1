// Issue 36 item 3: the block hash list of a one-pass disk and the check around the repair's merge, on real files
// and a real qcow2 overlay (qemu-img, qemu-io): the list a user recomputes with dd | sha256sum, the blocks an
// overlay wrote read from `qemu-img map`, and a changed byte in a block the repair did not write failing the check
// with that block named.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { createHash, randomFillSync } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync, openSync, writeSync, closeSync, ftruncateSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { blocksWritten, StreamHash } from '../../domain/vsphere/block-hash';
import { checkBlocks } from '../../domain/vsphere/block-check';
import { until } from '../helpers/http';

const KIB = 1024;
const BLOCK = 64 * KIB;

describe('one pass: the block hash list (issue 36 item 3)', () => {
  let dir: string;
  let disk: string;
  let bytes: Buffer;
  before(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-blocks-'));
    disk = path.join(dir, 'disk.raw');
    bytes = Buffer.alloc(10 * BLOCK + 123);
    randomFillSync(bytes, 0, 6 * BLOCK);
    writeFileSync(disk, bytes);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('is the sha256 of each block as dd reads it, fed in pieces of any size; the whole-disk sha256 is unchanged', () => {
    const h = new StreamHash(BLOCK);
    for (let off = 0; off < bytes.length; off += 10_007) h.update(bytes.subarray(off, off + 10_007));
    expect(h.digest('hex')).to.equal(createHash('sha256').update(bytes).digest('hex'));
    expect(h.blocks).to.have.length(11);
    for (const i of [0, 5, 9, 10]) {
      const dd = execFileSync('sh', ['-c', `dd if="$0" bs=${BLOCK} skip=${i} count=1 status=none | sha256sum`, disk], { encoding: 'utf8' }).split(' ')[0];
      expect(h.blocks[i], `block ${i}`).to.equal(dd);
    }
    // A one-pass disk's hash keeps the list only (no whole-disk sha256): the same list.
    const listOnly = new StreamHash(BLOCK, false);
    for (let off = 0; off < bytes.length; off += 65_536) listOnly.update(bytes.subarray(off, off + 65_536));
    expect(listOnly.digest('hex')).to.equal(undefined);
    expect(listOnly.blocks).to.deep.equal(h.blocks);
  });

  it('hashes a block of zeros, and a block that is zeros before its data, as dd does, whatever the pieces', () => {
    // Block 0 zeros then data from its middle, block 1 all zeros, block 2 data then zeros, block 3 short and zero.
    const b = Buffer.alloc(3 * BLOCK + 100);
    randomFillSync(b, BLOCK / 2, BLOCK / 2);
    randomFillSync(b, 2 * BLOCK, 1000);
    const file = path.join(dir, 'zeros.raw');
    writeFileSync(file, b);
    for (const piece of [4096, 10_007, BLOCK / 2, 3 * BLOCK]) {
      const h = new StreamHash(BLOCK);
      for (let off = 0; off < b.length; off += piece) h.update(b.subarray(off, off + piece));
      expect(h.digest('hex'), `whole, pieces of ${piece}`).to.equal(createHash('sha256').update(b).digest('hex'));
      const dd = [0, 1, 2, 3].map((i) => execFileSync('sh', ['-c', `dd if="$0" bs=${BLOCK} skip=${i} count=1 status=none | sha256sum`, file], { encoding: 'utf8' }).split(' ')[0]);
      expect(h.blocks, `blocks, pieces of ${piece}`).to.deep.equal(dd);
    }
  });

  it('names the blocks an overlay wrote, passes the others, and fails naming a block changed outside them', async () => {
    const h = new StreamHash(BLOCK);
    h.update(bytes);
    h.digest('hex');
    const list = { block_bytes: BLOCK, sha256: h.blocks };
    const overlay = path.join(dir, 'repair.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-o', 'cluster_size=4096', '-b', disk, '-F', 'raw', overlay]);
    // The "repair": 5 bytes inside block 2, a run across blocks 6 and 7, zeros written into block 4.
    execFileSync('qemu-io', ['-f', 'qcow2', '-c', `write -P 0x41 ${2 * BLOCK + 100} 5`, '-c', `write -P 0x42 ${7 * BLOCK - 10} 20`, '-c', `write -z ${4 * BLOCK} 4096`, overlay]);
    const written = await blocksWritten(overlay, BLOCK);
    expect([...written].sort((a, b) => a - b)).to.deep.equal([2, 4, 6, 7]);
    const others = list.sha256.map((_, i) => i).filter((i) => !written.has(i));
    expect(await checkBlocks(disk, list, [...written], 'before')).to.equal(4 * BLOCK);
    execFileSync('qemu-img', ['commit', '-q', '-d', '-f', 'qcow2', overlay]);
    // After the merge: the repair's blocks differ from the list, as they must; every other block still matches.
    await checkBlocks(disk, list, others, 'after');
    const err = await checkBlocks(disk, list, [2], 'after').then(() => null, (e: Error) => e);
    expect(err?.message).to.include('block 2 (bytes 131072-196607)');
    // One byte changed in a block the repair did not write (block 9): the check fails naming it.
    const fd = openSync(disk, 'r+');
    try { writeSync(fd, Buffer.from([bytes[9 * BLOCK + 7] ^ 0xff]), 0, 1, 9 * BLOCK + 7); } finally { closeSync(fd); }
    const fds = readdirSync('/proc/self/fd').length;
    const bad = await checkBlocks(disk, list, others, 'after the merge').then(() => null, (e: Error) => e);
    expect(bad?.message).to.match(/block 9 \(bytes 589824-655359\) after the merge has sha256 [0-9a-f]{64}, the bytes as served had [0-9a-f]{64}/);
    expect(readdirSync('/proc/self/fd').length, 'every hashing lane closed the volume before the failure was thrown').to.equal(fds);
    // Stopped by the job's signal: it fails, nothing left open.
    const ac = new AbortController();
    ac.abort(new Error('cancelled by the test'));
    const aborted = await checkBlocks(disk, list, others, 'after', ac.signal).then(() => null, (e: Error) => e);
    expect(aborted, 'a cancelled check fails').to.be.an('error');
    // (the killed qemu-img's pipes close when it has exited, a moment after the rejection)
    await until(() => readdirSync('/proc/self/fd').length === fds, 10_000, 'every file of the cancelled check to be closed');
    expect(readFileSync(disk).length).to.equal(bytes.length);
  });

  it('takes a block that is all hole as zeros without reading it, and fails naming a hole where the source had data', async () => {
    // A thin volume: data in blocks 0 and 3, holes elsewhere (a file written at two offsets only).
    const thin = path.join(dir, 'thin.raw');
    const src = Buffer.alloc(6 * BLOCK);
    randomFillSync(src, 0, BLOCK);
    randomFillSync(src, 3 * BLOCK, BLOCK);
    const fd = openSync(thin, 'w');
    try { writeSync(fd, src, 0, BLOCK, 0); writeSync(fd, src, 3 * BLOCK, BLOCK, 3 * BLOCK); ftruncateSync(fd, src.length); } finally { closeSync(fd); }
    const h = new StreamHash(BLOCK);
    h.update(src);
    h.digest('hex');
    const list = { block_bytes: BLOCK, sha256: h.blocks };
    expect(await checkBlocks(thin, list, [0, 1, 2, 3, 4, 5], 'after'), 'only the two blocks with data are read').to.equal(2 * BLOCK);
    // The source held data in block 4 where the volume has a hole: named, though nothing of it was read.
    const other = Buffer.from(src);
    randomFillSync(other, 4 * BLOCK + 100, 10);
    const h2 = new StreamHash(BLOCK);
    h2.update(other);
    h2.digest('hex');
    const err = await checkBlocks(thin, { block_bytes: BLOCK, sha256: h2.blocks }, [0, 1, 2, 3, 4, 5], 'after the merge').then(() => null, (e: Error) => e);
    expect(err?.message).to.match(/block 4 \(bytes 262144-327679\) after the merge has sha256 [0-9a-f]{64}, the bytes as served had [0-9a-f]{64}/);
  });
});
