// Worker processes doing real conversions with qemu-img: progress over SSE, identical output, capability
// matching, priority order, cancel of a running conversion, and a worker killed mid-job.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync, existsSync, openSync, writeSync, closeSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { EventSource } from 'eventsource';
import { TestRedis } from '../helpers/redis';
import { awaitWorkers, Proc, startGatewayProc, startWorkerProc, startWorkerWithMetrics, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import { makeImage } from '../helpers/images';
import type { JobStatus, StoredEvent, WorkerList } from '../helpers/api-types';
import type { ProgressEvent } from '../../domain/schemas/job';
import type { JobState } from '../../domain/states';

/** A convert job's result (services/worker/operations/convert.ts), the fields read here (a type, not an
 *  interface: the record's result is a Record<string, unknown>). */
type ConvertResult = { output_path: string; format: string; virtual_size: number; sha256: string };
/** Job API: DELETE /jobs/:id (Lifecycle.cancel). */
interface Cancelled { job_id: string; state: JobState; message: string }

const terminal = (s: string) => ['COMPLETED', 'FAILED', 'CANCELLED'].includes(s);

describe('worker processes', function () {
  this.timeout(120000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-workers-'));
  const out = path.join(dir, 'out');
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let env: Record<string, string>;
  const procs: Proc[] = [];
  let vmdk: string;
  let vhdx: string;

  const waitState = (id: string, pred: (s: string) => boolean = terminal, ms = 60000) =>
    until(async () => { const r = await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`); return pred(r.body.state) && r.body; }, ms, `job ${id}`);

  before(async () => {
    await redis.start();
    env = { ...testEnv(redis.url), FERRY_EXTRA_CAPABILITIES: 'graceful_cap,metered_cap' };
    gw = await startGatewayProc(env);
    vmdk = makeImage(dir, 'disk-a', 'vmdk', 24);
    vhdx = makeImage(dir, 'disk-b', 'vhdx', 16);
    const workers = [await startWorkerProc(env, 'plain', ['img_tool']), await startWorkerProc(env, 'nbd', ['img_tool', 'nbd_access'])];
    procs.push(...workers);
    await awaitWorkers(gw.url, workers);
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await gw?.stop();
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('converts vmdk -> qcow2 end to end, streamed over SSE, and the output is identical to the source', async () => {
    const sub = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'conv-1', operation: 'convert', image: { path: vmdk, format: 'vmdk' }, parameters: { output_format: 'qcow2', output_dir: out } });
    expect(sub.status).to.equal(201);
    const events: StoredEvent[] = [];
    const final = await new Promise<{ state: JobState }>((resolve, reject) => {
      const es = new EventSource(`${gw.url}/jobs/conv-1/events/stream`);
      es.addEventListener('progress', (e: MessageEvent) => events.push({ id: e.lastEventId, ...(JSON.parse(e.data as string) as ProgressEvent) }));
      es.addEventListener('complete', (e: MessageEvent) => { es.close(); resolve(JSON.parse(e.data as string) as { state: JobState }); });
      setTimeout(() => { es.close(); reject(new Error('no complete event')); }, 60000);
    });
    expect(final).to.deep.equal({ state: 'COMPLETED' });
    expect(events[0]).to.include({ phase: 'initialization', percentage: 0, job_id: 'conv-1' });
    const conv = events.filter((e) => e.phase === 'conversion');
    expect(conv.length).to.be.greaterThan(0);
    expect(conv.at(-1)!.details.total_bytes).to.equal(String(24 * 1024 * 1024));
    expect(Number(conv.at(-1)!.details.bytes_processed)).to.be.at.most(24 * 1024 * 1024);
    expect(new Set(events.map((e) => e.id)).size).to.equal(events.length);
    const job = (await req<JobStatus>(gw.url, 'GET', '/jobs/conv-1')).body;
    expect(job.state_history.map((h) => h.state)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED', 'ASSIGNED', 'RUNNING', 'COMPLETED']);
    const r = job.result as ConvertResult;
    expect(r.output_path).to.equal(path.join(out, 'conv-1.qcow2'));
    expect(r.format).to.equal('qcow2');
    expect(r.virtual_size).to.equal(24 * 1024 * 1024);
    expect(r.sha256).to.equal(createHash('sha256').update(readFileSync(r.output_path)).digest('hex'));
    execFileSync('qemu-img', ['compare', '-f', 'vmdk', '-F', 'qcow2', vmdk, r.output_path]); // throws if they differ
    expect(readdirSync(out).filter((f) => f.includes('partial'))).to.deep.equal([]);
  });

  it('converts vhdx -> raw to an exact output_path, identical to the source', async () => {
    const target = path.join(dir, 'exact', 'b.img');
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'conv-2', operation: 'convert', image: { path: vhdx, format: 'vhdx' }, parameters: { output_format: 'raw', output_path: target } });
    const j = await waitState('conv-2');
    expect(j.state).to.equal('COMPLETED');
    expect(j.result!.output_path).to.equal(target);
    execFileSync('qemu-img', ['compare', '-f', 'vhdx', '-F', 'raw', vhdx, target]);
  });

  it('fails (not retried) with a clear reason when the source does not exist, and refuses to overwrite', async () => {
    const gone = path.join(dir, 'nonexistent', 'x.vmdk');
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'missing', operation: 'convert', image: { path: gone, format: 'vmdk' }, parameters: { output_dir: out } });
    const j = await waitState('missing');
    expect(j.state).to.equal('FAILED');
    expect(j.error).to.include(gone);
    expect(j.attempts).to.equal(1);
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'dup-out', operation: 'convert', image: { path: vmdk, format: 'vmdk' }, parameters: { output_path: path.join(out, 'conv-1.qcow2') } });
    const d = await waitState('dup-out');
    expect(d.state).to.equal('FAILED');
    expect(d.error).to.include('already exists');
  });

  it('routes by capability: a job needing nbd_access only ever runs on the worker that has it', async () => {
    const ids = ['nbd-1', 'nbd-2', 'nbd-3', 'nbd-4'];
    for (const id of ids) await req(gw.url, 'POST', '/jobs?queue=true', { job_id: id, operation: 'noop', parameters: { sleep_ms: 100 }, requirements: { capabilities: ['nbd_access'] } });
    for (const id of ids) {
      const j = await waitState(id);
      expect(j.state).to.equal('COMPLETED');
      const assigned = j.state_history.filter((h) => h.state === 'ASSIGNED');
      expect(assigned.map((h) => h.worker_id)).to.deep.equal(['nbd']);
      expect(j.queue.name).to.equal('jobs.nbd_access');
    }
  });

  it('takes jobs in priority order (higher first; equal priorities in submission order)', async () => {
    const prios: [string, number][] = [['p-low', 10], ['p-high-a', 90], ['p-mid', 50], ['p-high-b', 90], ['p-top', 100]];
    for (const [id, priority] of prios) {
      await req(gw.url, 'POST', '/jobs?queue=true', { job_id: id, operation: 'noop', parameters: { sleep_ms: 50 }, requirements: { capabilities: ['lvm_tools'] }, execution_policy: { priority } });
    }
    const q = (await req<JobStatus>(gw.url, 'GET', '/jobs/p-top')).body.queue;
    expect(q.position).to.equal(1);
    expect(q.waiting_reason).to.include('lvm_tools');
    const w = await startWorkerProc(env, 'lvm', ['lvm_tools'], ['--concurrency', '1']);
    procs.push(w);
    const started: [string, number][] = [];
    for (const [id] of prios) {
      const j = await waitState(id);
      started.push([id, Date.parse(j.state_history.find((h) => h.state === 'ASSIGNED')!.timestamp)]);
    }
    expect(started.sort((a, b) => a[1] - b[1]).map((s) => s[0])).to.deep.equal(['p-top', 'p-high-a', 'p-high-b', 'p-mid', 'p-low']);
  });

  // Random data compressed into qcow2 takes seconds: slow enough to watch progress and to cancel mid-way.
  let big: string | undefined;
  const randomImage = () => {
    if (big) return big;
    big = path.join(dir, 'random.raw');
    const fd = openSync(big, 'w');
    for (let i = 0; i < 192; i++) writeSync(fd, randomBytes(1024 * 1024));
    closeSync(fd);
    return big;
  };

  it('reports progress while qemu-img converts (no -p: read from what it has read), rising, 100 only when done', async () => {
    const src = randomImage();
    const total = 192 * 1024 * 1024;
    const pdir = path.join(dir, 'progress-out');
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'progress-1', operation: 'convert', image: { path: src, format: 'raw' }, parameters: { output_format: 'qcow2', compress: true, output_dir: pdir } });
    // The qemu-img the worker runs, found by the job's partial file: its argv has no -p.
    const pid = await until(() => {
      try { return execFileSync('pgrep', ['-f', 'progress-1.partial']).toString().trim().split('\n')[0]; } catch { return undefined; }
    }, 30000, 'qemu-img to start');
    const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    expect(argv).to.include('convert');
    expect(argv).to.not.include('-p');
    // Progress seen while the job still runs, before the output is renamed into place.
    const during = await until(async () => {
      const evs = (await req<StoredEvent[]>(gw.url, 'GET', '/jobs/progress-1/events')).body.filter((e) => e.phase === 'conversion' && e.percentage > 0);
      return evs.length >= 2 && !existsSync(path.join(pdir, 'progress-1.qcow2')) && evs;
    }, 60000, 'two conversion progress events during the conversion');
    expect(during.every((e) => e.percentage < 100)).to.equal(true);
    const j = await waitState('progress-1');
    expect(j.state).to.equal('COMPLETED');
    const evs = (await req<StoredEvent[]>(gw.url, 'GET', '/jobs/progress-1/events')).body;
    const pcts = evs.map((e) => e.percentage);
    expect(pcts).to.deep.equal([...pcts].sort((a: number, b: number) => a - b)); // never goes back
    expect(pcts.slice(0, -1).every((p: number) => p < 100)).to.equal(true);
    expect(evs.at(-1)).to.include({ percentage: 100 });
    const conv = evs.filter((e) => e.phase === 'conversion');
    expect(new Set(conv.map((e) => e.percentage)).size).to.be.at.least(3);
    for (const e of conv) expect(Number(e.details.bytes_processed)).to.be.at.most(total);
    execFileSync('qemu-img', ['compare', '-f', 'raw', '-F', 'qcow2', src, (j.result as ConvertResult).output_path]);
  });

  it('cancels a running conversion: qemu-img is killed, no partial file remains, the job ends CANCELLED', async () => {
    const big = randomImage();
    const cdir = path.join(dir, 'cancel-out');
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'to-cancel', operation: 'convert', image: { path: big, format: 'raw' }, parameters: { output_format: 'qcow2', compress: true, output_dir: cdir } });
    // Under way: qemu-img has read part of the source (a progress event above 0) and is writing the partial file.
    await until(async () => {
      const evs = (await req<StoredEvent[]>(gw.url, 'GET', '/jobs/to-cancel/events')).body;
      return evs.some((e) => e.phase === 'conversion' && e.percentage > 0) && existsSync(path.join(cdir, '.to-cancel.qcow2.to-cancel.partial'));
    }, 30000, 'conversion under way');
    const r = await req<Cancelled>(gw.url, 'DELETE', '/jobs/to-cancel');
    expect(r.status).to.equal(200);
    expect(r.body.state).to.equal('CANCELLED');
    await until(() => {
      let ps = '';
      try { ps = execFileSync('pgrep', ['-f', 'to-cancel.partial']).toString(); } catch { /* pgrep exits 1 when none */ }
      return ps.trim() === '' && readdirSync(cdir).length === 0;
    }, 15000, 'qemu-img gone and no partial file');
    const j = (await req<JobStatus>(gw.url, 'GET', '/jobs/to-cancel')).body;
    expect(j.state).to.equal('CANCELLED');
    expect(j.state_history.at(-2)!.state).to.equal('RUNNING');
    // The worker is free again.
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'after-cancel', operation: 'noop' });
    expect((await waitState('after-cancel')).state).to.equal('COMPLETED');
  });

  it('requeues the job of a worker SIGKILLed mid-job; another worker completes it', async () => {
    const a = await startWorkerProc(env, 'mount-a', ['mount_operations']);
    const b = await startWorkerProc(env, 'mount-b', ['mount_operations']);
    procs.push(a, b);
    await until(async () => (await req<WorkerList>(gw.url, 'GET', '/workers')).body.workers.filter((w) => w.worker_id.startsWith('mount-')).length === 2, 30000, 'mount workers');
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'survivor', operation: 'noop', parameters: { sleep_ms: 4000, steps: 4 }, requirements: { capabilities: ['mount_operations'] } });
    const running = await waitState('survivor', (s) => s === 'RUNNING', 30000);
    const victim = running.worker_id === 'mount-a' ? a : b;
    const other = running.worker_id === 'mount-a' ? 'mount-b' : 'mount-a';
    await victim.kill();
    const j = await waitState('survivor', terminal, 60000);
    expect(j.state).to.equal('COMPLETED');
    const hist = j.state_history;
    const lost = hist.find((h) => h.state === 'QUEUED' && /lost/.test(h.reason));
    expect(lost, JSON.stringify(hist)).to.not.equal(undefined);
    expect(lost!.reason).to.include(running.worker_id);
    expect(hist.filter((h) => h.state === 'ASSIGNED').at(-1)!.worker_id).to.equal(other);
    expect(j.attempts).to.equal(2);
  });

  it('fails a job that runs past timeout_seconds, with the reason, after its retries', async () => {
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'slowpoke', operation: 'noop', parameters: { sleep_ms: 20000 }, execution_policy: { timeout_seconds: 1, retry_count: 1 } });
    const j = await waitState('slowpoke', terminal, 30000);
    expect(j.state).to.equal('FAILED');
    expect(j.error).to.include('timed out after 1 s');
    expect(j.attempts).to.equal(2);
    expect(j.state_history.map((h) => h.state)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED', 'ASSIGNED', 'RUNNING', 'QUEUED', 'ASSIGNED', 'RUNNING', 'FAILED']);
  });

  it('on SIGTERM a worker finishes its running job within the grace period, then deregisters', async () => {
    const w = await startWorkerProc(env, 'graceful', ['graceful_cap']);
    procs.push(w);
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'grace', operation: 'noop', parameters: { sleep_ms: 1500, steps: 3 }, requirements: { capabilities: ['graceful_cap'] } });
    await waitState('grace', (s) => s === 'RUNNING', 30000);
    await w.stop('SIGTERM');
    const j = (await req<JobStatus>(gw.url, 'GET', '/jobs/grace')).body;
    expect(j.state).to.equal('COMPLETED');
    const ws = (await req<WorkerList>(gw.url, 'GET', '/workers')).body.workers.map((x) => x.worker_id);
    expect(ws).to.not.include('graceful');
  });

  it('a worker exposes its own /metrics port', async () => {
    const w = await startWorkerWithMetrics(env, 'metered', ['metered_cap']);
    procs.push(w);
    const port = w.metricsPort;
    await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'metered-1', operation: 'noop', requirements: { capabilities: ['metered_cap'] } });
    expect((await waitState('metered-1')).state).to.equal('COMPLETED');
    // The worker counts a job once its attempt is settled, a moment after it reported the completion the gateway
    // shows: the count is awaited, not assumed.
    const counted = /ferry_worker_jobs_total\{operation="noop",outcome="completed",service="worker"\} 1/;
    const m = await until(async () => { const x = await req(`http://127.0.0.1:${port}`, 'GET', '/metrics'); return counted.test(x.text) && x; }, 10_000, 'the completed job in the worker\'s /metrics');
    expect(m.status).to.equal(200);
    expect(m.text).to.include('ferry_worker_info{worker_id="metered",capabilities="metered_cap",execution_mode="PROCESS",service="worker"} 1');
  });
});
