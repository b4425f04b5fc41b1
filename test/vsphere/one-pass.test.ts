// Issue 36: disks of real size in one pass. Shape B jobs against the simulator, the tests' libvirtd and real
// workers, with the bytes checked on disk afterwards: a two-disk VM (a flat boot disk holding the tiny guest, a
// snapshot-delta data disk) whose boot disk goes straight into its raw volume (holes kept, no copy in the export
// folder) and equals its source with exactly the repair's writes, while the delta disk falls back to the export
// folder, named in the result, the report and the manifest, and equals its source; a dropped connection and a
// worker killed mid-copy, after which the job resumes into the same volume file; and a pool too small for the
// disk, refused before any byte moves with both sizes named. The repair beside the copy (issue 36 item 2): a flat
// one-disk VM repaired on an overlay over an nbdkit reader of its source while the copy runs, the two overlapping
// in the job's recorded spans and progress events, the volume equal to its source plus exactly the repair's writes,
// the source's files unchanged.
// A reused proof (test/helpers/proof-tests.ts): the four jobs run in order on one stack, and what the test read after
// each (the job records, the report's and manifest's data paths, the volumes' sizes, blocks and inodes, qemu-img's
// comparisons, the block hash lists and sha256s, the export folder, the proxy's counts, Redis's events and warm stage
// times) is the evidence, each test its check on it. With every input unchanged (the tiny guest's disk among them)
// the same checks re-assert the last passing run's evidence; FERRY_FRESH_PROOFS=1 runs the jobs again.
import { expect } from 'chai';
import { closeSync, mkdirSync, openSync, readdirSync, readFileSync, statSync, truncateSync } from 'node:fs';
import path from 'node:path';
import { until } from '../helpers/http';
import type { Proc } from '../helpers/procs';
import { startProxy, type ProxyControl } from '../helpers/tcp-proxy';
import { createPlanVm, type PlanStack, startPlanStack } from '../plans/fixture';
import { makeSnapshotChain, upload } from './fixture';
import { tolerate } from '../helpers/teardown';
import { BOOT_BYTES, blockList, flatBootDisk, identical, jobDriver, MIB, qemuImg, repairedExactly, sha256, walk } from './one-pass-jobs';
import { keys } from '../../platform/redis';
import { ensureTinyGuest } from '../fixtures/tiny-guest';
import { fixtureInputs } from '../helpers/proofs';
import { proofTests } from '../helpers/proof-tests';

interface Rec {
  status: string; attempts: number; state_history: { state: string; reason?: string }[]; result?: Record<string, unknown> & JobResult; error?: string;
  ledger: { id: string; kind: string }[];
}
interface BlockCheck { block_bytes: number; blocks: number; checked_after_merge: number; repair_written: number[] }
interface JobResult {
  volumes: { path: string; format: string }[];
  data_path: { mode: string; reason?: string; volume?: string; sha256?: string; verified?: string; block_check?: BlockCheck }[];
  conversion: { report_path: string; artifacts: { disk_id: string; path: string; modified_by_fix?: boolean }[] };
  export: { manifest_path: string; resumes: number; bytes_rehashed: number; bytes_sparse: number; files: { target?: string; sha256?: string }[] };
  boot: { status: string };
  repair_beside_copy: { ran: boolean; reason?: string; repair?: Span; copy?: Span; overlap_seconds?: number };
  stage_seconds?: { repair: number; import: number; boot: number };
}
interface Span { started_at: string; finished_at: string }
/** A progress event as the job store keeps it in its Redis stream (queue/store.ts). */
interface StoredEvent { phase: string; timestamp: string; message: string }
interface ManifestDataPath { mode: string; sha256?: string; verified?: string; blocks: { block_bytes: number; sha256: string[] }; block_check: BlockCheck }
interface ReportStage { started_at?: string; result?: { disks?: { read_from?: string }[] } }

/** The two-disk VM's job: its record and, once it completed, the report's and the manifest's data paths and the
 *  disks as read after it (qemu-img's comparisons as booleans, block hash lists, the export folder with sizes). */
interface FallbackEvidence {
  id: string; r: Rec;
  read?: {
    report: { data_path: { mode: string; reason?: string }[] }; manifest: { disks: { data_path: ManifestDataPath }[] };
    volume: { size: number; blocks: number }; sameAsSource: boolean; repaired: boolean; volumeBlocks: string[]; dataEqual: boolean;
    exportFiles: string[]; exportSizes: Record<string, number>; datastoreExtent: string;
  };
}
/** The repair beside the copy: the record, the warm stage times and the job's events in Redis and, once it
 *  completed, the report's fix and inspect stages, the manifest's block list, the overlay's backing file. */
