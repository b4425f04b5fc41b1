// The dashboard's VMs page and migration page in headless Chromium, against the plan tests' stack (the simulator,
// the tests' libvirtd and a second libvirtd as another destination host, a real Redis, the daemon and a worker as
// processes; test/plans/fixture.ts) with auth on: an admin key drives the wizard (filter and select VMs, both
// hosts chosen, maps pre-filled by name and picked from dropdowns, a blocker for the VM on an unmapped network, a
// warning overridden), starts the plan, cancels it and retries it from the page, watches every VM that can run
// reach completed live over /ws (each on the host the plan placed it on, checked with virsh), and rolls one VM
// back (its domain and volume gone); a read key sees the same pages with every action disabled and the API
// answers it 403. Screenshots at 1280 px and 390 px go to test/artifacts/.
//
// The VMs' disks are the tiny real guest (test/fixtures/tiny-guest.ts): each job exports, repairs (one appliance
// launch under TCG), imports and sees the guest's boot marker on the console, a minute or two per VM here.
import { expect } from 'chai';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { BrowserContext, Page } from 'playwright-core';
import { ARTIFACTS, launchChromium } from '../helpers/browser';
import { req, until } from '../helpers/http';
import { startOwnLibvirt, virshNames as names, type TestLibvirt } from '../helpers/libvirt';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { createPlanVm, snapshot, startPlanStack, type PlanStack } from '../plans/fixture';
import { powerOn, upload } from '../vsphere/fixture';
import { execFileSync } from 'node:child_process';
import type { WarmState } from '../../domain/warm-predict';
import type { DaemonJob, PlanList, PlanView } from '../helpers/api-types';

/** What the test reads of a DOM element in the page (tsconfig has no DOM lib). */
interface PageElement { getAttribute(name: string): string | null }

const ADMIN = 'wizard-admin-key-0123456789';
const READER = 'wizard-read-key-0123456789';
const NET = 'DC0_DVPG0'; // the target network has the source port group's name: the network map is pre-filled by name
const FINAL = ['completed', 'failed', 'cancelled'];
const RUNNABLE = ['wz-app', 'wz-web'];

