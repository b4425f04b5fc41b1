// domain/libvirt/volume-stream.ts against the tests' libvirtd: pieces uploaded at their offsets land there and
// nowhere else (what lies between stays a hole), pieces read back are the volume's bytes, pieces asked for at once
// go one after the other (libvirt lets one stream at a time use a volume), and a command libvirt refuses (a volume that is not there) fails with its 404 while the lane goes on
// working; closing removes the pipes.
import { expect } from 'chai';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { releaseLibvirt, type TestLibvirt, useLibvirt } from '../helpers/libvirt';
import { VolumeStreams } from '../../domain/libvirt/volume-stream';
import { findVolume } from '../../domain/libvirt/volumes';
import { LibvirtError, Virsh } from '../../domain/libvirt/virsh';

const MIB = 1024 * 1024;

describe('volume streams: pieces into and out of a volume at their offsets (domain/libvirt/volume-stream.ts)', function () {
  this.timeout(120_000);
  let lv: TestLibvirt;
  let dir: string;
  const name = `vs-${process.pid}.raw`;
  before(async () => {
    lv = await useLibvirt();
    dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-vs-'));
    await lv.virsh(['vol-create-as', lv.pool, name, String(32 * MIB), '--format', 'raw', '--allocation', '0']);
  });
  after(async () => {
    await lv?.virsh(['vol-delete', '--pool', lv.pool, name]).catch(() => undefined);
    await releaseLibvirt();
  });

  it('writes pieces asked for at once at their offsets, the rest left holes; reads them back; sizes from libvirt', async () => {
    const s = await VolumeStreams.open({ uri: lv.uri, pool: lv.pool, name }, path.join(dir, 'lanes'));
    const pieces = [0, 5, 9, 20, 31].map((m) => ({ at: m * MIB, b: randomBytes(MIB) }));
    try {
      // Two buffers make one piece: written back to back.
      await Promise.all(pieces.map((p) => s.write(p.at, [p.b.subarray(0, 1000), p.b.subarray(1000)])));
      const file = path.join(lv.poolDir, name);
      const bytes = readFileSync(file);
      for (const p of pieces) expect(bytes.subarray(p.at, p.at + MIB).equals(p.b), `the piece at ${p.at}`).to.equal(true);
      expect(bytes.subarray(MIB, 5 * MIB).every((x) => x === 0)).to.equal(true);
      expect(statSync(file).blocks * 512, 'only the pieces are allocated').to.be.at.most(6 * MIB);
      // A read across a piece and the hole after it, in whatever pieces the pipe hands over.
      const got: Buffer[] = [];
      await s.read(9 * MIB + 100, MIB, (b) => got.push(Buffer.from(b)));
      expect(Buffer.concat(got).equals(bytes.subarray(9 * MIB + 100, 10 * MIB + 100))).to.equal(true);
      const sizes = await findVolume(new Virsh(lv.uri), lv.pool, name);
      expect(sizes!.capacity).to.equal(32 * MIB);
      expect(sizes!.allocation).to.be.at.least(5 * MIB).and.at.most(6 * MIB);
      expect(await findVolume(new Virsh(lv.uri), lv.pool, 'not-there.raw')).to.equal(null);
    } finally { await s.close(); }
    expect(readdirSync(path.join(dir, 'lanes'))).to.deep.equal([]);
  });

  it('a piece libvirt refuses fails with its error, and the lane goes on working', async () => {
    const gone = await VolumeStreams.open({ uri: lv.uri, pool: lv.pool, name: 'not-there.raw' }, path.join(dir, 'gone'));
    try {
      const e = await gone.write(0, [Buffer.alloc(MIB, 1)]).then(() => null, (x: unknown) => x);
      expect(e).to.be.instanceOf(LibvirtError);
      expect((e as LibvirtError).status).to.equal(404);
      const r = await gone.read(0, 10, () => undefined).then(() => null, (x: unknown) => x);
      expect((r as LibvirtError).status).to.equal(404);
    } finally { await gone.close(); }
    expect(readdirSync(path.join(dir, 'gone'))).to.deep.equal([]);
    const s = await VolumeStreams.open({ uri: lv.uri, pool: lv.pool, name }, path.join(dir, 'again'));
    try {
      await s.write(2 * MIB, [Buffer.alloc(10, 7)]);
      const got: Buffer[] = [];
      await s.read(2 * MIB, 10, (b) => got.push(Buffer.from(b)));
      expect(Buffer.concat(got)).to.deep.equal(Buffer.alloc(10, 7));
    } finally { await s.close(); }
  });
});