interface BesideEvidence {
  id: string; r: Rec; warm: { repair: number }[]; events: StoredEvent[]; datastore: { extent: string; desc: string };
  read?: { stages: { fix: ReportStage; inspect: ReportStage }; manifestBlocks: string[]; backing: string; sameAsSource: boolean; repaired: boolean };
}
/** The resumed job: the partial volume's path and inode mid-copy, the proxy's cuts then and bytes down after. */
interface ResumeEvidence {
  id: string; r: Rec; partial: string; inode: number; cuts: number; downloaded: number;
  read?: { volumeInode: number; manifestBlocks: string[]; repaired: boolean };
}
/** The refused job: the pool's and the export folder's files after it, the bytes it fetched. */
interface RefusedEvidence { id: string; r: Rec; pool: string[]; exportFiles: string[]; downloaded: number }
interface Evidence {
  poolDir: string; pool: string; sourceBlocks: string[]; uploaded: { extent: string; desc: string };
  od: FallbackEvidence; ov: BesideEvidence; kr: ResumeEvidence; huge: RefusedEvidence;
}

/** The stack, the proxy in front of the simulator, the disks uploaded, the workers and the jobs' driver. */
interface Ctx {
  s: PlanStack; proxy: ProxyControl; workers: Proc[]; boot: Awaited<ReturnType<typeof flatBootDisk>>;
  chain: ReturnType<typeof makeSnapshotChain>; driver: ReturnType<typeof jobDriver<Rec>>;
}

/** The block hash list an export's manifest recorded for its first disk. */
const manifestBlocks = (manifestPath: string) =>
  (JSON.parse(readFileSync(manifestPath, 'utf8')) as { disks: { data_path: { blocks: { sha256: string[] } } }[] }).disks[0].data_path.blocks.sha256;
const readJson = <T>(f: string) => JSON.parse(readFileSync(f, 'utf8')) as T;
const t = (x: string) => Date.parse(x);
const submit = (c: Ctx, vm: string) => c.driver.submit(vm, c.s.lv.uri);
const repaired = (c: Ctx, volume: string, overlay: string) => repairedExactly(c.s.dir, c.boot.raw, volume, overlay);
/** The job's result once it completed (what is read after it then exists), else nothing more is read. */
const completed = (r: Rec) => (r.status === 'completed' ? r.result : undefined);

async function addVm(s: PlanStack, name: string, mac: string, disks: { file: string; bytes: number; local: [string, string][] }[]) {
  await createPlanVm(s.m, { name, mac, disks: disks.map((d) => ({ ds: 'LocalDS_0', file: `${name}/${d.file}`, bytes: d.bytes })) });
  for (const d of disks) for (const [local, remote] of d.local) await upload(s.v, local, `${name}/${remote}`);
}

/** What the before hook did: the VMs od (flat boot + snapshot delta), kr and ov (flat boot), huge (15 TiB), worker op-1. */
async function setUp(s: PlanStack, proxy: ProxyControl, workers: Proc[]): Promise<Ctx> {
  const boot = await flatBootDisk(s.dir, 'boot');
  const chain = makeSnapshotChain(s.dir, 8);
  const c: Ctx = { s, proxy, workers, boot, chain, driver: jobDriver<Rec>(() => s, () => proxy, workers) };
  const flat = (name: string) =>
    ({ file: `${name}.vmdk`, bytes: BOOT_BYTES, local: [[boot.desc, `${name}.vmdk`], [boot.extent, `${name}-flat.vmdk`]] as [string, string][] });
  // The descriptor names its extent "boot-flat.vmdk": each VM's files keep those names in its own folder.
  const delta: [string, string][] = [[chain.delta, 'base-000001.vmdk'], [chain.base, 'base.vmdk'], [chain.baseExtent, 'base-flat.vmdk']];
  await addVm(s, 'od', '00:50:56:36:00:01', [flat('boot'), { file: 'base-000001.vmdk', bytes: chain.bytes, local: delta }]);
  await addVm(s, 'kr', '00:50:56:36:00:02', [flat('boot')]);
  await addVm(s, 'ov', '00:50:56:36:00:04', [flat('boot')]);
  // 15 TiB of flat disk, sparse on the simulator's datastore: more than any pool here holds.
  const huge = path.join(s.dir, 'huge');
  mkdirSync(huge, { recursive: true });
  qemuImg(['create', '-q', '-f', 'vmdk', '-o', 'subformat=monolithicFlat', path.join(huge, 'huge.vmdk'), '15T']);
  await createPlanVm(s.m, { name: 'huge', mac: '00:50:56:36:00:03', disks: [{ ds: 'LocalDS_0', file: 'huge/huge.vmdk', bytes: 15 * 2 ** 40 }] });
  await upload(s.v, path.join(huge, 'huge.vmdk'), 'huge/huge.vmdk');
  const extent = path.join(s.v.datastores.LocalDS_0, 'huge', 'huge-flat.vmdk');
  closeSync(openSync(extent, 'w'));
  truncateSync(extent, 15 * 2 ** 40);
  await c.driver.worker('op-1');
  return c;
}

