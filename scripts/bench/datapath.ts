// npm run -s bench:datapath (issue 36 item 6): what one pass costs against moving the bytes once. Its own stack
// (test/plans/fixture.ts: Redis, the simulator, the tests' private libvirtd, a daemon, one shape B worker) and one
// VM whose 12 GiB flat disk holds the tiny real guest (test/fixtures/tiny-guest.ts) plus 8 GiB of random data (the
// rest zeros, holes on the datastore). In the same run:
//   - bare download: the flat extent fetched with BENCH_STREAMS (default 4) parallel ranged GETs of
//     FERRY_EXPORT_CHUNK_BYTES through Ferry's own HTTP agent, each range written at its offset in one write per run
//     of data past the page cache (zeros left as holes; both as one pass writes), no hash, no state (the floor of
//     moving the bytes once);
//   - repair alone: the pipeline's repair-only mode (runPipeline in this process: qcow2 overlay, the migration's
//     repairs) on the same guest, the same flat extent read as raw;
//   - both at once: the bare download and the repair alone started together, the floor of running a copy and a
//     repair side by side on this machine's cores (printed beside ferry's time, not part of the last line);
//   - ferry: the shape B job (migrate_vm) of the VM into the pool, its wall time from submit until the boot check
//     starts (the job's phase turns `boot`), so the boot check is not counted.
// A line gives each phase's CPU use, all processes of the machine (/proc/stat), against its cores x seconds: what the
// work of a phase costs, so a wall time above the floor can be told from the cores being full.
// `written` is the sum of write_bytes in /proc/<pid>/io over the worker's process tree (a reaped child's count is
// added to its parent's, so qemu-img is in it), after the job less before, plus the last count sampled of the
// processes that detach from it (guestfish --listen and its appliance, found by the job's folder in their command
// line), per byte of the source's data (its allocated bytes: zeros are holes on both sides, never written). `scratch peak` is the highest space taken (allocated blocks, sampled every 250 ms) outside the
// target volume: the job's export folder, libguestfs's scratch folder and the pool's other files.
import { execFileSync } from 'node:child_process';
import { existsSync, lstatSync, mkdtempSync, readdirSync, readFileSync, rmSync, promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { request } from 'undici';
import { req } from '../../test/helpers/http';
import { TINY_GUEST_MARKER } from '../../test/fixtures/tiny-guest';
import { type PlanStack, startPlanStack } from '../../test/plans/fixture';
import { makeSourceDisk } from './source-disk';
import { cmdlineOf, cpuByKind, procStats, stopOnSignal, type ProcStat } from './common';
import { tolerate } from '../../test/helpers/teardown';
import { folderUrl } from '../../domain/vsphere/download';
import { directWriter, openDirect } from '../../domain/vsphere/direct-sink';
import { runPipeline } from '../../domain/converter/pipeline';
import { MIGRATION_REPAIR } from '../../domain/converter/guest';
import { validateManifest } from '../../domain/schemas/manifest';

const GIB = 2 ** 30;
const MIB = 2 ** 20;
const DISK = 12 * GIB;
const RANDOM = 8 * GIB;
const RANDOM_AT = 2 * GIB;
const STREAMS = Number(process.env.BENCH_STREAMS || 4);
const CHUNK = 8 * MIB;
const FINAL = ['completed', 'failed', 'cancelled'];
const ZERO = Buffer.alloc(4 * MIB);
const load = () => os.loadavg().map((x) => x.toFixed(1)).join(' ');

/** The source disk on the datastore: the tiny guest at offset 0, 8 GiB of random data from 2 GiB, holes elsewhere;
 *  a monolithicFlat descriptor uploaded beside it. Returns its bytes of data (allocated blocks). */
async function makeSource(s: PlanStack): Promise<{ extent: string; data: number }> {
  const extent = await makeSourceDisk(s, { name: 'dp', mac: '00:50:56:36:06:01', bytes: DISK, dataAt: RANDOM_AT, data: RANDOM });
  return { extent, data: lstatSync(extent).blocks * 512 };
}

/** The floor: the flat extent in STREAMS parallel ranged GETs, each range written at its offset; seconds. */
async function bareDownload(s: PlanStack, out: string): Promise<number> {
  const u = folderUrl(s.m, { datastore: 'LocalDS_0', path: 'dp/dp-flat.vmdk', dcPath: 'DC0' });
  const cookie = await s.m.sessionCookie();
  const fh = await fsp.open(out, 'w');
  // Past the page cache where the file system allows it, as Ferry's copy writes a one-pass volume (direct-sink.ts):
  // through the cache, each new page cost a fault the host serves, 3-4 core-s per GiB here (stop 59).
  const direct = await openDirect(out);
  const plain = async (bufs: Buffer[], at: number) => { await fh.writev(bufs, at); };
  const write = direct ? directWriter(out, direct, plain) : plain;
  const t0 = Date.now();
  let next = 0;
  const stream = async () => {
    for (let at = next; at < DISK; at = next) {
      next += CHUNK;
      const r = await request(u, { dispatcher: s.m.agent, headers: { cookie, range: `bytes=${at}-${Math.min(DISK, at + CHUNK) - 1}` } });
      if (r.statusCode !== 206) throw new Error(`range at ${at}: HTTP ${r.statusCode}`);
      // Zeros stay holes, as one pass leaves them: the same bytes land on disk on both sides. The pieces TLS hands
      // over (16 KiB) go down in one writev per run of data, as Ferry's copy writes them: a write per piece costs
      // a hop into libuv's pool each, and a floor that pays it is no floor.
      let runAt = at;
      let run: Buffer[] = [];
      let runLen = 0;
      const flush = async () => { if (runLen) await write(run, runAt); runAt += runLen; run = []; runLen = 0; };
      for await (const c of r.body) {
        const b = c as Buffer;
        if (b.equals(ZERO.subarray(0, b.length))) { await flush(); runAt += b.length; continue; }
        run.push(b); runLen += b.length;
        if (runLen >= MIB) await flush();
      }
      await flush();
    }
  };
  await Promise.all(Array.from({ length: STREAMS }, stream));
  await fh.sync();
  await direct?.close();
  await fh.close();
  return (Date.now() - t0) / 1000;
}

/** The repair alone: the pipeline's repair-only mode on the same guest (the flat extent read as raw); seconds. */
async function repairAlone(extent: string, dir: string): Promise<number> {
  const manifest = validateManifest({
    manifest_version: '1.0', source: { provider: 'vsphere', vm_name: 'dp' }, vm: { cpu: 1, mem_gb: 1, firmware: 'bios', os_hint: 'linux' },
    disks: [{ id: 'disk-0', source_format: 'raw', bytes: DISK, local_path: extent, boot_order_hint: 0 }],
    pipeline: { inspect: { enabled: true }, convert: { enabled: false }, validate: { enabled: true }, fix: MIGRATION_REPAIR },
    output: { directory: dir, format: 'qcow2' },
  });
  const t0 = Date.now();
  const r = await runPipeline(manifest, {});
  if (!r.success) throw new Error(`the repair alone failed: ${JSON.stringify(r.errors ?? r)}`);
  return (Date.now() - t0) / 1000;
}

/** The floor of the repair beside the copy on this machine: the bare download and the repair alone started
 *  together (on 2 cores they share the CPUs, as Ferry's copy and repair do); seconds until both have ended. */
async function bothAtOnce(s: PlanStack, extent: string): Promise<number> {
  const file = path.join(s.dir, 'bare-both.raw');
  const dir = path.join(s.dir, 'repair-both');
  const t0 = Date.now();
  try {
    await Promise.all([bareDownload(s, file), repairAlone(extent, dir)]);
    return (Date.now() - t0) / 1000;
  } finally {
    rmSync(file, { force: true });
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Each process's children, from one scan of /proc (or `table`, a scan already made). */
function children(table = procStats()): Map<number, number[]> {
  const kids = new Map<number, number[]>();
  for (const p of table) kids.set(p.ppid, [...(kids.get(p.ppid) ?? []), p.pid]);
  return kids;
}

/** Every process below `root` (itself included), from one scan of /proc (or `kids`, from a scan already made). */
function tree(root: number, kids = children()): number[] {
  const out: number[] = [];
  for (let todo = [root]; todo.length;) { const p = todo.pop()!; out.push(p); todo.push(...(kids.get(p) ?? [])); }
  return out;
}

const HZ = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());
/** CPU seconds the whole machine has been busy (every process: the simulator, the worker, the appliance), from
 *  /proc/stat: all time but idle and iowait. What a phase took of the cores is the difference. */
function busySeconds(): number {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  return (f.reduce((a, b) => a + b, 0) - f[3] - f[4]) / HZ;
}
/** How much of the cores a phase used: "<busy> core-s of <cores x seconds> (<share>%)". */
const cpuUse = (busy: number, seconds: number) => `${busy.toFixed(0)} core-s of ${(os.cpus().length * seconds).toFixed(0)} (${((busy / (os.cpus().length * seconds)) * 100).toFixed(0)}%)`;

/** write_bytes of a process tree (each process's count includes its reaped children). */
const writeBytes = (root: number) => tree(root).reduce((a, p) => {
  try { return a + Number(/write_bytes: (\d+)/.exec(readFileSync(`/proc/${p}/io`, 'utf8'))![1]); } catch { return a; }
}, 0);

/** Allocated bytes under `dir`, files whose inode is in `skip` left out. */
function allocated(dir: string, skip: Set<number>): number {
  if (!existsSync(dir)) return 0;
  let n = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    try {
      if (e.isDirectory()) n += allocated(p, skip);
      else { const st = lstatSync(p); if (!skip.has(st.ino)) n += st.blocks * 512; }
    } catch { /* removed meanwhile */ }
  }
  return n;
}

interface JobView {
  status: string; progress?: { phase?: string }; error?: unknown;
  result?: { repair_beside_copy?: { ran: boolean; repair?: { started_at: string; finished_at?: string }; copy?: { started_at: string; finished_at?: string } }; conversion?: { report_path?: string } };
}
interface ReportView { stages: Record<string, { started_at?: string; duration_seconds?: number }>; summary: { timings: Record<string, number> } }
interface Run { seconds: number; written: number; scratchPeak: number; phases: string; busy: number; byKind: Record<string, number> }

/** What a process is, for the CPU by process: this process (the bare client and the repair alone run in it), Ferry's
 *  services, the simulator, the appliance and the tools the job runs. */
function kindOf(s: PlanStack) {
  const worker = s.workers.dp.proc.pid;
  const daemons = s.daemons.map((d) => d.proc.pid);
  const tools: [RegExp, string][] = [[/vcsim/, 'simulator'], [/qemu-system/, 'appliance (qemu)'], [/nbdkit/, 'nbdkit'], [/qemu-img/, 'qemu-img'],
    [/guestfish|supermin/, 'guestfish'], [/redis-server/, 'redis'], [/libvirtd|virtlogd/, 'libvirtd']];
  return (pid: number, cmd: string) => (pid === process.pid ? 'this process' : pid === worker ? 'worker' : daemons.includes(pid) ? 'daemon'
    : tools.find(([re]) => re.test(cmd))?.[1] ?? 'other');
}

/** "<kind> <core-s>, ..." from the largest, those of 0.5 core-s or more, and what the samples missed of `busy`. */
function byKindLine(byKind: Record<string, number>, busy: number): string {
  const all = Object.entries(byKind).sort((a, b) => b[1] - a[1]);
  const seen = all.reduce((a, [, v]) => a + v, 0);
  return `${all.filter(([, v]) => v >= 0.5).map(([k, v]) => `${k} ${v.toFixed(1)}`).join(', ')}; not seen by the samples ${(busy - seen).toFixed(1)}`;
}

/** Processes outside the worker's tree that work for the job: libguestfs's `guestfish --listen` detaches (its
 *  parent becomes init) with the appliance below it; found by the job's export folder in their command line. */
function detached(exportDir: string, table: ProcStat[], kids: Map<number, number[]>): number[] {
  return table.filter((p) => cmdlineOf(p)?.includes(exportDir)).flatMap((p) => tree(p.pid, kids));
}

/** The last write_bytes seen of each process (a detached one's count is lost when it exits: the last sample stands;
 *  a child reaped by a sampled parent may count twice, an upper bound of a few MiB here). */
function sampleWrites(pids: number[], seen: Map<number, number>) {
  for (const p of pids) {
    try { seen.set(p, Number(/write_bytes: (\d+)/.exec(readFileSync(`/proc/${p}/io`, 'utf8'))![1])); } catch { /* gone meanwhile */ }
  }
}

/** The shape B job of the VM, sampled every 250 ms: its time to the boot check, the worker tree's writes and the
 *  scratch space outside the target volume (known by its inode: the import links it under the volume's name). */
async function ferryJob(s: PlanStack, guestfsTmp: string): Promise<Run> {
  const worker = s.workers.dp.proc.pid!;
  const w0 = writeBytes(worker);
  const b0 = busySeconds();
  const procs = cpuByKind(kindOf(s), { timer: false });
  let byKind: Record<string, number> | undefined;
  let busy = 0;
  const t0 = Date.now();
  const parameters = { vm_path: s.vm('dp'), source_type: 'vsphere', destination: { type: 'kvm', virt_uri: s.lv.uri }, network_mapping: { 'VM Network': s.net }, pool: s.lv.pool, power_off: 'force', parallel_downloads: STREAMS, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 900 } };
  const r = await req<{ job_id: string }>(s.url, 'POST', '/jobs/operation', { operation: 'migrate_vm', parameters });
  if (r.status !== 201) throw new Error(`submitting the job: ${r.status} ${r.text}`);
  const id = r.body.job_id;
  const exportDir = path.join(s.env.FERRY_EXPORT_DIR, id);
  const volume = new Set<number>();
  let bootAt = 0;
  let peak = 0;
  const phases: string[] = [];
  const outside = new Map<number, number>();
  for (;;) {
    const j = (await req<JobView>(s.url, 'GET', `/jobs/${id}`)).body;
    const phase = j.progress?.phase ?? '';
    if (phase && !phases.some((x) => x.startsWith(`${phase} `))) phases.push(`${phase} ${((Date.now() - t0) / 1000).toFixed(0)}`);
    if (!bootAt && phase === 'boot') { bootAt = Date.now(); busy = busySeconds() - b0; byKind = procs.stop(); }
    // One scan of /proc per sample, for the CPU by process and both trees (there were three until stop 58: this
    // sampling's own CPU, 5 core-s over ferry's job at stop 55, is on the same cores as the job; the bare download
    // runs with no sampling).
    const table = procStats();
    if (!byKind) procs.sample(table);
    const kids = children(table);
    const workers = new Set(tree(worker, kids));
    sampleWrites(detached(exportDir, table, kids).filter((p) => !workers.has(p)), outside);
    for (const f of readdirSync(s.lv.poolDir)) if (f.startsWith(`.ferry-${id}-disk0.raw`)) volume.add(lstatSync(path.join(s.lv.poolDir, f)).ino);
    peak = Math.max(peak, allocated(exportDir, volume) + allocated(guestfsTmp, volume) + allocated(s.lv.poolDir, volume));
    if (FINAL.includes(j.status)) {
      byKind ??= procs.stop();
      if (j.status !== 'completed') throw new Error(`the job ended ${j.status}: ${JSON.stringify(j.error)}`);
      break;
    }
    await new Promise((res) => setTimeout(res, 250));
  }
  if (!bootAt) throw new Error('the job never reported its boot phase');
  const apart = [...outside.values()].reduce((a, b) => a + b, 0);
  const spans = await repairSpans(s, id, t0);
  return { seconds: (bootAt - t0) / 1000, written: writeBytes(worker) - w0 + apart, scratchPeak: peak, busy, byKind: byKind ?? {}, phases: `${phases.join(' s, ')} s; detached processes wrote ${apart} bytes\n  ${spans}` };
}

