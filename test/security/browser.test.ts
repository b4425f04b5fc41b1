// Browsers kept out unless invited (issue 18 item 4), tried as a hostile web page would, with auth off (the
// default `npm start`): a cross-site WebSocket to /ws, /ws/metrics and the VM console, a DNS-rebound request
// (Host: rebind.evil.example) on both APIs, the metrics port and an upgrade, a form POST (text/plain) that would
// queue a job, and a JSON POST that says it comes from another site. Each is refused and changes nothing; the
// same requests from the service's own origin, from FERRY_ALLOWED_HOSTS names and from non-browser clients pass.
// Every answer of both APIs forbids framing (X-Frame-Options, CSP frame-ancestors) and inline code (a strict CSP):
// a hostile page that frames the dashboard or the console gets nothing, and the pages still work in Chromium.
import { expect } from 'chai';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis, freePort, waitForPort } from '../helpers/redis';
import { Proc, startDaemonProc, startGatewayProc, testEnv } from '../helpers/procs';
import { rawReq, req, until } from '../helpers/http';
import { openWs } from '../helpers/ws';
import { launchChromium } from '../helpers/browser';
import http from 'node:http';
import type { BrowserContext } from 'playwright-core';
import type { JobStatus } from '../helpers/api-types';

const EVIL = 'http://evil.example';

