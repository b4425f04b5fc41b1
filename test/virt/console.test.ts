// The VM console page in headless Chromium: vm-console.html for a guest started on the private libvirtd shows its
// boot text live (xterm.js over the daemon's authenticated WebSocket), `echo hi` typed in the page comes back as
// `hi`; a domain without a serial device is said plainly; a wrong key is refused.
import { expect } from 'chai';
import path from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import WebSocket from 'ws';
import { until } from '../helpers/http';
import { defineGuest, GUEST_MARKER } from '../helpers/libvirt';
import { startVirtStack, VirtStack } from './stack';

const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];
const KEY = 'console-test-key-0123456789';

describe('VM console page (headless Chromium, xterm.js, a real guest) @vm', function () {
  this.timeout(240_000);
  let s: VirtStack;
  let ctx: BrowserContext;
  let page: Page;
  const screen = () => page.evaluate<string>("document.querySelector('.xterm-rows')?.innerText || ''");
  // A locator, not waitForFunction: the page's CSP (script-src 'self', no eval) refuses a string predicate.
  const statusShows = (re: string) => page.locator('#status', { hasText: new RegExp(re) }).waitFor({ timeout: 30000 });

  before(async () => {
    s = await startVirtStack({ FERRY_API_KEYS: KEY }, 'auth:\n  enabled: true\n');
    await defineGuest(s.lv, 'con-1');
    await defineGuest(s.lv, 'con-noserial', { serial: false });
    ctx = await chromium.launchPersistentContext(path.join(s.dir, 'chromium-profile'), { executablePath: '/usr/bin/chromium', headless: true, args: CHROMIUM_ARGS, viewport: { width: 1200, height: 900 } });
    page = await ctx.newPage();
    page.on('pageerror', (e) => { throw new Error(`page error: ${e.message}`); });
    // The dashboard keeps the key in sessionStorage; set it as the dashboard's key form would.
    await page.goto(`${s.daemon.url}/web/dashboard/vm-console.html`);
    await page.evaluate(`sessionStorage.setItem('ferry.apiKey', ${JSON.stringify(KEY)})`);
  });
  after(async () => { await ctx?.close(); await s?.stop(); });

  it('shows the boot text live and runs what is typed: echo hi -> hi', async () => {
    await s.lv.virsh(['start', 'con-1', '--paused']);
    await page.goto(`${s.daemon.url}/web/dashboard/vm-console.html?name=con-1`);
    await statusShows('Connected to con-1');
    expect(await page.locator('#domain option').allTextContents()).to.include.members(['con-1 (paused)', 'con-noserial (shut off)']);
    await s.lv.virsh(['resume', 'con-1']);
    await until(async () => (await screen()).includes(GUEST_MARKER), 150000, 'the boot marker in the page');
    await until(async () => /\/ # \s*$/m.test(await screen()), 30000, 'the shell prompt');
    await page.click('#terminal');
    await page.keyboard.type('echo hi');
    await page.keyboard.press('Enter');
    await until(async () => (await screen()).split('\n').some((l) => l.trim() === 'hi'), 30000, '"hi" on its own line');
    expect(await screen()).to.include('echo hi');
    await page.screenshot({ path: path.join(s.dir, 'console.png') });
  });

  it('says plainly when the domain has no serial device', async () => {
    await s.lv.virsh(['start', 'con-noserial', '--paused']);
    await page.goto(`${s.daemon.url}/web/dashboard/vm-console.html?name=con-noserial`);
    await statusShows('has no serial device');
  });

  it('refuses the console WebSocket without the API key', async () => {
    const url = `${s.daemon.url.replace('http', 'ws')}/virt/console?name=con-1`;
    const code = await new Promise<number>((resolve) => {
      const ws = new WebSocket(url);
      ws.once('unexpected-response', (_r, res) => resolve(res.statusCode || 0));
      ws.once('open', () => resolve(101));
      ws.once('error', () => undefined); // a refused upgrade also emits error; unexpected-response above settles the promise
    });
    expect(code).to.equal(401);
  });
});