/** The two-disk VM: its boot disk in one pass, its snapshot-delta disk through the export folder. */
async function fallback(c: Ctx): Promise<FallbackEvidence> {
  const { s, boot } = c;
  const id = await submit(c, 'od');
  const r = await c.driver.finished(id);
  const res = completed(r);
  if (!res) return { id, r };
  const [bv, dv] = res.volumes;
  const overlay = res.conversion.artifacts.find((a) => a.disk_id === 'disk-0')!;
  const report = readJson<NonNullable<FallbackEvidence['read']>['report']>(res.conversion.report_path);
  const manifest = readJson<NonNullable<FallbackEvidence['read']>['manifest']>(res.export.manifest_path);
  const exportFiles = walk(path.join(s.env.FERRY_EXPORT_DIR, id));
  const st = statSync(bv.path);
  // Of the report and the manifest, only the parts the checks read: their data paths.
  const read: FallbackEvidence['read'] = {
    report: { data_path: report.data_path }, manifest: { disks: manifest.disks.map((d) => ({ data_path: d.data_path })) },
    volume: { size: st.size, blocks: st.blocks },
    sameAsSource: identical(['-f', 'raw', '-F', 'raw', boot.raw, bv.path]), repaired: repaired(c, bv.path, overlay.path), volumeBlocks: blockList(bv.path),
    dataEqual: identical(['-f', 'vmdk', '-F', dv.format, c.chain.delta, dv.path]),
    exportFiles, exportSizes: Object.fromEntries(exportFiles.map((f) => [f, statSync(f).size])),
    datastoreExtent: sha256(path.join(s.v.datastores.LocalDS_0, 'od', 'boot-flat.vmdk')),
  };
  return { id, r, read };
}

/** The one-disk VM repaired beside its throttled copy. */
async function beside(c: Ctx): Promise<BesideEvidence> {
  const { s, proxy, boot } = c;
  proxy.throttle(1024 * 1024); // 1 MiB/s per connection: the copy of 48 MiB takes about 12 s on 4 streams
  const id = await submit(c, 'ov');
  const r = await c.driver.finished(id);
  proxy.throttle(0);
  const warm = (await s.rc.lrange(keys('onepass').warmStageTimes, 0, -1)).map((x) => JSON.parse(x) as { repair: number });
  const rows = (await s.rc.xrange(keys('onepass').events(id), '-', '+')) as [string, string[]][];
  const events = rows.map(([, f]) => JSON.parse(f[1]) as StoredEvent);
  const ds = path.join(s.v.datastores.LocalDS_0, 'ov');
  const e: BesideEvidence = { id, r, warm, events, datastore: { extent: sha256(path.join(ds, 'boot-flat.vmdk')), desc: sha256(path.join(ds, 'boot.vmdk')) } };
  const res = completed(r);
  if (!res) return e;
  const report = readJson<{ stages: Record<string, ReportStage> }>(res.conversion.report_path);
  const overlay = res.conversion.artifacts[0];
  const info = JSON.parse(qemuImg(['info', '--output=json', '-U', '-f', 'qcow2', overlay.path])) as { 'backing-filename': string };
  e.read = {
    stages: { fix: report.stages.fix, inspect: report.stages.inspect }, manifestBlocks: manifestBlocks(res.export.manifest_path),
    backing: info['backing-filename'],
    sameAsSource: identical(['-f', 'raw', '-F', 'raw', boot.raw, res.volumes[0].path]), repaired: repaired(c, res.volumes[0].path, overlay.path),
  };
  return e;
}

