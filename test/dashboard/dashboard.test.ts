// The browser dashboard (/web/dashboard/ on the daemon) in headless Chromium against real processes: redis,
// the gateway, a worker with img_tool, the daemon and a scheduler. A conversion submitted from the form runs
// qemu-img on a real image; cancel and schedule triggers go through the page; auth on asks for the key; and the
// jobs list stays quick and bounded with 10,000 jobs in the store. Screenshots go to test/artifacts/.
import { expect } from 'chai';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import IORedis from 'ioredis';
import type { BrowserContext, Page } from 'playwright-core';
import { ARTIFACTS, launchChromium } from '../helpers/browser';
import { TestRedis } from '../helpers/redis';
import { startDaemonProc, startGatewayProc, startProcess, startWorkerProc, testEnv, Proc } from '../helpers/procs';
import { req, until } from '../helpers/http';
import { makeImage } from '../helpers/images';
import { JobStore } from '../../queue/store';
import { queueName } from '../../platform/capabilities';
import { tolerate } from '../helpers/teardown';
import { importClosure, pageAssets } from '../helpers/page-assets';
import type { DaemonJob, DaemonJobList, JobStatus, QueueStatus, Schedule } from '../helpers/api-types';
import type { ImageInfo } from '../../domain/qemu';

/** What the page functions below read of an element in the browser (the tests compile without the DOM lib). */
interface PageElement { textContent: string | null; dataset: Record<string, string | undefined> }

const API_KEY = 'dashboard-test-key-0123456789';

