// Issue 37: warm migration, end to end. A warm plan of two running VMs on the simulator (CBT, snapshots that freeze
// flat disks, QueryChangedDiskAreas), the tests' libvirtd and a real worker: the test writes to each running VM's
// disk between rounds (the first and last tracking block, ranges crossing a 64 KiB block, zeros over data); one VM
// cuts over by hand (POST /plans/{id}/cutover) after three rounds, the other automatically by its downtime budget.
// Each target volume equals its source as of power-off with exactly the repair's writes (the repair's own overlay
// over the source reads the same as the volume), the guest boots, every snapshot is gone (the simulator's
// inventory and its datastore folder), the prediction and the measured downtime are in the job result, the plan
// view and the metrics; the downtime is printed beside the same VM's cold migration. Then a warm plan cancelled
// mid-round: the source keeps running, its disk as the guest left it, no snapshot, CBT off again, no target volume.
// A reused proof (test/helpers/proof-tests.ts): the three scenarios run in order on one stack, and what the test read
// (answers, job records, plan views, the inventory, the datastore folders, Redis, the metrics, and the results of the
// qemu-img compares and disk hashes computed as it ran) is the evidence, each test its check on it; with every input
// unchanged (the tiny guest's disk among them) the same checks re-assert the last passing run's. The guest's writes
// are random, so FERRY_FRESH_PROOFS=1 runs it with new ones.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes, randomFillSync, randomInt } from 'node:crypto';
import { closeSync, copyFileSync, mkdirSync, openSync, readdirSync, readFileSync, writeSync } from 'node:fs';
import path from 'node:path';
import { answer, req, until, type Answer } from '../helpers/http';
import { ensureTinyGuest, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { createPlanVm, type PlanStack, startPlanStack } from '../plans/fixture';
import { powerOn, upload } from './fixture';
import { fixtureInputs } from '../helpers/proofs';
import { proofTests } from '../helpers/proof-tests';
import { vmDetail } from '../../domain/vsphere/inventory';
import { cbtEnabled } from '../../domain/vsphere/cbt';
import type { PlanView } from '../../orchestration/plan-view';
import type { WarmState } from '../../domain/warm-predict';

const MIB = 1024 * 1024;
const KIB = 1024;
const BLOCK = 64 * KIB; // the simulator's tracking block
const BOOT_BYTES = 48 * MIB;
type Vm = PlanView['vms'][number] & { warm?: WarmState & { cutover_requested?: unknown } };
interface Rec {
  status: string; state_history: { state: string; reason?: string }[]; error?: string;
  result?: {
    warm: WarmState; volumes: { path: string; format: string }[]; boot: { status: string }; conversion: { artifacts: { disk_id: string; path: string }[] };
    stage_seconds?: Record<string, number>; export?: { seconds?: number };
  };
}
type Snapshots = Awaited<ReturnType<typeof vmDetail>>['snapshots'];

/** Bad warm options on a job's submission, each refused with a 400 naming its field. */
const BAD: [Record<string, unknown>, RegExp][] = [
  [{ power_off: 'none', warm: {} }, /options\.power_off.*shutdown or force for a warm migration/],
  [{ warm: { precopy_interval: 1 } }, /options\.warm\.precopy_interval.*greater than or equal to 5/],
  [{ warm: { cutover_at: '2030-01-01T00:00:00Z', downtime_budget_seconds: 60 } }, /options\.warm.*cutover_at.*downtime_budget_seconds/],
  [{ warm: { downtime_budget_seconds: 0 } }, /options\.warm\.downtime_budget_seconds/],
];
const WARM = { precopy_interval: 5 };

/** What the warm plan's VM showed at its end: the plan's view of it, its job's record, the source after it, whether the
 *  volume is the source plus the repair (qemu-img compare, null when the record names no volume or overlay). */
interface VmEnd { view: Vm; record: Rec; power: string; repaired: boolean | null; snapshots: Snapshots; files: string[]; jobSnapshots: unknown }
interface Evidence {
  bad: { jobs: (Answer & { error?: string })[]; plan: Answer & { error?: string }; nosuch: number; snapshots: Snapshots };
  warm: {
    created: Answer; early: number; started: number; rounds: { snapshots: number; prediction?: WarmState['prediction'] }[];
    cut: Answer & { requested?: unknown }; ends: Record<string, VmEnd>; metrics: string; cold: { submit: Answer; status?: string; error?: string };
  };
  stopped: {
    cbtBefore: boolean; created: Answer; started: number; cancel: Answer; status: string; power: string; cbtAfter: boolean;
    files: string[]; written: string; now: string; volumes: string[]; domains: string[];
  };
}

const qemuImg = (args: string[]) => execFileSync('qemu-img', args, { encoding: 'utf8' });
const identical = (args: string[]) => {
  try { qemuImg(['compare', '-U', ...args]); return true; } catch (e) { if ((e as { status?: number }).status === 1) return false; throw e; }
};
const sha256 = (f: string) => createHash('sha256').update(readFileSync(f)).digest('hex');
/** Stops a fresh run whose next wait could only time out, saying why (the check says it again on a record). */
const must = (ok: boolean, why: string) => { if (!ok) throw new Error(why); };

/** The tiny guest grown to 48 MiB, random data at 24-40 MiB, as a monolithicFlat pair in <dir>/boot/. */
async function flatBootDisk(dir: string) {
  const raw = path.join(dir, 'boot.raw');
  qemuImg(['convert', '-f', 'vmdk', '-O', 'raw', await ensureTinyGuest(), raw]);
  qemuImg(['resize', '-q', '-f', 'raw', raw, String(BOOT_BYTES)]);
  const fd = openSync(raw, 'r+');
  try { const b = Buffer.alloc(16 * MIB); randomFillSync(b); writeSync(fd, b, 0, b.length, 24 * MIB); } finally { closeSync(fd); }
  mkdirSync(path.join(dir, 'boot'), { recursive: true });
  const desc = path.join(dir, 'boot', 'boot.vmdk');
  qemuImg(['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=monolithicFlat', raw, desc]);
  return { desc, extent: path.join(dir, 'boot', 'boot-flat.vmdk') };
}

/** One round of the guest's writes into its running disk file, outside what the tiny guest boots from (its MBR
 *  boot code and its 16 MiB partition): the first tracking block (after the MBR), the disk's last bytes, ranges
 *  crossing a 64 KiB boundary, zeros over the random data, random others. */
function guestWrites(file: string) {
  const w: [number, Buffer][] = [
    [4096, randomBytes(4096)], [BOOT_BYTES - 5000, randomBytes(5000)],
    [randomInt(17 * 16, 47 * 16) * BLOCK - 1000, randomBytes(3000)], [randomInt(17 * 16, 40 * 16) * BLOCK - 10, randomBytes(2 * BLOCK + 20)],
    [24 * MIB + randomInt(0, 15 * MIB), Buffer.alloc(8 * KIB)],
  ];
  for (let i = 0; i < 5; i++) w.push([randomInt(17 * MIB, BOOT_BYTES - 8 * KIB), randomBytes(randomInt(1, 8 * KIB))]);
  const fd = openSync(file, 'r+');
  try { for (const [at, b] of w) writeSync(fd, b, 0, b.length, at); } finally { closeSync(fd); }
}

const live = (s: PlanStack, name: string) => path.join(s.v.datastores.LocalDS_0, name, 'boot-flat.vmdk');
const jobRecord = async (s: PlanStack, id: string) => (await req<Rec>(s.url, 'GET', `/jobs/${id}/record`)).body;
const vmView = async (s: PlanStack, plan: string, name: string) => (await s.get(plan)).vms.find((x) => x.vm_path === s.vm(name)) as Vm;
const roundsDone = (s: PlanStack, plan: string, name: string, n: number) => until(async () => {
  const v = await vmView(s, plan, name);
  return (v.warm?.rounds.length ?? 0) >= n && v.warm?.status === 'copying' && v;
}, 600_000, `${name}: round ${n} done`);
const snapshotFiles = (s: PlanStack, name: string) =>
  readdirSync(path.join(s.v.datastores.LocalDS_0, name)).filter((f) => /snapshot|\.vmsn$|-0000\d+/i.test(f));
/** The volume equals `source` with exactly the repair's writes: the repair's overlay over the source reads as the volume. */
function repairedExactly(s: PlanStack, volume: string, overlay: string, source: string) {
  const copy = path.join(s.dir, `check-${path.basename(overlay)}-${randomInt(1e9)}`);
  copyFileSync(overlay, copy);
  qemuImg(['rebase', '-u', '-f', 'qcow2', '-b', source, '-F', 'raw', copy]);
  return identical(['-f', 'qcow2', '-F', 'raw', copy, volume]);
}
const planBody = (s: PlanStack, id: string, names: string[], options: Record<string, unknown>, vms?: unknown[]) => ({
  ...s.plan(id, names), ...(vms ? { vms } : {}),
  options: { power_off: 'force', guest_preflight: false, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 }, ...options },
});

