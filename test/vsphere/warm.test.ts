// Issue 37: warm migration, end to end. A warm plan of two running VMs on the simulator (CBT, snapshots that freeze
// flat disks, QueryChangedDiskAreas), the tests' libvirtd and a real worker: the test writes to each running VM's
// disk between rounds (the first and last tracking block, ranges crossing a 64 KiB block, zeros over data); one VM
// cuts over by hand (POST /plans/{id}/cutover) after three rounds, the other automatically by its downtime budget.
// Each target volume equals its source as of power-off with exactly the repair's writes (the repair's own overlay
// over the source reads the same as the volume), the guest boots, every snapshot is gone (the simulator's
// inventory and its datastore folder), the prediction and the measured downtime are in the job result, the plan
// view and the metrics; the downtime is printed beside the same VM's cold migration. Then a warm plan cancelled
// mid-round: the source keeps running, its disk as the guest left it, no snapshot, CBT off again, no target volume.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes, randomFillSync, randomInt } from 'node:crypto';
import { closeSync, copyFileSync, mkdirSync, openSync, readdirSync, readFileSync, writeSync } from 'node:fs';
import path from 'node:path';
import { req, until } from '../helpers/http';
import { ensureTinyGuest, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { createPlanVm, type PlanStack, startPlanStack } from '../plans/fixture';
import { powerOn, upload } from './fixture';
import { vmDetail } from '../../domain/vsphere/inventory';
import { cbtEnabled } from '../../domain/vsphere/cbt';
import type { PlanView } from '../../orchestration/plan-view';
import type { WarmState } from '../../domain/warm-predict';

const MIB = 1024 * 1024;
const KIB = 1024;
const BLOCK = 64 * KIB; // the simulator's tracking block
const BOOT_BYTES = 48 * MIB;
type Vm = PlanView['vms'][number] & { warm?: WarmState & { cutover_requested?: unknown } };
interface Rec { status: string; state_history: { state: string; reason?: string }[]; result?: { warm: WarmState; volumes: { path: string; format: string }[]; boot: { status: string }; conversion: { artifacts: { disk_id: string; path: string }[] }; stage_seconds?: Record<string, number>; export?: { seconds?: number } }; error?: string }

const qemuImg = (args: string[]) => execFileSync('qemu-img', args, { encoding: 'utf8' });
const identical = (args: string[]) => { try { qemuImg(['compare', '-U', ...args]); return true; } catch (e) { if ((e as { status?: number }).status === 1) return false; throw e; } };
const sha256 = (f: string) => createHash('sha256').update(readFileSync(f)).digest('hex');

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

describe('warm migration: rounds of changed blocks while the VM runs, then cutover (issue 37) @vm', function () {
  this.timeout(1_800_000);
  let s: PlanStack;
  let disk: Awaited<ReturnType<typeof flatBootDisk>>;
  const live = (name: string) => path.join(s.v.datastores.LocalDS_0, name, 'boot-flat.vmdk');
  const record = async (id: string) => (await req<Rec>(s.url, 'GET', `/jobs/${id}/record`)).body;
  const vmView = async (plan: string, name: string) => (await s.get(plan)).vms.find((x) => x.vm_path === s.vm(name)) as Vm;
  const roundsDone = (plan: string, name: string, n: number) => until(async () => { const v = await vmView(plan, name); return (v.warm?.rounds.length ?? 0) >= n && v.warm?.status === 'copying' && v; }, 600_000, `${name}: round ${n} done`);
  const addVm = async (name: string, mac: string) => {
    await createPlanVm(s.m, { name, mac, disks: [{ ds: 'LocalDS_0', file: `${name}/boot.vmdk`, bytes: BOOT_BYTES }] });
    await upload(s.v, disk.desc, `${name}/boot.vmdk`);
    await upload(s.v, disk.extent, `${name}/boot-flat.vmdk`);
    await powerOn(s.m, s.vm(name));
  };
  const snapshotFiles = (name: string) => readdirSync(path.join(s.v.datastores.LocalDS_0, name)).filter((f) => /snapshot|\.vmsn$|-0000\d+/i.test(f));
  /** The volume equals `source` with exactly the repair's writes: the repair's overlay over the source reads as the volume. */
  const repairedExactly = (volume: string, overlay: string, source: string) => {
    const copy = path.join(s.dir, `check-${path.basename(overlay)}-${randomInt(1e9)}`);
    copyFileSync(overlay, copy);
    qemuImg(['rebase', '-u', '-f', 'qcow2', '-b', source, '-F', 'raw', copy]);
    return identical(['-f', 'qcow2', '-F', 'raw', copy, volume]);
  };
  const warmOpts = { precopy_interval: 5 };
  const plan = (id: string, names: string[], options: Record<string, unknown>, vms?: unknown[]) => ({ ...s.plan(id, names), ...(vms ? { vms } : {}), options: { power_off: 'force', guest_preflight: false, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 }, ...options } });

  before(async function () {
    this.timeout(300_000);
    s = await startPlanStack({ prefix: 'warm', workers: { ww: 3 } });
    disk = await flatBootDisk(s.dir);
    await addVm('wa', '00:50:56:37:00:01');
    await addVm('wb', '00:50:56:37:00:02');
    await addVm('wc', '00:50:56:37:00:03');
    await addVm('wk', '00:50:56:37:00:04');
  });
  after(async () => { await s?.stop(); });

  it('bad warm options are refused with a 400 naming the field, before anything runs', async () => {
    const def = (options: Record<string, unknown>) => ({ vm_path: s.vm('wk'), source: { type: 'vsphere' }, destination: { type: 'kvm', virt_uri: s.lv.uri }, options });
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ power_off: 'none', warm: {} }, /options\.power_off.*shutdown or force for a warm migration/],
      [{ warm: { precopy_interval: 1 } }, /options\.warm\.precopy_interval.*greater than or equal to 5/],
      [{ warm: { cutover_at: '2030-01-01T00:00:00Z', downtime_budget_seconds: 60 } }, /options\.warm.*cutover_at.*downtime_budget_seconds/],
      [{ warm: { downtime_budget_seconds: 0 } }, /options\.warm\.downtime_budget_seconds/],
    ];
    for (const [options, msg] of cases) {
      const r = await req<{ error: string }>(s.url, 'POST', '/jobs/submit', def(options));
      expect(r.status, r.text).to.equal(400);
      expect(r.body.error).to.match(msg);
    }
    const p = await req<{ error: string }>(s.url, 'POST', '/plans', plan('badwarm', ['wk'], { warm: { precopy_interval: 2 } }));
    expect(p.status, p.text).to.equal(400);
    expect(p.body.error).to.match(/options\.warm\.precopy_interval/);
    expect((await req(s.url, 'POST', '/plans/nosuch/cutover')).status).to.equal(404);
    expect((await vmDetail(s.m, s.vm('wk'))).snapshots, 'nothing touched the source').to.deep.equal([]);
  });

  it('two VMs written between rounds: a manual cutover after three rounds, one by budget; targets equal the sources at power-off, guests boot, no snapshot left', async () => {
    const body = plan('warm', ['wa', 'wb'], { warm: warmOpts }, [s.vm('wa'), { vm_path: s.vm('wb'), options: { warm: { ...warmOpts, downtime_budget_seconds: 86_400 } } }]);
    const c = await req(s.url, 'POST', '/plans', body);
    expect(c.status, c.text).to.equal(201);
    const bad = await req<{ error: string }>(s.url, 'POST', '/plans/warm/cutover', { vm_path: s.vm('wa') });
    expect(bad.status, 'a plan that has not started has nothing to cut over').to.equal(409);
    expect((await req(s.url, 'POST', '/plans/warm/start')).status).to.equal(200);

    await roundsDone('warm', 'wb', 1);
    guestWrites(live('wb')); // wb cuts over by itself once round 2 measured a change rate within its budget
    for (let n = 1; n <= 3; n++) {
      const v = await roundsDone('warm', 'wa', n);
      expect((await vmDetail(s.m, s.vm('wa'))).snapshots.length, 'one snapshot between rounds').to.equal(1);
      if (n > 1) expect(v.warm!.prediction!.seconds, 'a prediction after each round').to.be.above(0);
      guestWrites(live('wa'));
    }
    const cut = await req<PlanView>(s.url, 'POST', '/plans/warm/cutover', { vm_path: s.vm('wa') });
    expect(cut.status, cut.text).to.equal(200);
    expect((cut.body.vms.find((x) => x.vm_path === s.vm('wa')) as Vm).warm?.cutover_requested).to.be.an('object');

    const p = await until(async () => { const x = await s.get('warm'); return ['completed', 'failed'].includes(x.status) && x; }, 1_500_000, 'plan warm to end');
    for (const name of ['wa', 'wb']) {
      const v = p.vms.find((x) => x.vm_path === s.vm(name)) as Vm;
      const r = await record(v.job_id!);
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
      expect((await vmDetail(s.m, s.vm(name))).power_state).to.equal('poweredOff');
      const overlay = res.conversion.artifacts.find((a) => a.disk_id === 'disk-0')!.path;
      expect(res.volumes[0].format).to.equal('raw');
      expect(repairedExactly(res.volumes[0].path, overlay, live(name)), `${name}: target = source at power-off + the repair`).to.equal(true);
      expect((await vmDetail(s.m, s.vm(name))).snapshots, `${name}: no snapshot left`).to.deep.equal([]);
      expect(snapshotFiles(name), `${name}: no frozen file left`).to.deep.equal([]);
      expect(JSON.parse((await s.rc.hget(`warm:job:${v.job_id}`, 'warm_snapshots')) ?? '[]')).to.deep.equal([]);
      console.log(`      ${name}: ${w.rounds.length} rounds, cut over (${w.cutover!.reason}); predicted ${w.prediction!.seconds} s, measured ${w.downtime!.seconds} s ${JSON.stringify(w.downtime!.parts)}; ${w.cutover!.last_delta_bytes} bytes after power-off`);
    }
    // Computed at scrape time (within 2 s, else left out of that scrape): the next scrapes are read until both show.
    let lines = '';
    await until(async () => {
      lines = (await req(s.url, 'GET', '/metrics')).text.split('\n').filter((l) => l.startsWith('ferry_plan_vm_')).join('\n');
      // (the daemon adds its own service label to every series)
      return /ferry_plan_vm_downtime_seconds\{plan="warm",vm="0"[^}]*\} [0-9.]+/.test(lines) && /ferry_plan_vm_predicted_downtime_seconds\{plan="warm",vm="1"[^}]*\} [0-9.]+/.test(lines);
    }, 60_000, 'the warm metrics in a scrape').catch((e: Error) => { throw new Error(`${e.message}; last scrape's ferry_plan_vm_ lines: ${lines || '(none)'}`); });

    // The same VM's cold migration, in the same run: its downtime is the whole job (power-off to the boot milestone).
    const cold = await req<{ job_id: string }>(s.url, 'POST', '/jobs/submit', { vm_path: s.vm('wk'), source: { type: 'vsphere' }, destination: { type: 'kvm', virt_uri: s.lv.uri }, options: { power_off: 'force', network_mapping: { 'VM Network': s.net }, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 } } });
    expect(cold.status, cold.text).to.be.oneOf([200, 201]);
    const t0 = Date.now();
    const k = await until(async () => { const r = await record(cold.body.job_id); return ['completed', 'failed'].includes(r.status) && r; }, 1_200_000, 'the cold job');
    expect(k.status, k.error).to.equal('completed');
    const wa = await record(p.vms.find((x) => x.vm_path === s.vm('wa'))!.job_id!);
    console.log(`      cold (wk, same disk): about ${Math.round((Date.now() - t0) / 100) / 10} s down (submission to the boot milestone), stages ${JSON.stringify(k.result!.stage_seconds)}; warm (wa): ${wa.result!.warm.downtime!.seconds} s (load ${readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')})`);
  });

  it('a warm plan cancelled mid-round: the source keeps running, unchanged by Ferry, no snapshot, CBT off again, nothing on the target', async () => {
    expect(await cbtEnabled(s.m, (await vmDetail(s.m, s.vm('wc'))).moref)).to.equal(false);
    const c = await req(s.url, 'POST', '/plans', plan('warmstop', ['wc'], { warm: warmOpts }));
    expect(c.status, c.text).to.equal(201);
    expect((await req(s.url, 'POST', '/plans/warmstop/start')).status).to.equal(200);
    await roundsDone('warmstop', 'wc', 2);
    guestWrites(live('wc'));
    const written = sha256(live('wc'));
    // Into round 3: its snapshot is taken, then the cancel lands while it copies or just after.
    await until(async () => ((await vmDetail(s.m, s.vm('wc'))).snapshots.length >= 2 || (await vmView('warmstop', 'wc')).warm!.rounds.length >= 3) && true, 60_000, 'round 3 under way');
    const r = await req(s.url, 'POST', '/plans/warmstop/cancel');
    expect(r.status, r.text).to.equal(200);
    const p = await until(async () => { const x = await s.get('warmstop'); return ['cancelled', 'failed', 'completed'].includes(x.status) && x; }, 300_000, 'plan warmstop to end');
    expect(p.status).to.equal('cancelled');
    const jobId = p.vms[0].job_id!;
    const d = await until(async () => { const x = await vmDetail(s.m, s.vm('wc')); return x.snapshots.length === 0 && x; }, 120_000, 'the snapshots removed');
    expect(d.power_state, 'the source still runs').to.equal('poweredOn');
    expect(await cbtEnabled(s.m, d.moref), 'CBT off again: Ferry turned it on').to.equal(false);
    expect(snapshotFiles('wc')).to.deep.equal([]);
    expect(sha256(live('wc')), 'the source disk as the guest left it').to.equal(written);
    const vols = await until(async () => { const v = await s.volumes(); return !v.some((x) => x.includes(jobId)) && v; }, 120_000, 'the target volume removed');
    expect(vols.filter((x) => x.includes(jobId))).to.deep.equal([]);
    expect((await s.domains()).includes('wc')).to.equal(false);
  });
});
