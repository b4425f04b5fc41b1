// Issue 38, item 3: a worker checks its tools before it registers. Real worker processes against a real Redis:
// without `virsh` on its PATH and libvirt_access declared it exits non-zero naming `virsh` and the capability;
// unknown capability names, a local libvirt socket that is not there and a metrics port in use stop it the same
// way, and none of them leaves a registration behind. A job no live worker can take says why on both APIs.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createRedis } from '../../platform/redis';
import { WORKER_NODE_FLAGS } from '../../platform/node-flags';
import { TestRedis, freePort } from '../helpers/redis';
import { startDaemonProc, startGatewayProc, startProcess, startWorkerProc, testEnv, type Proc } from '../helpers/procs';
import { req, until } from '../helpers/http';
import { which } from '../helpers/programs';
import type { BatchSubmitted, DaemonJob, JobStatus } from '../helpers/api-types';

const PREFIX = 'wstart';

describe('workers check their tools at start (issue 38)', function () {
  this.timeout(180_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-wstart-'));
  const procs: Proc[] = [];
  let env: Record<string, string>;
  before(async () => { await redis.start(); env = testEnv(redis.url, PREFIX); });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Starts a worker and waits for it to exit: its exit code and what it wrote. */
  const runWorker = async (id: string, caps: string, extraEnv: Record<string, string> = {}, args: string[] = []) => {
    const p = startProcess('services/worker/main.ts', ['--id', id, '--capabilities', caps, ...args], { ...env, ...extraEnv });
    procs.push(p);
    const code = await new Promise<number | null>((r) => { if (p.proc.exitCode !== null) r(p.proc.exitCode); else p.proc.once('exit', (c) => r(c)); });
    return { code, out: p.logs.join('') };
  };
  /** Whether Redis holds a registration of `id` (a refused worker must leave none). */
  const registered = async (id: string) => {
    const r = createRedis({ url: redis.url });
    try { return (await r.exists(`${PREFIX}:worker:${id}`)) === 1 || (await r.zscore(`${PREFIX}:workers`, id)) !== null; } finally { r.disconnect(); }
  };

  it('libvirt_access with a PATH that has no virsh: exits non-zero naming virsh and libvirt_access; no registration', async () => {
    // A PATH with every other program libvirt_access needs (OpenSSH's client), so virsh is the one missing.
    const bin = path.join(dir, 'bin');
    mkdirSync(bin);
    for (const p of ['ssh', 'scp', 'ssh-keygen']) symlinkSync(which(p)!, path.join(bin, p));
    const { code, out } = await runWorker('no-virsh', 'libvirt_access', { PATH: bin });
    expect(code, out).to.not.equal(0);
    expect(out).to.match(/refusing to start/).and.to.match(/- virsh \(Debian package libvirt-clients\), needed by libvirt_access/);
    expect(out).to.not.match(/- ssh /);
    expect(await registered('no-virsh')).to.equal(false);
  });

  it('unknown capability names are refused, each named', async () => {
    const { code, out } = await runWorker('unknown-caps', 'img_tool,teleport,warp_drive');
    expect(code, out).to.not.equal(0);
    expect(out).to.include('"teleport"').and.include('"warp_drive"').and.include('known are img_tool');
    expect(await registered('unknown-caps')).to.equal(false);
  });

  it("started by Ferry's launchers a worker runs with the worker's node flags; started without them it warns, naming them", async () => {
    const flagged = await runWorker('flagged', 'teleport');
    expect(flagged.code).to.equal(2);
    expect(procs[procs.length - 1].proc.spawnargs).to.include.members([...WORKER_NODE_FLAGS]);
    expect(flagged.out).to.not.include('warning');
    // An operator's own launch, without them: node and the entry script only.
    const bare = spawnSync(process.execPath, ['--import', 'tsx', 'services/worker/main.ts', '--id', 'unflagged', '--capabilities', 'teleport'],
      { cwd: path.resolve(__dirname, '..', '..'), env: { ...process.env, ...env }, encoding: 'utf8', timeout: 60_000 });
    expect(bare.status, bare.stderr).to.equal(2);
    for (const f of WORKER_NODE_FLAGS) expect(bare.stderr).to.include(`worker: warning: started without ${f}`);
  });

  it("a local libvirt URI whose socket is not there, and an unwritable scratch folder: each named with its capability", async () => {
    const sock = path.join(dir, 'no-libvirtd', 'libvirt-sock');
    // Not writable even for root (these tests may run as root): a folder under /proc cannot be made.
    const scratch = '/proc/ferry-no-such-folder';
    const { code, out } = await runWorker('no-socket', 'libvirt_access,mount_operations', { FERRY_LIBVIRT_URI: `qemu+unix:///system?socket=${sock}`, LIBGUESTFS_TMPDIR: scratch });
    expect(code, out).to.not.equal(0);
    expect(out).to.include(`libvirt's socket ${sock}`).and.match(/needed by libvirt_access/);
    expect(out).to.include(`a writable scratch folder (LIBGUESTFS_TMPDIR ${scratch}), needed by mount_operations`);
    expect(await registered('no-socket')).to.equal(false);
  });

  it('a metrics port in use: exits non-zero naming the port, before registering', async () => {
    const port = await freePort();
    const blocker = net.createServer();
    await new Promise<void>((r) => blocker.listen(port, '127.0.0.1', r));
    try {
      const { code, out } = await runWorker('port-clash', 'img_tool', {}, ['--metrics-port', String(port)]);
      expect(code, out).to.not.equal(0);
      expect(out).to.include(`metrics port ${port} could not be opened`).and.include('EADDRINUSE');
      expect(await registered('port-clash')).to.equal(false);
    } finally { blocker.close(); }
  });

  it('a job no live worker can take says why in waiting_reason, on the job API and the daemon API', async () => {
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 1h\n');
    const denv = { ...env, FERRY_SECRET_KEY: 'test-secret-key-wstart', GOVC_URL: 'https://127.0.0.1:9/sdk', GOVC_USERNAME: 'u' };
    const [gw, dm] = await Promise.all([startGatewayProc(denv), startDaemonProc(denv, cfg)]);
    procs.push(gw, dm);
    // A live worker that cannot take an export (no vsphere_access): the job still waits, and says why.
    const w = await startWorkerProc(denv, 'conv-only', ['img_tool']);
    procs.push(w);
    await until(async () => (await req<{ active: number }>(gw.url, 'GET', '/workers')).body.active === 1, 120_000, `conv-only registered\n${w.logs.join('')}`);
    const sub = await req<BatchSubmitted>(dm.url, 'POST', '/jobs/submit', { name: 'web', vm_path: '/dc1/vm/web-01', output_path: path.join(dir, 'export'), password: 'pw-wstart-0001', username: 'u' });
    expect(sub.status, sub.text).to.equal(200);
    const id = sub.body.job_ids[0];
    const want = 'no active worker has the capabilities this job needs (vsphere_access)';
    const viaDaemon = (await req<DaemonJob>(dm.url, 'GET', `/jobs/${id}`)).body;
    expect(viaDaemon.status).to.equal('pending');
    expect(viaDaemon.waiting_reason).to.equal(want);
    const list = (await req<{ jobs: DaemonJob[] }>(dm.url, 'GET', '/jobs')).body.jobs.find((j) => j.id === id)!;
    expect(list.waiting_reason).to.equal(want);
    const viaGateway = (await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`)).body;
    expect(viaGateway.state).to.equal('QUEUED');
    expect(viaGateway.queue.waiting_reason).to.equal(want);
  });
});