/** The stack and its four running VMs, each on its own copy of the flat boot disk. */
async function startWarmStack(): Promise<PlanStack> {
  const s = await startPlanStack({ prefix: 'warm', workers: { ww: 3 } });
  try {
    const disk = await flatBootDisk(s.dir);
    for (const [i, name] of ['wa', 'wb', 'wc', 'wk'].entries()) {
      const mac = `00:50:56:37:00:0${i + 1}`;
      await createPlanVm(s.m, { name, mac, disks: [{ ds: 'LocalDS_0', file: `${name}/boot.vmdk`, bytes: BOOT_BYTES }] });
      await upload(s.v, disk.desc, `${name}/boot.vmdk`);
      await upload(s.v, disk.extent, `${name}/boot-flat.vmdk`);
      await powerOn(s.m, s.vm(name));
    }
    return s;
  } catch (e) { await s.stop(); throw e; }
}

/** Bad warm options, on a job and on a plan, and a cutover of no plan: before anything runs. */
async function badOptions(s: PlanStack): Promise<Evidence['bad']> {
  const def = (options: Record<string, unknown>) => ({
    vm_path: s.vm('wk'), source: { type: 'vsphere' }, destination: { type: 'kvm', virt_uri: s.lv.uri }, options,
  });
  const jobs: Evidence['bad']['jobs'] = [];
  for (const [options] of BAD) {
    const r = await req<{ error: string } | undefined>(s.url, 'POST', '/jobs/submit', def(options));
    jobs.push({ ...answer(r), error: r.body?.error });
  }
  const p = await req<{ error: string } | undefined>(s.url, 'POST', '/plans', planBody(s, 'badwarm', ['wk'], { warm: { precopy_interval: 2 } }));
  const nosuch = (await req(s.url, 'POST', '/plans/nosuch/cutover')).status;
  return { jobs, plan: { ...answer(p), error: p.body?.error }, nosuch, snapshots: (await vmDetail(s.m, s.vm('wk'))).snapshots };
}

