// Issue 36 item 1, another host: a shape B job whose destination is a libvirt host reached over qemu+ssh:// (the
// tests' libvirtd behind a private sshd on 127.0.0.1) writes each disk straight into its volume there, through
// libvirt's upload streams, with nothing of the disk landing on the worker. Checked as its operator would: the
// volume on the host (named after the domain, its zero runs holes) equals the source plus exactly the repair's
// writes, the domain boots, the data path names the host, the block check ran, the worker's export folder holds no
// copy, the connection went through ssh; a worker killed mid-copy resumes into the same volume; a volume of that
// name Ferry did not make is refused before any byte moves, left as it was; and a worker whose reader of the source
// cannot start, so that the disk would go through its export folder instead, is refused before any byte moves when
// that folder is too small for it, its volume on the host removed again.
// A reused proof (test/helpers/proof-tests.ts): the four jobs run in order on one stack, and what the test read of
// each (the job's record, virsh, the volumes' and export folders' files as stat, qemu-img compare and the block
// hashes saw them, the manifest, the sshd's logins, the bytes through the proxy) is the evidence, each test its
// check on it; with every input unchanged (the tiny guest's disk among them) the same checks re-assert the last
// passing run's, and FERRY_FRESH_PROOFS=1 runs the jobs again.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statfsSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { until } from '../helpers/http';
import type { Proc } from '../helpers/procs';
import { startProxy, type ProxyControl } from '../helpers/tcp-proxy';
import { startSshd, type TestSshd } from '../helpers/sshd';
import { releaseLibvirt, useLibvirt } from '../helpers/libvirt';
import { createPlanVm, type PlanStack, startPlanStack } from '../plans/fixture';
import { upload } from './fixture';
import { tolerate } from '../helpers/teardown';
import { ensureTinyGuest } from '../fixtures/tiny-guest';
import { fixtureInputs } from '../helpers/proofs';
import { proofTests } from '../helpers/proof-tests';
import { BOOT_BYTES, blockList, flatBootDisk, identical, jobDriver, MIB, repairedExactly, sha256, walk } from './one-pass-jobs';

interface BlockCheck { block_bytes: number; blocks: number; checked_after_merge: number; repair_written: number[]; repair_uploaded_bytes: number }
interface Rec {
  status: string; attempts: number; state_history: { state: string; reason?: string }[]; error?: string;
  ledger: { id: string; kind: string; virt_uri: string }[];
  result?: {
    boot: { status: string }; domain: string; virt_uri: string; volumes: { name: string; path: string; format: string }[];
    data_path: { mode: string; volume?: string; virt_uri?: string; verified?: string; block_check?: BlockCheck }[];
    conversion: { report_path: string; artifacts: { disk_id: string; path: string; modified_by_fix?: boolean }[] };
    export: { manifest_path: string; bytes_sparse: number; bytes_rehashed: number };
    repair_beside_copy: { ran: boolean; reason?: string; overlap_seconds?: number };
  };
}
interface Manifest { disks: { data_path: { blocks: { sha256: string[] }; virt_uri: string } }[] }

/** The first job (ra): its record, and what was read of its volume, the manifest, the worker and the host after it. */
interface Straight {
  rec: Rec; loginsBefore: number; loginsAfter: number;
  read?: {
    domblklist: string; size?: number; blocks?: number; uploaded?: boolean; repaired?: boolean; vol: string[]; list: string[];
    manifest: Manifest; files: string[]; fileBlocks: Record<string, number>; datastoreSha: string; extentSha: string;
  };
}
/** The job whose worker was killed mid-copy (rk): the volume's inode then and after the retry, bytes fetched. */
interface Killed { rec: Rec; inode: number; inodeAfter?: number; down: number; repaired?: boolean }
/** The job refused by a volume it did not make (rx): that volume's hash before and after, bytes fetched. */
interface Planted { rec: Rec; was: string; now: string; down: number }
/** The job refused by a too small export folder (rs): its folder, sizes, what is left in the pool and the folder. */
interface TooSmall {
  rec: Rec; dir: string; descSize: number; volumes: string[]; volumeLeft: boolean; files: string[];
  statfs: { blocks: number; bfree: number; bsize: number }; down: number;
}
interface Evidence { uri: string; poolDir: string; straight: Straight; killed: Killed; planted: Planted; tooSmall: TooSmall }

