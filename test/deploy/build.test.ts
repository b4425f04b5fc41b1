// The production build, as the Docker image holds it (there is no Docker engine here to build the image itself):
// `npm run build` (dist/, built once per run and reused here when current), then a copy of dist/, package.json and
// package-lock.json in a temporary folder with production dependencies only (`npm ci --omit=dev`, as the
// Dockerfile's prod-deps stage), and the services started
// from there with plain `node` (no tsx, no NODE_OPTIONS) against a real redis-server: the gateway and a worker run
// a real `convert`, the daemon serves its dashboard files, and the ferry-convert bin converts a disk.
import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { TestRedis, freePort, waitForPort } from '../helpers/redis';
import { Proc, startProcess, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import { makeImage } from '../helpers/images';
import { nodeFlagsFor } from '../../platform/node-flags';
import type { JobStatus, StoredEvent, WorkerList } from '../helpers/api-types';
import { buildIsCurrent } from '../../scripts/build';

/** What a convert job's result holds (the fields read here). */
interface ConvertResult { output_path: string; sha256: string }
type ConvertJob = Omit<JobStatus, 'result'> & { result: ConvertResult | null };

const ROOT = path.resolve(__dirname, '..', '..');

function files(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(path.join(dir, e.name)) : [path.join(dir, e.name)]));
}