/** The warm plan of wa and wb, written between rounds: wb cuts over by its budget, wa by hand after three rounds. */
async function warmRounds(s: PlanStack): Promise<Pick<Evidence['warm'], 'created' | 'early' | 'started' | 'rounds' | 'cut'>> {
  const wb = { vm_path: s.vm('wb'), options: { warm: { ...WARM, downtime_budget_seconds: 86_400 } } };
  const body = planBody(s, 'warm', ['wa', 'wb'], { warm: WARM }, [s.vm('wa'), wb]);
  const created = answer(await req(s.url, 'POST', '/plans', body));
  const early = (await req(s.url, 'POST', '/plans/warm/cutover', { vm_path: s.vm('wa') })).status;
  const started = (await req(s.url, 'POST', '/plans/warm/start')).status;
  must(created.status === 201 && started === 200, `plan warm: created ${created.status} ${created.text}, started ${started}`);

  await roundsDone(s, 'warm', 'wb', 1);
  guestWrites(live(s, 'wb')); // wb cuts over by itself once round 2 measured a change rate within its budget
  const rounds: Evidence['warm']['rounds'] = [];
  for (let n = 1; n <= 3; n++) {
    const v = await roundsDone(s, 'warm', 'wa', n);
    rounds.push({ snapshots: (await vmDetail(s.m, s.vm('wa'))).snapshots.length, prediction: v.warm?.prediction });
    guestWrites(live(s, 'wa'));
  }
  const cut = await req<PlanView | undefined>(s.url, 'POST', '/plans/warm/cutover', { vm_path: s.vm('wa') });
  const requested = cut.body?.vms?.find((x) => x.vm_path === s.vm('wa'))?.warm?.cutover_requested;
  return { created, early, started, rounds, cut: { ...answer(cut), requested } };
}

