// Issue 37: a warm plan cut over as a whole, as an operator does it: POST /plans/{id}/cutover with no vm_path (every
// warm VM of the plan waiting for its cutover), and the dashboard's "Cut over all" button in headless Chromium. Two
// plans of two running VMs each wait after round 1 (one hour between rounds). A read key is refused everywhere
// (403 on the route and under /api/v1, `ferry plan cutover` fails naming 403, the page offers no button) and
// nothing is recorded; a pending plan and a plan whose VMs all began their cutover answer 409 naming why. Asked by
// a submit key, each job of that plan (and none of the other) records the request by the key's name, powers its VM
// off, copies the last delta, leaves no snapshot (inventory and datastore folder), and boots on the target (virsh).
// A reused proof (test/helpers/proof-tests.ts): the steps run in order on one stack, and what the test read (the
// answers, the CLI's exit code and output, what the pages showed and sent, Redis, the job records, the plan views,
// the inventory, the datastore folders, virsh) is the evidence, each test its check on it; with every input unchanged
// (the tiny guest's disk and Debian's chromium among them) the same checks re-assert the last passing run's.
import { expect } from 'chai';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import type { BrowserContext } from 'playwright-core';
import { launchChromium } from '../helpers/browser';
import { answer, req, until, type Answer } from '../helpers/http';
import { ferryCli } from '../helpers/procs';
import { fixtureInputs } from '../helpers/proofs';
import { proofTests } from '../helpers/proof-tests';
import { ensureTinyGuest, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { tinyFlatGuest } from './flat-guest';
import { createPlanVm, type PlanStack, startPlanStack } from '../plans/fixture';
import { powerOn, upload } from './fixture';
import { vmDetail } from '../../domain/vsphere/inventory';
import type { PlanView } from '../helpers/api-types';
import type { WarmState } from '../../domain/warm-predict';

const K = { ops: 'wpc-ops-submit-key-0123456789', viewer: 'wpc-viewer-read-key-01234567' };
const BYTES = 32 * 1024 * 1024;
const PLANS = { rest: ['wpc-ca', 'wpc-cb'], dash: ['wpc-da', 'wpc-db'] } as const;
type PlanId = keyof typeof PLANS;
const IDS = Object.keys(PLANS) as PlanId[];
const ALL = [...PLANS.rest, ...PLANS.dash];
type Vm = PlanView['vms'][number] & { warm?: WarmState & { cutover_requested?: { at: string; by: string | null } } };
interface Rec { status: string; error?: string; result?: { warm: WarmState; boot: { status: string } } }
type Asked = { at: string; by: string | null } | null;
/** Who a request names (undefined when there was none to read). */
type By = string | null | undefined;

/** Each VM of a plan at its end: its job's record and request, the source after it, the domain on the target. */
interface VmEnd { record: Rec; asked: Asked; power: string; snapshots: unknown[]; files: string[]; jobSnapshots: unknown; domstate: string }
interface Evidence {
  /** `/DC0/vm/<name>` of each VM. */
  vms: Record<string, string>;
  start: { created: Answer[]; early: Answer & { error?: string }; started: number[]; waiting: { vm_path: string; power: string; snapshots: number }[] };
  read: {
    routes: { p: string; body?: unknown; status: number; text: string }[]; noKey: number; cli: { code: number | null; stdout: string; stderr: string };
    page: { planCutover: number; vmCutover: number }; after: { vm_path: string; asked: Asked; power: string }[];
  };
  rest: { cut: Answer; shown: Record<string, By>; asked: Record<string, By>; other: { vm_path: string; asked: Asked }[]; again: Answer & { error?: string } };
  dash: { vmCutover: number; posted: string; pageErrors: string[]; planCutoverAfter: number; asked: Record<string, By> };
  ends: Record<PlanId, { plan: PlanView; vms: Record<string, VmEnd> }>;
}

const as = (key: string) => ({ 'x-api-key': key });

/** The test's reads of the stack, by the viewer's key unless it says otherwise. */
function client(s: PlanStack, browser: BrowserContext) {
  const api = <T = unknown>(method: string, p: string, key: string, body?: unknown) => req<T>(s.url, method, p, body, as(key));
  const plan = async (id: string) => (await api<PlanView>('GET', `/plans/${id}`, K.viewer)).body;
  const vmOf = async (id: string, name: string) => (await plan(id)).vms.find((v) => v.vm_path === s.vm(name)) as Vm;
  return {
    s, browser, api, plan, vmOf,
    asked: async (jobId: string) => JSON.parse((await s.rc.hget(`wpc:job:${jobId}`, 'warm_cutover')) ?? 'null') as Asked,
    record: async (jobId: string) => (await api<Rec>('GET', `/jobs/${jobId}/record`, K.viewer)).body,
    snapshotFiles: (name: string) => readdirSync(path.join(s.v.datastores.LocalDS_0, name)).filter((f) => /snapshot|\.vmsn$|-0000\d+/i.test(f)),
    /** Every VM of the plan after round 1, waiting (status copying) for the next round an hour away. */
    waiting: (id: PlanId) => until(async () => {
      const vms = await Promise.all(PLANS[id].map((n) => vmOf(id, n)));
      return vms.every((v) => v.warm?.status === 'copying' && v.warm.rounds.length === 1 && !!v.job_id) && vms;
    }, 600_000, `plan ${id}: round 1 of each VM`),
  };
}
type Client = ReturnType<typeof client>;

/** Both plans created (a pending one asked to cut over on the way) and started; every VM waits after round 1. */
async function startBoth(c: Client): Promise<Evidence['start']> {
  const created: Answer[] = [];
  for (const id of IDS) {
    const body = {
      ...c.s.plan(id, [...PLANS[id]]), limits: { per_esxi_host: 4, per_datastore: 4 },
      options: { power_off: 'force', guest_preflight: false, warm: { precopy_interval: 3600 }, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 } },
    };
    created.push(answer(await c.api('POST', '/plans', K.ops, body)));
  }
  const early = await c.api<{ error: string } | undefined>('POST', '/plans/rest/cutover', K.ops);
  const started: number[] = [];
  for (const id of IDS) started.push((await c.api('POST', `/plans/${id}/start`, K.ops)).status);
  // Not created and started, nothing would wait after round 1: the run stops here, saying why (the check says it again).
  const ok = created.every((x) => x.status === 201) && started.every((x) => x === 200);
  if (!ok) throw new Error(`plans not started: ${JSON.stringify({ created, started })}`);
  const waiting: Evidence['start']['waiting'] = [];
  for (const v of [...await c.waiting('rest'), ...await c.waiting('dash')]) {
    const d = await vmDetail(c.s.m, v.vm_path);
    waiting.push({ vm_path: v.vm_path, power: d.power_state, snapshots: d.snapshots.length });
  }
  return { created, early: { ...answer(early), error: early.body?.error }, started, waiting };
}

