// `unseal` only for the fields that were sealed (issue 18, item 10). A caller who got hold of a sealed value (a
// Redis dump, a backup: `sealed:v1:...`) copies it into a job of their own: into a field that is shown (a noop's
// `fail` message becomes the job's error) or into their own guest's password_hash. The worker that claims the job
// must get the literal sealed text in both, never the victim's secret.
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRedis } from '../../platform/redis';
import { TestRedis } from '../helpers/redis';
import { Proc, startGatewayProc, testEnv } from '../helpers/procs';
import { req } from '../helpers/http';
import type { JobSpec } from '../../domain/schemas/job';

/** A migrate job's parameters as this test writes them: the guest accounts hold the password_hash. */
interface MigrateParameters { manifest: { configuration: { users: Record<string, Record<string, string>> } } }
/** A noop's parameters (its `fail` message becomes the job's error). */
interface NoopParameters { fail: string }
/** POST /queue/dequeue (services/gateway/queue-routes.ts): the spec with its lease (the answer is null when none waits). */
type Claimed<P> = JobSpec & { parameters: P; lease_token: string };

const HASH = '$6$victimsalt$Vq8hVbQ0zT1nLqK3fJ5yW7eR9uI2oP4aS6dF8gH0jK2lZ4xC6vB8nM0qW2eR4tY6uI8oP0aS2dF4gH6jK8lZ0';

describe('security: a sealed secret copied into another field or job stays sealed', function () {
  this.timeout(60_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-sec-sealed-'));
  const procs: Proc[] = [];
  let gw: Proc & { url: string };
  const manifest = (users: Record<string, unknown>, out: string) => ({
    manifest_version: '1.0', disks: [{ id: 'root', source_format: 'vmdk', bytes: 1 << 20, local_path: path.join(dir, 'x.vmdk') }],
    output: { directory: path.join(dir, out), format: 'qcow2' }, configuration: { users },
  });
  /** Claims jobs as an HTTP pull worker until it gets `id` (others are failed out of the way). */
  async function claim<P>(id: string, capabilities: string[]) {
    for (let i = 0; i < 5; i++) {
      const got = await req<Claimed<P> | null>(gw.url, 'POST', '/queue/dequeue', { worker_id: `w-${id}`, capabilities });
      if (got.body?.job_id === id) return got.body;
      if (got.body?.job_id) await req(gw.url, 'POST', `/jobs/${got.body.job_id}/fail`, { worker_id: `w-${id}`, lease_token: got.body.lease_token, error: 'out of the way', retryable: false });
    }
    throw new Error(`job ${id} was never handed out`);
  }

  before(async () => {
    await redis.start();
    gw = await startGatewayProc({ ...testEnv(redis.url, 'sealed'), FERRY_SECRET_KEY: 'sealed-test-secret-key' });
    procs.push(gw);
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('the victim\'s job is sealed in Redis and opened for its own worker (the control)', async () => {
    const r = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'victim', operation: 'migrate', parameters: { manifest: manifest({ root: { password_hash: HASH } }, 'v') }, requirements: { capabilities: ['lvm_tools'] } });
    expect(r.status, r.text).to.equal(201);
    const got = await claim<MigrateParameters>('victim', ['img_tool', 'lvm_tools']);
    expect(got.parameters.manifest.configuration.users.root.password_hash).to.equal(HASH);
    await req(gw.url, 'POST', '/jobs/victim/fail', { worker_id: 'w-victim', lease_token: got.lease_token, error: 'done', retryable: false });
  });

  it('copied into a noop\'s fail message or another job\'s password_hash, the sealed value reaches the worker as the sealed text, never the hash', async () => {
    const rc = createRedis({ url: redis.url });
    const stored = JSON.parse((await rc.hget('sealed:job:victim', 'spec'))!) as JobSpec & { parameters: MigrateParameters };
    rc.disconnect();
    const sealed: string = stored.parameters.manifest.configuration.users.root.password_hash;
    expect(sealed).to.match(/^sealed:v1:/);

    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'copy-fail', operation: 'noop', parameters: { fail: sealed } });
    const a = await claim<NoopParameters>('copy-fail', []);
    expect(a.parameters.fail).to.equal(sealed);
    expect(JSON.stringify(a)).to.not.include(HASH);
    await req(gw.url, 'POST', '/jobs/copy-fail/fail', { worker_id: 'w-copy-fail', lease_token: a.lease_token, error: a.parameters.fail, retryable: false });
    expect((await req(gw.url, 'GET', '/jobs/copy-fail')).text).to.not.include(HASH);

    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'copy-hash', operation: 'migrate', parameters: { manifest: manifest({ root: { password_hash: sealed } }, 'c') }, requirements: { capabilities: ['lvm_tools'] } });
    const b = await claim<MigrateParameters>('copy-hash', ['img_tool', 'lvm_tools']);
    expect(b.parameters.manifest.configuration.users.root.password_hash).to.equal(sealed);
    expect(JSON.stringify(b)).to.not.include(HASH);
  });
});