/** A connection cut and the worker killed mid-copy; another worker resumes the job. */
async function resume(c: Ctx): Promise<ResumeEvidence> {
  const { s, proxy } = c;
  proxy.throttle(1024 * 1024); // 1 MiB/s per connection: the 48 MiB disk takes about 12 s on 4 streams
  proxy.cutAfter(3 * MIB, 1);
  const before = proxy.bytesDown;
  const id = await submit(c, 'kr');
  const found = await until(() => readdirSync(s.lv.poolDir).find((f) => f.startsWith(`.ferry-${id}-disk0.raw`)), 120_000, 'the partial volume');
  const partial = path.join(s.lv.poolDir, found);
  await until(() => proxy.bytesDown - before >= 16 * MIB, 120_000, '16 MiB through the proxy');
  const inode = statSync(partial).ino;
  const cuts = proxy.cuts;
  await c.workers[0].kill();
  proxy.throttle(0);
  await c.driver.worker('op-2');
  const r = await c.driver.finished(id);
  const e: ResumeEvidence = { id, r, partial, inode, cuts, downloaded: proxy.bytesDown - before };
  const res = completed(r);
  if (!res) return e;
  e.read = {
    volumeInode: statSync(res.volumes[0].path).ino, manifestBlocks: manifestBlocks(res.export.manifest_path),
    repaired: repaired(c, res.volumes[0].path, res.conversion.artifacts[0].path),
  };
  return e;
}

/** The 15 TiB disk against a smaller pool. */
async function refused(c: Ctx): Promise<RefusedEvidence> {
  const { s, proxy } = c;
  const before = proxy.bytesDown;
  const id = await submit(c, 'huge');
  const r = await c.driver.finished(id, 120_000);
  return { id, r, pool: readdirSync(s.lv.poolDir), exportFiles: walk(path.join(s.env.FERRY_EXPORT_DIR, id)), downloaded: proxy.bytesDown - before };
}

/** The fresh run: the stack, the four jobs in order, everything stopped (and the target's domains removed) after. */
async function produce(): Promise<Evidence> {
  const s = await startPlanStack({ prefix: 'onepass', workers: {}, env: { FERRY_EXPORT_CHUNK_BYTES: String(MIB), FERRY_ONE_PASS_BLOCK_BYTES: String(MIB) } });
  const workers: Proc[] = [];
  let proxy: ProxyControl | undefined;
  try {
    proxy = await startProxy(s.v.port);
    const c = await setUp(s, proxy, workers);
    const e: Evidence = {
      poolDir: s.lv.poolDir, pool: s.lv.pool, sourceBlocks: blockList(c.boot.raw), uploaded: { extent: sha256(c.boot.extent), desc: sha256(c.boot.desc) },
      od: await fallback(c), ov: await beside(c), kr: await resume(c), huge: await refused(c),
    };
    return JSON.parse(JSON.stringify(e)) as Evidence;
  } finally {
    await Promise.all(workers.map((w) => w.kill()));
    await proxy?.close();
    for (const d of ['od', 'kr', 'ov']) {
      await s.lv.virsh(['destroy', d]).catch(tolerate(`destroy ${d}`));
      await s.lv.virsh(['undefine', d, '--remove-all-storage']).catch(tolerate(`undefine ${d}`));
    }
    await s.stop();
  }
}

