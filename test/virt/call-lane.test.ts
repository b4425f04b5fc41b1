// The call lane (FERRY_LIBVIRT_VIA=worker): a daemon's virsh_call never waits behind long jobs. Real processes on
// one Redis: a gateway, a daemon whose libvirt goes through workers, and ONE worker with vsphere_access and
// libvirt_access and a single job slot, busy with an export of a 24 MiB VM from the simulator (one stream) through
// a proxy throttled to 128 KiB/s (about two minutes). While that export holds the slot, the daemon's /virt routes answer within
// a few seconds and change the host as virsh then shows; Redis shows the calls on the call lane's queue, run by
// that same worker while its export was still RUNNING. /ws shows the calls as the job lists do: a plain client's
// job_update messages leave them out (the export's come through), a client with ?internal=true gets them.
import { expect } from 'chai';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import IORedis from 'ioredis';
import { TestRedis } from '../helpers/redis';
import { awaitWorkers, startDaemonProc, startGatewayProc, startWorkerProc, testEnv, type Proc } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DaemonJob, JobStatus, WsMessage } from '../helpers/api-types';
import { openWs } from '../helpers/ws';
import { startVcsim, type Vcsim } from '../helpers/vcsim';
import { startProxy, type ProxyControl } from '../helpers/tcp-proxy';
import { managerFor } from '../../domain/vsphere/client';
import { tinyVm } from '../vsphere/fixture';
import { defineGuest, releaseLibvirt, useLibvirt, type TestLibvirt } from '../helpers/libvirt';

const PASSWORD = 'vcsim-call-lane-pw';
const PREFIX = 'lane';
/** How long a daemon's libvirt call may take while every job slot is busy (it took 96 s and more before the lane). */
const BOUND_MS = 10_000;