type Boot = Awaited<ReturnType<typeof flatBootDisk>>;
type Driver = ReturnType<typeof jobDriver<Rec>>;
/** What the run started (each set once started, so the clean-up stops exactly that). */
interface Run {
  libvirt: boolean; s?: PlanStack; sshd?: TestSshd; sshdDir?: string; uri: string; proxy?: ProxyControl; boot?: Boot;
  small?: string; // a tmpfs the last job's worker takes as its export folder
  workers: Proc[]; drv: Driver;
}

const logins = (sshd: TestSshd) => (sshd.log().match(/Accepted publickey/g) ?? []).length;

/** libvirtd, the sshd in front of it, the stack, the proxy, the source disk, the four VMs and the first worker. */
async function setUp(r: Run): Promise<void> {
  // The host's URI names the shared libvirtd's socket behind the sshd, so it is known before the stack starts.
  const lv = await useLibvirt();
  r.libvirt = true;
  r.sshdDir = mkdtempSync(path.join(os.tmpdir(), 'ferry-remote1p-ssh-'));
  r.sshd = await startSshd(r.sshdDir);
  r.uri = `qemu+ssh://root@127.0.0.1:${r.sshd.port}/system?socket=${lv.sockDir}/libvirt-sock&keyfile=${r.sshd.key}&no_verify=1&no_tty=1`;
  const env = { FERRY_EXPORT_CHUNK_BYTES: String(MIB), FERRY_ONE_PASS_BLOCK_BYTES: String(MIB), FERRY_LIBVIRT_URIS: r.uri };
  r.s = await startPlanStack({ prefix: 'remote1p', workers: {}, env });
  const s = r.s;
  r.proxy = await startProxy(s.v.port);
  const boot = r.boot = await flatBootDisk(s.dir, 'boot');
  const addVm = async (name: string, mac: string) => {
    await createPlanVm(s.m, { name, mac, disks: [{ ds: 'LocalDS_0', file: `${name}/boot.vmdk`, bytes: BOOT_BYTES }] });
    await upload(s.v, boot.desc, `${name}/boot.vmdk`);
    await upload(s.v, boot.extent, `${name}/boot-flat.vmdk`);
  };
  await addVm('ra', '00:50:56:36:01:01');
  await addVm('rk', '00:50:56:36:01:02');
  await addVm('rx', '00:50:56:36:01:03');
  await addVm('rs', '00:50:56:36:01:04');
  await r.drv.worker('rp-1');
}

/** Everything setUp and the jobs started, stopped; what they left on the host removed. */
async function cleanUp(r: Run): Promise<void> {
  const s = r.s;
  await Promise.all(r.workers.map((w) => w.kill()));
  await r.proxy?.close();
  for (const d of ['ra', 'rk']) {
    await s?.lv.virsh(['destroy', d]).catch(tolerate(`destroy ${d}`));
    await s?.lv.virsh(['undefine', d, '--remove-all-storage']).catch(tolerate(`undefine ${d}`));
  }
  await s?.lv.virsh(['vol-delete', '--pool', s.lv.pool, 'rx.raw']).catch(tolerate('the planted volume'));
  await s?.lv.virsh(['vol-delete', '--pool', s.lv.pool, 'rs.raw']).catch(tolerate('rs.raw (expected gone)'));
  // Unmounted before the stack's folder, which holds it, is removed.
  if (r.small) { try { execFileSync('umount', [r.small]); } catch (e) { tolerate(`umount ${r.small}`)(e as Error); } }
  await s?.stop();
  await r.sshd?.stop();
  if (r.sshdDir) rmSync(r.sshdDir, { recursive: true, force: true }); // its keys and log
  if (r.libvirt) await releaseLibvirt();
}

