// npm run bench:plan: what a plan buys over running the same migrations one by one. N small VMs (the tiny real
// guest of test/fixtures/tiny-guest.ts: each one a whole shape B job, export, repair in a libguestfs appliance,
// convert, import, boot check) on one ESXi host and one datastore of the simulator, onto the tests' libvirtd:
//   - serial: N single shape B jobs (POST /jobs/submit), each submitted when the one before has ended; the sum
//     of their wall times;
//   - plans: a plan of N such VMs (fresh ones each time) with limits.per_esxi_host 1, 2 and 4, its wall time
//     from POST /plans/{id}/start to its end.
// All in the same run, on the same stack (test/plans/fixture.ts: a daemon, two workers with two job slots each),
// printed beside each other with the load average at each measurement (this is a shared 2-core machine, and the
// appliance's TCG boot is CPU-bound, so parallel VMs can gain at most the cores that are free).
// BENCH_VMS (default 4).
import os from 'node:os';
import { execFileSync } from 'node:child_process';
import { req, until } from '../../test/helpers/http';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../../test/fixtures/tiny-guest';
import { PlanStack, startPlanStack } from '../../test/plans/fixture';

/** The daemon's answers read here: POST /jobs/submit, and GET /jobs/{id} (orchestration/daemon-views.ts). */
interface Submitted { job_id: string }
interface JobAnswer { status: string; error?: unknown }

const N = Number(process.env.BENCH_VMS || 4);
const LIMITS = [1, 2, 4];
const HOST = 'DC0_H0';
const DS = 'LocalDS_0';
const VIRT_TEST = { expect: TINY_GUEST_MARKER, timeout_seconds: 600 };
const FINAL = ['completed', 'failed', 'cancelled'];

const load = () => os.loadavg()[0].toFixed(1);

/** N fresh VMs named <prefix>0..N-1 (MACs 00:50:56:05:<set>:<i>). */
async function vms(s: PlanStack, prefix: string, set: number, disk: string): Promise<string[]> {
  const names: string[] = [];
  for (let i = 0; i < N; i++) {
    const name = `${prefix}${i}`;
    await s.addVm({ name, host: HOST, ds: DS, mac: `00:50:56:05:${set.toString(16).padStart(2, '0')}:${i.toString(16).padStart(2, '0')}` }, { path: disk, bytes: TINY_GUEST_BYTES });
    names.push(name);
  }
  return names;
}

/** One shape B job for `name`, to its end; its wall time in seconds. */
async function single(s: PlanStack, name: string): Promise<number> {
  const t0 = Date.now();
  const r = await req(s.url, 'POST', '/jobs/submit', {
    vm_path: s.vm(name), source: { type: 'vsphere' }, destination: { type: 'kvm', virt_uri: s.lv.uri },
    options: { power_off: 'force', network_mapping: { 'VM Network': s.net }, virt_test: VIRT_TEST },
  });
  if (r.status !== 200) throw new Error(`submitting ${name}: ${r.status} ${r.text}`);
  const j = await until(async () => { const x = (await req(s.url, 'GET', `/jobs/${(r.body as Submitted).job_id}`)).body as JobAnswer; return FINAL.includes(x.status) && x; }, 3_600_000, `job of ${name}`);
  if (j.status !== 'completed') throw new Error(`the job of ${name} ended ${j.status}: ${JSON.stringify(j.error)}`);
  return (Date.now() - t0) / 1000;
}

/** A plan of `names` with `perHost` per ESXi host, from start to its end; its wall time in seconds. */
async function plan(s: PlanStack, id: string, names: string[], perHost: number): Promise<number> {
  const c = await req(s.url, 'POST', '/plans', s.plan(id, names, { limits: { per_plan: N, per_esxi_host: perHost, per_datastore: N }, options: { power_off: 'force', virt_test: VIRT_TEST } }));
  if (c.status !== 201) throw new Error(`creating plan ${id}: ${c.status} ${c.text}`);
  const t0 = Date.now();
  const st = await req(s.url, 'POST', `/plans/${id}/start`);
  if (st.status !== 200) throw new Error(`starting plan ${id}: ${st.status} ${st.text}`);
  const p = await until(async () => { const x = await s.get(id); return FINAL.includes(x.status) && x; }, 3_600_000, `plan ${id}`);
  if (p.status !== 'completed') throw new Error(`plan ${id} ended ${p.status}: ${JSON.stringify(p.vms.map((v) => [v.vm_path, v.status, v.error]))}`);
  return (Date.now() - t0) / 1000;
}

async function main() {
  // The commit measured is the one the run starts on (the services are started from it).
  const commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  const disk = await ensureTinyGuest();
  const s = await startPlanStack({ prefix: 'benchplan', workers: { b1: 2, b2: 2 } });
  try {
    const rows: { what: string; seconds: number; load: string }[] = [];
    const serial = await vms(s, 's', 0, disk);
    const each: number[] = [];
    const l0 = load();
    for (const n of serial) each.push(await single(s, n));
    const sum = each.reduce((a, b) => a + b, 0);
    rows.push({ what: `${N} single jobs, one after another (sum; each ${each.map((x) => x.toFixed(0)).join(', ')} s)`, seconds: sum, load: `${l0} -> ${load()}` });
    for (const [i, l] of LIMITS.entries()) {
      const names = await vms(s, `p${l}-`, i + 1, disk);
      const l1 = load();
      rows.push({ what: `plan of ${N}, limits.per_esxi_host ${l}`, seconds: await plan(s, `bench-${l}`, names, l), load: `${l1} -> ${load()}` });
    }
    console.log(`\nbench:plan, ${N} tiny VMs on one ESXi host, commit ${commit}, ${os.cpus().length} CPUs\n`);
    console.log('| run | wall s | vs serial sum | load avg (1 min) |\n|---|---|---|---|');
    for (const r of rows) console.log(`| ${r.what} | ${r.seconds.toFixed(0)} | ${(r.seconds / sum).toFixed(2)}x | ${r.load} |`);
    for (const r of rows.slice(1)) console.log(`${r.what}: ${r.seconds < sum ? 'beats' : 'does not beat'} the serial sum (${r.seconds.toFixed(0)} s vs ${sum.toFixed(0)} s)`);
  } finally {
    await s.stop();
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