describe('production build: compiled JavaScript with production dependencies only', function () {
  this.timeout(180_000);
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'ferry-build-'));
  const app = path.join(tmp, 'app');
  const dist = path.join(app, 'dist');
  const redis = new TestRedis();
  const procs: Proc[] = [];
  // Nothing from the checkout or the test runner leaks in: no tsx loader through NODE_OPTIONS.
  const env = (extra: Record<string, string> = {}) => ({ NODE_OPTIONS: '', NODE_ENV: 'production', ...extra });

  before(async () => {
    mkdirSync(app);
    // The run's one build of dist/ (scripts/test.ts builds it before the first file; `npm run build` is then
    // "current" and compiles nothing), copied as the Dockerfile's build stage hands it on.
    const b = spawnSync('npm', ['run', 'build'], { cwd: ROOT, encoding: 'utf8' });
    expect(b.status, b.stdout + b.stderr).to.equal(0);
    expect(buildIsCurrent(path.join(ROOT, 'dist')), 'dist/ is a build of these sources').to.equal(true);
    cpSync(path.join(ROOT, 'dist'), dist, { recursive: true, preserveTimestamps: true });
    for (const f of ['package.json', 'package-lock.json']) copyFileSync(path.join(ROOT, f), path.join(app, f));
    const i = spawnSync('npm', ['ci', '--omit=dev', '--no-audit', '--no-fund', '--prefer-offline', '--loglevel=error'], { cwd: app, encoding: 'utf8', env: { ...process.env, NODE_OPTIONS: '' } });
    expect(i.status, i.stdout + i.stderr).to.equal(0);
    await redis.start();
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await redis.stop();
    rmSync(tmp, { recursive: true, force: true });
  });

  it('holds JavaScript and the files the code reads beside itself, and no development dependency', () => {
    const all = files(dist).map((f) => path.relative(dist, f));
    expect(all.filter((f) => f.endsWith('.ts'))).to.deep.equal([]);
    for (const svc of ['gateway', 'worker', 'daemon', 'scheduler', 'notifier']) expect(all).to.include(`services/${svc}/main.js`);
    expect(all).to.include('scripts/cluster.js');
    // The daemon's dashboard and the CLI's bin are not TypeScript: copied as they are.
    for (const f of readdirSync(path.join(ROOT, 'services/daemon/web'))) expect(all).to.include(`services/daemon/web/${f}`);
    expect(all).to.include('services/converter/ferry-convert.js');
    // The queue's Lua commands, read by queue/scripts.ts at load time (every job goes through them).
    for (const f of files(path.join(ROOT, 'queue/commands'))) expect(all).to.include(path.relative(ROOT, f));
    const pkg = JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { dependencies: Record<string, string>; devDependencies: Record<string, string> };
    for (const dev of Object.keys(pkg.devDependencies)) expect(existsSync(path.join(app, 'node_modules', dev)), dev).to.equal(false);
    for (const dep of Object.keys(pkg.dependencies)) expect(existsSync(path.join(app, 'node_modules', dep)), dep).to.equal(true);
    expect(existsSync(path.join(app, 'node_modules', 'esbuild'))).to.equal(false); // tsx's compiler
  });

  it('the gateway and a worker run as plain `node dist/...` and convert a disk for a job', async () => {
    const renv = env(testEnv(redis.url));
    const port = await freePort();
    const gw = startProcess(path.join(dist, 'services/gateway/main.js'), [], { ...renv, GATEWAY_PORT: String(port), FERRY_HOST: '127.0.0.1' }, app);
    procs.push(gw);
    await waitForPort(port, 30000).catch((e: Error) => { throw new Error(`${e.message}\n${gw.logs.join('')}`); });
    const url = `http://127.0.0.1:${port}`;
    const worker = startProcess(path.join(dist, 'services/worker/main.js'), ['--id', 'built-worker', '--capabilities', 'img_tool'], renv, app);
    procs.push(worker);
    await until(async () => (await req<WorkerList>(url, 'GET', '/workers')).body.active === 1, 30000, `the worker to register\n${worker.logs.join('')}`);
    // Both really are the built code: their command lines name dist/ and no loader, after the service's own node
    // flags (platform/node-flags.ts; the worker's).
    for (const p of [gw, worker]) {
      const argv = readFileSync(`/proc/${p.proc.pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
      const entry = argv.findIndex((a) => a.endsWith('/main.js'));
      expect(argv[entry]).to.match(new RegExp(`^${dist}/services/\\w+/main\\.js$`));
      expect(argv.slice(1, entry)).to.deep.equal(nodeFlagsFor(argv[entry]));
      expect(argv.join(' ')).to.not.include('tsx');
    }
    const src = makeImage(tmp, 'disk', 'vmdk', 16);
    const out = path.join(tmp, 'out');
    const sub = await req(url, 'POST', '/jobs?queue=true', { job_id: 'built-1', operation: 'convert', image: { path: src, format: 'vmdk' }, parameters: { output_format: 'qcow2', output_dir: out } });
    expect(sub.status, JSON.stringify(sub.body)).to.equal(201);
    const j = await until(async () => { const r = await req<ConvertJob>(url, 'GET', '/jobs/built-1'); return ['COMPLETED', 'FAILED', 'CANCELLED'].includes(r.body.state) && r.body; }, 60000, 'job built-1');
    expect(j.state, JSON.stringify(j.error)).to.equal('COMPLETED');
    expect(j.result!.output_path).to.equal(path.join(out, 'built-1.qcow2'));
    expect(j.result!.sha256).to.equal(createHash('sha256').update(readFileSync(j.result!.output_path)).digest('hex'));
    execFileSync('qemu-img', ['compare', '-f', 'vmdk', '-F', 'qcow2', src, j.result!.output_path]); // throws if they differ
    const evs = (await req<StoredEvent[]>(url, 'GET', '/jobs/built-1/events')).body;
    expect(evs.some((e) => e.phase === 'conversion')).to.equal(true);
  });

  it('the daemon serves its dashboard from dist/', async () => {
    const port = await freePort();
    const d = startProcess(path.join(dist, 'services/daemon/main.js'), ['-addr', `127.0.0.1:${port}`], env(testEnv(redis.url)), app);
    procs.push(d);
    await waitForPort(port, 30000).catch((e: Error) => { throw new Error(`${e.message}\n${d.logs.join('')}`); });
    const r = await fetch(`http://127.0.0.1:${port}/web/dashboard/`);
    expect(r.status).to.equal(200);
    expect(await r.text()).to.equal(readFileSync(path.join(ROOT, 'services/daemon/web/index.html'), 'utf8'));
    await d.stop();
  });

  it('the ferry-convert bin runs the compiled CLI', () => {
    const src = makeImage(tmp, 'cli', 'vmdk', 8);
    const out = path.join(tmp, 'cli-out');
    const cfg = path.join(tmp, 'cli.yaml');
    writeFileSync(cfg, yaml.dump({ command: 'local', vmdk: src, output_dir: out, to_output: 'cli.qcow2', out_format: 'qcow2', fstab_mode: 'preserve', update_grub: false, regen_initramfs: false }));
    const r = spawnSync(process.execPath, [path.join(dist, 'services/converter/ferry-convert.js'), '--config', cfg], { cwd: app, encoding: 'utf8', env: { ...process.env, ...env() } });
    expect(r.status, r.stderr).to.equal(0);
    expect(JSON.parse(r.stdout)).to.include({ disks: 1 });
    execFileSync('qemu-img', ['compare', '-f', 'vmdk', '-F', 'qcow2', src, path.join(out, 'cli.qcow2')]);
  });
});