describe('dashboard: VMs page and migration wizard (headless Chromium, simulator and libvirtd) @vm', function () {
  this.timeout(900_000);
  let s: PlanStack;
  let lv2: TestLibvirt;
  let stopLv2: (() => Promise<void>) | undefined;
  let ctx: BrowserContext;
  let page: Page;
  let D: string;
  let planId: string;
  const vm = (n: string) => `/DC0/vm/${n}`;
  const shot = async (p: Page, name: string) => p.screenshot({ path: path.join(ARTIFACTS, `wizard-${name}.png`), fullPage: true });
  const api = <T = unknown>(method: string, p: string, key = ADMIN, body?: unknown) => req<T>(s.url, method, p, body, { 'X-API-Key': key });
  const hostOf = (uri: string) => (uri === s.lv.uri ? s.lv : lv2);

  before(async function () {
    this.timeout(600_000);
    mkdirSync(ARTIFACTS, { recursive: true });
    const [disk, own] = await Promise.all([ensureTinyGuest(), startOwnLibvirt()]);
    lv2 = own.lv; stopLv2 = own.stop;
    // The second host has the same network and pool names: the maps hold on both.
    writeFileSync(path.join(lv2.dir, 'net.xml'), `<network><name>${NET}</name><bridge name="virbrwz1"/></network>`);
    await lv2.virsh(['net-define', path.join(lv2.dir, 'net.xml')]);
    await lv2.virsh(['net-start', NET]);
    s = await startPlanStack({
      prefix: 'wizard', net: NET, workers: { w1: 2 }, config: 'websocket:\n  status_interval_seconds: 1\n',
      env: { FERRY_API_KEYS: `admin:admin:${ADMIN},viewer:read:${READER}`, FERRY_LIBVIRT_URIS: lv2.uri },
    });
    const tiny = { path: disk, bytes: TINY_GUEST_BYTES };
    // The four VMs go onto the simulator side by side (each a folder of its own), while Chromium starts.
    await Promise.all([
      launchChromium(path.join(s.dir, 'chromium-profile'), { width: 1280, height: 900 }).then((b) => { ctx = b; }),
      s.addVm({ name: 'wz-web', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:04:00:01', network: NET }, tiny),
      s.addVm({ name: 'wz-app', host: 'DC0_C0_H0', ds: 'LocalDS_0', mac: '00:50:56:04:00:02', network: NET }, tiny),
      // On "VM Network", which the target has no network of: left unmapped, a blocker.
      s.addVm({ name: 'wz-dmz', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:04:00:03' }, tiny)
        .then(() => snapshot(s.m, vm('wz-dmz'), 'before-upgrade')), // a warning (snapshot) to override
      s.addVm({ name: 'other', host: 'DC0_H0', ds: 'LocalDS_1', mac: '00:50:56:04:00:04' }, tiny),
    ]);
    D = `${s.url}/web/dashboard/`;
    page = await ctx.newPage();
    page.on('pageerror', (e) => { throw new Error(`page error: ${e.message}`); });
  });
  after(async () => {
    await ctx?.close().catch((e: Error) => console.warn(`      chromium close: ${e.message}`));
    await s?.stop();
    await stopLv2?.();
  });

  async function login(p: Page, key: string, hash: string) {
    await p.goto(D + hash);
    await p.waitForSelector('#auth:not([hidden])');
    await p.fill('#auth-key', key);
    await p.click('#auth-form button[type=submit]');
    await p.waitForSelector('#live:text("live")');
  }

  it('VMs page: columns from /vms/list, the folder tree, the filter, a VM\'s detail from /vms/info', async () => {
    await login(page, ADMIN, '#/vms');
    await page.waitForSelector('table.vms tbody tr[data-path]');
    expect(await page.locator('table.vms tbody tr[data-path]').count()).to.equal(4);
    expect(await page.textContent('#folder-tree')).to.include('vm (4)');
    await page.selectOption('#filter-network', NET);
    expect((await page.locator('table.vms tbody tr[data-path]').evaluateAll((rows: PageElement[]) => rows.map((r) => r.getAttribute('data-path')))).sort()).to.deep.equal([vm('wz-app'), vm('wz-web')]);
    await page.selectOption('#filter-network', '');
    await page.selectOption('#filter-datastore', 'LocalDS_1');
    expect(await page.locator('table.vms tbody tr[data-path]').count()).to.equal(1);
    await page.selectOption('#filter-datastore', '');
    await page.fill('#filter-name', 'wz-');
    expect(await page.textContent('#vm-summary')).to.include('3 of 4 VMs shown');
    await shot(page, 'vms-1280');
    await page.click('tr[data-path="/DC0/vm/wz-dmz"] a.open');
    await page.waitForSelector('#vm-name');
    expect(await page.textContent('#vm-firmware')).to.equal('bios');
    expect(await page.textContent('table.disks')).to.include('[LocalDS_0] wz-dmz/wz-dmz.vmdk');
    expect(await page.textContent('table.nics')).to.include('00:50:56:04:00:03').and.include('VM Network');
    expect(await page.textContent('main')).to.include('before-upgrade');
  });

  it('migration page: select by filter, two hosts, maps pre-filled by name and picked, a blocker for the unmapped network, a warning overridden', async () => {
    await page.goto(D + '#/migrate');
    await page.waitForSelector('#targets input[type=checkbox]:checked');
    await page.fill('#filter-name', 'wz-');
    await page.check('#select-shown');
    expect(await page.textContent('#vm-summary')).to.include('3 selected');
    await page.check(`#targets input[value="${lv2.uri}"]`);
    // Pre-filled by name: the target has a network named as the source's; the datastore is picked from the pools.
    expect(await page.inputValue(`table.map.net tr[data-source="${NET}"] select`)).to.equal(NET);
    expect(await page.inputValue('table.map.net tr[data-source="VM Network"] select')).to.equal('');
    await page.selectOption('table.map.ds tr[data-source="LocalDS_0"] select', s.lv.pool);
    await page.fill('#plan-options input[name=name]', 'wizard wave');
    await page.selectOption('#plan-options select[name=power_off]', 'none');
    await page.fill('#plan-options input[name=boot_expect]', TINY_GUEST_MARKER);
    await page.fill('#plan-options input[name=boot_timeout]', '300');
    await page.click('#validate-plan');
    await page.waitForSelector('#findings tr[data-vm]');
    // Blockers first: the VM on the unmapped port group leads, its blocker names the fix and cannot be overridden.
    const first = page.locator('#findings tr[data-vm]').first();
    expect(await first.getAttribute('data-vm')).to.equal(vm('wz-dmz'));
    const blocker = first.locator('li.finding[data-rule="network_unmapped"]');
    expect(await blocker.textContent()).to.include('blocker').and.include('Fix:').and.include('cannot be overridden');
    const warn = first.locator('li.finding[data-rule="snapshot"]');
    expect(await warn.textContent()).to.include('warning');
    await warn.locator('input.reason').fill('the snapshot is not needed on KVM');
    await warn.locator('button.override-btn').click();
    await page.waitForSelector('tr[data-vm="/DC0/vm/wz-dmz"] li.finding.overridden[data-rule="snapshot"]');
    expect(await page.textContent('tr[data-vm="/DC0/vm/wz-dmz"] li.finding[data-rule="snapshot"]')).to.include('accepted by admin: the snapshot is not needed on KVM');
    // The warning is accepted; the blocker still holds the VM.
    expect(await page.textContent('#wizard-msg')).to.include('1 of 3 VMs have blockers');
    // What the page made is the plan in Redis, as the API shows it.
    const { plans } = (await api<PlanList>('GET', '/plans')).body;
    expect(plans).to.have.length(1);
    planId = plans[0].id;
    expect(plans[0]).to.deep.include({ network_map: { [NET]: NET }, storage_map: { LocalDS_0: s.lv.pool } });
    // One plan onto both hosts, each VM's host shown beside it as preflight placed it.
    expect(plans[0].destination).to.deep.include({ virt_uris: [s.lv.uri, lv2.uri], placement: 'round_robin' });
    expect(plans[0].vms.map((x) => x.vm_path).sort()).to.deep.equal([vm('wz-app'), vm('wz-dmz'), vm('wz-web')]);
    for (const x of plans[0].vms) {
      expect([s.lv.uri, lv2.uri], x.vm_path).to.include(x.placement!.virt_uri);
      expect(await page.textContent(`tr[data-vm="${x.vm_path}"] small.host`)).to.include(x.placement!.virt_uri);
    }
    expect(new Set(plans[0].vms.map((x) => x.placement!.virt_uri)).size, 'round robin used both hosts').to.equal(2);
    expect(plans[0].vms.find((x) => x.vm_path === vm('wz-dmz'))!.overrides.snapshot).to.include({ by: 'admin', reason: 'the snapshot is not needed on KVM' });
    expect(plans[0].options.virt_test).to.deep.equal({ expect: TINY_GUEST_MARKER, timeout_seconds: 300 });
    await shot(page, 'findings-1280');
    await page.setViewportSize({ width: 390, height: 844 });
    await shot(page, 'findings-390');
    expect(await page.evaluate<number>('document.documentElement.scrollWidth'), 'no sideways scrolling of the page').to.be.at.most(390 + 1);
    await page.setViewportSize({ width: 1280, height: 900 });
  });

  it('start, then cancel from the page: the plan and its jobs are cancelled; retry from the page: the VMs run again as new jobs', async () => {
    await page.click('#start-plan');
    await page.waitForURL(/#\/plan\//);
    await page.waitForSelector('#plan-status .badge:text("running")');
    await page.click('#plan-cancel');
    await until(async () => (await page.textContent('#plan-status .badge')) === 'cancelled', 180_000, 'the plan cancelled on the page');
    const cancelled = (await api<PlanView>('GET', `/plans/${planId}`)).body;
    for (const n of RUNNABLE) {
      const v = cancelled.vms.find((x) => x.vm_path === vm(n))!;
      expect(v.status, `${n}: ${v.error}`).to.equal('cancelled');
      for (const j of v.jobs) expect((await api<DaemonJob>('GET', `/jobs/${j}`)).body.status, `${n}'s job ${j}`).to.be.oneOf(['cancelled', 'failed']);
      expect(await page.locator(`tr[data-vm="${vm(n)}"]`).getAttribute('data-status')).to.equal('cancelled');
    }
    // Nothing half-made on the targets.
    for (const l of [s.lv, lv2]) expect((await names(l, ['list', '--all', '--name'])).filter((x) => x.startsWith('wz-')), l.uri).to.deep.equal([]);
    const jobsBefore = Object.fromEntries(cancelled.vms.map((x): [string, number] => [x.vm_path, x.jobs.length]));
    await page.click('#plan-retry');
    await until(async () => (await page.textContent('#plan-status .badge')) === 'running', 30_000, 'the plan running again');
    await until(async () => {
      const p = (await api<PlanView>('GET', `/plans/${planId}`)).body;
      return RUNNABLE.every((n) => p.vms.find((x) => x.vm_path === vm(n))!.jobs.length === jobsBefore[vm(n)] + 1);
    }, 120_000, 'each VM to have a new job');
  });

  it('watch live: every VM that can run reaches completed on the page as in the API, on the host it was placed on; the blocked one never ran', async () => {
    // The page is not reloaded: its rows change with the plan_update messages of /ws.
    const seen = new Set<string>();
    await until(async () => {
      for (const r of RUNNABLE) seen.add(`${r}:${await page.locator(`tr[data-vm="${vm(r)}"]`).getAttribute('data-status')}`);
      return FINAL.includes((await page.textContent('#plan-status .badge')) ?? '');
    }, 720_000, 'the plan to end on the page');
    expect([...seen].some((x) => x.endsWith(':running')), [...seen].join(' ')).to.equal(true);
    const p = (await api<PlanView>('GET', `/plans/${planId}`)).body;
    expect(p.status, 'a plan with a blocked VM ends failed').to.equal('failed');
    const row = (n: string) => page.locator(`tr[data-vm="${vm(n)}"]`);
    expect(await row('wz-dmz').getAttribute('data-status')).to.equal('blocked');
    expect(p.vms.find((x) => x.vm_path === vm('wz-dmz'))!.jobs).to.deep.equal([]);
    for (const n of RUNNABLE) {
      const v = p.vms.find((x) => x.vm_path === vm(n))!;
      expect(v.status, v.error as string).to.equal('completed'); // null when none: chai takes it as no message
      expect(await row(n).getAttribute('data-status')).to.equal('completed');
      const l = hostOf(v.placement!.virt_uri);
      expect((await l.virsh(['domstate', n])).trim(), `${n} on ${l.uri}`).to.equal('running');
    }
    await shot(page, 'plan-1280');
    await page.setViewportSize({ width: 390, height: 844 });
    await shot(page, 'plan-390');
    expect(await page.evaluate<number>('document.documentElement.scrollWidth'), 'no sideways scrolling of the plan page').to.be.at.most(390 + 1);
    await page.setViewportSize({ width: 1280, height: 900 });
  });

  it('roll one VM back from the page: its status says so, and virsh on its host shows no domain or volume of its name', async () => {
    const placed = (await api<PlanView>('GET', `/plans/${planId}`)).body.vms.find((x) => x.vm_path === vm('wz-web'))!.placement!;
    await page.click(`tr[data-vm="${vm('wz-web')}"] button.rollback`);
    await page.waitForSelector(`tr[data-vm="${vm('wz-web')}"][data-status="rolled_back"]`, { timeout: 120_000 });
    const v = (await api<PlanView>('GET', `/plans/${planId}`)).body.vms.find((x) => x.vm_path === vm('wz-web'))!;
    expect(v.status).to.equal('rolled_back');
    expect(v.rollback!.detail).to.be.a('string');
    const l = hostOf(placed.virt_uri);
    expect(await names(l, ['list', '--all', '--name'])).to.not.include('wz-web');
    await l.virsh(['pool-refresh', l.pool]);
    expect((await names(l, ['vol-list', l.pool])).filter((x) => x.startsWith('wz-web'))).to.deep.equal([]);
    // The other VM is untouched.
    const other = (await api<PlanView>('GET', `/plans/${planId}`)).body.vms.find((x) => x.vm_path === vm('wz-app'))!;
    expect(other.status).to.equal('completed');
  });

  it('a warm plan\'s page: each VM\'s rounds, last change and predicted downtime as GET /plans/{id} says; Cut over for a submit key only, which asks the job', async () => {
    // A running VM on a monolithicFlat disk (the simulator tracks changed blocks of flat disks), one hour between rounds.
    const raw = path.join(s.dir, 'hot.raw');
    execFileSync('qemu-img', ['convert', '-f', 'vmdk', '-O', 'raw', await ensureTinyGuest(), raw]);
    mkdirSync(path.join(s.dir, 'hot'), { recursive: true });
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=monolithicFlat', raw, path.join(s.dir, 'hot', 'boot.vmdk')]);
    await createPlanVm(s.m, { name: 'wz-hot', mac: '00:50:56:04:00:09', network: NET, disks: [{ ds: 'LocalDS_0', file: 'wz-hot/boot.vmdk', bytes: TINY_GUEST_BYTES }] });
    await upload(s.v, path.join(s.dir, 'hot', 'boot.vmdk'), 'wz-hot/boot.vmdk');
    await upload(s.v, path.join(s.dir, 'hot', 'boot-flat.vmdk'), 'wz-hot/boot-flat.vmdk');
    await powerOn(s.m, vm('wz-hot'));
    const body = { ...s.plan('wz-warm', ['wz-hot']), network_map: { [NET]: NET }, options: { power_off: 'force', guest_preflight: false, warm: { precopy_interval: 3600 } } };
    expect((await api('POST', '/plans', ADMIN, body)).status).to.equal(201);
    expect((await api('POST', '/plans/wz-warm/start', ADMIN)).status).to.equal(200);
    type WarmVm = PlanView['vms'][number] & { warm?: WarmState & { cutover_requested?: { by: string } } };
    const view = async () => (await api<PlanView>('GET', '/plans/wz-warm')).body.vms[0] as WarmVm;
    await until(async () => { const w = (await view()).warm; return w?.status === 'copying' && w.rounds.length >= 1 && !!w.prediction; }, 600_000, 'round 1 of wz-hot');

    // What the page must say, from the plan view (the dashboard's own formats: dom.js bytes and duration).
    const fmtBytes = (n: number) => { const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']; let i = 0; while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; } return `${n.toFixed(i ? 1 : 0)} ${u[i]}`; };
    const fmtSeconds = (x: number) => { const t = Math.round(x); return t < 60 ? `${t} s` : t < 3600 ? `${Math.floor(t / 60)} min ${t % 60} s` : `${Math.floor(t / 3600)} h ${Math.floor((t % 3600) / 60)} min`; };
    const row = (p: Page) => p.locator(`tr[data-vm="${vm('wz-hot')}"]`);
    const shows = (p: Page) => until(async () => {
      const w = (await view()).warm!;
      const last = w.rounds[w.rounds.length - 1];
      const got = [await row(p).locator('.warm-rounds').textContent(), await row(p).locator('.warm-changed').textContent(), await row(p).locator('.warm-predicted').textContent()];
      return JSON.stringify(got) === JSON.stringify([`${w.rounds.length} rounds`, `last: ${fmtBytes(last.changed_bytes)} changed`, `predicted downtime ${fmtSeconds(w.prediction!.seconds)}`]);
    }, 30_000, 'the page showing the plan view\'s rounds, last change and prediction');

    // A read key: the figures, no cutover button.
    const p2 = await ctx.newPage();
    await login(p2, READER, '#/plan/wz-warm');
    await shows(p2);
    expect(await p2.locator('#plan-cutover').count(), 'no "Cut over all" for a read key').to.equal(0);
    expect(await row(p2).locator('button.vm-cutover').count(), 'no "Cut over" for a read key').to.equal(0);
    await p2.close();

    const p3 = await ctx.newPage();
    await login(p3, ADMIN, '#/plan/wz-warm');
    await shows(p3);
    expect(await p3.locator('#plan-cutover').count(), '"Cut over all" for an admin key').to.equal(1);
    await row(p3).locator('button.vm-cutover').click();
    await p3.waitForSelector('#plan-msg:text("cutover of wz-hot requested")');
    const asked = await view();
    expect(asked.warm!.cutover_requested?.by, 'the plan view: asked by the admin key').to.equal('admin');
    expect(JSON.parse((await s.rc.hget(`wizard:job:${asked.job_id!}`, 'warm_cutover'))!), 'on the job record in Redis').to.include({ by: 'admin' });
    await until(async () => (await view()).warm!.status !== 'copying', 120_000, 'the job acting on the cutover');
    await p3.close();
    expect((await api('POST', '/plans/wz-warm/cancel', ADMIN)).status).to.equal(200);
    await until(async () => FINAL.includes((await api<PlanView>('GET', '/plans/wz-warm')).body.status), 300_000, 'plan wz-warm to end');
  });

  it('a read key sees the pages, every action is disabled, and the API answers it 403', async () => {
    const p2 = await ctx.newPage();
    // A fresh tab: the key lives in sessionStorage, per tab.
    await login(p2, READER, '#/migrate');
    await p2.waitForSelector('#read-only');
    expect(await p2.isDisabled('#validate-plan')).to.equal(true);
    expect(await p2.isDisabled('#start-plan')).to.equal(true);
    await p2.goto(D + `#/plan/${planId}`);
    await p2.waitForSelector('#plan-status .badge');
    expect(await p2.isDisabled('#plan-retry')).to.equal(true);
    expect(await p2.isDisabled('#plan-cancel')).to.equal(true);
    for (const b of await p2.locator('button.rollback').all()) expect(await b.isDisabled()).to.equal(true);
    for (const [m, u] of [['POST', `/plans/${planId}/retry`], ['POST', '/plans'], ['POST', `/plans/${planId}/vms/wz-web/rollback`]]) {
      expect((await api(m, u, READER, {})).status, u).to.equal(403);
    }
    expect((await api('GET', `/plans/${planId}`, READER)).status).to.equal(200);
    await p2.close();
  });
});