/** A read key asks to cut over: the route (three ways), no key, the CLI, the dashboard; then what the VMs show. */
async function readKey(c: Client): Promise<Evidence['read']> {
  const routes: Evidence['read']['routes'] = [];
  const asks = [['/plans/rest/cutover', undefined], ['/api/v1/plans/rest/cutover', undefined], ['/plans/rest/cutover', { vm_path: c.s.vm('wpc-ca') }]] as const;
  for (const [p, body] of asks) {
    routes.push({ p, body, ...answer(await c.api('POST', p, K.viewer, body)) });
  }
  const noKey = (await req(c.s.url, 'POST', '/plans/rest/cutover')).status;
  const cli = await ferryCli(['plan', 'cutover', 'rest'], { FERRY_URL: c.s.url, FERRY_API_KEY: K.viewer });

  const page = await c.browser.newPage();
  await page.goto(`${c.s.url}/web/dashboard/#/plan/dash`);
  await page.waitForSelector('#auth:not([hidden])');
  await page.fill('#auth-key', K.viewer);
  await page.click('#auth-form button[type=submit]');
  await page.waitForSelector(`tr[data-vm="${c.s.vm('wpc-da')}"] .warm-rounds:text("1 rounds")`);
  const seen = { planCutover: await page.locator('#plan-cutover').count(), vmCutover: await page.locator('button.vm-cutover').count() };
  await page.close();

  const after: Evidence['read']['after'] = [];
  for (const id of IDS) {
    for (const v of await c.waiting(id)) {
      after.push({ vm_path: v.vm_path, asked: await c.asked(v.job_id!), power: (await vmDetail(c.s.m, v.vm_path)).power_state });
    }
  }
  return { routes, noKey, cli: { code: cli.code, stdout: cli.stdout, stderr: cli.stderr }, page: seen, after };
}