/** Where the job's time went beside the sampled phases: the copy's and the repair's spans (the job result) and
 *  each stage of the repair (its report), in seconds after submit. */
async function repairSpans(s: PlanStack, id: string, t0: number): Promise<string> {
  const j = (await req<JobView>(s.url, 'GET', `/jobs/${id}/record`)).body;
  const at = (iso?: string) => (iso ? ((Date.parse(iso) - t0) / 1000).toFixed(1) : '?');
  const b = j.result?.repair_beside_copy;
  const spans = b?.ran ? `copy ${at(b.copy?.started_at)}-${at(b.copy?.finished_at)} s, repair ${at(b.repair?.started_at)}-${at(b.repair?.finished_at)} s` : 'the repair ran after the copy';
  const rp = j.result?.conversion?.report_path;
  if (!rp || !existsSync(rp)) return `${spans}; no report.json to read the repair's stages from`;
  const report = JSON.parse(readFileSync(rp, 'utf8')) as ReportView;
  const stages = Object.entries(report.stages).filter(([, x]) => x.started_at).map(([k, x]) => `${k} ${at(x.started_at)}+${(x.duration_seconds ?? 0).toFixed(1)}`).join(', ');
  const timings = Object.entries(report.summary.timings).filter(([, v]) => v >= 0.5).map(([k, v]) => `${k} ${v.toFixed(1)}`).join(', ');
  return `${spans}; the repair's stages (start+seconds): ${stages}; its steps of 0.5 s or more (summed): ${timings}`;
}

