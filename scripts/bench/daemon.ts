// Daemon benchmark: (1) p99 latency from a job change to 500 WebSocket clients receiving its job_update;
// (2) the webhook delivery rate one notifier sustains against a local receiver. Starts its own redis-server,
// daemon and notifier processes.   npm run bench:daemon [-- --clients 500 --changes 40 --deliveries 2000]
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import WebSocket from 'ws';
import { TestRedis, freePort, waitForPort } from '../../test/helpers/redis';
import { startProcess, testEnv, Proc } from '../../test/helpers/procs';
import type { JobSpec } from '../../domain/schemas/job';

/** A message of the daemon's /ws (services/daemon/ws.ts); only job_update is read, whose data is a job (its id). */
interface DaemonWsMessage { type: string; data: { id: string } }

const { values } = parseArgs({ options: { clients: { type: 'string' }, changes: { type: 'string' }, deliveries: { type: 'string' } } });
const CLIENTS = Number(values.clients || 500);
const CHANGES = Number(values.changes || 40);
const DELIVERIES = Number(values.deliveries || 2000);
const pct = (xs: number[], p: number) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]; };

async function main() {
  const redis = await new TestRedis().start();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-bench-'));
  const cfg = path.join(dir, 'daemon.yaml');
  writeFileSync(cfg, 'webhooks:\n  allow_loopback: true\n  concurrency: 50\n');
  process.env.REDIS_URL = redis.url;
  process.env.FERRY_PREFIX = 'bench';
  const env = { ...testEnv(redis.url, 'bench'), FERRY_CONFIG: cfg, FERRY_HOST: '127.0.0.1', FERRY_RATE_LIMIT: '0' }; // one client stands in for a fleet: the per-client rate limit would cap it
  const port = await freePort();
  const procs: Proc[] = [startProcess('services/daemon/main.ts', ['-addr', `127.0.0.1:${port}`], env), startProcess('services/notifier/main.ts', [], env)];
  await waitForPort(port, 30000);
  const base = `http://127.0.0.1:${port}`;
  // In-process job changes through the same Lifecycle every service uses.
  const { createRedis } = await import('../../platform/redis');
  const { JobStore } = await import('../../queue/store');
  const { QueueRouter } = await import('../../queue/router');
  const { Registry } = await import('../../queue/registry');
  const { Lifecycle } = await import('../../queue/lifecycle');
  const { jobSpecSchema } = await import('../../domain/schemas/job');
  const rc = createRedis();
  const life = new Lifecycle(new JobStore(rc), new QueueRouter(rc, { stalledCheck: false }), new Registry(rc));
  const submit = (id: string) => life.submit(jobSpecSchema.validate({ job_id: id, operation: 'noop' }).value as JobSpec, { enqueue: false }); // Joi's value is untyped

  // 1. WebSocket fan-out latency.
  const sent = new Map<string, number>();
  const lat: number[] = [];
  const sockets: WebSocket[] = [];
  await Promise.all(Array.from({ length: CLIENTS }, () => new Promise<void>((resolve, reject) => {
    const ws = new WebSocket(`${base.replace('http', 'ws')}/ws`);
    const seen = new Set<string>();
    ws.on('message', (d) => {
      const m = JSON.parse((d as Buffer).toString()) as DaemonWsMessage; // ws hands a text frame over as one Buffer
      if (m.type !== 'job_update') return;
      const t0 = sent.get(m.data.id);
      if (t0 !== undefined && !seen.has(m.data.id)) { seen.add(m.data.id); lat.push(performance.now() - t0); }
    });
    ws.once('open', () => resolve());
    ws.once('error', reject);
    sockets.push(ws);
  })));
  await new Promise((r) => setTimeout(r, 1000));
  for (let i = 0; i < CHANGES; i++) {
    const id = `ws-${i}`;
    sent.set(id, performance.now());
    await submit(id);
    await new Promise((r) => setTimeout(r, 100));
  }
  const want = CHANGES * CLIENTS;
  for (let i = 0; i < 100 && lat.length < want; i++) await new Promise((r) => setTimeout(r, 100));
  console.log(`websocket: ${CLIENTS} clients, ${CHANGES} job changes, ${lat.length}/${want} job_update received; latency p50 ${pct(lat, 50).toFixed(1)} ms, p99 ${pct(lat, 99).toFixed(1)} ms, max ${Math.max(...lat).toFixed(1)} ms`);
  for (const ws of sockets) ws.terminate();

  // 2. Webhook delivery rate of one notifier.
  let got = 0;
  let first = 0;
  let last = 0;
  const rx = http.createServer((q, s) => { q.resume(); q.on('end', () => { if (!first) first = performance.now(); got++; last = performance.now(); s.writeHead(200); s.end(); }); });
  rx.keepAliveTimeout = 10_000;
  await new Promise<void>((r) => rx.listen(0, '127.0.0.1', r));
  const hook = await fetch(`${base}/webhooks`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ url: `http://127.0.0.1:${(rx.address() as AddressInfo).port}/hook`, events: ['job.created'], retry_count: 0 }) });
  if (hook.status !== 201) throw new Error(`webhook not created: ${await hook.text()}`);
  await new Promise((r) => setTimeout(r, 300));
  const t0 = performance.now();
  for (let i = 0; i < DELIVERIES; i += 50) await Promise.all(Array.from({ length: Math.min(50, DELIVERIES - i) }, (_, j) => submit(`wh-${i + j}`)));
  const submitted = performance.now();
  for (let i = 0; i < 600 && got < DELIVERIES; i++) await new Promise((r) => setTimeout(r, 100));
  console.log(`webhooks: ${got}/${DELIVERIES} deliveries in ${((last - t0) / 1000).toFixed(2)} s (jobs created in ${((submitted - t0) / 1000).toFixed(2)} s): ${(got / ((last - t0) / 1000)).toFixed(0)} deliveries/s sustained by one notifier (concurrency 50)`);

  rx.close();
  rc.disconnect();
  await Promise.all(procs.map((p) => p.stop()));
  await redis.stop();
  process.exit(0);
}

main().catch((e) => { console.error(e); process.exit(1); });