/** POST /plans/rest/cutover without vm_path by the submit key; the other plan; then asked again. */
async function cutRest(c: Client): Promise<Evidence['rest']> {
  const r = await c.api<PlanView | undefined>('POST', '/plans/rest/cutover', K.ops);
  const shown: Evidence['rest']['shown'] = {};
  const asked: Evidence['rest']['asked'] = {};
  for (const name of PLANS.rest) {
    const v = r.body?.vms?.find((x) => x.vm_path === c.s.vm(name)) as Vm | undefined;
    shown[name] = v?.warm?.cutover_requested?.by;
    asked[name] = v?.job_id ? (await c.asked(v.job_id))?.by : undefined;
  }
  // The other plan is not touched.
  const other: Evidence['rest']['other'] = [];
  for (const v of await c.waiting('dash')) other.push({ vm_path: v.vm_path, asked: await c.asked(v.job_id!) });

  const acting = async () => (await Promise.all(PLANS.rest.map((n) => c.vmOf('rest', n)))).every((v) => v.warm?.status !== 'copying');
  await until(acting, 120_000, 'both jobs acting on the cutover');
  const again = await c.api<{ error: string } | undefined>('POST', '/plans/rest/cutover', K.ops);
  return { cut: answer(r), shown, asked, other, again: { ...answer(again), error: again.body?.error } };
}

/** "Cut over all" on the dashboard by the submit key: the buttons, the request the page sent, the requests recorded. */
async function cutDash(c: Client): Promise<Evidence['dash']> {
  const page = await c.browser.newPage();
  const pageErrors: string[] = [];
  page.on('pageerror', (e) => { pageErrors.push(`page error: ${e.message}`); });
  await page.goto(`${c.s.url}/web/dashboard/#/plan/dash`);
  await page.waitForSelector('#auth:not([hidden])');
  await page.fill('#auth-key', K.ops);
  await page.click('#auth-form button[type=submit]');
  await page.waitForSelector('#plan-cutover');
  const vmCutover = await page.locator('button.vm-cutover').count();
  const sent = page.waitForRequest((q) => q.method() === 'POST' && new URL(q.url()).pathname === '/plans/dash/cutover');
  await page.click('#plan-cutover');
  const posted = (await sent).postData() ?? '';
  await page.waitForSelector('#plan-msg:text("cutover requested for every warm VM")');
  const planCutoverAfter = await page.locator('#plan-cutover').count();
  await page.close();
  const asked: Evidence['dash']['asked'] = {};
  for (const name of PLANS.dash) asked[name] = (await c.asked((await c.vmOf('dash', name)).job_id!))?.by;
  return { vmCutover, posted, pageErrors, planCutoverAfter, asked };
}

/** Both plans at their end: each job's record, the source, its folder, Redis and the target's domain. */
async function ends(c: Client): Promise<Evidence['ends']> {
  const out: Partial<Evidence['ends']> = {};
  for (const id of IDS) {
    const plan = await until(async () => {
      const x = await c.plan(id);
      return ['completed', 'failed', 'cancelled'].includes(x.status) && x;
    }, 1_200_000, `plan ${id} to end`);
    const vms: Record<string, VmEnd> = {};
    for (const name of PLANS[id]) {
      const v = plan.vms.find((x) => x.vm_path === c.s.vm(name)) as Vm;
      const d = await vmDetail(c.s.m, c.s.vm(name));
      vms[name] = {
        record: await c.record(v.job_id!), asked: await c.asked(v.job_id!), power: d.power_state, snapshots: d.snapshots, files: c.snapshotFiles(name),
        jobSnapshots: JSON.parse((await c.s.rc.hget(`wpc:job:${v.job_id}`, 'warm_snapshots')) ?? '[]'),
        domstate: (await c.s.lv.virsh(['domstate', name])).trim(),
      };
    }
    out[id] = { plan, vms };
  }
  return out as Evidence['ends'];
}