/** One VM of the ended warm plan: its job's record, the source, the volume compared with the source plus the repair. */
async function vmEnd(s: PlanStack, p: PlanView, name: string): Promise<VmEnd> {
  const view = p.vms.find((x) => x.vm_path === s.vm(name)) as Vm;
  const record = await jobRecord(s, view.job_id!);
  // The source as of its power-off (it is off now; nothing wrote since) plus the repair's writes is the volume.
  const power = (await vmDetail(s.m, s.vm(name))).power_state;
  const overlay = record.result?.conversion?.artifacts.find((a) => a.disk_id === 'disk-0')?.path;
  const volume = record.result?.volumes?.[0]?.path;
  const repaired = overlay && volume ? repairedExactly(s, volume, overlay, live(s, name)) : null;
  const snapshots = (await vmDetail(s.m, s.vm(name))).snapshots;
  const jobSnapshots: unknown = JSON.parse((await s.rc.hget(`warm:job:${view.job_id}`, 'warm_snapshots')) ?? '[]');
  const w = record.result?.warm;
  console.log(`      ${name}: ${w?.rounds.length} rounds, cut over (${w?.cutover?.reason}); predicted ${w?.prediction?.seconds} s, `
    + `measured ${w?.downtime?.seconds} s ${JSON.stringify(w?.downtime?.parts)}; ${w?.cutover?.last_delta_bytes} bytes after power-off`);
  return { view, record, power, repaired, snapshots, files: snapshotFiles(s, name), jobSnapshots };
}

/** The plan's end, each VM's, the metrics, and the same VM's cold migration beside it. */
async function warmPlan(s: PlanStack): Promise<Evidence['warm']> {
  const before = await warmRounds(s);
  const p = await until(async () => { const x = await s.get('warm'); return ['completed', 'failed'].includes(x.status) && x; }, 1_500_000, 'plan warm to end');
  const ends: Record<string, VmEnd> = {};
  for (const name of ['wa', 'wb']) ends[name] = await vmEnd(s, p, name);
  // Computed at scrape time (within 2 s, else left out of that scrape): the next scrapes are read until both show.
  let lines = '';
  await until(async () => {
    lines = (await req(s.url, 'GET', '/metrics')).text.split('\n').filter((l) => l.startsWith('ferry_plan_vm_')).join('\n');
    return METRICS.every((m) => m.test(lines));
  }, 60_000, 'the warm metrics in a scrape').catch((e: Error) => {
    throw new Error(`${e.message}; last scrape's ferry_plan_vm_ lines: ${lines || '(none)'}`);
  });
  return { ...before, ends, metrics: lines, cold: await coldJob(s, ends.wa.record) };
}
// (the daemon adds its own service label to every series)
const METRICS = [
  /ferry_plan_vm_downtime_seconds\{plan="warm",vm="0"[^}]*\} [0-9.]+/,
  /ferry_plan_vm_predicted_downtime_seconds\{plan="warm",vm="1"[^}]*\} [0-9.]+/,
];

/** The same VM's cold migration, in the same run: its downtime is the whole job (power-off to the boot milestone). */
async function coldJob(s: PlanStack, wa: Rec): Promise<Evidence['warm']['cold']> {
  const cold = await req<{ job_id: string }>(s.url, 'POST', '/jobs/submit', {
    vm_path: s.vm('wk'), source: { type: 'vsphere' }, destination: { type: 'kvm', virt_uri: s.lv.uri },
    options: { power_off: 'force', network_mapping: { 'VM Network': s.net }, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 } },
  });
  if (![200, 201].includes(cold.status)) return { submit: answer(cold) };
  const t0 = Date.now();
  const k = await until(async () => {
    const r = await jobRecord(s, cold.body.job_id);
    return ['completed', 'failed'].includes(r.status) && r;
  }, 1_200_000, 'the cold job');
  const load = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  console.log(`      cold (wk, same disk): about ${Math.round((Date.now() - t0) / 100) / 10} s down (submission to the boot milestone), `
    + `stages ${JSON.stringify(k.result?.stage_seconds)}; warm (wa): ${wa.result?.warm.downtime?.seconds} s (load ${load})`);
  return { submit: answer(cold), status: k.status, error: k.error };
}