function checkFallback({ od: o, poolDir, sourceBlocks, uploaded }: Evidence) {
  const r = o.r;
  expect(r.status, JSON.stringify(r.state_history)).to.equal('completed');
  const res = r.result!;
  const m = o.read!;
  expect(res.boot.status).to.equal('passed');
  const [b, d] = res.data_path;
  expect(b.mode).to.equal('one_pass');
  expect(b, 'a one-pass disk\'s record is its block hash list: no whole-disk sha256').to.not.have.property('sha256');
  expect(b.verified).to.be.a('string');
  expect(d.mode).to.equal('export_folder');
  expect(d.reason).to.include('snapshot delta chain of 2 files');
  // A disk through the export folder: the repair reads every disk, so it waited for the copy, saying why.
  expect(res.repair_beside_copy.ran).to.equal(false);
  expect(res.repair_beside_copy.reason).to.include('goes through the export folder').and.include('snapshot delta chain');
  // The report and the manifest say the same.
  const { report, manifest } = m;
  expect(report.data_path.map((x) => x.mode)).to.deep.equal(['one_pass', 'export_folder']);
  expect(manifest.disks[0].data_path).to.include({ mode: 'one_pass' }).and.not.have.property('sha256');
  expect(res.export.files.find((f) => f.target), 'the export result\'s one-pass file').to.not.have.property('sha256');
  expect(manifest.disks[0].data_path.verified).to.be.a('string');
  // The block hash list: each entry is what a user recomputes over the source, block by block.
  const list = manifest.disks[0].data_path.blocks;
  expect(list.block_bytes).to.equal(MIB);
  expect(list.sha256).to.deep.equal(sourceBlocks);
  // The check after the merge: the blocks the repair wrote are named, every other one was re-hashed and matched.
  const check = b.block_check!;
  expect(check).to.deep.equal(manifest.disks[0].data_path.block_check);
  expect(check.blocks).to.equal(48);
  expect(check.repair_written.length).to.be.above(0).and.below(48);
  expect(check.checked_after_merge).to.equal(48 - check.repair_written.length);
  expect(report.data_path[0]).to.not.have.property('blocks');

  // The boot volume: raw, in the pool, its zero runs holes, equal to source + the repair's writes and nothing else.
  const [bv] = res.volumes;
  expect(bv.format).to.equal('raw');
  expect(path.dirname(bv.path)).to.equal(poolDir);
  expect(m.volume.size).to.equal(BOOT_BYTES);
  expect(m.volume.blocks * 512, 'zeros left as holes').to.be.below(BOOT_BYTES - 8 * MIB);
  expect(res.export.bytes_sparse).to.be.above(8 * MIB);
  const overlay = res.conversion.artifacts.find((a) => a.disk_id === 'disk-0')!;
  expect(overlay.modified_by_fix).to.equal(true);
  expect(m.sameAsSource, 'the repair wrote into the volume').to.equal(false);
  expect(m.repaired).to.equal(true);
  // Every block where the volume now differs from the source is one the check names as the repair's.
  const vol = m.volumeBlocks;
  const changed = Array.from({ length: 48 }, (_, i) => i).filter((i) => vol[i] !== list.sha256[i]);
  expect(changed.length).to.be.above(0);
  expect(check.repair_written).to.include.members(changed);
  // The data disk: its whole chain as the source reads.
  expect(m.dataEqual).to.equal(true);
  // No copy of the boot disk in the worker's scratch space: its flat extent was never written there.
  const files = m.exportFiles;
  expect(files.filter((f) => /boot-flat\.vmdk/.test(f))).to.deep.equal([]);
  expect(files.some((f) => f.endsWith('base-flat.vmdk')), 'the delta disk went through the export folder').to.equal(true);
  expect(files.filter((f) => m.exportSizes[f] >= BOOT_BYTES)).to.deep.equal([]);
  // The source's files on the datastore are as uploaded.
  expect(m.datastoreExtent).to.equal(uploaded.extent);
}

function checkBeside({ ov: o, sourceBlocks, uploaded }: Evidence) {
  const r = o.r;
  expect(r.status, JSON.stringify(r.state_history)).to.equal('completed');
  const res = r.result!;
  const m = o.read!;
  expect(res.boot.status).to.equal('passed');
  const bc = res.repair_beside_copy;
  expect(bc.ran, JSON.stringify(bc)).to.equal(true);
  // The recorded spans overlap: the repair started before the copy ended, and the copy before the repair ended.
  expect(t(bc.repair!.started_at)).to.be.below(t(bc.copy!.finished_at));
  expect(t(bc.copy!.started_at)).to.be.below(t(bc.repair!.finished_at));
  expect(bc.overlap_seconds).to.be.above(0);
  // What warm predictions learn from this cold run (orchestration/warm.ts): the repair's whole span, not the tail left after
  // the copy, because a warm cutover runs the repair whole after the last delta.
  const whole = (t(bc.repair!.finished_at) - t(bc.repair!.started_at)) / 1000;
  expect(res.stage_seconds!.repair, JSON.stringify(res.stage_seconds)).to.be.at.least(whole);
  expect(o.warm.map((x) => x.repair), 'recorded in Redis for the predictions').to.include(res.stage_seconds!.repair);
  // The job's progress events in Redis say the same: the repair's stages reported while the copy still reported.
  const evs = o.events;
  const lastCopy = Math.max(...evs.filter((e) => e.phase === 'export').map((e) => t(e.timestamp)));
  const repairEvs = evs.filter((e) => e.phase === 'fix' && e.message.endsWith('(beside the copy)'));
  expect(repairEvs.length, JSON.stringify(evs.map((e) => [e.phase, e.message]))).to.be.above(0);
  expect(Math.min(...repairEvs.map((e) => t(e.timestamp))), 'a repair event before the last copy event').to.be.below(lastCopy);
  // The pipeline's report has the fix stage starting before the copy finished, on the source through nbdkit.
  expect(t(m.stages.fix.started_at!)).to.be.below(t(bc.copy!.finished_at));
  expect(m.stages.inspect.result!.disks![0].read_from).to.include('nbdkit');
  // The merge: the blocks the repair wrote come from its overlay's map, every other block re-hashed as served.
  const b = res.data_path[0];
  expect(b.mode).to.equal('one_pass');
  expect(m.manifestBlocks).to.deep.equal(sourceBlocks);
  expect(b.block_check!.repair_written.length).to.be.above(0).and.below(48);
  expect(b.block_check!.checked_after_merge).to.equal(48 - b.block_check!.repair_written.length);
  const overlay = res.conversion.artifacts[0];
  expect(overlay.modified_by_fix).to.equal(true);
  // The overlay was rebased onto the one-pass volume (by its partial name, which the import then renamed) before
  // its merge: no reference to the nbdkit reader is left.
  expect(m.backing).to.equal(b.volume);
  expect(m.sameAsSource, 'the repair was merged').to.equal(false);
  expect(m.repaired).to.equal(true);
  // The source VM's files on the datastore are as uploaded: nbdkit read them, nothing wrote them.
  expect(o.datastore.extent).to.equal(uploaded.extent);
  expect(o.datastore.desc).to.equal(uploaded.desc);
}

