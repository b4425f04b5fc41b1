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

interface Rec { status: string; attempts: number; state_history: { state: string; reason?: string }[]; result?: Record<string, unknown> & JobResult; error?: string; ledger: { id: string; kind: string }[] }
interface BlockCheck { block_bytes: number; blocks: number; checked_after_merge: number; repair_written: number[] }
interface JobResult {
  volumes: { path: string; format: string }[]; data_path: { mode: string; reason?: string; volume?: string; sha256?: string; verified?: string; block_check?: BlockCheck }[];
  conversion: { report_path: string; artifacts: { disk_id: string; path: string; modified_by_fix?: boolean }[] };
  export: { manifest_path: string; resumes: number; bytes_rehashed: number; bytes_sparse: number; files: { target?: string; sha256?: string }[] }; boot: { status: string };
  repair_beside_copy: { ran: boolean; reason?: string; repair?: Span; copy?: Span; overlap_seconds?: number };
  stage_seconds?: { repair: number; import: number; boot: number };
}
interface Span { started_at: string; finished_at: string }
/** A progress event as the job store keeps it in its Redis stream (queue/store.ts). */
interface StoredEvent { phase: string; timestamp: string; message: string }

/** The block hash list an export's manifest recorded for its first disk. */
const manifestBlocks = (manifestPath: string) => (JSON.parse(readFileSync(manifestPath, 'utf8')) as { disks: { data_path: { blocks: { sha256: string[] } } }[] }).disks[0].data_path.blocks.sha256;
describe('one pass: shape B writes each disk straight into its target volume (issue 36) @vm', function () {
  this.timeout(1_800_000);
  let s: PlanStack;
  let proxy: ProxyControl;
  const workers: Proc[] = [];
  let boot: Awaited<ReturnType<typeof flatBootDisk>>;
  let chain: ReturnType<typeof makeSnapshotChain>;
  const { finished, worker, submit: submitTo } = jobDriver<Rec>(() => s, () => proxy, workers);
  const submit = (vm: string) => submitTo(vm, s.lv.uri);
  const addVm = async (name: string, mac: string, disks: { file: string; bytes: number; local: [string, string][] }[]) => {
    await createPlanVm(s.m, { name, mac, disks: disks.map((d) => ({ ds: 'LocalDS_0', file: `${name}/${d.file}`, bytes: d.bytes })) });
    for (const d of disks) for (const [local, remote] of d.local) await upload(s.v, local, `${name}/${remote}`);
  };
  const repaired = (volume: string, overlay: string) => repairedExactly(s.dir, boot.raw, volume, overlay);

  before(async function () {
    this.timeout(300_000);
    s = await startPlanStack({ prefix: 'onepass', workers: {}, env: { FERRY_EXPORT_CHUNK_BYTES: String(MIB), FERRY_ONE_PASS_BLOCK_BYTES: String(MIB) } });
    proxy = await startProxy(s.v.port);
    boot = await flatBootDisk(s.dir, 'boot');
    chain = makeSnapshotChain(s.dir, 8);
    const flat = (name: string) => ({ file: `${name}.vmdk`, bytes: BOOT_BYTES, local: [[boot.desc, `${name}.vmdk`], [boot.extent, `${name}-flat.vmdk`]] as [string, string][] });
    // The descriptor names its extent "boot-flat.vmdk": each VM's files keep those names in its own folder.
    await addVm('od', '00:50:56:36:00:01', [flat('boot'), { file: 'base-000001.vmdk', bytes: chain.bytes, local: [[chain.delta, 'base-000001.vmdk'], [chain.base, 'base.vmdk'], [chain.baseExtent, 'base-flat.vmdk']] }]);
    await addVm('kr', '00:50:56:36:00:02', [flat('boot')]);
    await addVm('ov', '00:50:56:36:00:04', [flat('boot')]);
    // 15 TiB of flat disk, sparse on the simulator's datastore: more than any pool here holds.
    const huge = path.join(s.dir, 'huge');
    mkdirSync(huge, { recursive: true });
    qemuImg(['create', '-q', '-f', 'vmdk', '-o', 'subformat=monolithicFlat', path.join(huge, 'huge.vmdk'), '15T']);
    await createPlanVm(s.m, { name: 'huge', mac: '00:50:56:36:00:03', disks: [{ ds: 'LocalDS_0', file: 'huge/huge.vmdk', bytes: 15 * 2 ** 40 }] });
    await upload(s.v, path.join(huge, 'huge.vmdk'), 'huge/huge.vmdk');
    const extent = path.join(s.v.datastores.LocalDS_0, 'huge', 'huge-flat.vmdk');
    closeSync(openSync(extent, 'w'));
    truncateSync(extent, 15 * 2 ** 40);
    await worker('op-1');
  });
  after(async () => {
    await Promise.all(workers.map((w) => w.kill()));
    await proxy?.close();
    for (const d of ['od', 'kr', 'ov']) {
      await s.lv.virsh(['destroy', d]).catch(tolerate(`destroy ${d}`));
      await s.lv.virsh(['undefine', d, '--remove-all-storage']).catch(tolerate(`undefine ${d}`));
    }
    await s?.stop();
  });

  it('a flat boot disk goes straight into its raw volume, holes kept, repaired exactly; the snapshot-delta disk falls back, named; both compare equal', async () => {
    const id = await submit('od');
    const r = await finished(id);
    expect(r.status, JSON.stringify(r.state_history)).to.equal('completed');
    const res = r.result!;
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
    const report = JSON.parse(readFileSync(res.conversion.report_path, 'utf8')) as { data_path: { mode: string; reason?: string }[] };
    expect(report.data_path.map((x) => x.mode)).to.deep.equal(['one_pass', 'export_folder']);
    const manifest = JSON.parse(readFileSync(res.export.manifest_path, 'utf8')) as { disks: { data_path: { mode: string; sha256?: string; verified?: string; blocks: { block_bytes: number; sha256: string[] }; block_check: BlockCheck } }[] };
    expect(manifest.disks[0].data_path).to.include({ mode: 'one_pass' }).and.not.have.property('sha256');
    expect(res.export.files.find((f) => f.target), 'the export result\'s one-pass file').to.not.have.property('sha256');
    expect(manifest.disks[0].data_path.verified).to.be.a('string');
    // The block hash list: each entry is what a user recomputes over the source, block by block.
    const list = manifest.disks[0].data_path.blocks;
    expect(list.block_bytes).to.equal(MIB);
    expect(list.sha256).to.deep.equal(blockList(boot.raw));
    // The check after the merge: the blocks the repair wrote are named, every other one was re-hashed and matched.
    const check = b.block_check!;
    expect(check).to.deep.equal(manifest.disks[0].data_path.block_check);
    expect(check.blocks).to.equal(48);
    expect(check.repair_written.length).to.be.above(0).and.below(48);
    expect(check.checked_after_merge).to.equal(48 - check.repair_written.length);
    expect(report.data_path[0]).to.not.have.property('blocks');

    // The boot volume: raw, in the pool, its zero runs holes, equal to source + the repair's writes and nothing else.
    const [bv, dv] = res.volumes;
    expect(bv.format).to.equal('raw');
    expect(path.dirname(bv.path)).to.equal(s.lv.poolDir);
    expect(statSync(bv.path).size).to.equal(BOOT_BYTES);
    expect(statSync(bv.path).blocks * 512, 'zeros left as holes').to.be.below(BOOT_BYTES - 8 * MIB);
    expect(res.export.bytes_sparse).to.be.above(8 * MIB);
    const overlay = res.conversion.artifacts.find((a) => a.disk_id === 'disk-0')!;
    expect(overlay.modified_by_fix).to.equal(true);
    expect(identical(['-f', 'raw', '-F', 'raw', boot.raw, bv.path]), 'the repair wrote into the volume').to.equal(false);
    expect(repaired(bv.path, overlay.path)).to.equal(true);
    // Every block where the volume now differs from the source is one the check names as the repair's.
    const vol = blockList(bv.path);
    const changed = Array.from({ length: 48 }, (_, i) => i).filter((i) => vol[i] !== list.sha256[i]);
    expect(changed.length).to.be.above(0);
    expect(check.repair_written).to.include.members(changed);
    // The data disk: its whole chain as the source reads.
    expect(identical(['-f', 'vmdk', '-F', dv.format, chain.delta, dv.path])).to.equal(true);
    // No copy of the boot disk in the worker's scratch space: its flat extent was never written there.
    const exportDir = path.join(s.env.FERRY_EXPORT_DIR, id);
    const files = walk(exportDir);
    expect(files.filter((f) => /boot-flat\.vmdk/.test(f))).to.deep.equal([]);
    expect(files.some((f) => f.endsWith('base-flat.vmdk')), 'the delta disk went through the export folder').to.equal(true);
    expect(files.filter((f) => statSync(f).size >= BOOT_BYTES)).to.deep.equal([]);
    // The source's files on the datastore are as uploaded.
    expect(sha256(path.join(s.v.datastores.LocalDS_0, 'od', 'boot-flat.vmdk'))).to.equal(sha256(boot.extent));
  });

  it('the repair runs beside the copy, on an overlay over an nbdkit reader of the source: overlapped in time, the volume is source + exactly its writes, the source unchanged', async () => {
    proxy.throttle(1024 * 1024); // 1 MiB/s per connection: the copy of 48 MiB takes about 12 s on 4 streams
    const id = await submit('ov');
    const r = await finished(id);
    proxy.throttle(0);
    expect(r.status, JSON.stringify(r.state_history)).to.equal('completed');
    const res = r.result!;
    expect(res.boot.status).to.equal('passed');
    const bc = res.repair_beside_copy;
    expect(bc.ran, JSON.stringify(bc)).to.equal(true);
    const t = (x: string) => Date.parse(x);
    // The recorded spans overlap: the repair started before the copy ended, and the copy before the repair ended.
    expect(t(bc.repair!.started_at)).to.be.below(t(bc.copy!.finished_at));
    expect(t(bc.copy!.started_at)).to.be.below(t(bc.repair!.finished_at));
    expect(bc.overlap_seconds).to.be.above(0);
    // What warm predictions learn from this cold run (orchestration/warm.ts): the repair's whole span, not the tail left after
    // the copy, because a warm cutover runs the repair whole after the last delta.
    const whole = (t(bc.repair!.finished_at) - t(bc.repair!.started_at)) / 1000;
    expect(res.stage_seconds!.repair, JSON.stringify(res.stage_seconds)).to.be.at.least(whole);
    const recorded = (await s.rc.lrange(keys('onepass').warmStageTimes, 0, -1)).map((x) => JSON.parse(x) as { repair: number });
    expect(recorded.map((x) => x.repair), 'recorded in Redis for the predictions').to.include(res.stage_seconds!.repair);
    // The job's progress events in Redis say the same: the repair's stages reported while the copy still reported.
    const rows = (await s.rc.xrange(keys('onepass').events(id), '-', '+')) as [string, string[]][];
    const evs = rows.map(([, f]) => JSON.parse(f[1]) as StoredEvent);
    const lastCopy = Math.max(...evs.filter((e) => e.phase === 'export').map((e) => t(e.timestamp)));
    const repairEvs = evs.filter((e) => e.phase === 'fix' && e.message.endsWith('(beside the copy)'));
    expect(repairEvs.length, JSON.stringify(evs.map((e) => [e.phase, e.message]))).to.be.above(0);
    expect(Math.min(...repairEvs.map((e) => t(e.timestamp))), 'a repair event before the last copy event').to.be.below(lastCopy);
    // The pipeline's report has the fix stage starting before the copy finished, on the source through nbdkit.
    const report = JSON.parse(readFileSync(res.conversion.report_path, 'utf8')) as { stages: Record<string, { started_at?: string; result?: { disks?: { read_from?: string }[] } }> };
    expect(t(report.stages.fix.started_at!)).to.be.below(t(bc.copy!.finished_at));
    expect(report.stages.inspect.result!.disks![0].read_from).to.include('nbdkit');
    // The merge: the blocks the repair wrote come from its overlay's map, every other block re-hashed as served.
    const b = res.data_path[0];
    expect(b.mode).to.equal('one_pass');
    expect(manifestBlocks(res.export.manifest_path)).to.deep.equal(blockList(boot.raw));
    expect(b.block_check!.repair_written.length).to.be.above(0).and.below(48);
    expect(b.block_check!.checked_after_merge).to.equal(48 - b.block_check!.repair_written.length);
    const overlay = res.conversion.artifacts[0];
    expect(overlay.modified_by_fix).to.equal(true);
    // The overlay was rebased onto the one-pass volume (by its partial name, which the import then renamed) before
    // its merge: no reference to the nbdkit reader is left.
    const info = JSON.parse(qemuImg(['info', '--output=json', '-U', '-f', 'qcow2', overlay.path])) as { 'backing-filename': string };
    expect(info['backing-filename']).to.equal(b.volume);
    expect(identical(['-f', 'raw', '-F', 'raw', boot.raw, res.volumes[0].path]), 'the repair was merged').to.equal(false);
    expect(repaired(res.volumes[0].path, overlay.path)).to.equal(true);
    // The source VM's files on the datastore are as uploaded: nbdkit read them, nothing wrote them.
    const ds = path.join(s.v.datastores.LocalDS_0, 'ov');
    expect(sha256(path.join(ds, 'boot-flat.vmdk'))).to.equal(sha256(boot.extent));
    expect(sha256(path.join(ds, 'boot.vmdk'))).to.equal(sha256(boot.desc));
  });

  it('a dropped connection and a worker killed mid-copy: the job resumes into the same volume file and the result still compares equal', async () => {
    proxy.throttle(1024 * 1024); // 1 MiB/s per connection: the 48 MiB disk takes about 12 s on 4 streams
    proxy.cutAfter(3 * MIB, 1);
    const before = proxy.bytesDown;
    const id = await submit('kr');
    const partial = await until(() => readdirSync(s.lv.poolDir).find((f) => f.startsWith(`.ferry-${id}-disk0.raw`)), 120_000, 'the partial volume');
    const file = path.join(s.lv.poolDir, partial);
    await until(() => proxy.bytesDown - before >= 16 * MIB, 120_000, '16 MiB through the proxy');
    const inode = statSync(file).ino;
    expect(proxy.cuts).to.equal(1);
    await workers[0].kill();
    proxy.throttle(0);
    await worker('op-2');
    const r = await finished(id);
    expect(r.status, JSON.stringify(r.state_history)).to.equal('completed');
    expect(r.attempts).to.be.at.least(2);
    expect(r.state_history.map((h) => h.reason ?? '').join('\n')).to.match(/op-1 lost/);
    const res = r.result!;
    expect(res.data_path[0].mode).to.equal('one_pass');
    expect(res.repair_beside_copy.ran, 'the retry ran its repair beside the resumed copy').to.equal(true);
    // The same file, continued: what the killed worker wrote was read back for the hash, not fetched again.
    expect(statSync(res.volumes[0].path).ino).to.equal(inode);
    expect(res.export.bytes_rehashed).to.be.at.least(4 * MIB);
    expect(proxy.bytesDown - before, 'the disk was not downloaded twice').to.be.below(BOOT_BYTES * 1.6);
    expect(manifestBlocks(res.export.manifest_path), 'the resumed hash: every block as a user recomputes it').to.deep.equal(blockList(boot.raw));
    expect(repaired(res.volumes[0].path, res.conversion.artifacts[0].path)).to.equal(true);
    expect(r.ledger.map((e) => e.id)).to.include(file);
  });

  it('a pool too small for the disk: refused before any byte moves, naming both sizes', async () => {
    const before = proxy.bytesDown;
    const id = await submit('huge');
    const r = await finished(id, 120_000);
    expect(r.status).to.equal('failed');
    const msg = JSON.stringify(r.state_history) + (r.error ?? '');
    expect(msg).to.include('15360.00 GiB (16492674416640 bytes)').and.include(`in pool ${s.lv.pool}`).and.match(/which has \d+\.\d\d GiB \(\d+ bytes\) free: refused before any byte moved/);
    // Nothing written: no volume, no partial file in the pool, no disk file in the export folder, no range fetched.
    expect(readdirSync(s.lv.poolDir).filter((f) => f.includes(id))).to.deep.equal([]);
    expect(walk(path.join(s.env.FERRY_EXPORT_DIR, id)).filter((f) => /huge-flat/.test(f))).to.deep.equal([]);
    expect(r.ledger).to.deep.equal([]);
    expect(proxy.bytesDown - before).to.be.below(MIB);
  });
});