describe('browser dashboard (headless Chromium)', function () {
  this.timeout(30000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-dash-'));
  const procs: Proc[] = [];
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let daemon: Awaited<ReturnType<typeof startDaemonProc>>;
  let env: Record<string, string>;
  let ctx: BrowserContext;
  let page: Page;
  let D: string;
  let rc: IORedis;

  before(async function () {
    this.timeout(90000);
    mkdirSync(ARTIFACTS, { recursive: true });
    await redis.start();
    rc = new IORedis(redis.url);
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'metrics:\n  enabled: true\nwebsocket:\n  status_interval_seconds: 1\nwebhooks:\n  allow_loopback: true\n');
    env = { ...testEnv(redis.url), FERRY_CONFIG: cfg, FERRY_HOST: '127.0.0.1' };
    const started = await Promise.all([startGatewayProc(env), startDaemonProc(env, cfg)]);
    [gw, daemon] = started;
    procs.push(gw, daemon, await startWorkerProc(env, 'img-worker', ['img_tool'], ['--concurrency', '2']), startProcess('services/scheduler/main.ts', [], env));
    D = `${daemon.url}/web/dashboard/`;
    ctx = await launchChromium(path.join(dir, 'chromium-profile'));
    page = await ctx.newPage();
    page.on('pageerror', (e) => { throw new Error(`page error: ${e.message}`); });
  });
  after(async () => {
    await ctx?.close().catch(tolerate('chromium close'));
    await Promise.all(procs.map((p) => p.stop()));
    rc?.disconnect();
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const apiState = async (id: string) => (await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`)).body?.state;

  it('serves its own files (no CDN) under both path forms, the VM console page with xterm.js from node_modules', async () => {
    for (const p of ['/web/dashboard/', '/api/v1/web/dashboard/']) {
      const r = await req(daemon.url, 'GET', p);
      expect(r.status, p).to.equal(200);
      expect(r.headers.get('content-type')).to.include('text/html');
      expect(r.text).to.include('app.js').and.not.match(/https?:\/\//);
    }
    for (const f of ['app.js', 'api.js', 'jobs.js', 'admin.js', 'dom.js']) {
      const r = await req(daemon.url, 'GET', `/web/dashboard/${f}`);
      expect(r.status, f).to.equal(200);
      expect(r.headers.get('content-type')).to.include('javascript');
      expect(r.text, f).to.not.match(/import .* from ['"]https?:/);
    }
    expect((await req(daemon.url, 'GET', '/web/dashboard')).status).to.equal(200); // redirected to the slash form
    const con = await req(daemon.url, 'GET', '/web/dashboard/vm-console.html');
    expect(con.status).to.equal(200);
    expect(con.text).to.include('vendor/xterm/lib/xterm.js').and.include('vm-console.js');
    expect((await req(daemon.url, 'GET', '/web/dashboard/vendor/xterm/lib/xterm.js')).status).to.equal(200);
  });

  it('each page preloads every module its script imports, directly or not; its files are not rate-counted and revalidate with 304', async () => {
    const get = async (f: string) => {
      const r = await req(daemon.url, 'GET', `/web/dashboard/${f}`);
      expect(r.status, f).to.equal(200);
      return r.text;
    };
    for (const html of ['index.html', 'vm-console.html']) {
      const page = pageAssets(await get(html));
      expect(page.modules, html).to.have.length(1);
      expect([...page.preloads].sort(), `${html}: modulepreload links`).to.deep.equal((await importClosure(page.modules, get)).sort());
    }
    // Public files answer without a role and outside the rate limit; the API beside them is counted.
    const file = await req(daemon.url, 'GET', '/web/dashboard/app.js');
    expect(file.headers.get('x-ratelimit-limit'), 'a static file is not counted').to.equal(null);
    expect((await req(daemon.url, 'GET', '/status')).headers.get('x-ratelimit-limit'), 'an API call is').to.match(/^\d+$/);
    const etag = file.headers.get('etag');
    expect(etag).to.match(/^W\/"/);
    // As a browser revalidates on a reload (fetch() itself would add Cache-Control: no-cache, which asks for the file).
    const again = await req(daemon.url, 'GET', '/web/dashboard/app.js', undefined, { 'If-None-Match': etag!, 'Cache-Control': 'max-age=0' });
    expect(again.status, 'unchanged since the browser\'s copy').to.equal(304);
    expect(again.text).to.equal('');
  });

  it('loads: jobs table, live /ws connection, counters', async () => {
    await page.goto(D);
    await page.waitForSelector('table.jobs');
    await page.waitForSelector('#live.live:not(.off)', { timeout: 10000 });
    await page.waitForSelector('#counts .count.completed');
  });

  it('converts a real image submitted from the form and shows it going to completed with its progress bar', async function () {
    this.timeout(60000);
    const img = makeImage(dir, 'disk', 'vmdk', 64);
    const out = path.join(dir, 'out');
    mkdirSync(out);
    await page.goto(D + '#/submit');
    await page.fill('input[name=image_path]', img);
    await page.selectOption('select[name=image_format]', 'vmdk');
    await page.selectOption('select[name=output_format]', 'qcow2');
    await page.fill('input[name=output_dir]', out);
    await page.check('input[name=compress]');
    await page.fill('input[name=priority]', '70');
    await page.click('#convert-form button[type=submit]');
    await page.waitForURL(/#\/job\//);
    const id = decodeURIComponent(page.url().split('#/job/')[1]);
    // The job page follows it live (SSE events + /ws) to completed, with a full bar and its state history.
    await page.waitForSelector('h2 .badge.completed', { timeout: 45000 });
    await page.waitForSelector('#job-progress .bar.completed[aria-valuenow="100"]');
    const history = await page.$$eval('table.history tbody tr td:first-child', (tds: PageElement[]) => tds.map((t) => t.textContent));
    expect(history).to.include.members(['VALIDATED', 'QUEUED', 'ASSIGNED', 'RUNNING', 'COMPLETED']);
    await until(async () => (await page.$$('table.events tbody tr')).length >= 2, 10000, 'progress events on the page');
    expect(await page.textContent('table.events')).to.include('conversion');
    expect(await page.textContent('table.kv')).to.include(img).and.include('"compress":true').and.include('70');
    await page.screenshot({ path: path.join(ARTIFACTS, 'dashboard-job.png'), fullPage: true });
    // The output is a real qcow2 image.
    const file = path.join(out, `${id}.qcow2`);
    expect(existsSync(file)).to.equal(true);
    expect((JSON.parse(execFileSync('qemu-img', ['info', '--output=json', file]).toString()) as ImageInfo).format).to.equal('qcow2');
    // And the list shows it completed with a full bar.
    await page.goto(D + '#/jobs');
    const row = page.locator(`tr[data-id="${id}"]`);
    await row.locator('.badge.completed').waitFor();
    expect(await row.locator('.bar').getAttribute('aria-valuenow')).to.equal('100');
  });

  it('cancels a running job from the list (live update over /ws)', async () => {
    const id = 'dash-slow-1';
    expect((await req(gw.url, 'POST', '/jobs?queue=true', { job_id: id, operation: 'noop', parameters: { sleep_ms: 60000, steps: 60 } })).status).to.equal(201);
    await page.goto(D + '#/jobs');
    const row = page.locator(`tr[data-id="${id}"]`);
    await row.locator('.badge.running').waitFor({ timeout: 15000 });
    // Rate and ETA from /jobs/{id}/progress appear once there are two progress samples.
    await until(async () => (await row.locator('td.eta').textContent())?.trim(), 10000, 'an ETA on the running row');
    await page.screenshot({ path: path.join(ARTIFACTS, 'dashboard-jobs.png'), fullPage: true });
    await row.locator('button.cancel').click();
    await row.locator('.badge.cancelled').waitFor({ timeout: 10000 });
    expect(await apiState(id)).to.equal('CANCELLED');
    expect(await row.locator('button.cancel').count()).to.equal(0);
  });

  it('filters by state and pages on the server', async () => {
    await page.goto(D + '#/jobs?status=cancelled');
    await page.waitForSelector('tr[data-id="dash-slow-1"]');
    const statuses = await page.$$eval('table.jobs tbody tr', (trs: PageElement[]) => trs.map((t) => t.dataset.status));
    expect(statuses.every((s) => s === 'cancelled')).to.equal(true);
    expect(await page.inputValue('#status-filter')).to.equal('cancelled');
  });

  it('shows workers with capabilities and heartbeat, and queues by requirement set', async () => {
    await page.goto(D + '#/workers');
    const w = page.locator('table.workers tr[data-id="img-worker"]');
    await w.waitFor();
    const text = await w.textContent();
    expect(text).to.include('img_tool');
    expect(text).to.match(/just now|ago/);
    const q = await page.textContent('table.queues');
    expect(q).to.include('img_tool');
    const gwQueue = (await req<QueueStatus>(gw.url, 'GET', '/queue')).body;
    expect((await req<QueueStatus>(daemon.url, 'GET', '/queue')).body.queues.map((x) => x.name)).to.deep.equal(gwQueue.queues.map((x) => x.name));
    await page.screenshot({ path: path.join(ARTIFACTS, 'dashboard-workers.png'), fullPage: true });
  });

  it('creates a schedule, disables and enables it, and a trigger from the page produces a job', async () => {
    await page.goto(D + '#/schedules');
    await page.fill('#schedule-form input[name=name]', 'dash nightly');
    await page.fill('#schedule-form input[name=cron]', '0 3 * * *');
    await page.fill('#schedule-form textarea[name=template]', '{"operation": "noop", "parameters": {"steps": 2}}');
    await page.click('#schedule-form button[type=submit]');
    const row = page.locator('table.schedules tbody tr', { hasText: 'dash nightly' });
    await row.waitFor();
    const sid = await row.getAttribute('data-id');
    await row.locator('button.toggle', { hasText: 'Disable' }).click();
    await page.locator(`tr[data-id="${sid}"] button.toggle`, { hasText: 'Enable' }).waitFor();
    expect((await req<Schedule>(daemon.url, 'GET', `/schedules/${sid}`)).body.enabled).to.equal(false);
    await page.locator(`tr[data-id="${sid}"] button.toggle`).click();
    await page.locator(`tr[data-id="${sid}"] button.toggle`, { hasText: 'Disable' }).waitFor();
    await page.locator(`tr[data-id="${sid}"] button.trigger`).click();
    await page.waitForSelector('#schedule-msg a.triggered-job');
    const href = await page.getAttribute('#schedule-msg a.triggered-job', 'href');
    const jobId = decodeURIComponent(href!.split('#/job/')[1]);
    const job = await until(async () => { const j = (await req<DaemonJob>(daemon.url, 'GET', `/jobs/${jobId}`)).body; return j?.status === 'completed' && j; }, 15000, 'the triggered job to complete');
    expect(job.schedule_id).to.equal(sid);
  });

  it('shows webhooks and their delivery log', async () => {
    // Loopback targets are refused by default; this daemon's configuration allows them (webhooks.allow_loopback).
    const r = await req(daemon.url, 'POST', '/webhooks', { url: 'https://127.0.0.1:9/hook', events: ['job.completed'] });
    expect(r.status, r.text).to.equal(201);
    await page.goto(D + '#/webhooks');
    await page.waitForSelector('table.webhooks tbody tr');
    expect(await page.textContent('table.webhooks')).to.include('https://127.0.0.1:9/hook');
    await page.click('table.webhooks button:has-text("Delivery log")');
    await page.waitForSelector('.deliveries table');
  });

  it('POST /jobs/operation answers 400 naming the field for bad input; the form shows it', async () => {
    const r = await req(daemon.url, 'POST', '/jobs/operation', { operation: 'convert', image: { path: 'relative.vmdk', format: 'vmdk' }, parameters: { output_dir: '/tmp', output_format: 'raw', compress: true } });
    expect(r.status, r.text).to.equal(400);
    expect(r.text).to.include('image.path').and.include('compress');
    expect((await req(daemon.url, 'GET', '/jobs/no-such-job/record')).status).to.equal(404);
    await page.goto(D + '#/submit');
    await page.fill('input[name=image_path]', 'relative.vmdk');
    await page.fill('input[name=output_dir]', '/tmp');
    await page.click('#convert-form button[type=submit]');
    await page.waitForSelector('#submit-msg.err');
    expect(await page.textContent('#submit-msg')).to.include('image.path');
  });

  it('with auth on, asks for the key once, refuses a wrong one, then works (HTTP and /ws)', async function () {
    this.timeout(40000);
    const cfg = path.join(dir, 'auth.yaml');
    writeFileSync(cfg, `auth:\n  enabled: true\n  api_keys: ["${API_KEY}"]\nwebsocket:\n  status_interval_seconds: 1\n`);
    const d2 = await startDaemonProc({ ...env, FERRY_CONFIG: cfg }, cfg);
    procs.push(d2);
    expect((await req(d2.url, 'GET', '/jobs')).status).to.equal(401);
    const p2 = await ctx.newPage();
    try {
      await p2.goto(`${d2.url}/web/dashboard/`);
      await p2.waitForSelector('#auth:not([hidden])');
      await p2.fill('#auth-key', 'wrong-key');
      await p2.click('#auth-form button');
      await p2.waitForSelector('#auth:not([hidden]) #auth-msg.err');
      await p2.fill('#auth-key', API_KEY);
      await p2.click('#auth-form button');
      await p2.waitForSelector('table.jobs tbody tr[data-id]');
      await p2.waitForSelector('#live.live:not(.off)', { timeout: 10000 });
      expect(await p2.isHidden('#auth')).to.equal(true);
      // Navigating keeps the key (asked once per tab).
      await p2.click('nav a[href="#/workers"]');
      await p2.waitForSelector('table.workers tr[data-id="img-worker"]');
      expect(await p2.evaluate('sessionStorage.getItem("ferry.apiKey")')).to.equal(API_KEY);
    } finally { await p2.close(); }
  });

  it('stays quick with 10,000 jobs: the first page renders in a few seconds and every payload is bounded', async function () {
    this.timeout(60000);
    await rc.config('SET', 'appendfsync', 'no');
    const store = new JobStore(rc, 'ferry');
    const queue = queueName({ capabilities: [] });
    const t0 = Date.now();
    const N = 10000;
    for (let b = 0; b < N; b += 1000) {
      await Promise.all(Array.from({ length: 1000 }, (_, i) => {
        const id = `bulk-${String(b + i).padStart(5, '0')}`;
        const spec = { job_id: id, operation: 'noop', parameters: {}, execution_policy: { timeout_seconds: 60, retry_count: 0, priority: 50, idempotent: true } };
        return store.create(id, { spec: JSON.stringify(spec), operation: 'noop', queue, priority: 50, attempts: 0, max_attempts: 1, meta: '{}' }, [{ to: 'VALIDATED', reason: 'bulk insert for the dashboard test' }]);
      }));
    }
    const insertMs = Date.now() - t0;
    expect((await req<DaemonJobList>(daemon.url, 'GET', '/jobs?limit=1')).body.total).to.be.at.least(N);

    const sizes: Record<string, number> = {};
    const wsFrames: number[] = [];
    const p3 = await ctx.newPage();
    p3.on('response', async (r) => { if (/\/jobs\?/.test(r.url())) sizes[r.url()] = (await r.body().catch(() => Buffer.alloc(0))).length; });
    p3.on('websocket', (ws) => ws.on('framereceived', (f) => wsFrames.push(typeof f.payload === 'string' ? Buffer.byteLength(f.payload) : f.payload.length)));
    try {
      const t1 = Date.now();
      await p3.goto(D + '#/jobs');
      // Locators, not waitForFunction: the page's CSP (script-src 'self', no eval) refuses a string predicate.
      await p3.locator('table.jobs tbody tr[data-id]').nth(49).waitFor();
      expect(await p3.locator('table.jobs tbody tr[data-id]').count()).to.equal(50);
      await p3.waitForSelector('.pager .range');
      const renderMs = Date.now() - t1;
      expect(await p3.textContent('.pager .range')).to.match(/^1–50 of 10\d{3}$/);
      // Paging asks the server for the next page (offset), never for everything.
      await p3.click('.pager button.next');
      await p3.locator('.pager .range', { hasText: /^51–100/ }).waitFor();
      const t2 = Date.now();
      await p3.goto(D + '#/jobs?status=pending&offset=5000');
      await p3.locator('.pager .range', { hasText: /^5001–5050/ }).waitFor();
      const deepMs = Date.now() - t2;
      await p3.screenshot({ path: path.join(ARTIFACTS, 'dashboard-10k.png'), fullPage: false });
      const biggestJobs = Math.max(...Object.values(sizes));
      const biggestWs = Math.max(...wsFrames);
      console.log(`      10,000 jobs inserted in ${insertMs} ms; first page rendered in ${renderMs} ms, page at offset 5000 in ${deepMs} ms; largest /jobs response ${biggestJobs} B, largest /ws frame ${biggestWs} B`);
      expect(renderMs).to.be.below(5000);
      expect(deepMs).to.be.below(3000);
      expect(Object.keys(sizes).every((u) => /limit=50\b/.test(u))).to.equal(true);
      expect(biggestJobs).to.be.below(100_000);
      expect(biggestWs).to.be.below(200_000); // the /ws `jobs` message carries the newest 100 only
    } finally { await p3.close(); }
  });
});
