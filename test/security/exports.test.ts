// Exports confined and cleaned up by what the job owns (issue 18 item 6), against vcsim, a real gateway and a
// real worker. The attacker chooses the job id and plants a `.ferry-export.json` (with that id as export_id)
// listing a file outside the job's folder and one in another job's folder; after the export runs and is
// cancelled, both files are still there. A partial download the job did not start is neither resumed nor
// deleted. migrate_vm exports into a 0700 folder under FERRY_DATA_DIR, and refuses one that is not its own.
import { expect } from 'chai';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import IORedis from 'ioredis';
import { TestRedis } from '../helpers/redis';
import { awaitWorkers, Proc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { startProxy, ProxyControl } from '../helpers/tcp-proxy';
import { managerFor } from '../../domain/vsphere/client';
import { tinyVm } from '../vsphere/fixture';
import { makeExportDir } from '../../services/worker/operations/migrate-vm';
import { releaseLibvirt, useLibvirt, type TestLibvirt } from '../helpers/libvirt';

const PASSWORD = 'vcsim-sec-exports-pw';

describe('security: exports confined and cleaned up by what the job owns', function () {
  this.timeout(180_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-sec-exports-'));
  const OUT = path.join(dir, 'out');
  const DATA = path.join(dir, 'data');
  const ELSE = path.join(dir, 'elsewhere');
  const procs: Proc[] = [];
  let v: Vcsim;
  let proxy: ProxyControl;
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let rc: IORedis;
  let big: Awaited<ReturnType<typeof tinyVm>>;
  let tiny: Awaited<ReturnType<typeof tinyVm>>;
  let lv: TestLibvirt;

  const job = async (id: string) => (await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`)).body;
  const finished = (id: string) => until(async () => { const j = await job(id); return j.is_terminal && j; }, 90000, `job ${id} to finish`);
  const submit = async (id: string, operation: string, parameters: object) => {
    const r = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: id, operation, parameters: { credentials: 'environment', ...parameters }, execution_policy: { retry_count: 0 } });
    expect(r.status, r.text).to.equal(201);
  };
  const downloading = (id: string) => until(async () => {
    const j = await job(id);
    if (j.is_terminal) throw new Error(`ended early: ${j.state} ${j.error}`);
    return Number(j.latest_event?.details?.bytes_downloaded) >= 256 * 1024;
  }, 60000, `job ${id} downloading`);
  const cancel = async (id: string) => {
    expect((await req(gw.url, 'DELETE', `/jobs/${id}`)).status).to.be.oneOf([200, 202]);
    return until(async () => { const j = await job(id); return j.state === 'CANCELLED' && j; }, 30000, `job ${id} cancelled`);
  };
  /** A file outside every job folder and one in another job's folder, with what they hold. */
  const victims = (tag: string) => {
    const outside = path.join(ELSE, `precious-${tag}.txt`);
    const other = path.join(OUT, `other-${tag}`, 'LocalDS_0', 'big', 'big.vmdk');
    mkdirSync(path.dirname(other), { recursive: true });
    writeFileSync(outside, `keep me ${tag}`);
    writeFileSync(other, `another job's disk ${tag}`);
    writeFileSync(other + '.ferry-part', `another job's partial ${tag}`);
    return { outside, other };
  };
  const plant = (folder: string, exportId: string, paths: string[]) => {
    mkdirSync(folder, { recursive: true });
    writeFileSync(path.join(folder, '.ferry-export.json'), JSON.stringify({ export_id: exportId, vm_path: 'x', files: Object.fromEntries(paths.map((p) => [p, { size: 1, sha256: 'x' }])), planned: paths }));
  };
  const intact = (v: { outside: string; other: string }, tag: string) => {
    expect(readFileSync(v.outside, 'utf8')).to.equal(`keep me ${tag}`);
    expect(readFileSync(v.other, 'utf8')).to.equal(`another job's disk ${tag}`);
    expect(readFileSync(v.other + '.ferry-part', 'utf8')).to.equal(`another job's partial ${tag}`);
  };

  before(async function () {
    this.timeout(300_000);
    for (const d of [OUT, ELSE]) mkdirSync(d);
    v = await startVcsim({ password: PASSWORD });
    // migrate_vm places its disks in the target pool before any byte moves: the tests' own libvirtd, never the
    // machine's (CI's machine has none at qemu:///system).
    lv = await useLibvirt();
    await redis.start();
    rc = new IORedis(redis.url);
    const m = managerFor({ url: v.url, username: v.username, password: PASSWORD, ca: readFileSync(v.caFile, 'utf8') });
    big = await tinyVm(v, m, dir, 'big', 12);
    tiny = await tinyVm(v, m, dir, 'tiny', 1);
    proxy = await startProxy(v.port);
    proxy.throttle(256 * 1024);
    const env = {
      ...testEnv(redis.url, 'secexp'), FERRY_HOST: '127.0.0.1', FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1',
      GOVC_URL: `https://127.0.0.1:${proxy.port}/sdk`, GOVC_USERNAME: v.username, GOVC_PASSWORD: PASSWORD, FERRY_EXPORT_CHUNK_BYTES: String(256 * 1024),
      FERRY_OUTPUT_ROOTS: `${OUT}:${DATA}`, FERRY_INPUT_ROOTS: `${OUT}:${DATA}`, FERRY_DATA_DIR: DATA,
      FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_POOL: lv.pool, FERRY_LIBVIRT_POOL_DIR: lv.poolDir,
    };
    gw = await startGatewayProc(env);
    const worker = await startWorkerProc(env, 'exp-w', ['vsphere_access', 'img_tool', 'mount_operations', 'libvirt_access'], ['--concurrency', '2']);
    procs.push(gw, worker);
    await awaitWorkers(gw.url, [worker]);
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await proxy?.close();
    await v?.stop();
    if (lv) await releaseLibvirt();
    rc?.disconnect();
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('a state file planted before the job, naming the chosen job id: the job is refused, nothing listed is touched', async () => {
    const vic = victims('a');
    const folder = path.join(OUT, 'attack-a');
    plant(folder, 'atk-a', [vic.outside, vic.other]);
    await submit('atk-a', 'export', { vm_path: tiny.path, output_path: folder });
    const j = await finished('atk-a');
    expect(j.state).to.equal('FAILED');
    expect(j.error).to.match(/holds another export/);
    intact(vic, 'a');
    expect(existsSync(path.join(folder, '.ferry-export.json'))).to.equal(true);
  });

  it('a state file rewritten during the run to list other files, then cancel: only the job\'s own files go', async () => {
    const vic = victims('b');
    const folder = path.join(OUT, 'attack-b');
    await submit('atk-b', 'export', { vm_path: big.path, output_path: folder, parallel_downloads: 2 });
    await downloading('atk-b');
    plant(folder, 'atk-b', [vic.outside, vic.other]);
    await cancel('atk-b');
    await until(() => !existsSync(path.join(folder, 'LocalDS_0')), 15000, 'the job\'s own partial files removed');
    intact(vic, 'b');
    // What the job recorded as its own, in its record (Redis), lies inside its folder only.
    const owned = JSON.parse((await rc.hget('secexp:job:atk-b', 'export_files')) || '[]') as string[];
    expect(owned.length).to.be.greaterThan(0);
    for (const p of owned) expect(p.startsWith(folder + '/'), p).to.equal(true);
  });

  it('a partial download the job did not start is neither resumed nor deleted', async () => {
    const folder = path.join(OUT, 'partial-c');
    const local = path.join(folder, 'LocalDS_0', 'tiny', 'tiny.vmdk');
    mkdirSync(path.dirname(local), { recursive: true });
    const size = statSync(tiny.sparse).size;
    writeFileSync(local + '.ferry-part', 'VICTIM BYTES');
    writeFileSync(local + '.ferry-part.json', JSON.stringify({ source: '[LocalDS_0] tiny/tiny.vmdk', size, runs: [[0, 12]] }));
    await submit('take-c', 'export', { vm_path: tiny.path, output_path: folder });
    const j = await finished('take-c');
    expect(j.state).to.equal('FAILED');
    expect(j.error).to.include('partial download').and.include(local);
    expect(readFileSync(local + '.ferry-part', 'utf8')).to.equal('VICTIM BYTES');
    expect(existsSync(local + '.ferry-part.json')).to.equal(true);
    expect(existsSync(local)).to.equal(false);
  });

  it('a legitimate export completes beside a file of the operator, which it leaves alone', async () => {
    const folder = path.join(OUT, 'legit-d');
    mkdirSync(folder, { recursive: true });
    writeFileSync(path.join(folder, 'notes.txt'), 'the operator\'s own file');
    await submit('legit-d', 'export', { vm_path: tiny.path, output_path: folder });
    const j = await finished('legit-d');
    expect(j.state, j.error as string | undefined).to.equal('COMPLETED');
    expect(existsSync(path.join(folder, 'LocalDS_0', 'tiny', 'tiny.vmdk'))).to.equal(true);
    expect(existsSync(path.join(folder, 'manifest.json'))).to.equal(true);
    expect(readFileSync(path.join(folder, 'notes.txt'), 'utf8')).to.equal('the operator\'s own file');
  });

  it('migrate_vm exports into a 0700 folder under FERRY_DATA_DIR', async () => {
    await submit('mvm-f', 'migrate_vm', { vm_path: big.path, source_type: 'vsphere', destination: { type: 'kvm' } });
    await downloading('mvm-f');
    const base = path.join(DATA, 'exports');
    const folder = path.join(base, 'mvm-f');
    for (const d of [base, folder]) {
      const st = statSync(d);
      expect(st.isDirectory()).to.equal(true);
      expect(st.mode & 0o777, d).to.equal(0o700);
      expect(st.uid).to.equal(process.getuid!());
    }
    expect(existsSync(path.join(folder, 'LocalDS_0', 'big'))).to.equal(true);
    expect(existsSync(path.join(os.tmpdir(), 'ferry-exports', 'mvm-f'))).to.equal(false);
    await cancel('mvm-f');
  });

  it('refuses an export folder that is a symlink or not private (a world-writable FERRY_DATA_DIR/exports planted by someone else)', async () => {
    const data = path.join(dir, 'data-planted');
    mkdirSync(data);
    symlinkSync(ELSE, path.join(data, 'exports'));
    let err: Error | undefined;
    await makeExportDir('job-g', { FERRY_DATA_DIR: data }).catch((e: Error) => { err = e; });
    expect(err?.message).to.match(/exports is a symbolic link/);
    expect(existsSync(path.join(ELSE, 'job-g'))).to.equal(false);
    // A folder of ours with a loose mode is tightened to 0700.
    const loose = path.join(dir, 'data-loose');
    mkdirSync(path.join(loose, 'exports'), { recursive: true, mode: 0o777 });
    const made = await makeExportDir('job-g', { FERRY_DATA_DIR: loose });
    expect(statSync(path.join(loose, 'exports')).mode & 0o777).to.equal(0o700);
    expect(statSync(made).mode & 0o777).to.equal(0o700);
  });
});