/** The stack, its four running VMs on copies of the tiny flat guest, and Chromium. */
async function startWpcStack(): Promise<{ s: PlanStack; browser: BrowserContext }> {
  const s = await startPlanStack({ prefix: 'wpc', workers: { wpc: 4 }, env: { FERRY_API_KEYS: `ops:submit:${K.ops},viewer:read:${K.viewer}` } });
  try {
    const flat = await tinyFlatGuest(s.dir, BYTES);
    for (const [i, name] of ALL.entries()) {
      await createPlanVm(s.m, { name, mac: `00:50:56:37:02:0${i + 1}`, disks: [{ ds: 'LocalDS_0', file: `${name}/boot.vmdk`, bytes: BYTES }] });
      await upload(s.v, flat.desc, `${name}/boot.vmdk`);
      await upload(s.v, flat.extent, `${name}/boot-flat.vmdk`);
      await powerOn(s.m, s.vm(name));
    }
    return { s, browser: await launchChromium(path.join(s.dir, 'chromium-profile')) };
  } catch (e) { await s.stop(); throw e; }
}

async function stopWpcStack(s: PlanStack, browser: BrowserContext) {
  await browser.close().catch((e: Error) => console.warn(`      chromium close: ${e.message}`));
  try {
    // The domains these plans made (the stack removes only those of its addVm) go from the run's shared libvirtd.
    for (const n of (await s.domains()).filter((x) => (ALL as readonly string[]).includes(x))) {
      if ((await s.lv.virsh(['domstate', n])).trim() !== 'shut off') await s.lv.virsh(['destroy', n]);
      await s.lv.virsh(['undefine', n, '--nvram', '--remove-all-storage']);
    }
  } finally { await s.stop(); }
}

async function produce(): Promise<Evidence> {
  const { s, browser } = await startWpcStack();
  try {
    const c = client(s, browser);
    // In order, as the tests ran: the read key first, then the route on one plan, the page on the other.
    const start = await startBoth(c);
    const read = await readKey(c);
    const rest = await cutRest(c);
    const dash = await cutDash(c);
    const e: Evidence = { vms: Object.fromEntries(ALL.map((n) => [n, s.vm(n)])), start, read, rest, dash, ends: await ends(c) };
    return JSON.parse(JSON.stringify(e)) as Evidence;
  } finally { await stopWpcStack(s, browser); }
}