/** A warm plan of wc cancelled in round 3: the source as the guest left it, nothing of Ferry's left on either side. */
async function cancelled(s: PlanStack): Promise<Evidence['stopped']> {
  const cbtBefore = await cbtEnabled(s.m, (await vmDetail(s.m, s.vm('wc'))).moref);
  const created = answer(await req(s.url, 'POST', '/plans', planBody(s, 'warmstop', ['wc'], { warm: WARM })));
  const started = (await req(s.url, 'POST', '/plans/warmstop/start')).status;
  must(created.status === 201 && started === 200, `plan warmstop: created ${created.status} ${created.text}, started ${started}`);
  await roundsDone(s, 'warmstop', 'wc', 2);
  guestWrites(live(s, 'wc'));
  const written = sha256(live(s, 'wc'));
  // Into round 3: its snapshot is taken, then the cancel lands while it copies or just after.
  await until(async () => ((await vmDetail(s.m, s.vm('wc'))).snapshots.length >= 2 || (await vmView(s, 'warmstop', 'wc')).warm!.rounds.length >= 3) && true,
    60_000, 'round 3 under way');
  const cancel = answer(await req(s.url, 'POST', '/plans/warmstop/cancel'));
  const p = await until(async () => {
    const x = await s.get('warmstop');
    return ['cancelled', 'failed', 'completed'].includes(x.status) && x;
  }, 300_000, 'plan warmstop to end');
  const jobId = p.vms[0].job_id!;
  const d = await until(async () => { const x = await vmDetail(s.m, s.vm('wc')); return x.snapshots.length === 0 && x; }, 120_000, 'the snapshots removed');
  const cbtAfter = await cbtEnabled(s.m, d.moref);
  const files = snapshotFiles(s, 'wc');
  const now = sha256(live(s, 'wc'));
  const vols = await until(async () => { const v = await s.volumes(); return !v.some((x) => x.includes(jobId)) && v; }, 120_000, 'the target volume removed');
  const volumes = vols.filter((x) => x.includes(jobId));
  return { cbtBefore, created, started, cancel, status: p.status, power: d.power_state, cbtAfter, files, written, now, volumes, domains: await s.domains() };
}

async function produce(): Promise<Evidence> {
  const s = await startWarmStack();
  try {
    // In order, as the tests ran: wk's cold job follows the warm plan, wc's plan is the last.
    const bad = await badOptions(s);
    const warm = await warmPlan(s);
    const stopped = await cancelled(s);
    return JSON.parse(JSON.stringify({ bad, warm, stopped })) as Evidence;
  } finally { await s.stop(); }
}

function checkBad({ bad }: Evidence) {
  for (const [i, [, msg]] of BAD.entries()) {
    const r = bad.jobs[i];
    expect(r.status, r.text).to.equal(400);
    expect(r.error).to.match(msg);
  }
  expect(bad.plan.status, bad.plan.text).to.equal(400);
  expect(bad.plan.error).to.match(/options\.warm\.precopy_interval/);
  expect(bad.nosuch).to.equal(404);
  expect(bad.snapshots, 'nothing touched the source').to.deep.equal([]);
}

