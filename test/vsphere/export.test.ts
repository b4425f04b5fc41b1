// Export jobs against the vSphere simulator (vcsim from Debian's govmomi) with real processes: redis, the
// gateway, the daemon, workers with vsphere_access. Real disks made with qemu-img are uploaded to the
// simulator's datastore; the export must bring them back byte-identical with a manifest that a migrate job
// takes next. Faults: connections cut mid-file (a TCP proxy), a worker SIGKILLed mid-export, the simulator
// stopped mid-export, cancel mid-download; and the per-manager export limit across workers.
import { expect } from 'chai';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import IORedis from 'ioredis';
import { TestRedis } from '../helpers/redis';
import { Proc, startDaemonProc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { BatchSubmitted, CancelEach, DaemonJob, JobStatus, QueueStatus, StoredEvent, WorkerList } from '../helpers/api-types';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { startProxy, ProxyControl } from '../helpers/tcp-proxy';
import { managerFor } from '../../domain/vsphere/client';
import { vmDetail } from '../../domain/vsphere/inventory';
import { validateManifest, type Manifest } from '../../domain/schemas/manifest';
import type { ExportResult } from '../../domain/vsphere/export';
import { createVm, makeDisks, makeSnapshotChain, otherSessions, powerOn, sha256, tinyVm, upload } from './fixture';

/** An export job's result (services/worker/operations/export.ts runExportOp), its manifest read as one. */
type ExportJobResult = Omit<ExportResult, 'manifest'> & { manifest: Manifest; output_path: string; throughput_bytes_per_second: number | null };
/** One converted disk in a migrate job's report (domain/converter/stages/plan.ts). */
interface Artifact { disk_id: string; path: string; format: string; boot_order: number; source_path: string; source_format: string }
/** A migrate job's result (the pipeline's report), as far as read here. */
interface MigrateResult { artifacts: Artifact[] }
/** Gateway GET /jobs/:id of a job whose result is read as R (null until the job completes; read once it has). */
type JobWith<R> = Omit<JobStatus, 'result'> & { result: R };

const PASSWORD = 'vcsim-export-pw-77';
const JOB_PASSWORD = 'second-manager-pw-99';

/** Every file under a directory, relative. */
function walk(dir: string, base = dir): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => e.isDirectory() ? walk(path.join(dir, e.name), base) : [path.relative(base, path.join(dir, e.name))]);
}

