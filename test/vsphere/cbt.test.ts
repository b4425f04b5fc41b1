// Issue 37's foundation: changed-block tracking against the project's simulator (scripts/vcsim/main.go), through
// Ferry's client (domain/vsphere/cbt.ts). A running VM with a real monolithicFlat disk: CBT enabled, a snapshot,
// the whole frozen disk copied into a raw target; then three rounds of writes to the running VM's disk (first and
// last block, ranges crossing the 64 KiB tracking block, zeros over data), each a new snapshot, the changed areas
// since the previous change id (paged: the simulator lists 3 areas per answer), only those copied, the previous
// snapshot removed. After each round qemu-img compare says the target equals that snapshot's frozen disk, and the
// bytes copied stay within the changed blocks. At the end no snapshot and no frozen file is left. Faults: a bogus
// change id, a VM without CBT.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { randomBytes, randomInt } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readSync, readFileSync, rmSync, truncateSync, writeFileSync, writeSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { Manager, managerFor } from '../../domain/vsphere/client';
import { findVm, vmDetail } from '../../domain/vsphere/inventory';
import { ChangedArea, cbtEnabled, changedAreas, copyAreas, createSnapshot, enableCbt, removeSnapshot, Snapshot, snapshotDisks } from '../../domain/vsphere/cbt';
import { VsphereError } from '../../domain/vsphere/errors';
import { parseDatastorePath } from '../../domain/vsphere/vmdk';
import type { MoRef } from '../../domain/vsphere/xml';
import { createVm, DC, makeDisks, powerOn, upload } from './fixture';

const KIB = 1024;
const BLOCK = 64 * KIB; // the simulator's tracking block (cbtBlock in scripts/vcsim/main.go)

/** qemu-img compare's verdict: exit 0 identical, 1 different. */
const identical = (a: string, fa: string, b: string, fb: string) => {
  try { execFileSync('qemu-img', ['compare', '-U', '-f', fa, '-F', fb, a, b], { stdio: 'pipe' }); return true; } catch (e) { if ((e as { status?: number }).status === 1) return false; throw e; }
};

/** Writes `buf` into the running VM's disk file at `at`, as the guest would; false when the bytes were already
 *  there (the simulator tracks changed content, so a write of the same bytes is not a change it reports). */
function writeLive(file: string, at: number, buf: Buffer): boolean {
  const fd = openSync(file, 'r+');
  try {
    const old = Buffer.alloc(buf.length);
    readSync(fd, old, 0, buf.length, at);
    writeSync(fd, buf, 0, buf.length, at);
    return !old.equals(buf);
  } finally { closeSync(fd); }
}

/** One round of guest writes: the first and last block, ranges crossing a block boundary, zeros over data,
 *  random others. Returns the ranges whose bytes changed. */
function guestWrites(file: string, size: number): ChangedArea[] {
  const w: ChangedArea[] = [
    { start: 0, length: 4 * KIB }, { start: size - 5000, length: 5000 },
    { start: 3 * BLOCK - 1000, length: 3000 }, { start: randomInt(8, 40) * BLOCK - 10, length: 2 * BLOCK + 20 },
  ];
  for (let i = 0; i < 6; i++) w.push({ start: randomInt(0, size - 8 * KIB), length: randomInt(1, 8 * KIB) });
  const changed = w.filter((a) => writeLive(file, a.start, randomBytes(a.length)));
  // zeros over the random data makeDisks put in the first half of each 256 KiB: a delta must write them, not
  // skip them as holes
  const zeros = { start: randomInt(0, size / (256 * KIB)) * 256 * KIB + randomInt(0, 64 * KIB), length: 8 * KIB };
  if (writeLive(file, zeros.start, Buffer.alloc(zeros.length))) changed.push(zeros);
  return changed;
}

/** The tracking blocks the writes touched, in bytes: what a delta may copy at most. */
const blockBytes = (writes: ChangedArea[]) => {
  const blocks = new Set<number>();
  for (const a of writes) for (let b = Math.floor(a.start / BLOCK); b * BLOCK < a.start + a.length; b++) blocks.add(b);
  return blocks.size * BLOCK;
};

