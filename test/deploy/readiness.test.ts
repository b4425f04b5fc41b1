// Issue 38, item 4: readiness means ready. Every service with a health route (the gateway, two daemons, a worker's
// metrics port) answers 200 while its Redis answers, 503 once the test's redis-server is stopped by its pid, and
// 200 again after it is restarted on the same port; liveness (/livez) answers throughout, so an orchestrator
// takes the pods out of service without restarting them. The daemon that does not lead the plans is as ready as
// the one that does, and its body shows the libvirt connection's state (none here) without failing on it.
import { expect } from 'chai';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRedis } from '../../platform/redis';
import { TestRedis } from '../helpers/redis';
import { startDaemonProc, startGatewayProc, startWorkerWithMetrics, testEnv, type Proc } from '../helpers/procs';
import { req, until } from '../helpers/http';

interface DaemonHealth { status: string; redis: string; libvirt: { uri: string; state: string; checked_at: string | null } }
const PREFIX = 'ready';

describe('readiness: every health route follows Redis (issue 38)', function () {
  this.timeout(240_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-ready-'));
  const procs: Proc[] = [];
  let urls: Record<string, string> = {};

  before(async () => {
    await redis.start();
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 1h\n');
    // A libvirt URI where nothing listens: the daemon's state for it is `unreachable`, and it stays ready.
    const env = { ...testEnv(redis.url, PREFIX), FERRY_LIBVIRT_URI: `qemu+unix:///system?socket=${dir}/no-libvirtd-sock` };
    const [gw, d1, d2] = await Promise.all([startGatewayProc(env), startDaemonProc(env, cfg), startDaemonProc(env, cfg)]);
    const w = await startWorkerWithMetrics(testEnv(redis.url, PREFIX), 'ready-w', ['img_tool']);
    procs.push(gw, d1, d2, w);
    urls = { gateway: gw.url, daemon1: d1.url, daemon2: d2.url, worker: `http://127.0.0.1:${w.metricsPort}` };
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const statuses = async (p: string) => Object.fromEntries(await Promise.all(Object.entries(urls).map(async ([n, u]) => [n, (await req(u, 'GET', p).catch(() => ({ status: 0 }))).status] as const)));
  const all = (code: number) => Object.fromEntries(Object.keys(urls).map((n) => [n, code]));

  it('ready with Redis up; the daemon that does not lead is ready too; libvirt shown, not judged', async () => {
    expect(await statuses('/health')).to.deep.equal(all(200));
    // Exactly one daemon holds the plans lease (a Redis key naming its holder); both answer 200 above.
    const r = createRedis({ url: redis.url });
    try { expect(await until(async () => r.get(`${PREFIX}:leader:plans`), 30_000, 'a plans leader')).to.be.a('string'); } finally { r.disconnect(); }
    for (const d of ['daemon1', 'daemon2']) {
      const h = await until(async () => { const b = (await req<DaemonHealth>(urls[d], 'GET', '/health')).body; return b.libvirt.state !== 'unknown' && b; }, 60_000, `${d}: the libvirt probe answered`);
      expect(h).to.deep.include({ status: 'ok', redis: 'reachable' });
      expect(h.libvirt).to.include({ state: 'unreachable', uri: `qemu+unix:///system?socket=${dir}/no-libvirtd-sock` });
    }
  });

  it('503 on every health route while redis-server is stopped (by its pid), 200 again after it restarts on the same port', async () => {
    const pid = redis.proc!.pid!;
    const gone = new Promise((r) => redis.proc!.once('exit', r));
    process.kill(pid, 'SIGTERM');
    await gone;
    const down = await until(async () => { const s = await statuses('/health'); return Object.values(s).every((c) => c === 503) && s; }, 30_000, 'every health route 503');
    expect(down).to.deep.equal(all(503));
    const body = (await req<DaemonHealth>(urls.daemon2, 'GET', '/health')).body;
    expect(body).to.include({ status: 'unavailable', redis: 'unreachable' });
    // Liveness is apart: every process still answers it.
    expect(await statuses('/livez')).to.deep.equal(all(200));
    await redis.start(); // the same port (TestRedis keeps it) and data folder
    const up = await until(async () => { const s = await statuses('/health'); return Object.values(s).every((c) => c === 200) && s; }, 60_000, 'every health route 200 again');
    expect(up).to.deep.equal(all(200));
  });
});
