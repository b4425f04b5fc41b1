// Every daemon job record has the same keys (domain/schemas/daemon.ts jobRecordSchema, every key required):
// fields that do not apply are null. A job of each operation (the job API's too, whose definition names no VM)
// and of each status, listed through a real daemon's GET /jobs, /jobs/query and GET /jobs/{id}, matches the one
// schema, so a client that indexes definition.vm_path or progress.total_bytes does not break on any of them.
import { expect } from 'chai';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis } from '../helpers/redis';
import { startDaemonProc, testEnv, Proc } from '../helpers/procs';
import { req } from '../helpers/http';
import type { DaemonJob, DaemonJobList } from '../helpers/api-types';
import { createRedis, RedisClient } from '../../platform/redis';
import { JobStore } from '../../queue/store';
import { OPERATIONS } from '../../domain/operations';
import { jobRecordSchema } from '../../domain/schemas/daemon';
import type { JobState } from '../../domain/states';

describe('daemon: every job record has the same keys', function () {
  this.timeout(90000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-records-'));
  let daemon: Proc & { url: string };
  let rc: RedisClient;
  let store: JobStore;

  before(async function () {
    this.timeout(90000);
    await redis.start();
    rc = createRedis({ url: redis.url });
    store = new JobStore(rc, 'ferry');
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'metrics:\n  enabled: true\n');
    daemon = await startDaemonProc({ ...testEnv(redis.url), FERRY_CONFIG: cfg }, cfg);
  });
  after(async () => {
    await daemon?.stop();
    rc?.disconnect();
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('lists jobs of every operation and status, each record against one schema', async () => {
    // Records as the Lua commands write them (the way every submission ends): the view is built from the record.
    const paths: Record<string, unknown> = { vm_path: '/dc1/vm/web-01', output_path: '/srv/export' };
    const walks: JobState[][] = [['VALIDATED'], ['VALIDATED', 'QUEUED'], ['VALIDATED', 'QUEUED', 'ASSIGNED', 'RUNNING'], ['VALIDATED', 'QUEUED', 'ASSIGNED', 'RUNNING', 'COMPLETED'], ['VALIDATED', 'CANCELLED']];
    const ids: string[] = [];
    for (const op of Object.keys(OPERATIONS)) {
      for (const [w, walk] of walks.entries()) {
        const id = `${op}-${w}`;
        const parameters = op === 'export' || op === 'migrate_vm' ? paths : {};
        const meta = op === 'export' ? { kind: 'export' } : op === 'migrate_vm' ? { kind: 'migration' } : undefined;
        const r = await store.create(id, { spec: JSON.stringify({ job_id: id, operation: op, parameters }), queue: 'jobs.none', priority: 50, max_attempts: 1, ...(meta ? { meta: JSON.stringify(meta) } : {}) }, walk.slice(0, 2).map((to) => ({ to, reason: 'test' })));
        expect(r.created, id).to.equal(true);
        if (walk.length > 2) expect((await store.transition(id, walk.slice(2).map((to) => ({ to, reason: 'test' })))).ok, id).to.equal(true);
        // One running job reports bytes and files (an export's progress), the others report nothing of the kind.
        if (w === 2 && op === 'export') {
          const details = { bytes_downloaded: 10, total_bytes: 100, current_file: 'disk.vmdk', files_downloaded: 0, total_files: 1, rate_bytes_per_second: 5, eta_seconds: 18 };
          expect((await store.appendEvent(id, { job_id: id, timestamp: new Date().toISOString(), phase: 'download', percentage: 10, message: '', details: details as unknown as Record<string, string> })).ok).to.equal(true); // numbers, as an export reports them, where the type says strings
        }
        ids.push(id);
      }
    }
    const list = await req<DaemonJobList>(daemon.url, 'GET', `/jobs?limit=${ids.length}`);
    expect(list.status, list.text).to.equal(200);
    const query = await req<DaemonJobList>(daemon.url, 'GET', `/jobs/query?status=pending,running,completed,cancelled&limit=${ids.length}`);
    expect(query.status, query.text).to.equal(200);
    const one = await Promise.all(ids.map(async (id) => (await req<DaemonJob>(daemon.url, 'GET', `/jobs/${id}`)).body));
    for (const [where, jobs] of [['GET /jobs', list.body.jobs], ['GET /jobs/query', query.body.jobs], ['GET /jobs/{id}', one]] as const) {
      expect(jobs.map((j) => j.id).sort(), where).to.deep.equal([...ids].sort());
      for (const j of jobs) {
        const { error } = jobRecordSchema.validate(j, { abortEarly: false });
        expect(error?.message, `${where}: ${j.id}`).to.equal(undefined);
      }
    }
    const exported = list.body.jobs.find((j) => j.id === 'export-2');
    expect(exported!.progress).to.include({ total_bytes: 100, bytes_downloaded: 10, current_file: 'disk.vmdk' });
    const noop = list.body.jobs.find((j) => j.id === 'noop-1');
    expect(noop!.definition.vm_path, 'a job-API job: present and null').to.equal(null);
    expect(noop!.progress.total_bytes).to.equal(null);
  });

  it('cancels every pending job, past a page of 1,000, and names the ones it could not', async () => {
    for (let i = 0; i < 1200; i++) {
      const id = `many-${i}`;
      await store.create(id, { spec: JSON.stringify({ job_id: id, operation: 'noop', parameters: {} }), queue: 'jobs.none', priority: 50, max_attempts: 1 }, [{ to: 'VALIDATED', reason: 'test' }]);
    }
    const pending = ['CREATED', 'VALIDATED', 'QUEUED', 'ASSIGNED'].map((s) => `ferry:jobs:state:${s}`);
    const before = (await Promise.all(pending.map((k) => rc.zcard(k)))).reduce((a, b) => a + b, 0);
    expect(before).to.be.above(1200);
    const r = await req(daemon.url, 'POST', '/jobs/cancel', { status: 'pending' });
    expect(r.status, r.text).to.equal(200);
    expect(r.body).to.deep.include({ count: before, failed: [], errors: {} });
    expect((await Promise.all(pending.map((k) => rc.zcard(k)))).reduce((a, b) => a + b, 0), 'pending jobs left in Redis').to.equal(0);
    expect(await rc.hget('ferry:job:many-0', 'state')).to.equal('CANCELLED');
  });
});