function checkWarm({ warm: e }: Evidence) {
  expect(e.created.status, e.created.text).to.equal(201);
  expect(e.early, 'a plan that has not started has nothing to cut over').to.equal(409);
  expect(e.started).to.equal(200);
  for (const [i, r] of e.rounds.entries()) {
    expect(r.snapshots, 'one snapshot between rounds').to.equal(1);
    if (i > 0) expect(r.prediction!.seconds, 'a prediction after each round').to.be.above(0);
  }
  expect(e.rounds.length, 'three rounds of wa seen').to.equal(3);
  expect(e.cut.status, e.cut.text).to.equal(200);
  expect(e.cut.requested).to.be.an('object');
  for (const name of ['wa', 'wb']) checkVmEnd(name, e.ends[name]);
  // (the daemon adds its own service label to every series)
  for (const m of METRICS) expect(e.metrics, `the warm metrics in a scrape: ${m}`).to.match(m);
  expect(e.cold.submit.status, e.cold.submit.text).to.be.oneOf([200, 201]);
  expect(e.cold.status, e.cold.error).to.equal('completed');
}

function checkVmEnd(name: string, { view: v, record: r, power, repaired, snapshots, files, jobSnapshots }: VmEnd) {
  expect(r.status, `${name}: ${r.error} ${JSON.stringify(r.state_history)}`).to.equal('completed');
  const res = r.result!;
  const w = res.warm;
  expect(res.boot.status).to.equal('passed');
  expect(w.status).to.equal('completed');
  expect(w.cutover!.reason).to.match(name === 'wa' ? /cutover requested/ : /within options\.warm\.downtime_budget_seconds 86400/);
  expect(w.rounds.length, `${name}: rounds before the cutover plus the last delta`).to.be.at.least(name === 'wa' ? 4 : 3);
  expect(w.rounds[0].bytes_copied, 'round 1 copies the whole disk').to.be.at.least(BOOT_BYTES / 2);
  for (const x of w.rounds.slice(1, -1)) expect(x.bytes_copied, `${name} round ${x.round}: only changed blocks`).to.be.below(BOOT_BYTES / 8);
  expect(w.cutover!.last_delta_bytes, 'bytes copied after the power-off').to.be.below(BOOT_BYTES / 8);
  expect(w.prediction!.seconds).to.be.above(0);
  expect(w.downtime!.seconds).to.be.above(0);
  expect(v.warm?.downtime?.seconds, 'the plan view shows the measured downtime').to.equal(w.downtime!.seconds);
  // The source as of its power-off (it is off now; nothing wrote since) plus the repair's writes is the volume.
  expect(power).to.equal('poweredOff');
  expect(res.volumes[0].format).to.equal('raw');
  expect(repaired, `${name}: target = source at power-off + the repair`).to.equal(true);
  expect(snapshots, `${name}: no snapshot left`).to.deep.equal([]);
  expect(files, `${name}: no frozen file left`).to.deep.equal([]);
  expect(jobSnapshots).to.deep.equal([]);
}

function checkStopped({ stopped: e }: Evidence) {
  expect(e.cbtBefore).to.equal(false);
  expect(e.created.status, e.created.text).to.equal(201);
  expect(e.started).to.equal(200);
  expect(e.cancel.status, e.cancel.text).to.equal(200);
  expect(e.status).to.equal('cancelled');
  expect(e.power, 'the source still runs').to.equal('poweredOn');
  expect(e.cbtAfter, 'CBT off again: Ferry turned it on').to.equal(false);
  expect(e.files).to.deep.equal([]);
  expect(e.now, 'the source disk as the guest left it').to.equal(e.written);
  expect(e.volumes).to.deep.equal([]);
  expect(e.domains.includes('wc')).to.equal(false);
}

describe('warm migration: rounds of changed blocks while the VM runs, then cutover (issue 37) @vm', function () {
  this.timeout(1_800_000);

  proofTests<Evidence>({
    spec: async () => ({ name: 'vsphere-warm', entries: [__filename], extra: fixtureInputs(await ensureTinyGuest()) }),
    produce,
    runTitle: 'runs the warm plans, the cold job and the cancelled plan on one stack (or reuses the record of the same inputs)',
    checks: [
      ['bad warm options are refused with a 400 naming the field, before anything runs', checkBad],
      [
        'two VMs written between rounds: a manual cutover after three rounds, one by budget; '
          + 'targets equal the sources at power-off, guests boot, no snapshot left',
        checkWarm,
      ],
      ['a warm plan cancelled mid-round: the source keeps running, unchanged by Ferry, no snapshot, CBT off again, nothing on the target', checkStopped],
    ],
  });
});
