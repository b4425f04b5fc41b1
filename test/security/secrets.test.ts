// Secrets in a job's spec (a guest account's password_hash, any credential-named value) are redacted in every
// response and message: GET /jobs/{id} on the job API, the daemon's record, its WebSocket updates and the logs of
// both services; they are kept encrypted in Redis and only the worker that claims the job receives them. One definition (platform/sensitive.ts) serves
// logs, webhooks and responses.
import { expect } from 'chai';
import path from 'node:path';
import { isSensitiveKey, redact } from '../../platform/sensitive';
import { createRedis } from '../../platform/redis';
import { JobStore } from '../../queue/store';
import { QueueRouter } from '../../queue/router';
import { Registry } from '../../queue/registry';
import { Lifecycle } from '../../queue/lifecycle';
import type { TestRedis } from '../helpers/redis';
import { useStack, type Stack } from '../helpers/stack';
import { req, until } from '../helpers/http';
import { openWs } from '../helpers/ws';
import type { DaemonJob, JobStatus, WsMessage } from '../helpers/api-types';
import type { JobSpec } from '../../domain/schemas/job';

/** A migrate job's spec as this test writes it: the manifest's guest accounts hold the secrets. */
type MigrateSpec = JobSpec & { parameters: { manifest: { configuration: { users: Record<string, Record<string, string>> } } } };

const HASH = '$6$saltsalt$Zq8hVbQ0zT1nLqK3fJ5yW7eR9uI2oP4aS6dF8gH0jK2lZ4xC6vB8nM0qW2eR4tY6uI8oP0aS2dF4gH6jK8lZ0';
const TOKEN = 'tok-e1b2c3d4-private-api-token';

describe('security: secrets are redacted in every response and message', function () {
  this.timeout(60_000);
  const s = useStack({
    name: 'sec-secrets', prefix: 'secrets', daemonYaml: 'websocket:\n  status_interval_seconds: 0.5\n',
    env: { LOG_LEVEL: 'debug', FERRY_SECRET_KEY: 'secrets-test-secret-key' },
  });
  let gw: Stack['gw'];
  let dm: Stack['dm'];
  let redis: TestRedis;
  let dir: string;
  before(() => { ({ gw, dm, redis, dir } = s); });

  it('one definition: password_hash, tokens, keys and authorization are sensitive; `credentials: job` is not', () => {
    for (const k of ['password', 'password_hash', 'api_key', 'X-API-Key', 'Authorization', 'lease_token', 'client_secret', 'private_key', 'Cookie', 'ticket']) expect(isSensitiveKey(k), k).to.equal(true);
    for (const k of ['credentials', 'username', 'vm_path', 'output_path', 'hostname']) expect(isSensitiveKey(k), k).to.equal(false);
    expect(redact({ a: { password_hash: HASH, name: 'root' }, list: [{ token: TOKEN }] })).to.deep.equal({ a: { password_hash: '[redacted]', name: 'root' }, list: [{ token: '[redacted]' }] });
  });

  it('GET /jobs/{id}, the daemon record, WebSocket updates and logs never show them; the claiming worker gets them', async () => {
    const ws = openWs<WsMessage>(`${dm.url.replace('http', 'ws')}/ws`);
    await ws.opened;
    const src = path.join(dir, 'x.vmdk');
    const manifest = {
      manifest_version: '1.0', disks: [{ id: 'root', source_format: 'vmdk', bytes: 1 << 20, local_path: src }],
      output: { directory: path.join(dir, 'out'), format: 'qcow2' },
      configuration: { users: { root: { password_hash: HASH }, deploy: { ssh_token: TOKEN } } },
    };
    const sub = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'sec-1', operation: 'migrate', parameters: { manifest }, requirements: { capabilities: ['lvm_tools'] } });
    expect(sub.status, JSON.stringify(sub.body)).to.equal(201);
    const seen: string[] = [];
    const g = await req<JobStatus & { spec: MigrateSpec }>(gw.url, 'GET', '/jobs/sec-1');
    seen.push(g.text);
    expect(g.body.spec.parameters.manifest.configuration.users.root.password_hash).to.equal('[redacted]');
    expect(g.body.spec.parameters.manifest.configuration.users.deploy.ssh_token).to.equal('[redacted]');
    const rec = await req<DaemonJob & { spec: MigrateSpec }>(dm.url, 'GET', '/jobs/sec-1/record');
    seen.push(rec.text);
    expect(rec.body.spec.parameters.manifest.configuration.users.root.password_hash).to.equal('[redacted]');
    seen.push((await req(dm.url, 'GET', '/api/v1/jobs/sec-1')).text, (await req(dm.url, 'GET', '/jobs')).text);
    // Kept encrypted in Redis (FERRY_SECRET_KEY), opened only for the worker that claims it.
    const rc = createRedis({ url: redis.url });
    const stored = await rc.hget('secrets:job:sec-1', 'spec');
    rc.disconnect();
    expect(stored).to.include('"password_hash":"sealed:v1:');
    seen.push(stored!);
    const got = await req<(MigrateSpec & { lease_token: string }) | null>(gw.url, 'POST', '/queue/dequeue', { worker_id: 'sec-w', capabilities: ['img_tool', 'lvm_tools'] });
    expect(got.body!.parameters.manifest.configuration.users.root.password_hash).to.equal(HASH);
    await req(gw.url, 'POST', '/jobs/sec-1/fail', { worker_id: 'sec-w', lease_token: got.body!.lease_token, error: 'drill', retryable: false });
    await until(() => ws.msgs.some((m) => m.type === 'job_update' && (m.data as DaemonJob).id === 'sec-1' && (m.data as DaemonJob).status === 'failed'), 15000, 'the job_update');
    seen.push(JSON.stringify(ws.msgs));
    ws.ws.close();
    seen.push(gw.logs.join(''), dm.logs.join(''));
    for (const text of seen) {
      expect(text).to.not.include(HASH);
      expect(text).to.not.include(TOKEN);
    }
  });

  it('a worker without FERRY_SECRET_KEY cannot open sealed credentials: the job fails, not retried, naming the setting', async () => {
    const src = path.join(dir, 'y.vmdk');
    const manifest = { manifest_version: '1.0', disks: [{ id: 'root', source_format: 'vmdk', bytes: 1 << 20, local_path: src }], output: { directory: path.join(dir, 'out2'), format: 'qcow2' }, configuration: { users: { root: { password_hash: HASH } } } };
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'sec-2', operation: 'migrate', parameters: { manifest }, requirements: { capabilities: ['lvm_tools'] } });
    // A native worker's claim, in this test process, which has no FERRY_SECRET_KEY.
    const prefix = process.env.FERRY_PREFIX;
    process.env.FERRY_PREFIX = 'secrets';
    const r = createRedis({ url: redis.url });
    const router = new QueueRouter(r, { stalledCheck: false });
    try {
      const life = new Lifecycle(new JobStore(r), router, new Registry(r));
      expect(await life.claim({ worker_id: 'keyless', capabilities: ['img_tool', 'lvm_tools'] })).to.equal(null);
      const j = (await req<JobStatus>(gw.url, 'GET', '/jobs/sec-2')).body;
      expect(j.state).to.equal('FAILED');
      expect(j.attempts).to.equal(1);
      expect(j.error).to.include('FERRY_SECRET_KEY');
    } finally {
      await router.close();
      r.disconnect();
      if (prefix === undefined) delete process.env.FERRY_PREFIX; else process.env.FERRY_PREFIX = prefix;
    }
  });
});
