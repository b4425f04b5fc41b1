// Issue 37: a warm plan cut over as a whole, as an operator does it: POST /plans/{id}/cutover with no vm_path (every
// warm VM of the plan waiting for its cutover), and the dashboard's "Cut over all" button in headless Chromium. Two
// plans of two running VMs each wait after round 1 (one hour between rounds). A read key is refused everywhere
// (403 on the route and under /api/v1, `ferry plan cutover` fails naming 403, the page offers no button) and
// nothing is recorded; a pending plan and a plan whose VMs all began their cutover answer 409 naming why. Asked by
// a submit key, each job of that plan (and none of the other) records the request by the key's name, powers its VM
// off, copies the last delta, leaves no snapshot (inventory and datastore folder), and boots on the target (virsh).
import { expect } from 'chai';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import type { BrowserContext } from 'playwright-core';
import { launchChromium } from '../helpers/browser';
import { req, until } from '../helpers/http';
import { ferryCli } from '../helpers/procs';
import { TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { tinyFlatGuest } from './flat-guest';
import { createPlanVm, type PlanStack, startPlanStack } from '../plans/fixture';
import { powerOn, upload } from './fixture';
import { vmDetail } from '../../domain/vsphere/inventory';
import type { PlanView } from '../helpers/api-types';
import type { WarmState } from '../../domain/warm-predict';

const K = { ops: 'wpc-ops-submit-key-0123456789', viewer: 'wpc-viewer-read-key-01234567' };
const BYTES = 32 * 1024 * 1024;
const PLANS = { rest: ['wpc-ca', 'wpc-cb'], dash: ['wpc-da', 'wpc-db'] } as const;
const ALL = [...PLANS.rest, ...PLANS.dash];
type Vm = PlanView['vms'][number] & { warm?: WarmState & { cutover_requested?: { at: string; by: string | null } } };
interface Rec { status: string; error?: string; result?: { warm: WarmState; boot: { status: string } } }

describe('warm migration: a whole plan cut over by POST /plans/{id}/cutover and the dashboard\'s "Cut over all" (issue 37) @vm', function () {
  this.timeout(1_800_000);
  let s: PlanStack;
  let browser: BrowserContext;
  const as = (key: string) => ({ 'x-api-key': key });
  const api = <T = unknown>(method: string, p: string, key: string, body?: unknown) => req<T>(s.url, method, p, body, as(key));
  const plan = async (id: string) => (await api<PlanView>('GET', `/plans/${id}`, K.viewer)).body;
  const vmOf = async (id: string, name: string) => (await plan(id)).vms.find((v) => v.vm_path === s.vm(name)) as Vm;
  const asked = async (jobId: string) => JSON.parse((await s.rc.hget(`wpc:job:${jobId}`, 'warm_cutover')) ?? 'null') as { at: string; by: string | null } | null;
  const record = async (jobId: string) => (await api<Rec>('GET', `/jobs/${jobId}/record`, K.viewer)).body;
  const snapshotFiles = (name: string) => readdirSync(path.join(s.v.datastores.LocalDS_0, name)).filter((f) => /snapshot|\.vmsn$|-0000\d+/i.test(f));
  /** Every VM of the plan after round 1, waiting (status copying) for the next round an hour away. */
  const waiting = (id: keyof typeof PLANS) => until(async () => {
    const vms = await Promise.all(PLANS[id].map((n) => vmOf(id, n)));
    return vms.every((v) => v.warm?.status === 'copying' && v.warm.rounds.length === 1 && !!v.job_id) && vms;
  }, 600_000, `plan ${id}: round 1 of each VM`);

  before(async function () {
    this.timeout(300_000);
    s = await startPlanStack({ prefix: 'wpc', workers: { wpc: 4 }, env: { FERRY_API_KEYS: `ops:submit:${K.ops},viewer:read:${K.viewer}` } });
    const flat = await tinyFlatGuest(s.dir, BYTES);
    for (const [i, name] of ALL.entries()) {
      await createPlanVm(s.m, { name, mac: `00:50:56:37:02:0${i + 1}`, disks: [{ ds: 'LocalDS_0', file: `${name}/boot.vmdk`, bytes: BYTES }] });
      await upload(s.v, flat.desc, `${name}/boot.vmdk`);
      await upload(s.v, flat.extent, `${name}/boot-flat.vmdk`);
      await powerOn(s.m, s.vm(name));
    }
    browser = await launchChromium(path.join(s.dir, 'chromium-profile'));
  });
  after(async () => {
    await browser?.close().catch((e: Error) => console.warn(`      chromium close: ${e.message}`));
    // The domains these plans made (the stack removes only those of its addVm) go from the run's shared libvirtd.
    for (const n of s ? (await s.domains()).filter((x) => (ALL as readonly string[]).includes(x)) : []) {
      if ((await s.lv.virsh(['domstate', n])).trim() !== 'shut off') await s.lv.virsh(['destroy', n]);
      await s.lv.virsh(['undefine', n, '--nvram', '--remove-all-storage']);
    }
    await s?.stop();
  });

  it('both plans created: a pending plan has nothing to cut over (409 naming its state); started, every VM waits after round 1', async () => {
    for (const id of Object.keys(PLANS) as (keyof typeof PLANS)[]) {
      const body = {
        ...s.plan(id, [...PLANS[id]]), limits: { per_esxi_host: 4, per_datastore: 4 },
        options: { power_off: 'force', guest_preflight: false, warm: { precopy_interval: 3600 }, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 } },
      };
      const c = await api('POST', '/plans', K.ops, body);
      expect(c.status, c.text).to.equal(201);
    }
    const early = await api<{ error: string }>('POST', '/plans/rest/cutover', K.ops);
    expect(early.status, early.text).to.equal(409);
    expect(early.body.error).to.match(/plan rest is pending: only a running plan's VMs cut over/);
    for (const id of Object.keys(PLANS)) expect((await api('POST', `/plans/${id}/start`, K.ops)).status).to.equal(200);
    for (const v of [...await waiting('rest'), ...await waiting('dash')]) {
      const d = await vmDetail(s.m, v.vm_path);
      expect(d.power_state, `${v.vm_path} runs while it is copied`).to.equal('poweredOn');
      expect(d.snapshots.length, `${v.vm_path}: round 1's snapshot, kept until the next round`).to.equal(1);
    }
  });

  it('a read key cannot cut over: 403 on the route (with and without vm_path, under /api/v1), ferry plan cutover fails, no button; nothing recorded', async () => {
    for (const [p, body] of [['/plans/rest/cutover', undefined], ['/api/v1/plans/rest/cutover', undefined], ['/plans/rest/cutover', { vm_path: s.vm('wpc-ca') }]] as const) {
      const r = await api('POST', p, K.viewer, body);
      expect(r.status, `${p} ${JSON.stringify(body)}: ${r.text}`).to.equal(403);
      expect(r.text).to.match(/has role read; this needs role submit/);
    }
    expect((await req(s.url, 'POST', '/plans/rest/cutover')).status, 'no key at all').to.equal(401);
    const cli = await ferryCli(['plan', 'cutover', 'rest'], { FERRY_URL: s.url, FERRY_API_KEY: K.viewer });
    expect(cli.code, cli.stdout).to.not.equal(0);
    expect(cli.stderr).to.match(/POST \/plans\/rest\/cutover: 403/);

    const page = await browser.newPage();
    await page.goto(`${s.url}/web/dashboard/#/plan/dash`);
    await page.waitForSelector('#auth:not([hidden])');
    await page.fill('#auth-key', K.viewer);
    await page.click('#auth-form button[type=submit]');
    await page.waitForSelector(`tr[data-vm="${s.vm('wpc-da')}"] .warm-rounds:text("1 rounds")`);
    expect(await page.locator('#plan-cutover').count(), 'no "Cut over all" for a read key').to.equal(0);
    expect(await page.locator('button.vm-cutover').count(), 'no "Cut over" for a read key').to.equal(0);
    await page.close();

    for (const id of Object.keys(PLANS) as (keyof typeof PLANS)[]) {
      for (const v of await waiting(id)) {
        expect(await asked(v.job_id!), `${v.vm_path}: no request on its job`).to.equal(null);
        expect((await vmDetail(s.m, v.vm_path)).power_state).to.equal('poweredOn');
      }
    }
  });

  it('POST /plans/{id}/cutover without vm_path cuts over every waiting VM of that plan only; asked again, 409 naming why', async () => {
    const r = await api<PlanView>('POST', '/plans/rest/cutover', K.ops);
    expect(r.status, r.text).to.equal(200);
    for (const name of PLANS.rest) {
      const v = r.body.vms.find((x) => x.vm_path === s.vm(name)) as Vm;
      expect(v.warm?.cutover_requested?.by, `${name}: the answer shows the request`).to.equal('ops');
      expect((await asked(v.job_id!))?.by, `${name}: recorded on the job in Redis`).to.equal('ops');
    }
    // The other plan is not touched.
    for (const v of await waiting('dash')) expect(await asked(v.job_id!), `${v.vm_path} (the other plan)`).to.equal(null);

    await until(async () => (await Promise.all(PLANS.rest.map((n) => vmOf('rest', n)))).every((v) => v.warm?.status !== 'copying'), 120_000, 'both jobs acting on the cutover');
    const again = await api<{ error: string }>('POST', '/plans/rest/cutover', K.ops);
    expect(again.status, again.text).to.equal(409);
    expect(again.body.error).to.match(/plan rest has no warm VM waiting for cutover: /);
    for (const name of PLANS.rest) expect(again.body.error).to.match(new RegExp(`${s.vm(name)}: job \\S+ is already (cutting over|completed) \\(cutover requested by ops`));
  });

  it('"Cut over all" on the dashboard asks every waiting VM of its plan (no vm_path sent) by the page\'s key, and the button goes', async () => {
    const page = await browser.newPage();
    page.on('pageerror', (e) => { throw new Error(`page error: ${e.message}`); });
    await page.goto(`${s.url}/web/dashboard/#/plan/dash`);
    await page.waitForSelector('#auth:not([hidden])');
    await page.fill('#auth-key', K.ops);
    await page.click('#auth-form button[type=submit]');
    await page.waitForSelector('#plan-cutover');
    expect(await page.locator('button.vm-cutover').count(), 'and "Cut over" on each VM').to.equal(2);
    const sent = page.waitForRequest((q) => q.method() === 'POST' && new URL(q.url()).pathname === '/plans/dash/cutover');
    await page.click('#plan-cutover');
    expect((await sent).postData() ?? '', 'the whole plan: no vm_path').to.not.match(/vm_path/);
    await page.waitForSelector('#plan-msg:text("cutover requested for every warm VM")');
    expect(await page.locator('#plan-cutover').count(), 'no second "Cut over all" once every VM is asked').to.equal(0);
    await page.close();
    for (const name of PLANS.dash) {
      const v = await vmOf('dash', name);
      expect((await asked(v.job_id!))?.by, `${name}: recorded on the job by the page's key`).to.equal('ops');
    }
  });

  it('each job of both plans powered its VM off, copied the last delta, left no snapshot and boots on the target', async () => {
    for (const id of Object.keys(PLANS) as (keyof typeof PLANS)[]) {
      const p = await until(async () => { const x = await plan(id); return ['completed', 'failed', 'cancelled'].includes(x.status) && x; }, 1_200_000, `plan ${id} to end`);
      expect(p.status, JSON.stringify(p.vms.map((v) => [v.vm_path, v.status, v.error]))).to.equal('completed');
      for (const name of PLANS[id]) {
        const v = p.vms.find((x) => x.vm_path === s.vm(name)) as Vm;
        const rec = await record(v.job_id!);
        expect(rec.status, `${name}: ${rec.error}`).to.equal('completed');
        const w = rec.result!.warm;
        expect(w.cutover!.reason, `${name}: cut over by the request`).to.equal(`cutover requested by ops at ${(await asked(v.job_id!))!.at}`);
        expect(w.rounds.length, `${name}: round 1, then the last delta after the power-off`).to.equal(2);
        expect(w.cutover!.powered_off_at).to.be.a('string');
        expect(rec.result!.boot.status).to.equal('passed');
        expect(v.warm?.downtime?.seconds, `${name}: the plan view shows the measured downtime`).to.be.above(0);
        const d = await vmDetail(s.m, s.vm(name));
        expect(d.power_state, `${name}: powered off at cutover`).to.equal('poweredOff');
        expect(d.snapshots, `${name}: no snapshot left`).to.deep.equal([]);
        expect(snapshotFiles(name), `${name}: no frozen file left`).to.deep.equal([]);
        expect(JSON.parse((await s.rc.hget(`wpc:job:${v.job_id}`, 'warm_snapshots')) ?? '[]'), `${name}: no snapshot in the job's record`).to.deep.equal([]);
        expect((await s.lv.virsh(['domstate', name])).trim(), `${name} on the target`).to.equal('running');
      }
    }
  });
});