/** ra: one pass onto the host; then its volume, the domain, the manifest, the worker's folder and the source read. */
async function straight(r: Run, s: PlanStack, boot: Boot): Promise<Straight> {
  const loginsBefore = logins(r.sshd!);
  const id = await r.drv.submit('ra', r.uri);
  const rec = await r.drv.finished(id);
  const loginsAfter = logins(r.sshd!);
  const res = rec.result;
  if (!res) return { rec, loginsBefore, loginsAfter };
  const volume = path.join(s.lv.poolDir, 'ra.raw');
  const st = statSync(volume, { throwIfNoEntry: false });
  const overlay = res.conversion?.artifacts?.[0];
  const files = walk(path.join(s.env.FERRY_EXPORT_DIR, id));
  return {
    rec, loginsBefore, loginsAfter,
    read: {
      domblklist: await s.lv.virsh(['domblklist', 'ra']), size: st?.size, blocks: st?.blocks,
      uploaded: st && identical(['-f', 'raw', '-F', 'raw', boot.raw, volume]),
      repaired: st && overlay && repairedExactly(s.dir, boot.raw, volume, overlay.path),
      vol: st ? blockList(volume) : [], list: blockList(boot.raw),
      manifest: JSON.parse(readFileSync(res.export.manifest_path, 'utf8')) as Manifest,
      files, fileBlocks: Object.fromEntries(files.map((f) => [f, statSync(f).blocks])),
      datastoreSha: sha256(path.join(s.v.datastores.LocalDS_0, 'ra', 'boot-flat.vmdk')), extentSha: sha256(boot.extent),
    },
  };
}

/** rk: its worker killed once 16 MiB went through the throttled proxy, a second worker taking the job over. */
async function killed(r: Run, s: PlanStack, boot: Boot): Promise<Killed> {
  const proxy = r.proxy!;
  proxy.throttle(1024 * 1024); // 1 MiB/s per connection: the 48 MiB disk takes about 12 s on 4 streams
  const before = proxy.bytesDown;
  const id = await r.drv.submit('rk', r.uri);
  const volume = path.join(s.lv.poolDir, 'rk.raw');
  await until(() => existsSync(volume), 120_000, 'the volume on the host');
  await until(() => proxy.bytesDown - before >= 16 * MIB, 120_000, '16 MiB through the proxy');
  const inode = statSync(volume).ino;
  await r.workers[0].kill();
  proxy.throttle(0);
  await r.drv.worker('rp-2');
  const rec = await r.drv.finished(id);
  const down = proxy.bytesDown - before;
  const after = statSync(volume, { throwIfNoEntry: false });
  const overlay = rec.result?.conversion?.artifacts?.[0];
  return { rec, inode, inodeAfter: after?.ino, down, repaired: after && overlay && repairedExactly(s.dir, boot.raw, volume, overlay.path) };
}

/** rx: a volume of the domain's name planted in the pool before the job. */
async function planted(r: Run, s: PlanStack): Promise<Planted> {
  await s.lv.virsh(['vol-create-as', s.lv.pool, 'rx.raw', String(MIB), '--format', 'raw']);
  const file = path.join(s.lv.poolDir, 'rx.raw');
  const was = sha256(file);
  const before = r.proxy!.bytesDown;
  const id = await r.drv.submit('rx', r.uri);
  const rec = await r.drv.finished(id, 300_000);
  return { rec, was, now: existsSync(file) ? sha256(file) : 'gone', down: r.proxy!.bytesDown - before };
}

/** rs: on a worker with no nbdkit whose export folder is an 8 MiB tmpfs. */
async function tooSmall(r: Run, s: PlanStack, boot: Boot): Promise<TooSmall> {
  // A worker host with no nbdkit (NBDKIT names no program) whose export folder is an 8 MiB tmpfs: the disk is placed
  // one pass onto the host, the reader fails, and the disk would now be downloaded and converted in that folder.
  const small = path.join(s.dir, 'small-exports');
  mkdirSync(small);
  execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=8m,mode=0700', 'ferry-small-exports', small]);
  r.small = small;
  await Promise.all(r.workers.map((w) => w.kill()));
  await r.drv.worker('rp-small', { NBDKIT: path.join(s.dir, 'no-nbdkit', 'nbdkit'), FERRY_EXPORT_DIR: small });
  const before = r.proxy!.bytesDown;
  const id = await r.drv.submit('rs', r.uri);
  const rec = await r.drv.finished(id, 300_000);
  const dir = path.join(small, id);
  const st = statfsSync(small);
  return {
    rec, dir, descSize: statSync(boot.desc).size, volumes: await s.volumes(), volumeLeft: existsSync(path.join(s.lv.poolDir, 'rs.raw')), files: walk(dir),
    statfs: { blocks: st.blocks, bfree: st.bfree, bsize: st.bsize }, down: r.proxy!.bytesDown - before,
  };
}

