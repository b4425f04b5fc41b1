// Ferry on a real Redis Cluster: three primaries and three replicas on loopback, created with
// `redis-cli --cluster create`. The gateway and a worker get REDIS_URL=redis-cluster://... and FERRY_PREFIX={ferry}
// (a hash tag: every Ferry and BullMQ key lands in one slot, as multi-key Lua scripts require), then run real jobs,
// and keep running them while the primary holding that slot is killed and its replica takes over.
import { expect } from 'chai';
import { execFileSync, spawn, ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { freePort, waitForPort } from '../helpers/redis';
import { awaitWorkers, Proc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobList, JobStatus } from '../helpers/api-types';
import { makeImage } from '../helpers/images';
import IORedis, { Cluster } from 'ioredis';
import { Bus, channelName } from '../../queue/bus';
import { keys } from '../../platform/redis';

/** What the test reads of a Bus's internals: its subscriber connection (private in Bus; ioredis's Cluster keeps
 *  its subscriber untyped). */
interface BusInternals { sub: { subscriber?: { getInstance(): { options: { port: number } } | undefined } } }

const cli = (port: number, ...args: string[]) => execFileSync('redis-cli', ['-p', String(port), ...args], { encoding: 'utf8' });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The live primary serving `slot` and its replicas, as `port`'s CLUSTER NODES shows them. */
function slotOwner(port: number, slot: number): { port: number; id: string; replicas: number[] } | null {
  const rows = cli(port, 'cluster', 'nodes').trim().split('\n').map((l) => l.split(' '));
  const portOf = (r: string[]) => Number(r[1].split('@')[0].split(':')[1]);
  const owner = rows.find((r) => /master/.test(r[2]) && !/fail/.test(r[2]) && r.slice(8).some((range) => {
    const [a, b = a] = range.split('-').map(Number);
    return slot >= a && slot <= b;
  }));
  if (!owner) return null;
  return { port: portOf(owner), id: owner[0], replicas: rows.filter((r) => r[3] === owner[0] && !/fail/.test(r[2])).map(portOf) };
}
/** Connections subscribed to at least one channel on the node at `port` (each process's Bus holds one). */
const subscribers = (port: number) => cli(port, 'client', 'list').split('\n').filter((l) => /\bsub=[1-9]/.test(l)).length;

describe('deploy: Redis Cluster (3 primaries + 3 replicas)', function () {
  this.timeout(120000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-cluster-'));
  const nodes: { port: number; proc: ChildProcess }[] = [];
  const procs: Proc[] = [];
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let clusterUrl = '';
  const cleanup: (() => unknown)[] = []; // in-process connections and timers a failing test leaves behind

  const run = async (id: string, body: object) => {
    const r = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: id, ...body });
    expect(r.status, `${JSON.stringify(r.body)}\n${gw.logs.slice(-5).join('')}`).to.equal(201);
    return until(async () => { const j = await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`); return j.body?.is_terminal && j.body; }, 60000, `job ${id}`);
  };

  before(async () => {
    for (let i = 0; i < 6; i++) {
      const port = await freePort();
      const d = path.join(dir, String(port));
      execFileSync('mkdir', ['-p', d]);
      const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--dir', d, '--cluster-enabled', 'yes',
        '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '2000', '--appendonly', 'yes', '--save', '', '--maxmemory-policy', 'noeviction'], { stdio: 'ignore' });
      nodes.push({ port, proc });
    }
    for (const n of nodes) await waitForPort(n.port);
    execFileSync('redis-cli', ['--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`), '--cluster-replicas', '1', '--cluster-yes'], { stdio: 'pipe' });
    await until(() => nodes.every((n) => /cluster_state:ok/.test(cli(n.port, 'cluster', 'info'))), 30000, 'cluster state ok on every node');
    clusterUrl = `redis-cluster://${nodes.slice(0, 3).map((n) => `127.0.0.1:${n.port}`).join(',')}`;
    const env = { ...testEnv(clusterUrl, '{ferry}') };
    gw = await startGatewayProc(env);
    const worker = await startWorkerProc(env, 'cluster-worker', ['img_tool'], ['--concurrency', '2']);
    procs.push(worker);
    await awaitWorkers(gw.url, [worker]);
  });

  after(async () => {
    for (const c of cleanup) await c();
    await Promise.all(procs.map((p) => p.kill()));
    await gw?.kill();
    await Promise.all(nodes.map((n) => n.proc.exitCode === null && n.proc.signalCode === null ? new Promise((r) => { n.proc.once('exit', r); n.proc.kill('SIGKILL'); }) : Promise.resolve()));
    rmSync(dir, { recursive: true, force: true });
  });

  it('runs noop jobs and a real conversion through gateway and worker on the cluster', async () => {
    for (let i = 0; i < 3; i++) expect((await run(`c-noop-${i}`, { operation: 'noop', parameters: { steps: 3 } })).state).to.equal('COMPLETED');
    const vmdk = makeImage(dir, 'cl-disk', 'vmdk', 8);
    const conv = await run('c-conv', { operation: 'convert', image: { path: vmdk, format: 'vmdk' }, parameters: { output_format: 'qcow2', output_dir: path.join(dir, 'out') } });
    expect(conv.state, JSON.stringify(conv.state_history)).to.equal('COMPLETED');
    execFileSync('qemu-img', ['compare', '-f', 'vmdk', '-F', 'qcow2', vmdk, path.join(dir, 'out', 'c-conv.qcow2')]);
    // All of Ferry's keys live in the {ferry} slot.
    const slot = Number(cli(nodes[0].port, 'cluster', 'keyslot', '{ferry}').trim());
    const owner = nodes.find((n) => Number(cli(n.port, 'cluster', 'countkeysinslot', String(slot)).trim()) > 0 && /role:master/.test(cli(n.port, 'info', 'replication')));
    expect(owner, 'a primary holds the {ferry} slot').to.not.be.oneOf([null, undefined]);
    expect(Number(cli(owner!.port, 'dbsize').trim())).to.be.greaterThan(5);
  });

  it('loses no job when the primary holding {ferry} is killed: running jobs finish, submissions resume', async function () {
    this.timeout(60000);
    const slot = Number(cli(nodes[0].port, 'cluster', 'keyslot', '{ferry}').trim());
    const owner = slotOwner(nodes[0].port, slot)!;
    expect(owner.replicas, 'the {ferry} primary has a replica').to.have.length(1);
    const victim = nodes.find((n) => n.port === owner.port)!;
    const statuses: number[] = [];
    let slowest = 0;
    const submitted: string[] = [];
    // Submits until accepted; during the failover the gateway must answer 503 (retry), never 500.
    const submit = async (id: string, parameters: object = { steps: 3, sleep_ms: 600 }, deadlineMs = 20000) => {
      const end = Date.now() + deadlineMs;
      for (;;) {
        const t = Date.now();
        const r = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: id, operation: 'noop', parameters });
        statuses.push(r.status);
        slowest = Math.max(slowest, Date.now() - t);
        expect([201, 503], `${id}: ${r.status} ${JSON.stringify(r.body)}`).to.include(r.status);
        if (r.status === 201) { submitted.push(id); return 0; }
        if (Date.now() > end) throw new Error(`${id} still refused: ${JSON.stringify(r.body)}`);
        await sleep(200);
      }
    };
    for (let i = 0; i < 4; i++) await submit(`f-before-${i}`);
    await until(async () => (await req<JobList>(gw.url, 'GET', '/jobs?state=RUNNING')).body?.total === 2, 10000, 'two jobs running');

    // A Bus of this process subscribed through the node about to die (ioredis picks a random node per subscriber
    // connection; internals read to find it): it must resubscribe elsewhere and keep receiving.
    const buses: Bus[] = [];
    const heard: string[] = [];
    let bus: Bus | undefined;
    for (let k = 0; k < 60 && !bus; k++) {
      const b = new Bus(clusterUrl, '{ferry}');
      buses.push(b);
      cleanup.push(() => b.close());
      await b.on('webhooks', (m) => { heard.push(String(m)); }); // a channel nobody else in this test publishes on
      // as unknown as: the fields read are private to Bus and untyped in ioredis, so no declared type has them.
      if ((b as unknown as BusInternals).sub.subscriber?.getInstance()?.options.port === owner.port) bus = b;
    }
    expect(bus, 'a Bus subscribed through the {ferry} primary').to.not.be.oneOf([null, undefined]);
    for (const b of buses) if (b !== bus) await b.close();
    // (the closed Buses' connections go away asynchronously: count once the figure holds still)
    let subsBefore = -1;
    await until(async () => { const n = nodes.reduce((a, x) => a + subscribers(x.port), 0); const same = n === subsBefore; subsBefore = n; await sleep(200); return same; }, 5000, 'subscriber count settled');
    expect(subsBefore).to.be.at.least(3); // gateway, worker, this test

    // Replication is asynchronous: make sure the acknowledged submissions reached the replica before the kill
    // (Ferry itself does not wait for replicas; docs/deploy.md says what a failover can lose).
    const direct = new IORedis(owner.port, '127.0.0.1', { lazyConnect: true });
    await direct.connect();
    await direct.set('{ferry}:test:fence', '1');
    expect(await direct.call('WAIT', '1', '2000')).to.equal(1);
    direct.disconnect();
    victim.proc.kill('SIGKILL');
    const killedAt = Date.now();
    let promotedAfter = 0;
    const watch = setInterval(() => {
      try { if (!promotedAfter && /role:master/.test(cli(owner.replicas[0], 'info', 'replication'))) promotedAfter = Date.now() - killedAt; } catch { /* busy */ }
    }, 100);
    cleanup.push(() => clearInterval(watch));

    // Submissions through the failover window, each retried on 503.
    let i = 0;
    while (Date.now() - killedAt < 6000) { await submit(`f-during-${i++}`, { steps: 1 }); await sleep(300); }
    await until(() => {
      const o = slotOwner(owner.replicas[0], slot);
      return o?.port === owner.replicas[0] && nodes.every((n) => n === victim || /cluster_state:ok/.test(cli(n.port, 'cluster', 'info')));
    }, 15000, 'the replica promoted and the cluster ok');
    clearInterval(watch);

    // Every subscription (gateway, worker, this test's Bus) is back, and messages arrive again.
    await until(() => nodes.filter((n) => n !== victim).reduce((a, n) => a + subscribers(n.port), 0) === subsBefore, 15000, `${subsBefore} subscriptions back`);
    const pub = new Cluster([{ host: '127.0.0.1', port: owner.replicas[0] }]);
    cleanup.push(() => pub.disconnect());
    await until(async () => { await pub.publish(channelName(keys('{ferry}'), 'webhooks'), 'added'); return heard.includes('added'); }, 10000, 'the Bus hearing a message after the failover');
    pub.disconnect();
    await bus!.close();

    // Once the cluster is ok, the gateway takes submissions at the first attempt.
    await submit('f-after-probe', { steps: 1 });
    for (let j = 0; j < 4; j++) {
      const r = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: `f-after-${j}`, operation: 'noop', parameters: { steps: 2 } });
      expect(r.status, JSON.stringify(r.body)).to.equal(201);
      submitted.push(`f-after-${j}`);
    }
    // Every accepted job completes: none lost, none failed by the outage.
    const snapshot = () => Promise.all(submitted.map(async (id) => [id, (await req<Partial<JobStatus>>(gw.url, 'GET', `/jobs/${id}`)).body?.state ?? 'MISSING'] as const));
    let states = await snapshot();
    for (const end = Date.now() + 30000; Date.now() < end && states.some(([, s]) => !['COMPLETED', 'FAILED', 'CANCELLED', 'MISSING'].includes(s)); states = await snapshot()) await sleep(250);
    expect(Object.fromEntries(states.filter(([, s]) => s !== 'COMPLETED')), `${gw.logs.slice(-5).join('')}\n${procs[0].logs.slice(-5).join('')}`).to.deep.equal({});
    expect(statuses.filter((s) => s === 201)).to.have.length(submitted.length - 4);
    // Neither service died on the way (the worker used to exit on an unhandled "Too many Cluster redirections").
    expect(gw.proc.exitCode ?? gw.proc.signalCode, gw.logs.slice(-5).join('')).to.equal(null);
    expect(procs[0].proc.exitCode ?? procs[0].proc.signalCode, procs[0].logs.slice(-5).join('')).to.equal(null);
    console.log(`      failover: replica promoted ${(promotedAfter / 1000).toFixed(1)} s after the kill; slowest submission ${slowest} ms; ${statuses.filter((s) => s === 503).length} answered 503; ${submitted.length} jobs completed`);
  });
});