describe('vSphere export jobs (vcsim)', function () {
  this.timeout(120_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-vsphere-export-'));
  const procs: Proc[] = [];
  let v: Vcsim;
  let v2: Vcsim;
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let daemon: Awaited<ReturnType<typeof startDaemonProc>>;
  let env: Record<string, string>;
  let rc: IORedis;
  let web1: { path: string; sparse: string; flat: string; flatExtent: string; delta: string; base: string; baseExtent: string; raw: string; deltaRaw: string };
  let tiny: Awaited<ReturnType<typeof tinyVm>>;
  let big: Awaited<ReturnType<typeof tinyVm>>;
  let running: Awaited<ReturnType<typeof tinyVm>>;
  let proxy: ProxyControl;
  const gwJob = async <R = ExportJobResult>(id: string) => (await req<JobWith<R>>(gw.url, 'GET', `/jobs/${id}`)).body;
  const submit = async (body: Record<string, unknown>) => {
    const r = await req<BatchSubmitted>(daemon.url, 'POST', '/jobs/submit', body);
    expect(r.status, r.text).to.equal(200);
    return r.body.job_ids[0];
  };
  const finished = <R = ExportJobResult>(id: string, ms = 60000) => until(async () => { const j = await gwJob<R>(id); return j.is_terminal && j; }, ms, `job ${id} to finish`);
  const worker = async (id: string, extra: Record<string, string> = {}, caps = ['vsphere_access', 'img_tool'], args: string[] = []) => {
    const p = await startWorkerProc({ ...env, ...extra }, id, caps, args);
    procs.push(p);
    await until(async () => (await req<WorkerList>(gw.url, 'GET', '/workers')).body.workers.some((w) => w.worker_id === id && w.active), 30000, `worker ${id}`);
    return p;
  };

  before(async function () {
    this.timeout(300_000);
    const t0 = Date.now();
    const lap = (what: string) => process.env.FERRY_TEST_LOGS && console.log(`  [setup] ${what} at ${Date.now() - t0} ms`);
    [v, v2] = await Promise.all([startVcsim({ password: PASSWORD }), startVcsim({ password: JOB_PASSWORD, args: ['-vm', '1', '-cluster', '0'] })]);
    await redis.start();
    rc = new IORedis(redis.url);
    const m = managerFor({ url: v.url, username: v.username, password: PASSWORD, ca: readFileSync(v.caFile, 'utf8') });
    // web1: a monolithicSparse disk, a monolithicFlat pair, and a snapshot delta over a flat base; a CD-ROM; EFI.
    const d = makeDisks(dir, 6);
    const c = makeSnapshotChain(dir, 4);
    const p = await createVm(m, { name: 'web1', cdrom: true, firmware: 'efi', guestId: 'debian10_64Guest', cpus: 2, memoryMB: 2048, mac: '00:50:56:aa:bb:01',
      disks: [{ file: 'web1/web1.vmdk', bytes: d.bytes }, { file: 'web1/data.vmdk', bytes: d.bytes }, { file: 'web1/base-000001.vmdk', bytes: c.bytes }] });
    for (const [local, remote] of [[d.sparse, 'web1.vmdk'], [d.flat, 'data.vmdk'], [d.flatExtent, 'data-flat.vmdk'], [c.delta, 'base-000001.vmdk'], [c.base, 'base.vmdk'], [c.baseExtent, 'base-flat.vmdk']]) await upload(v, local, `web1/${remote}`);
    const deltaRaw = path.join(dir, 'delta.raw');
    execFileSync('qemu-img', ['convert', '-O', 'raw', c.delta, deltaRaw]);
    web1 = { path: p, sparse: d.sparse, flat: d.flat, flatExtent: d.flatExtent, delta: c.delta, base: c.base, baseExtent: c.baseExtent, raw: d.raw, deltaRaw };
    tiny = await tinyVm(v, m, dir, 'tiny', 2);
    big = await tinyVm(v, m, dir, 'big', 12);
    running = await tinyVm(v, m, dir, 'running1', 1);
    await powerOn(m, running.path);
    const m2 = managerFor({ url: v2.url, username: v2.username, password: JOB_PASSWORD, insecure: true });
    await tinyVm(v2, m2, dir, 'other1', 1);

    lap('VMs and disks');
    proxy = await startProxy(v.port);
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 1h\n  parallel_downloads: 2\n');
    env = {
      ...testEnv(redis.url), FERRY_SECRET_KEY: 'export-test-secret', FERRY_HOST: '127.0.0.1', FERRY_VSPHERE_CA: v.caFile,
      // The cutting proxy in front of the simulator is the same manager: listed by scheme, host and port, so it
      // receives the default credentials (a bare host would only let it be named with its own).
      FERRY_VSPHERE_MANAGERS: `127.0.0.1,https://127.0.0.1:${proxy.port}`,
      GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: PASSWORD, FERRY_EXPORT_CHUNK_BYTES: String(1024 * 1024),
      FERRY_EXPORT_RETRIES: '3', FERRY_EXPORTS_PER_MANAGER: '2',
    };
    gw = await startGatewayProc(env);
    procs.push(gw);
    daemon = await startDaemonProc(env, cfg);
    procs.push(daemon);
    await worker('vs-1', {}, ['vsphere_access', 'img_tool'], ['--concurrency', '3']);
    lap('services');
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await proxy?.close();
    await Promise.all([v?.stop(), v2?.stop()]);
    rc?.disconnect();
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  let manifestPath: string;
  it('exports a VM (sparse disk, flat pair, snapshot chain) byte-identical, in parallel ranges, with progress and a manifest', async () => {
    const out = path.join(dir, 'out-web1');
    const id = await submit({ name: 'web1-export', vm_path: web1.path, output_path: out, options: { parallel_downloads: 4, remove_cdrom: true, show_individual_progress: true } });
    const j = await finished(id);
    expect(j.state, JSON.stringify(j.state_history)).to.equal('COMPLETED');
    const r = j.result;
    const ds = path.join(out, 'LocalDS_0', 'web1');
    // Every file identical to what was uploaded (sha256 computed by Ferry while downloading, and here from disk).
    const expected: Record<string, string> = { 'web1.vmdk': web1.sparse, 'data.vmdk': web1.flat, 'data-flat.vmdk': web1.flatExtent, 'base-000001.vmdk': web1.delta, 'base.vmdk': web1.base, 'base-flat.vmdk': web1.baseExtent };
    expect(r.files.map((f) => path.basename(f.path)).sort()).to.deep.equal(Object.keys(expected).sort());
    for (const f of r.files) {
      const want = await sha256(expected[path.basename(f.path)]);
      expect(f.sha256, f.path).to.equal(want);
      expect(await sha256(f.path), f.path).to.equal(want);
    }
    expect(walk(out).sort()).to.deep.equal([...Object.keys(expected).map((n) => `LocalDS_0/web1/${n}`), '.ferry-export.json', 'manifest.json'].sort());
    // The disks as images: the same guest-visible bytes (qemu-img compare), the chain followed to its base.
    execFileSync('qemu-img', ['compare', '-f', 'vmdk', '-F', 'raw', path.join(ds, 'web1.vmdk'), web1.raw]);
    execFileSync('qemu-img', ['compare', '-f', 'vmdk', '-F', 'raw', path.join(ds, 'data.vmdk'), web1.raw]);
    execFileSync('qemu-img', ['compare', '-f', 'vmdk', '-F', 'raw', path.join(ds, 'base-000001.vmdk'), web1.deltaRaw]);

    // The manifest validates with Ferry's own schema and describes the VM.
    manifestPath = r.manifest_path;
    const mf = validateManifest(JSON.parse(readFileSync(manifestPath, 'utf8')) as unknown);
    expect(mf.source).to.include({ provider: 'vsphere', vm_name: 'web1', datacenter: 'DC0', export_method: 'datastore-http' });
    expect(mf.vm).to.include({ cpu: 2, mem_gb: 2, firmware: 'uefi', os_hint: 'linux' });
    expect(mf.nics).to.deep.equal([{ id: mf.nics![0].id, mac: '00:50:56:aa:bb:01', network: 'VM Network', adapter: 'vmxnet3' }]);
    expect(mf.disks.map((x) => [x.id, path.basename(x.local_path), x.bytes, x.disk_type])).to.deep.equal([
      ['disk-0', 'web1.vmdk', 6 * 1024 * 1024, 'boot'], ['disk-1', 'data.vmdk', 6 * 1024 * 1024, 'data'], ['disk-2', 'base-000001.vmdk', 4 * 1024 * 1024, 'data']]);
    expect(mf.disks[0].checksum).to.equal(`sha256:${await sha256(web1.sparse)}`);
    expect(mf.disks[2].chain_length).to.equal(2);
    expect(mf.metadata!.job_id).to.equal(id);
    // remove_cdrom happened on the source and is recorded.
    expect(r.actions.join(' ')).to.match(/removed CD-ROM/);
    expect(mf.notes!.join(' ')).to.match(/removed CD-ROM/);
    const m = managerFor({ url: v.url, username: v.username, password: PASSWORD, ca: readFileSync(v.caFile, 'utf8') });
    expect((await vmDetail(m, web1.path)).cdroms).to.deep.equal([]);

    // Progress: the shape A record fields, per-file entries, a smoothed rate.
    const evs = (await req<StoredEvent[]>(gw.url, 'GET', `/jobs/${id}/events`)).body;
    const exp = evs.filter((e) => e.phase === 'exporting');
    expect(exp.length).to.be.greaterThan(0);
    const lastExp = exp[exp.length - 1].details;
    expect(lastExp).to.include.keys('current_file', 'files_downloaded', 'total_files', 'bytes_downloaded', 'total_bytes', 'percent_complete', 'rate_bytes_per_second', 'files');
    expect(Number(lastExp.total_files)).to.equal(6);
    expect(Number(lastExp.total_bytes)).to.equal(r.total_bytes);
    expect(JSON.parse(lastExp.files) as unknown[]).to.have.length(6);
    const dj = (await req<DaemonJob>(daemon.url, 'GET', `/api/v1/jobs/${id}`)).body;
    expect(dj.status).to.equal('completed');
    expect(dj.progress.percent_complete).to.equal(100);
  });

  it('the manifest feeds a migrate job that completes', async () => {
    const mf = JSON.parse(readFileSync(manifestPath, 'utf8')) as Record<string, unknown>;
    const out = path.join(dir, 'migrated');
    mf.pipeline = { inspect: { enabled: true }, fix: { enabled: false }, convert: { enabled: true }, validate: { enabled: true } };
    mf.output = { directory: out, format: 'qcow2' };
    const r = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'migrate-web1', operation: 'migrate', parameters: { manifest: mf } });
    expect(r.status, r.text).to.equal(201);
    const j = await finished<MigrateResult>('migrate-web1', 90000);
    expect(j.state, JSON.stringify(j.state_history)).to.equal('COMPLETED');
    expect(j.result.artifacts).to.have.length(3);
    for (const a of j.result.artifacts) expect(existsSync(a.path), a.path).to.equal(true);
    const boot = j.result.artifacts.find((a) => a.disk_id === 'disk-0');
    execFileSync('qemu-img', ['compare', '-F', 'raw', boot!.path, web1.raw]);
    // The snapshot chain (a delta VMDK whose parent hint names its base beside it) passes the image rule and
    // converts to the delta's content over the base.
    const chained = j.result.artifacts.find((a) => a.source_path.endsWith('base-000001.vmdk'));
    execFileSync('qemu-img', ['compare', '-F', 'raw', chained!.path, web1.deltaRaw]);
  });

  it('ferry-convert command: manager_export exports with the same code, then converts, with progress lines and exit 0', async () => {
    const out = path.join(dir, 'convert-out');
    const cfg = path.join(dir, 'manager-export.yaml');
    writeFileSync(cfg, [
      'command: manager_export', `manager_host: ${v.url}`, `manager_user: ${v.username}`, 'manager_password: ${VC_PW}', 'vm_name: tiny',
      `output_dir: ${out}`, 'parallel_streams: 2', 'out_format: raw', 'fstab_mode: preserve', 'update_grub: false', 'regen_initramfs: false', ''].join('\n'));
    const m = managerFor({ url: v.url, username: v.username, password: PASSWORD, ca: readFileSync(v.caFile, 'utf8') });
    const openBefore = await otherSessions(m);
    const r = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
      const child = spawn(path.resolve(__dirname, '..', '..', 'services', 'converter', 'ferry-convert.js'), ['--config', cfg], { env: { PATH: process.env.PATH!, HOME: process.env.HOME || '/root', TMPDIR: os.tmpdir(), VC_PW: PASSWORD, FERRY_VSPHERE_CA: v.caFile }, stdio: ['ignore', 'pipe', 'pipe'] });
      let stdout = ''; let stderr = '';
      child.stdout.setEncoding('utf8').on('data', (x) => { stdout += x; });
      child.stderr.setEncoding('utf8').on('data', (x) => { stderr += x; });
      child.on('error', reject);
      child.on('close', (code) => resolve({ code, stdout, stderr }));
    });
    expect(r.code, r.stderr).to.equal(0);
    expect(r.stderr).to.match(/exporting \/DC0\/vm\/tiny from https:\/\/127\.0\.0\.1:\d+ into .* with 2 stream/);
    expect(r.stderr, r.stderr).to.match(/export: \d\/1 files/);
    expect(r.stderr, r.stderr).to.match(/tiny: OK/);
    expect(r.stdout + r.stderr).to.not.include(PASSWORD);
    execFileSync('qemu-img', ['compare', '-f', 'raw', '-F', 'raw', path.join(out, 'tiny.raw'), tiny.raw]);
    const report = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as unknown;
    expect(JSON.stringify(report)).to.include('vsphere');
    // Its vSphere session is logged out at the end of the run, not left to expire on the manager.
    expect((await otherSessions(m)).filter((k) => !openBefore.includes(k)), 'sessions ferry-convert left open').to.deep.equal([]);
  });

  it('refuses a running VM by default with a clear reason; power_off=force powers it off (recorded) and exports', async () => {
    const refused = await finished(await submit({ vm_path: running.path, output_path: path.join(dir, 'out-running-1') }));
    expect(refused.state).to.equal('FAILED');
    expect(refused.error).to.match(/is poweredOn: Ferry exports only a powered-off VM.*options\.power_off/);
    expect(walk(path.join(dir, 'out-running-1'))).to.deep.equal([]);
    const id = await submit({ vm_path: running.path, output_path: path.join(dir, 'out-running-2'), options: { power_off: 'force' } });
    const j = await finished(id);
    expect(j.state, JSON.stringify(j.state_history)).to.equal('COMPLETED');
    expect(j.result.actions.join(' ')).to.match(/powered off .*running1.*power_off=force/);
    const evs = (await req<StoredEvent[]>(gw.url, 'GET', `/jobs/${id}/events`)).body;
    expect(evs.map((e) => e.message).join('\n')).to.match(/powered off/);
    expect(j.result.files[0].sha256).to.equal(await sha256(running.sparse));
  });

  it('takes per-job credentials (another manager, encrypted password, insecure) and keeps the password out of Redis and logs', async () => {
    const id = await submit({ vm_path: '/DC0/vm/other1', output_path: path.join(dir, 'out-other'), manager_url: v2.url, username: v2.username, password: JOB_PASSWORD, insecure: true });
    const j = await finished(id);
    expect(j.state, JSON.stringify(j.state_history)).to.equal('COMPLETED');
    expect(j.result.manifest.source!.vm_name).to.equal('other1');
    for (const key of await rc.keys('*')) {
      const t = await rc.type(key);
      const val = t === 'string' ? await rc.get(key) : t === 'hash' ? JSON.stringify(await rc.hgetall(key)) : t === 'list' ? JSON.stringify(await rc.lrange(key, 0, -1)) : t === 'stream' ? JSON.stringify(await rc.xrange(key, '-', '+')) : t === 'zset' ? JSON.stringify(await rc.zrange(key, 0, -1)) : '';
      expect(String(val), key).not.to.include(JOB_PASSWORD);
    }
    for (const p of procs) expect(p.logs.join('')).not.to.include(JOB_PASSWORD);
    // A wrong per-job password fails at once (no retries), saying so without the password.
    const bad = await finished(await submit({ vm_path: '/DC0/vm/other1', output_path: path.join(dir, 'out-other-bad'), manager_url: v2.url, username: v2.username, password: 'wrong-pw-123', insecure: true }));
    expect(bad.state).to.equal('FAILED');
    expect(bad.error).to.match(/user name or password is wrong/).and.not.include('wrong-pw-123');
    expect(bad.attempts).to.equal(1);
  });

  it('resumes a connection cut mid-file with Range: bytes fetched twice stay within one chunk, reported in the result', async () => {
    proxy.throttle(0);
    proxy.cutAfter(1536 * 1024, 2);
    const url = `https://127.0.0.1:${proxy.port}/sdk`;
    const id = await submit({ vm_path: big.path, output_path: path.join(dir, 'out-cut'), manager_url: url, options: { parallel_downloads: 1 } });
    const j = await finished(id);
    expect(j.state, JSON.stringify(j.state_history)).to.equal('COMPLETED');
    expect(proxy.cuts).to.equal(2);
    expect(j.attempts).to.equal(1);
    expect(j.result.resumes).to.be.at.least(2);
    expect(j.result.bytes_refetched).to.be.at.most(1024 * 1024);
    expect(j.result.files[0].sha256).to.equal(await sha256(big.sparse));
    expect(await sha256(j.result.files[0].path)).to.equal(await sha256(big.sparse));
  });

  it('a worker SIGKILLed mid-export: another worker finishes from the partial files', async () => {
    proxy.cutAfter(0, 0);
    proxy.throttle(512 * 1024); // 512 KiB/s per connection: the big disk (~4.5 MiB sparse) takes ~9 s on one stream
    const url = `https://127.0.0.1:${proxy.port}/sdk`;
    const spare = await worker('vs-spare', {}, ['vsphere_access']);
    const out = path.join(dir, 'out-kill');
    const id = await submit({ vm_path: big.path, output_path: out, manager_url: url, options: { parallel_downloads: 1 } });
    const run = await until(async () => { const j = await gwJob(id); return j.state === 'RUNNING' && Number(j.latest_event?.details?.bytes_downloaded) >= 1536 * 1024 && j; }, 90000, 'export running with 1.5 MiB done');
    const victimId = run.worker_id as string;
    const victim = victimId === 'vs-spare' ? spare : procs.find((p) => p.proc.spawnargs.includes(victimId))!;
    await victim.kill();
    expect(walk(out).some((f) => f.endsWith('.ferry-part'))).to.equal(true);
    const j = await finished(id, 90000);
    expect(j.state, JSON.stringify(j.state_history)).to.equal('COMPLETED');
    expect(j.state_history.map((h) => h.reason).join('\n')).to.match(new RegExp(`${victimId} lost`));
    expect(j.worker_id).to.not.equal(victimId);
    expect(j.result.files[0].sha256).to.equal(await sha256(big.sparse));
    // It continued: the bytes the victim wrote were read back for the checksum, not fetched again.
    expect(j.result.bytes_rehashed).to.be.at.least(512 * 1024);
    expect(walk(out).filter((f) => f.includes('.ferry-part'))).to.deep.equal([]);
  });

  it('cancel mid-download stops every stream and removes partial files', async () => {
    proxy.throttle(512 * 1024);
    const url = `https://127.0.0.1:${proxy.port}/sdk`;
    const out = path.join(dir, 'out-cancel');
    const id = await submit({ vm_path: big.path, output_path: out, manager_url: url, options: { parallel_downloads: 3 } });
    await until(async () => {
      const j = await gwJob(id);
      if (Number(j.latest_event?.details?.bytes_downloaded) >= 512 * 1024) return true;
      throw new Error(`${j.state} on ${j.worker_id}: ${j.latest_event?.phase} ${j.latest_event?.details?.bytes_downloaded ?? ''} ${j.queue?.waiting_reason ?? ''}`);
    }, 90000, 'download under way');
    const c = await req<CancelEach>(daemon.url, 'POST', '/jobs/cancel', { job_ids: [id] });
    expect(c.body.cancelled).to.deep.equal([id]);
    // No stream left: nothing more flows through the proxy, and no partial file stays.
    await until(() => walk(out).length === 0, 15000, 'partial files removed');
    const before = proxy.bytesDown;
    await until(async () => {
      const a = proxy.bytesDown;
      await new Promise((r) => setTimeout(r, 700));
      return proxy.bytesDown === a && a;
    }, 10000, 'no more bytes flowing');
    expect(proxy.bytesDown - before).to.be.below(3 * 512 * 1024);
    expect((await gwJob(id)).state).to.equal('CANCELLED');
    expect(walk(out)).to.deep.equal([]);
  });

  it('the per-manager limit: 6 exports with FERRY_EXPORTS_PER_MANAGER=2 never run more than 2 at once, wait with a reason, all complete; two exports of one VM never overlap (the source guard)', async () => {
    // Six VMs (one VM is exported by one job at a time: the source guard), and tiny once more.
    const m = managerFor({ url: v.url, username: v.username, password: PASSWORD, ca: readFileSync(v.caFile, 'utf8') });
    const vms = [tiny, ...await Promise.all([1, 2, 3, 4, 5].map((i) => tinyVm(v, m, dir, `lim-${i}`, 2)))];
    proxy.throttle(1024 * 1024);
    await worker('vs-2', {}, ['vsphere_access'], ['--concurrency', '3']);
    const url = `https://127.0.0.1:${proxy.port}/sdk`;
    const ids: string[] = [];
    for (let i = 0; i < 7; i++) ids.push(await submit({ vm_path: vms[i % 6].path, output_path: path.join(dir, `out-limit-${i}`), manager_url: url, options: { parallel_downloads: 1 } }));
    let bothTiny = false;
    let maxRunning = 0;
    let samples = 0;
    const reasons = new Set<string>();
    let queueReason = '';
    for (const end = Date.now() + 60000; Date.now() < end;) {
      const states = await Promise.all(ids.map(async (id) => (await gwJob(id))));
      const runningNow = states.filter((j) => j.state === 'RUNNING').length;
      bothTiny ||= states[0].state === 'RUNNING' && states[6].state === 'RUNNING';
      maxRunning = Math.max(maxRunning, runningNow);
      samples++;
      for (const j of states) if (j.state === 'QUEUED' && j.queue.waiting_reason) reasons.add(j.queue.waiting_reason);
      if (!queueReason) { const q = (await req<QueueStatus>(gw.url, 'GET', '/queue')).body; queueReason = q.queues.map((x) => x.waiting_reason).find(Boolean) || ''; }
      if (states.every((j) => j.is_terminal)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const finals = await Promise.all(ids.map((id) => gwJob(id)));
    expect(finals.map((j) => j.state)).to.deep.equal(Array(7).fill('COMPLETED'));
    expect(bothTiny, 'two exports of tiny ran at once').to.equal(false);
    expect(samples).to.be.greaterThan(10);
    expect(maxRunning).to.equal(2);
    expect([...reasons].join('\n')).to.match(/waiting for an export slot on vSphere manager https:\/\/127\.0\.0\.1:\d+: 2 of 2 in use/);
    expect(queueReason).to.match(/job\(s\) waiting: waiting for an export slot/);
    for (const [i, j] of finals.entries()) expect(j.result.files[0].sha256).to.equal(await sha256(vms[i % 6].sparse));
  });

  it('the simulator stopped mid-export: the job fails after its retries with the reason, nothing half-written unmarked', async () => {
    const v3 = await startVcsim({ password: PASSWORD });
    const p3 = await startProxy(v3.port);
    try {
      const m3 = managerFor({ url: v3.url, username: v3.username, password: PASSWORD, insecure: true });
      const vm = await tinyVm(v3, m3, dir, 'doomed', 24);
      p3.throttle(512 * 1024);
      const out = path.join(dir, 'out-doomed');
      const id = await submit({ vm_path: vm.path, output_path: out, manager_url: `https://127.0.0.1:${p3.port}/sdk`, username: v3.username, password: PASSWORD, insecure: true, options: { parallel_downloads: 2 } });
      await until(async () => {
        const j = await gwJob(id);
        if (j.is_terminal) throw new Error(`ended early: ${j.state} ${j.error} ${JSON.stringify((await req<StoredEvent[]>(gw.url, 'GET', `/jobs/${id}/events`)).body.map((e) => [e.phase, e.details.bytes_downloaded]))} ${JSON.stringify(j.result?.files)}`);
        return Number(j.latest_event?.details?.bytes_downloaded) >= 1024 * 1024;
      }, 30000, 'download under way');
      await v3.stop();
      const j = await finished(id, 90000);
      expect(j.state).to.equal('FAILED');
      expect(j.error).to.match(/cannot be reached|closed .* bytes early|gave up/);
      expect(j.attempts).to.equal(j.max_attempts);
      expect(existsSync(path.join(out, 'manifest.json'))).to.equal(false);
      // Every file left is either marked partial (.ferry-part with its state) or the export's own state file.
      for (const f of walk(out)) expect(f, f).to.match(/\.ferry-part(\.json)?$|^\.ferry-export\.json$/);
      const part = walk(out).find((f) => f.endsWith('.ferry-part'));
      expect(part, 'a marked partial file').to.be.a('string');
      expect(statSync(path.join(out, part!)).size).to.be.below(statSync(vm.sparse).size + 1);
    } finally {
      await p3.close();
      await v3.stop();
    }
  });
});