function checkStart({ start: e }: Evidence) {
  expect(e.created.length).to.equal(IDS.length);
  for (const c of e.created) expect(c.status, c.text).to.equal(201);
  expect(e.early.status, e.early.text).to.equal(409);
  expect(e.early.error).to.match(/plan rest is pending: only a running plan's VMs cut over/);
  for (const st of e.started) expect(st).to.equal(200);
  expect(e.waiting.map((v) => v.vm_path).sort(), 'every VM waits after round 1').to.have.length(ALL.length);
  for (const v of e.waiting) {
    expect(v.power, `${v.vm_path} runs while it is copied`).to.equal('poweredOn');
    expect(v.snapshots, `${v.vm_path}: round 1's snapshot, kept until the next round`).to.equal(1);
  }
}

function checkReadKey({ read: e }: Evidence) {
  expect(e.routes).to.have.length(3);
  for (const r of e.routes) {
    expect(r.status, `${r.p} ${JSON.stringify(r.body)}: ${r.text}`).to.equal(403);
    expect(r.text).to.match(/has role read; this needs role submit/);
  }
  expect(e.noKey, 'no key at all').to.equal(401);
  expect(e.cli.code, e.cli.stdout).to.not.equal(0);
  expect(e.cli.stderr).to.match(/POST \/plans\/rest\/cutover: 403/);
  expect(e.page.planCutover, 'no "Cut over all" for a read key').to.equal(0);
  expect(e.page.vmCutover, 'no "Cut over" for a read key').to.equal(0);
  expect(e.after).to.have.length(ALL.length);
  for (const v of e.after) {
    expect(v.asked, `${v.vm_path}: no request on its job`).to.equal(null);
    expect(v.power).to.equal('poweredOn');
  }
}

function checkRest({ rest: e, vms }: Evidence) {
  expect(e.cut.status, e.cut.text).to.equal(200);
  for (const name of PLANS.rest) {
    expect(e.shown[name], `${name}: the answer shows the request`).to.equal('ops');
    expect(e.asked[name], `${name}: recorded on the job in Redis`).to.equal('ops');
  }
  // The other plan is not touched.
  expect(e.other).to.have.length(PLANS.dash.length);
  for (const v of e.other) expect(v.asked, `${v.vm_path} (the other plan)`).to.equal(null);
  expect(e.again.status, e.again.text).to.equal(409);
  expect(e.again.error).to.match(/plan rest has no warm VM waiting for cutover: /);
  for (const name of PLANS.rest) {
    expect(e.again.error).to.match(new RegExp(`${vms[name]}: job \\S+ is already (cutting over|completed) \\(cutover requested by ops`));
  }
}

function checkDash({ dash: e }: Evidence) {
  expect(e.pageErrors, 'no page error').to.deep.equal([]);
  expect(e.vmCutover, 'and "Cut over" on each VM').to.equal(2);
  expect(e.posted, 'the whole plan: no vm_path').to.not.match(/vm_path/);
  expect(e.planCutoverAfter, 'no second "Cut over all" once every VM is asked').to.equal(0);
  for (const name of PLANS.dash) expect(e.asked[name], `${name}: recorded on the job by the page's key`).to.equal('ops');
}

function checkEnds({ ends: e, vms }: Evidence) {
  for (const id of IDS) {
    const p = e[id].plan;
    expect(p.status, JSON.stringify(p.vms.map((v) => [v.vm_path, v.status, v.error]))).to.equal('completed');
    for (const name of PLANS[id]) {
      const v = p.vms.find((x) => x.vm_path === vms[name]) as Vm;
      const { record: rec, asked, power, snapshots, files, jobSnapshots, domstate } = e[id].vms[name];
      expect(rec.status, `${name}: ${rec.error}`).to.equal('completed');
      const w = rec.result!.warm;
      expect(w.cutover!.reason, `${name}: cut over by the request`).to.equal(`cutover requested by ops at ${asked!.at}`);
      expect(w.rounds.length, `${name}: round 1, then the last delta after the power-off`).to.equal(2);
      expect(w.cutover!.powered_off_at).to.be.a('string');
      expect(rec.result!.boot.status).to.equal('passed');
      expect(v.warm?.downtime?.seconds, `${name}: the plan view shows the measured downtime`).to.be.above(0);
      expect(power, `${name}: powered off at cutover`).to.equal('poweredOff');
      expect(snapshots, `${name}: no snapshot left`).to.deep.equal([]);
      expect(files, `${name}: no frozen file left`).to.deep.equal([]);
      expect(jobSnapshots, `${name}: no snapshot in the job's record`).to.deep.equal([]);
      expect(domstate, `${name} on the target`).to.equal('running');
    }
  }
}

describe('warm migration: a whole plan cut over by POST /plans/{id}/cutover and the dashboard\'s "Cut over all" (issue 37) @vm', function () {
  this.timeout(1_800_000);

  proofTests<Evidence>({
    spec: async () => ({
      name: 'vsphere-warm-plan-cutover', entries: [__filename], extra: { ...fixtureInputs(await ensureTinyGuest()) },
    }),
    produce,
    runTitle: 'runs both warm plans to their cutover by the route and the dashboard (or reuses the record of the same inputs)',
    checks: [
      ['both plans created: a pending plan has nothing to cut over (409 naming its state); started, every VM waits after round 1', checkStart],
      [
        'a read key cannot cut over: 403 on the route (with and without vm_path, under /api/v1), ferry plan cutover fails, no button; nothing recorded',
        checkReadKey,
      ],
      ['POST /plans/{id}/cutover without vm_path cuts over every waiting VM of that plan only; asked again, 409 naming why', checkRest],
      ['"Cut over all" on the dashboard asks every waiting VM of its plan (no vm_path sent) by the page\'s key, and the button goes', checkDash],
      ['each job of both plans powered its VM off, copied the last delta, left no snapshot and boots on the target', checkEnds],
    ],
  });
});