describe('security: browsers kept out unless invited (auth off)', function () {
  this.timeout(120_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-sec-browser-'));
  const procs: Proc[] = [];
  let dm: Proc & { url: string; port: number };
  let gw: Proc & { url: string; port: number };
  let metricsPort: number;

  before(async () => {
    await redis.start();
    metricsPort = await freePort();
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, `metrics:\n  enabled: true\n  port: ${metricsPort}\n`);
    const env = { ...testEnv(redis.url, 'browser'), FERRY_ALLOWED_HOSTS: 'daemon,.ferry.internal' };
    [dm, gw] = await Promise.all([startDaemonProc(env, cfg), startGatewayProc(env)]);
    procs.push(dm, gw);
    await waitForPort(metricsPort);
    expect((await req(gw.url, 'POST', '/jobs', { job_id: 'browser-job', operation: 'noop' })).status).to.equal(201);
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()));
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const ws = (p: Proc & { port: number }, at: string) => `ws://127.0.0.1:${p.port}${at}`;

  it('a WebSocket to /ws from http://evil.example is refused (403) and receives no job list', async () => {
    const c = openWs(ws(dm, '/ws'), { Origin: EVIL });
    const err = await c.opened.then(() => 'opened', (e: Error) => e.message);
    expect(err).to.equal('HTTP 403');
    expect(c.msgs).to.deep.equal([]);
    for (const at of ['/ws/metrics', '/api/v1/ws/metrics', '/api/v1/ws', '/virt/console?name=vm1', '/api/v1/virt/console?name=vm1']) {
      const o = openWs(ws(dm, at), { Origin: EVIL });
      expect(await o.opened.then(() => 'opened', (e: Error) => e.message), at).to.equal('HTTP 403');
    }
    // The same from the service's own origin, and from a client that sends no Origin: the job list arrives.
    for (const headers of [{ Origin: `http://127.0.0.1:${dm.port}` }, {} as Record<string, string>]) {
      const ok = openWs(ws(dm, '/ws'), headers);
      await ok.opened;
      await until(() => ok.msgs.find((m) => m.type === 'jobs'), 10000, 'the job list');
      ok.ws.close();
    }
  });

  it('Host: rebind.evil.example is refused (421) on both APIs, the metrics port and a WebSocket upgrade', async () => {
    for (const [base, p] of [[dm.url, '/jobs'], [dm.url, '/api/v1/status'], [dm.url, '/web/dashboard/'], [gw.url, '/jobs'], [gw.url, '/health'], [`http://127.0.0.1:${metricsPort}`, '/metrics']]) {
      const r = await rawReq(base, 'GET', p, { host: 'rebind.evil.example' });
      expect(r.status, `${base}${p}: ${r.text}`).to.equal(421);
      expect(r.text).to.include('Host').and.not.include('browser-job');
    }
    const up = openWs(ws(dm, '/ws'), { Host: 'rebind.evil.example' });
    expect(await up.opened.then(() => 'opened', (e: Error) => e.message)).to.equal('HTTP 421');
    // Names it answers to: loopback names, IP addresses, FERRY_ALLOWED_HOSTS (exact and a domain).
    for (const host of [`localhost:${dm.port}`, `127.0.0.1:${dm.port}`, `[::1]:${dm.port}`, 'daemon:8080', 'api.ferry.internal', '10.1.2.3:8080']) {
      const r = await rawReq(dm.url, 'GET', '/jobs', { host });
      expect(r.status, `${host}: ${r.text}`).to.equal(200);
    }
  });

  it('a form POST (text/plain, urlencoded, multipart) that would queue a job is refused (415) and the job stays as it was', async () => {
    const state = async () => (await req<JobStatus>(gw.url, 'GET', '/jobs/browser-job')).body.state;
    const before = await state();
    expect(before).to.not.equal('QUEUED');
    for (const type of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x']) {
      const r = await rawReq(gw.url, 'POST', '/jobs/browser-job/queue', { 'content-type': type, origin: 'null' }, 'x=1');
      expect(r.status, `${type}: ${r.text}`).to.be.oneOf([403, 415]);
      const plain = await rawReq(gw.url, 'POST', '/jobs/browser-job/queue', { 'content-type': type }, 'x=1');
      expect(plain.status, `${type} without Origin: ${plain.text}`).to.equal(415);
      expect(plain.text).to.include('Content-Type');
    }
    expect(await state()).to.equal(before);
    // A cross-site JSON POST (Origin, or only Sec-Fetch-Site) is refused too.
    const cross = await rawReq(dm.url, 'POST', '/jobs/cancel', { 'content-type': 'application/json', origin: EVIL }, '{"status":"pending"}');
    expect(cross.status, cross.text).to.equal(403);
    const fetchSite = await rawReq(gw.url, 'POST', '/jobs/browser-job/queue', { 'sec-fetch-site': 'cross-site' });
    expect(fetchSite.status, fetchSite.text).to.equal(403);
    expect(await state()).to.equal(before);
    // The legitimate caller (a script: no Origin, or the dashboard: its own Origin) changes it.
    const ok = await rawReq(gw.url, 'POST', '/jobs/browser-job/queue', { origin: `http://127.0.0.1:${gw.port}`, 'sec-fetch-site': 'same-origin' });
    expect(ok.status, ok.text).to.be.below(300);
    expect(await state()).to.not.equal(before);
  });

  it('every page and answer of both APIs sends X-Frame-Options: DENY and a strict CSP with frame-ancestors \'none\'', async () => {
    const pages: [string, string][] = [[dm.url, '/web/dashboard/'], [dm.url, '/web/dashboard/vm-console.html'], [dm.url, '/api/v1/web/dashboard/app.js'],
      [dm.url, '/swagger-ui/'], [dm.url, '/api/v1/swagger-ui/'], [dm.url, '/openapi.yaml'], [dm.url, '/jobs'], [dm.url, '/no/such/page'],
      [gw.url, '/health'], [gw.url, '/jobs'], [gw.url, '/no/such/page']];
    for (const [base, p] of pages) {
      const r = await rawReq(base, 'GET', p, {});
      expect(r.status, `${base}${p}`).to.be.oneOf([200, 404]);
      expect(r.headers['x-frame-options'], `${base}${p}`).to.equal('DENY');
      const csp = String(r.headers['content-security-policy']);
      expect(csp, `${base}${p}`).to.include("frame-ancestors 'none'").and.include("script-src 'self'").and.include("default-src 'self'");
      expect(csp, `${base}${p}`).to.not.include("'unsafe-eval'");
      expect(csp.split(';').find((d) => d.trim().startsWith('script-src')), `${base}${p}`).to.not.include("'unsafe-inline'");
    }
  });

  describe('in Chromium', () => {
    let ctx: BrowserContext;
    let evil: http.Server;
    let evilUrl: string;
    before(async () => {
      ctx = await launchChromium(path.join(dir, 'chromium-profile'));
      // A hostile site on another origin that frames the console and the dashboard.
      evil = http.createServer((_q, res) => {
        res.writeHead(200, { 'content-type': 'text/html' });
        res.end(`<iframe id="c" src="${dm.url}/web/dashboard/vm-console.html"></iframe><iframe id="d" src="${dm.url}/web/dashboard/"></iframe>`);
      });
      await new Promise<void>((r) => evil.listen(0, '127.0.0.2', () => r()));
      evilUrl = `http://127.0.0.2:${(evil.address() as { port: number }).port}/`;
    });
    after(async () => {
      await ctx?.close();
      await new Promise((r) => evil?.close(r));
    });

    /** Loads `url`; the CSP violations Chromium reported while it loaded and `ready` held. */
    async function load(url: string, ready: string) {
      const page = await ctx.newPage();
      const violations: string[] = [];
      page.on('console', (m) => { if (/Content Security Policy/i.test(m.text())) violations.push(m.text()); });
      const errors: string[] = [];
      page.on('pageerror', (e) => errors.push(e.message));
      await page.goto(url);
      await page.waitForSelector(ready, { timeout: 60000 }); // Swagger UI's bundle takes seconds on a busy machine
      return { page, violations, errors };
    }

    it('the dashboard, Swagger UI and the console page work under the CSP (no violation reported)', async () => {
      const dash = await load(`${dm.url}/web/dashboard/#/jobs`, 'text=browser-job');
      expect(dash.violations).to.deep.equal([]);
      expect(dash.errors).to.deep.equal([]);
      // A progress bar is styled through the CSSOM, which the CSP allows (a style attribute it would refuse).
      const swagger = await load(`${dm.url}/swagger-ui/`, '.swagger-ui .info .title');
      expect(swagger.violations).to.deep.equal([]);
      const con = await load(`${dm.url}/web/dashboard/vm-console.html`, '#terminal .xterm');
      expect(con.violations).to.deep.equal([]);
      // xterm.js's own rules (cell sizes, theme) apply through constructable stylesheets (web/xterm-styles.js).
      const xtermRules = await con.page.evaluate<number>('document.adoptedStyleSheets.flatMap((x) => [...x.cssRules].map((r) => r.cssText)).filter((t) => t.includes("xterm")).length');
      expect(xtermRules).to.be.above(0);
      for (const x of [dash, swagger, con]) await x.page.close();
    });

    it('a hostile page that frames the console and the dashboard gets neither (frame-ancestors \'none\')', async () => {
      const page = await ctx.newPage();
      const refused: string[] = [];
      page.on('console', (m) => { if (/frame-ancestors|X-Frame-Options/i.test(m.text())) refused.push(m.text()); });
      await page.goto(evilUrl);
      await until(() => refused.length >= 2, 10000, 'both frames refused');
      for (const id of ['c', 'd']) {
        const frame = await (await page.$(`#${id}`))!.contentFrame();
        const loaded = await frame!.evaluate<boolean>('document.querySelector("#domain, #main, main") !== null').catch(() => false);
        expect(loaded, id).to.equal(false);
      }
      await page.close();
    });
  });
});