/** The four jobs in order on one stack (rk's job kills the worker ra's ran on; rs's replaces them all). */
async function produce(): Promise<Evidence> {
  const r: Run = { libvirt: false, uri: '', workers: [], drv: undefined as unknown as Driver };
  r.drv = jobDriver<Rec>(() => r.s!, () => r.proxy!, r.workers);
  try {
    await setUp(r);
    const s = r.s!;
    const boot = r.boot!;
    const e: Evidence = {
      uri: r.uri, poolDir: s.lv.poolDir,
      straight: await straight(r, s, boot), killed: await killed(r, s, boot), planted: await planted(r, s), tooSmall: await tooSmall(r, s, boot),
    };
    return JSON.parse(JSON.stringify(e)) as Evidence;
  } finally { await cleanUp(r); }
}

function checkStraight({ straight: e, uri, poolDir }: Evidence) {
  const r = e.rec;
  expect(r.status, JSON.stringify(r.state_history)).to.equal('completed');
  const res = r.result!;
  const x = e.read!;
  expect(res.boot.status).to.equal('passed');
  expect(res.virt_uri).to.equal(uri);
  const [dp] = res.data_path;
  expect(dp.mode, JSON.stringify(dp)).to.equal('one_pass');
  expect(dp.virt_uri).to.equal(uri);
  const volume = path.join(poolDir, 'ra.raw');
  expect(dp.volume).to.equal(volume);
  expect(res.volumes.map((v) => [v.name, v.path, v.format])).to.deep.equal([['ra.raw', volume, 'raw']]);
  expect(res.repair_beside_copy.ran, JSON.stringify(res.repair_beside_copy)).to.equal(true);
  // On the host: the domain's disk is that volume, its zero runs holes, source + exactly the repair's writes.
  expect(x.domblklist).to.include(volume);
  expect(x.size).to.equal(BOOT_BYTES);
  expect(x.blocks! * 512, 'zeros left as holes').to.be.below(BOOT_BYTES - 8 * MIB);
  expect(res.export.bytes_sparse).to.be.above(8 * MIB);
  const overlay = res.conversion.artifacts[0];
  expect(overlay.modified_by_fix).to.equal(true);
  expect(x.uploaded, 'the repair was uploaded').to.equal(false);
  expect(x.repaired).to.equal(true);
  // The block check: the repair's blocks named, every other block read back from the host and matched.
  const check = dp.block_check!;
  expect(check.blocks).to.equal(48);
  expect(check.repair_written.length).to.be.above(0).and.below(48);
  expect(check.checked_after_merge).to.equal(48 - check.repair_written.length);
  expect(check.repair_uploaded_bytes).to.be.above(0).and.below(BOOT_BYTES / 2);
  const { vol, list, manifest } = x;
  expect(check.repair_written).to.include.members(Array.from({ length: 48 }, (_, i) => i).filter((i) => vol[i] !== list[i]));
  expect(manifest.disks[0].data_path.blocks.sha256).to.deep.equal(list);
  expect(manifest.disks[0].data_path.virt_uri).to.equal(uri);
  // The volume, recorded in the job's ledger by its path on that host before it was made.
  expect(r.ledger.filter((l) => l.kind === 'volume').map((l) => [l.id, l.virt_uri])).to.deep.equal([[volume, uri]]);
  // Nothing of the disk on the worker: no extent, no raw copy, no file the size of the disk, no pipe left.
  const files = x.files;
  expect(files.filter((f) => /boot-flat\.vmdk|\.raw$|\.fifo$/.test(f)), files.join('\n')).to.deep.equal([]);
  expect(files.filter((f) => x.fileBlocks[f] * 512 >= 16 * MIB), 'nothing near the disk\'s size').to.deep.equal([]);
  // It went through the host's sshd (the upload lanes, the merge and the import each log in).
  expect(e.loginsAfter - e.loginsBefore).to.be.at.least(3);
  // The source's files on the datastore are as uploaded.
  expect(x.datastoreSha).to.equal(x.extentSha);
}