describe('the call lane: a daemon\'s virsh_call runs while long jobs hold every job slot', function () {
  this.timeout(300_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-call-lane-'));
  const OUT = path.join(dir, 'out');
  const procs: Proc[] = [];
  let v: Vcsim;
  let proxy: ProxyControl;
  let lv: TestLibvirt;
  let rc: IORedis;
  let gw: Proc & { url: string };
  let daemon: Proc & { url: string };
  let big: Awaited<ReturnType<typeof tinyVm>>;

  /** Every job record in Redis of `operation`, with the fields the test reads. */
  const records = async (operation: string) => {
    const out: Record<string, string>[] = [];
    for (const key of await rc.keys(`${PREFIX}:job:*`)) {
      if (key.split(':').length !== 3) continue; // a record's history, events: not the record
      const h = await rc.hgetall(key);
      if ((JSON.parse(h.spec || '{}') as { operation?: string }).operation === operation) out.push(h);
    }
    return out;
  };

  before(async function () {
    this.timeout(300_000);
    v = await startVcsim({ password: PASSWORD });
    lv = await useLibvirt();
    await redis.start();
    rc = new IORedis(redis.url);
    const m = managerFor({ url: v.url, username: v.username, password: PASSWORD, ca: readFileSync(v.caFile, 'utf8') });
    big = await tinyVm(v, m, dir, 'lanebig', 24);
    proxy = await startProxy(v.port);
    proxy.throttle(128 * 1024);
    const env = {
      ...testEnv(redis.url, PREFIX), FERRY_HOST: '127.0.0.1', FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1',
      GOVC_URL: `https://127.0.0.1:${proxy.port}/sdk`, GOVC_USERNAME: v.username, GOVC_PASSWORD: PASSWORD, FERRY_EXPORT_CHUNK_BYTES: String(128 * 1024),
      FERRY_OUTPUT_ROOTS: OUT, FERRY_INPUT_ROOTS: OUT, FERRY_DATA_DIR: path.join(dir, 'data'),
      FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_POOL: lv.pool, FERRY_LIBVIRT_POOL_DIR: lv.poolDir, FERRY_LIBVIRT_DOMAIN_TYPE: 'qemu',
    };
    gw = await startGatewayProc(env);
    procs.push(gw);
    const config = path.join(dir, 'daemon.yaml');
    writeFileSync(config, '{}\n');
    daemon = await startDaemonProc({ ...env, FERRY_LIBVIRT_VIA: 'worker' }, config);
    procs.push(daemon);
    procs.push(await startWorkerProc(env, 'lane-w', ['vsphere_access', 'libvirt_access'], ['--concurrency', '1']));
    await awaitWorkers(gw.url, [procs[2]]);
    await defineGuest(lv, 'lane-vm');
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

  it('with the worker\'s one job slot held by a throttled export, /virt reads and writes answer within the bound, on the call lane', async () => {
    const sub = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'lane-export', operation: 'export', parameters: { credentials: 'environment', vm_path: big.path, output_path: path.join(OUT, 'lane-export'), parallel_downloads: 1 }, execution_policy: { retry_count: 0 } });
    expect(sub.status, sub.text).to.equal(201);
    const job = async () => (await req<JobStatus>(gw.url, 'GET', '/jobs/lane-export')).body;
    await until(async () => {
      const j = await job();
      if (j.is_terminal) throw new Error(`the export ended early: ${j.state} ${j.error}`);
      return Number(j.latest_event?.details?.bytes_downloaded) >= 128 * 1024;
    }, 60_000, 'the export downloading');
    // Redis: the export holds the worker's only job slot.
    expect(await rc.hmget(`${PREFIX}:job:lane-export`, 'state', 'worker_id')).to.deep.equal(['RUNNING', 'lane-w']);

    const plain = openWs<WsMessage<DaemonJob>>(`${daemon.url.replace('http', 'ws')}/ws`);
    const internal = openWs<WsMessage<DaemonJob>>(`${daemon.url.replace('http', 'ws')}/ws?internal=true`);
    await Promise.all([plain.opened, internal.opened]);
    let t = Date.now();
    const d = await req<{ data: { domains: { name: string; state: string }[] } }>(daemon.url, 'GET', '/virt/domains');
    const readMs = Date.now() - t;
    expect(d.status, d.text).to.equal(200);
    expect(d.body.data.domains.find((x) => x.name === 'lane-vm')?.state).to.equal('shut off');
    t = Date.now();
    const made = await req(daemon.url, 'POST', '/virt/network/create', { name: 'lane-net', subnet: '10.81.0.0/24', ip_start: '10.81.0.10', ip_end: '10.81.0.20' });
    const writeMs = Date.now() - t;
    const exportNow = await rc.hget(`${PREFIX}:job:lane-export`, 'state');
    console.log(`      with the only job slot busy: GET /virt/domains ${readMs} ms, POST /virt/network/create ${writeMs} ms; the export then ${exportNow}`);
    expect(made.status, made.text).to.equal(201);
    expect(await lv.virsh(['net-dumpxml', 'lane-net'])).to.include("<ip address='10.81.0.1'");
    expect(exportNow, 'the export still holds the job slot after the calls').to.equal('RUNNING');
    expect(readMs, 'GET /virt/domains while the job slot is busy').to.be.below(BOUND_MS);
    expect(writeMs, 'POST /virt/network/create while the job slot is busy').to.be.below(BOUND_MS);

    // Redis: each call was a virsh_call on the call lane's queue, run by that worker (a lookup that libvirt answers
    // "not found", as the network's create asks first, ends FAILED with libvirt's answer kept), and the export
    // still runs.
    const calls = await records('virsh_call');
    expect(calls.length).to.be.greaterThan(1);
    for (const c of calls) {
      expect(c, JSON.stringify(c)).to.include({ queue: 'calls.libvirt_access', worker_id: 'lane-w' });
      expect(c.state === 'COMPLETED' || (c.state === 'FAILED' && (JSON.parse(c.libvirt_error || '{}') as { status?: number }).status === 404), JSON.stringify(c)).to.equal(true);
    }
    expect(calls.filter((c) => c.state === 'COMPLETED').length).to.be.greaterThan(1);

    // /ws: the calls' updates reach only the client that asked for internal jobs; both see the export's.
    const updates = (w: typeof plain, op: string) => w.msgs.filter((m) => m.type === 'job_update' && m.data.definition.operation === op);
    const callIds = new Set(calls.map((c) => (JSON.parse(c.spec) as { job_id: string }).job_id));
    await until(() => callIds.size > 0 && [...callIds].every((id) => updates(internal, 'virsh_call').some((m) => m.data.id === id)), 30_000, 'every call on the internal /ws');
    await until(() => updates(plain, 'export').length > 0 && updates(internal, 'export').length > 0, 30_000, 'the export\'s updates on both /ws clients');
    expect(updates(plain, 'virsh_call').map((m) => m.data.id), 'calls on the plain /ws').to.deep.equal([]);
    const firstPage = plain.msgs.find((m) => m.type === 'jobs')?.data as unknown as { jobs: DaemonJob[] };
    expect(firstPage.jobs.map((j) => j.definition.operation)).to.not.include('virsh_call');
    plain.ws.close();
    internal.ws.close();

    expect((await req(gw.url, 'DELETE', '/jobs/lane-export')).status).to.be.oneOf([200, 202]);
    await until(async () => (await job()).state === 'CANCELLED', 30_000, 'the export cancelled');
  });
});
