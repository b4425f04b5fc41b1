// Destinations from an allow-list (issue 18, item 7), as an attacker with a submit key tries them against the
// real daemon, gateway and a native worker: a libvirt URI that runs a program (qemu+ext, command=), points at
// another socket (socket=), or skips the host-key check (no_verify=) is refused naming the field, and the program
// never runs; the operator's own URIs (FERRY_LIBVIRT_URI, with its socket=, and FERRY_LIBVIRT_URIS) still work;
// a job already in Redis from before a configuration change is refused again on the worker, not retried.
import { expect } from 'chai';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { createRedis } from '../../platform/redis';
import { JobStore } from '../../queue/store';
import { QueueRouter } from '../../queue/router';
import { Registry } from '../../queue/registry';
import { Lifecycle } from '../../queue/lifecycle';
import { validate } from '../../platform/http';
import { jobSpecSchema, JobSpec } from '../../domain/schemas/job';
import { TestRedis } from '../helpers/redis';
import { Proc, startDaemonProc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DaemonError, JobApiError } from '../helpers/http';
import type { JobStatus, MigrationSubmitted } from '../helpers/api-types';

const K = { submit: 'dest-submit-key-0123456789', admin: 'dest-admin-key-0123456789' };
const PREFIX = 'dest';

describe('security: libvirt destinations come from the operator\'s allow-list', function () {
  this.timeout(90_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-sec-dest-'));
  const marker = path.join(dir, 'spawned');
  const program = path.join(dir, 'evil.sh');
  // What the operator configured: a private socket URI (as the tests' libvirtd) and one more host.
  const own = `qemu+unix:///system?socket=${dir}/sock/libvirt-sock`;
  const other = 'qemu+tls://kvm2.example/system';
  const procs: Proc[] = [];
  let dm: Proc & { url: string };
  let gw: Proc & { url: string };
  const as = (key: string) => ({ 'x-api-key': key });
  const shapeB = (virt_uri: string, extra: Record<string, unknown> = {}) => ({
    vm_path: '/DC0/vm/app1', source: { type: 'vsphere' }, destination: { type: 'kvm', virt_uri }, ...extra,
  });
  const jobCount = async () => {
    const r = createRedis({ url: redis.url });
    try { return (await r.keys(`${PREFIX}:job:*`)).length; } finally { r.disconnect(); }
  };

  // Something listens on the operator's socket: a libvirt_access worker with a local URI refuses to start
  // without it (services/worker/tools.ts). No job here reaches it.
  const sock = net.createServer((c) => c.destroy());
  before(async () => {
    mkdirSync(path.join(dir, 'sock'));
    await new Promise<void>((r) => sock.listen(path.join(dir, 'sock', 'libvirt-sock'), r));
    writeFileSync(program, `#!/bin/sh\ntouch ${marker}\n`);
    chmodSync(program, 0o755);
    await redis.start();
    const env = {
      ...testEnv(redis.url, PREFIX), FERRY_API_KEYS: `ci:submit:${K.submit},ops:admin:${K.admin}`,
      FERRY_LIBVIRT_URI: own, FERRY_LIBVIRT_URIS: other, GOVC_URL: 'https://127.0.0.1:9/sdk', GOVC_USERNAME: 'u', GOVC_PASSWORD: 'env-pw-dest-0001',
    };
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 1h\n');
    [dm, gw] = await Promise.all([startDaemonProc(env, cfg), startGatewayProc(env)]);
    procs.push(dm, gw, await startWorkerProc(env, 'dest-w', ['libvirt_access']));
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await redis.stop();
    sock.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('the reported attack: a shape B job with qemu+ext:///system?command=<program> is a 400 naming destination.virt_uri; no job, nothing spawned', async () => {
    const before = await jobCount();
    const r = await req<DaemonError>(dm.url, 'POST', '/jobs/submit', shapeB(`qemu+ext:///system?command=${program}`), as(K.submit));
    expect(r.status, r.text).to.equal(400);
    expect(r.body.error).to.include('destination.virt_uri').and.include('ext transport');
    expect(r.body.fields!.map((f) => f.field)).to.include('destination.virt_uri');
    // An admin key does not make it acceptable either: the URI is not the operator's.
    expect((await req(dm.url, 'POST', '/jobs/submit', shapeB(`qemu+ext:///system?command=${program}`), as(K.admin))).status).to.equal(400);
    expect(await jobCount()).to.equal(before);
    expect(existsSync(marker)).to.equal(false);
  });

  it('socket=, command=, no_verify= and an unlisted qemu+tcp or qemu+ssh host are refused on both APIs, naming the field', async () => {
    const attempts = [
      [`qemu+unix:///system?socket=${dir}/other-sock`, 'socket='],
      [`qemu+ssh://root@internal-host/system?command=${program}`, 'command='],
      ['qemu+ssh://root@internal-host/system?no_verify=1', 'no_verify='],
      ['qemu+ssh://root@internal-host/system?NetCat=/tmp/x', 'netcat='],
      ['qemu+tcp://10.0.0.9/system', 'qemu+tcp'],
      ['qemu+ssh://root@internal-host/system', 'FERRY_LIBVIRT_URIS'],
    ];
    for (const [uri, why] of attempts) {
      const d = await req<DaemonError>(dm.url, 'POST', '/jobs/submit', shapeB(uri), as(K.submit));
      expect(d.status, `${uri}: ${d.text}`).to.equal(400);
      expect(d.body.error, uri).to.include('destination.virt_uri').and.include(why);
      const g = await req<JobApiError>(gw.url, 'POST', '/jobs', { operation: 'import_kvm', parameters: { disks: [{ path: '/tmp/x.qcow2' }], name: 'x', virt_uri: uri } }, as(K.submit));
      expect(g.status, `${uri}: ${g.text}`).to.equal(400);
      expect(g.body.error.message, uri).to.include('parameters.virt_uri');
    }
    expect(existsSync(marker)).to.equal(false);
  });

  it('the operator\'s URIs are accepted as given: FERRY_LIBVIRT_URI (with its socket=) and an entry of FERRY_LIBVIRT_URIS', async () => {
    for (const uri of [own, other]) {
      const r = await req<MigrationSubmitted>(dm.url, 'POST', '/jobs/submit', shapeB(uri), as(K.submit));
      expect(r.status, `${uri}: ${r.text}`).to.equal(200);
      await req(dm.url, 'POST', '/jobs/cancel', { job_ids: [r.body.job_id] }, as(K.submit));
    }
  });

  it('a job already in Redis with a refused URI (a configuration changed since) fails on the worker without retry; nothing spawned', async () => {
    const evil = `qemu+ext:///system?command=${program}`;
    // Accepted at the time: this process's allow-list still had it.
    process.env.FERRY_LIBVIRT_URIS = evil;
    const prefix = process.env.FERRY_PREFIX;
    process.env.FERRY_PREFIX = PREFIX;
    const r = createRedis({ url: redis.url });
    const router = new QueueRouter(r, { stalledCheck: false });
    try {
      const spec = validate<JobSpec>(jobSpecSchema, { job_id: 'dest-old', operation: 'import_kvm', parameters: { disks: [{ path: '/tmp/x.qcow2' }], name: 'x', virt_uri: evil }, execution_policy: { retry_count: 2 } }, 'body');
      await new Lifecycle(new JobStore(r), router, new Registry(r)).submit(spec, { enqueue: true });
    } finally {
      delete process.env.FERRY_LIBVIRT_URIS;
      if (prefix === undefined) delete process.env.FERRY_PREFIX; else process.env.FERRY_PREFIX = prefix;
      await router.close();
      r.disconnect();
    }
    const j = await until(async () => { const g = await req<JobStatus>(gw.url, 'GET', '/jobs/dest-old', undefined, as(K.submit)); return g.body?.state === 'FAILED' && g.body; }, 30000, 'the worker to refuse the job');
    expect(j.attempts).to.equal(1);
    expect(j.error).to.include('parameters.virt_uri').and.include('ext transport');
    expect(existsSync(marker)).to.equal(false);
  });
});