function checkKilled({ killed: e }: Evidence) {
  const r = e.rec;
  expect(r.status, JSON.stringify(r.state_history)).to.equal('completed');
  expect(r.attempts).to.be.at.least(2);
  const res = r.result!;
  expect(res.data_path[0].mode).to.equal('one_pass');
  expect(e.inodeAfter, 'the same volume, continued').to.equal(e.inode);
  expect(res.export.bytes_rehashed, 'what the killed worker uploaded was read back for the hash').to.be.at.least(4 * MIB);
  expect(e.down, 'the disk was not downloaded twice').to.be.below(BOOT_BYTES * 1.6);
  expect(e.repaired).to.equal(true);
}

function checkPlanted({ planted: e }: Evidence) {
  const r = e.rec;
  expect(r.status).to.equal('failed');
  expect(JSON.stringify(r.state_history) + (r.error ?? '')).to.include('volume rx.raw already exists in pool').and.include('this job did not make it');
  expect(e.now).to.equal(e.was);
  expect(r.ledger).to.deep.equal([]);
  expect(e.down).to.be.below(MIB);
}

function checkTooSmall({ tooSmall: e, uri, poolDir }: Evidence) {
  const r = e.rec;
  expect(r.status, JSON.stringify(r.state_history)).to.equal('failed');
  expect(r.attempts, 'not retried').to.equal(1);
  const dir = e.dir;
  const msg = r.error ?? '';
  expect(msg).to.include(`the export folder ${dir} (the worker's scratch space) has `).and.include(': refused before any byte moved')
    .and.include('the reader of the source did not start (nbdkit is not installed (Debian package nbdkit)): the repair runs after the copy');
  // Both sizes: the folder's free bytes (at most the tmpfs), and the download (descriptor and extent) plus its converted copy.
  const [, free, need] = /has [\d.]+ GiB \((\d+) bytes\) free; the disks that go through it need [\d.]+ GiB \((\d+) bytes\)/.exec(msg) ?? [];
  expect(Number(free), msg).to.be.above(0).and.at.most(8 * MIB);
  expect(Number(need), msg).to.equal(e.descSize + 2 * BOOT_BYTES);
  // The volume placed on the host for it was recorded, then removed: no volume of the domain is left in the pool.
  const volume = path.join(poolDir, 'rs.raw');
  expect(r.ledger.filter((l) => l.kind === 'volume').map((l) => [l.id, l.virt_uri])).to.deep.equal([[volume, uri]]);
  expect(e.volumes.filter((v) => v.startsWith('rs'))).to.deep.equal([]);
  expect(e.volumeLeft).to.equal(false);
  // No byte of the disk on the worker, none fetched: the folder holds no download, the tmpfs is all but empty.
  const files = e.files;
  expect(files.filter((f) => /flat\.vmdk|\.ferry-part|\.raw$|\.qcow2$/.test(f)), files.join('\n')).to.deep.equal([]);
  const st = e.statfs;
  expect((st.blocks - st.bfree) * st.bsize, 'bytes used in the export folder').to.be.below(MIB);
  expect(e.down).to.be.below(MIB);
}

describe('one pass onto another host: each disk streamed once into its volume over qemu+ssh:// (issue 36) @vm', function () {
  this.timeout(1_800_000);

  proofTests<Evidence>({
    spec: async () => ({ name: 'vsphere-one-pass-remote', entries: [__filename], extra: { ...fixtureInputs(await ensureTinyGuest()) } }),
    produce,
    runTitle: 'runs the four jobs in order onto the host behind the sshd (or reuses the record of the same inputs)',
    checks: [
      ['the disk goes straight into its volume on the host, named after the domain, holes kept, repaired exactly; it boots; no copy on the worker',
        checkStraight],
      ['a worker killed mid-copy: the retry resumes into the same volume, this job\'s own, and the result still compares equal', checkKilled],
      ['a volume of that name Ferry did not make: refused before any byte moves, naming it, and left as it was', checkPlanted],
      ['the reader of the source cannot start and the export folder is too small for the disk instead: ' +
        'refused before any byte moves, naming both sizes and why', checkTooSmall],
    ],
  });
});