const covered = (areas: ChangedArea[], w: ChangedArea) => areas.some((a) => a.start <= w.start && w.start + w.length <= a.start + a.length)
  || areas.filter((a) => a.start < w.start + w.length && w.start < a.start + a.length).reduce((n, a) => n + Math.min(a.start + a.length, w.start + w.length) - Math.max(a.start, w.start), 0) === w.length;

describe('changed-block tracking: snapshots, QueryChangedDiskAreas and delta copies against the simulator (issue 37)', function () {
  this.timeout(300_000);
  let v: Vcsim;
  let m: Manager;
  let dir: string;
  let ds: string;
  let size: number;
  const made: MoRef[] = [];

  before(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-cbt-'));
    v = await startVcsim({ args: ['-cbt-max-areas', '3'] });
    ds = v.datastores.LocalDS_0;
    m = managerFor({ url: v.url, username: v.username, password: v.password, ca: readFileSync(v.caFile, 'utf8') });
    for (const name of ['cbt1', 'plain1']) {
      mkdirSync(path.join(dir, name), { recursive: true });
      const d = makeDisks(path.join(dir, name), 16);
      size = d.bytes;
      await createVm(m, { name, disks: [{ file: `${name}/data.vmdk`, bytes: d.bytes }], mac: name === 'cbt1' ? '00:50:56:aa:cc:01' : '00:50:56:aa:cc:02' });
      await upload(v, d.flat, `${name}/data.vmdk`);
      await upload(v, d.flatExtent, `${name}/data-flat.vmdk`);
      await powerOn(m, `/${DC}/vm/${name}`);
    }
  });

  after(async () => {
    await v?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const local = (file: string) => path.join(ds, parseDatastorePath(file).path);
  const snap = (vm: MoRef, name: string) => createSnapshot(m, vm, name, { onCreated: (r) => { made.push(r); } });
  const copy = (s: Snapshot, areas: ChangedArea[], target: string) => copyAreas(m, { dcPath: DC, disk: s.disks[0], areas, target, streams: 3, signal: new AbortController().signal });

  it('three rounds: the target equals each snapshot\'s frozen disk, only changed blocks are copied, and nothing is left', async () => {
    const vm = await findVm(m, `/${DC}/vm/cbt1`);
    const live = path.join(ds, 'cbt1/data-flat.vmdk');
    const liveDesc = path.join(ds, 'cbt1/data.vmdk');
    expect(await cbtEnabled(m, vm)).to.equal(false);
    await enableCbt(m, vm);
    expect(await cbtEnabled(m, vm)).to.equal(true);

    let prev = await snap(vm, 'ferry-round-1');
    expect(prev.disks).to.have.length(1);
    expect(prev.disks[0].change_id).to.match(/^[0-9a-f ]+-[0-9a-f ]+\/1$/);
    expect(prev.disks[0].file).to.not.equal('[LocalDS_0] cbt1/data.vmdk');
    const target = path.join(dir, 'target.raw');
    writeFileSync(target, '');
    truncateSync(target, size);
    // The guest keeps writing while round 1 copies: the copy must be the disk as of the snapshot.
    let writes = guestWrites(live, size);
    const all = await changedAreas(m, vm, prev.ref, prev.disks[0], '*');
    expect(all.areas.reduce((n, a) => n + a.length, 0)).to.equal(size); // an uploaded (thick) file: all allocated
    await copy(prev, all.areas, target);
    expect(identical(target, 'raw', local(prev.disks[0].file), 'vmdk'), 'round 1 target = frozen disk').to.equal(true);
    expect(identical(target, 'raw', liveDesc, 'vmdk'), 'the running disk moved on').to.equal(false);

    const first = prev.disks[0].change_id!;
    const since1: ChangedArea[] = [];
    for (let round = 2; round <= 4; round++) {
      const s = await snap(vm, `ferry-round-${round}`);
      expect(s.disks[0].change_id).to.match(new RegExp(`/${round}$`));
      const q = await changedAreas(m, vm, s.ref, s.disks[0], prev.disks[0].change_id!);
      expect(q.pages, 'the simulator lists 3 areas per answer: paging happened').to.be.above(1);
      for (const w of writes) expect(covered(q.areas, w), `write at ${w.start}+${w.length} listed`).to.equal(true);
      // A change id outlives the snapshot that issued it: round 1's, its snapshot long removed, lists every write
      // since round 1.
      since1.push(...writes);
      const fromFirst = await changedAreas(m, vm, s.ref, s.disks[0], first);
      for (const w of since1) expect(covered(fromFirst.areas, w), `write at ${w.start}+${w.length} listed since round 1`).to.equal(true);
      const { bytes_fetched } = await copy(s, q.areas, target);
      expect(bytes_fetched).to.be.above(0).and.at.most(blockBytes(writes));
      expect(identical(target, 'raw', local(s.disks[0].file), 'vmdk'), `round ${round} target = frozen disk`).to.equal(true);
      const prevFiles = [local(prev.disks[0].file), local(prev.disks[0].file).replace(/\.vmdk$/, '-flat.vmdk')];
      expect(prevFiles.every((f) => existsSync(f))).to.equal(true);
      await removeSnapshot(m, prev.ref);
      expect(prevFiles.some((f) => existsSync(f)), 'frozen files of the removed snapshot are gone').to.equal(false);
      prev = s;
      writes = guestWrites(live, size);
    }
    await removeSnapshot(m, prev.ref);
    const d = await vmDetail(m, `/${DC}/vm/cbt1`);
    expect(d.snapshots, 'no snapshot left on the VM').to.deep.equal([]);
    expect(d.current_snapshot).to.equal(null);
    for (const r of made) {
      const err = await snapshotDisks(m, r).then(() => null, (e: VsphereError) => e);
      expect(err?.kind, `snapshot ${r.value} is gone from the inventory`).to.equal('not_found');
    }
    expect(readdirSync(path.join(ds, 'cbt1')).filter((f) => /snapshot|\.vmsn$/i.test(f)), 'no frozen file left').to.deep.equal([]);
    expect(existsSync(liveDesc) && existsSync(live), 'the running disk is still there').to.equal(true);
  });

  it('a change id the disk never issued, and a VM without CBT, are refused with the fault vSphere raises', async () => {
    const vm = await findVm(m, `/${DC}/vm/cbt1`);
    await enableCbt(m, vm); // already on after the test above; it stays on when enabled again
    const s = await snap(vm, 'ferry-bogus');
    try {
      const err = await changedAreas(m, vm, s.ref, s.disks[0], '52 00 00 00 00 00 00 00-00 00 00 00 00 00 00 00/7').then(() => null, (e: VsphereError) => e);
      expect(err).to.be.instanceOf(VsphereError);
      expect(err!.fault, err!.message).to.equal('InvalidArgument');
      expect(err!.message).to.match(/changed areas of disk \d+ of vm-\d+ since change id 52 00.*changeId/);
    } finally { await removeSnapshot(m, s.ref); }

    const plain = await findVm(m, `/${DC}/vm/plain1`);
    expect(await cbtEnabled(m, plain)).to.equal(false);
    const p = await snap(plain, 'ferry-no-cbt');
    try {
      expect(p.disks[0].change_id).to.equal(undefined);
      const err = await changedAreas(m, plain, p.ref, { key: p.disks[0].key, capacity_bytes: size }, '*').then(() => null, (e: VsphereError) => e);
      expect(err).to.be.instanceOf(VsphereError);
      expect(err!.fault).to.equal('FileFault');
      expect(err!.message).to.match(/Change tracking is not enabled/);
    } finally { await removeSnapshot(m, p.ref); }
    expect((await vmDetail(m, `/${DC}/vm/plain1`)).snapshots).to.deep.equal([]);
  });
});