function checkResume({ kr: o, sourceBlocks }: Evidence) {
  expect(o.cuts).to.equal(1);
  const r = o.r;
  expect(r.status, JSON.stringify(r.state_history)).to.equal('completed');
  expect(r.attempts).to.be.at.least(2);
  expect(r.state_history.map((h) => h.reason ?? '').join('\n')).to.match(/op-1 lost/);
  const res = r.result!;
  const m = o.read!;
  expect(res.data_path[0].mode).to.equal('one_pass');
  expect(res.repair_beside_copy.ran, 'the retry ran its repair beside the resumed copy').to.equal(true);
  // The same file, continued: what the killed worker wrote was read back for the hash, not fetched again.
  expect(m.volumeInode).to.equal(o.inode);
  expect(res.export.bytes_rehashed).to.be.at.least(4 * MIB);
  expect(o.downloaded, 'the disk was not downloaded twice').to.be.below(BOOT_BYTES * 1.6);
  expect(m.manifestBlocks, 'the resumed hash: every block as a user recomputes it').to.deep.equal(sourceBlocks);
  expect(m.repaired).to.equal(true);
  expect(r.ledger.map((e) => e.id)).to.include(o.partial);
}

function checkRefused({ huge: o, pool }: Evidence) {
  const { r, id } = o;
  expect(r.status).to.equal('failed');
  const msg = JSON.stringify(r.state_history) + (r.error ?? '');
  expect(msg).to.include('15360.00 GiB (16492674416640 bytes)').and.include(`in pool ${pool}`)
    .and.match(/which has \d+\.\d\d GiB \(\d+ bytes\) free: refused before any byte moved/);
  // Nothing written: no volume, no partial file in the pool, no disk file in the export folder, no range fetched.
  expect(o.pool.filter((f) => f.includes(id))).to.deep.equal([]);
  expect(o.exportFiles.filter((f) => /huge-flat/.test(f))).to.deep.equal([]);
  expect(r.ledger).to.deep.equal([]);
  expect(o.downloaded).to.be.below(MIB);
}

describe('one pass: shape B writes each disk straight into its target volume (issue 36) @vm', function () {
  this.timeout(1_800_000);

  proofTests<Evidence>({
    spec: async () => ({ name: 'vsphere-one-pass', entries: [__filename], extra: fixtureInputs(await ensureTinyGuest()) }),
    produce,
    runTitle: 'runs the four jobs in order on one stack (or reuses the record of the same inputs)',
    checks: [
      ['a flat boot disk goes straight into its raw volume, holes kept, repaired exactly; the snapshot-delta disk falls back, named; both compare equal', checkFallback],
      ['the repair runs beside the copy, on an overlay over an nbdkit reader of the source: overlapped in time, the volume is source + exactly its writes, the source unchanged', checkBeside],
      ['a dropped connection and a worker killed mid-copy: the job resumes into the same volume file and the result still compares equal', checkResume],
      ['a pool too small for the disk: refused before any byte moves, naming both sizes', checkRefused],
    ],
  });
});