const verdict = (ok: boolean) => (ok ? 'met' : 'NOT met');

async function main() {
  const commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  const guestfsTmp = mkdtempSync(path.join(os.tmpdir(), 'ferry-bench-dp-guestfs-'));
  const s = await startPlanStack({ prefix: 'benchdp', workers: { dp: 1 }, env: { LIBGUESTFS_TMPDIR: guestfsTmp } });
  // Ctrl-C (or a kill) stops the stack and removes its 8-16 GiB as the end of a run does: without it the services,
  // the simulator, libvirtd and the disks outlived the benchmark (stop 58).
  const stopAll = stopOnSignal(async () => {
    await s.lv.virsh(['destroy', 'dp']).catch(tolerate('destroy dp'));
    await s.lv.virsh(['undefine', 'dp', '--remove-all-storage']).catch(tolerate('undefine dp'));
    await s.stop();
    rmSync(guestfsTmp, { recursive: true, force: true });
  });
  try {
    const { extent, data } = await makeSource(s);
    const loads = [`before: ${load()}`];
    const bareFile = path.join(s.dir, 'bare.raw');
    const measure = async <T>(f: () => Promise<T>) => { const b0 = busySeconds(); const r = await f(); return { r, busy: busySeconds() - b0 }; };
    const { r: bare, busy: bareBusy } = await measure(() => bareDownload(s, bareFile));
    rmSync(bareFile, { force: true });
    loads.push(`after the bare download: ${load()}`);
    const repairDir = path.join(s.dir, 'repair-alone');
    const { r: repair, busy: repairBusy } = await measure(() => repairAlone(extent, repairDir));
    rmSync(repairDir, { recursive: true, force: true });
    loads.push(`after the repair alone: ${load()}`);
    const bothProcs = cpuByKind(kindOf(s));
    const { r: both, busy: bothBusy } = await measure(() => bothAtOnce(s, extent));
    const bothByKind = bothProcs.stop();
    loads.push(`after both at once: ${load()}`);
    const f = await ferryJob(s, guestfsTmp);
    loads.push(`after ferry: ${load()}`);
    const ratio = f.seconds / Math.max(bare, repair);
    const written = f.written / data;
    const scratch = (f.scratchPeak / DISK) * 100;
    console.log(`bench:datapath, commit ${commit}, ${os.cpus().length} CPUs, ${STREAMS} streams, load average (1, 5, 15 min) ${loads.join('; ')}`);
    console.log(`  bare download ${bare.toFixed(1)} s (${(DISK / MIB / bare).toFixed(0)} MiB/s of the disk); repair alone ${repair.toFixed(1)} s; ferry (to its boot check) ${f.seconds.toFixed(1)} s`);
    console.log(`  the bare download and the repair alone at once: ${both.toFixed(1)} s (what these cores allow for a copy and a repair side by side); ferry against it: ${(f.seconds / both).toFixed(2)}x`);
    console.log(`  CPU busy, all processes: bare download ${cpuUse(bareBusy, bare)}; repair alone ${cpuUse(repairBusy, repair)}; both at once ${cpuUse(bothBusy, both)}; ferry ${cpuUse(f.busy, f.seconds)}: at least ${(f.busy / os.cpus().length).toFixed(1)} s on these cores for its work as it is`);
    // What the target asks against what the cores can give: the copy and the repair cost at least what each costs
    // alone (the machine's busy time over each, the simulator serving the copy included), and no overlap runs them
    // in less than their sum over the cores.
    const cores = os.cpus().length;
    const floor = (bareBusy + repairBusy) / cores;
    const allowed = 1.2 * Math.max(bare, repair);
    console.log(`  the floor on these cores: the bare download's and the repair alone's CPU (${bareBusy.toFixed(0)} + ${repairBusy.toFixed(0)} core-s) need at least ${floor.toFixed(1)} s on ${cores} cores; 1.2x of the larger of the two is ${allowed.toFixed(1)} s, so the ratio target is ${floor <= allowed ? 'within reach' : 'out of reach'} on this machine (its floor ${(floor / Math.max(bare, repair)).toFixed(2)}x)`);
    console.log(`  CPU by process (core-s), both at once: ${byKindLine(bothByKind, bothBusy)}`);
    console.log(`  CPU by process (core-s), ferry to its boot check: ${byKindLine(f.byKind, f.busy)}`);
    console.log(`  ferry's phases, each from its first sample (seconds after submit): ${f.phases}`);
    console.log(`  worker tree wrote ${f.written} bytes (${(f.written / DISK).toFixed(3)} per byte of the disk, ${written.toFixed(3)} per byte of its data); scratch peak ${f.scratchPeak} bytes`);
    console.log(`  target ratio <= 1.2: ${verdict(ratio <= 1.2)}; written <= 1.1: ${verdict(written <= 1.1)}; scratch <= 5%: ${verdict(scratch <= 5)}`);
    console.log(`datapath: disk ${(DISK / GIB).toFixed(0)} GiB (${(data / GIB).toFixed(2)} GiB data), ferry ${f.seconds.toFixed(1)} s, bare download ${bare.toFixed(1)} s, ratio ${ratio.toFixed(2)}x, written ${written.toFixed(3)} bytes per source byte, scratch peak ${scratch.toFixed(2)}% of the disk`);
  } finally {
    await stopAll();
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
