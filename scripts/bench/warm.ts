// npm run -s bench:warm (issue 37): the downtime of a cold and a warm migration of the same VM, side by side. Its own
// stack (test/plans/fixture.ts: Redis, the simulator, the tests' private libvirtd, a daemon, one shape B worker) and
// one running VM whose flat disk (BENCH_WARM_GIB, default 12 GiB) holds the tiny real guest plus random data on two
// thirds of it (8 GiB of 12; the rest zeros). In the same run:
//   - cold: the shape B job (power_off force); its downtime is the job's run, power-off to the boot milestone,
//     split into copy (the rest) and its measured repair, import and boot (result.stage_seconds);
//   - warm, twice (BENCH_WARM_RUNS): the VM powered on again (same disk, its target removed), the same job with options.warm
//     (precopy_interval 5 s); between rounds the bench writes 1% of the disk (random 1 MiB ranges in the data) into
//     the running disk file, for three rounds and once more before it asks for the cutover (the job's warm_cutover, as POST
//     /plans/{id}/cutover does for a plan VM). Its downtime and split come from result.warm.downtime, its
//     prediction from result.warm.prediction: the first's repair term from the cold run (no warm cutover measured
//     yet), the second's from the first warm cutover's repair; the last one is judged.
// Targets (issue 37): bytes copied after the power-off at most 5% of what the cold migration copied; the predicted
// downtime within 25% of the measured one. The load average is printed beside the figures (the machine is shared).
import { execFileSync } from 'node:child_process';
import { randomFillSync, randomInt } from 'node:crypto';
import { closeSync, openSync, writeSync } from 'node:fs';
import os from 'node:os';
import { req, until } from '../../test/helpers/http';
import { TINY_GUEST_MARKER } from '../../test/fixtures/tiny-guest';
import { type PlanStack, startPlanStack } from '../../test/plans/fixture';
import { powerOn } from '../../test/vsphere/fixture';
import { makeSourceDisk } from './source-disk';
import { tolerate } from '../../test/helpers/teardown';
import { keys } from '../../platform/redis';
import { requestCutover } from '../../orchestration/warm';
import type { WarmState } from '../../domain/warm-predict';

const GIB = 2 ** 30;
const MIB = 2 ** 20;
const DISK = Math.round(Number(process.env.BENCH_WARM_GIB || 12) * GIB / MIB) * MIB;
const DATA_AT = Math.round(DISK / 6 / MIB) * MIB;
const DATA = Math.round((DISK * 2) / 3 / MIB) * MIB;
/** Warm runs after the cold one (BENCH_WARM_RUNS, default 2): the last one's prediction is judged. */
const WARM_RUNS = Math.max(1, Number(process.env.BENCH_WARM_RUNS) || 2);
/** A record's time: epoch milliseconds or an ISO string. */
const ms = (t: string | number | undefined) => (typeof t === 'number' || /^\d+$/.test(String(t)) ? Number(t) : Date.parse(String(t)));
const load = () => os.loadavg().map((x) => x.toFixed(1)).join(' ');
interface Rec { status: string; error?: string; started_at?: string | number; completed_at?: string | number; result?: { stage_seconds?: { repair: number; import: number; boot: number }; export: { total_bytes: number; bytes_sparse?: number }; warm?: WarmState } }

/** The source disk on the datastore: the tiny guest at offset 0, random data over two thirds from a sixth on. */
const makeSource = (s: PlanStack) => makeSourceDisk(s, { name: 'bw', mac: '00:50:56:37:06:01', bytes: DISK, dataAt: DATA_AT, data: DATA });

/** 1% of the disk written in random 1 MiB ranges inside the data, as the running guest would. */
function writePercent(extent: string) {
  const b = Buffer.alloc(MIB);
  const fd = openSync(extent, 'r+');
  try { for (let n = 0; n < DISK / 100 / MIB; n++) { randomFillSync(b); writeSync(fd, b, 0, b.length, DATA_AT + randomInt(0, DATA / MIB - 1) * MIB); } } finally { closeSync(fd); }
}

async function job(s: PlanStack, warm?: Record<string, unknown>): Promise<string> {
  const parameters = { vm_path: s.vm('bw'), source_type: 'vsphere', destination: { type: 'kvm', virt_uri: s.lv.uri }, network_mapping: { 'VM Network': s.net }, pool: s.lv.pool, power_off: 'force', parallel_downloads: 4, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 900 }, ...(warm ? { warm } : {}) };
  const r = await req<{ job_id: string }>(s.url, 'POST', '/jobs/operation', { operation: 'migrate_vm', parameters });
  if (r.status !== 201) throw new Error(`submitting the job: ${r.status} ${r.text}`);
  return r.body.job_id;
}

const record = async (s: PlanStack, id: string) => (await req<Rec>(s.url, 'GET', `/jobs/${id}/record`)).body;
const ended = (s: PlanStack, id: string) => until(async () => { const r = await record(s, id); return ['completed', 'failed', 'cancelled'].includes(r.status) && r; }, 7_200_000, `job ${id}`);
const removeTarget = async (s: PlanStack) => {
  await s.lv.virsh(['destroy', 'bw']).catch(tolerate('destroy bw'));
  await s.lv.virsh(['undefine', 'bw', '--remove-all-storage']).catch(tolerate('undefine bw'));
};

async function warmRun(s: PlanStack, extent: string) {
  await powerOn(s.m, s.vm('bw'));
  const id = await job(s, { precopy_interval: 5 });
  const rounds = async (n: number) => until(async () => { const w = JSON.parse((await s.rc.hget(keys('benchwarm').job(id), 'warm')) || 'null') as WarmState | null; return (w?.rounds.length ?? 0) >= n && w; }, 7_200_000, `round ${n}`);
  for (let n = 1; n <= 3; n++) { await rounds(n); writePercent(extent); }
  await rounds(4);
  writePercent(extent); // the guest writes on until its power-off: the last delta carries 1% as well
  await requestCutover(s.rc, keys('benchwarm'), id, 'bench:warm');
  const r = await ended(s, id);
  if (r.status !== 'completed') throw new Error(`the warm job ended ${r.status}: ${r.error}`);
  return r.result!.warm!;
}

async function main() {
  const commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  const s = await startPlanStack({ prefix: 'benchwarm', workers: { bw: 1 } });
  try {
    const extent = await makeSource(s);
    await powerOn(s.m, s.vm('bw'));
    const loads = [`before: ${load()}`];
    const cold = await ended(s, await job(s));
    if (cold.status !== 'completed') throw new Error(`the cold job ended ${cold.status}: ${cold.error}`);
    loads.push(`after cold: ${load()}`);
    const st = cold.result!.stage_seconds!;
    const coldDown = (ms(cold.completed_at) - ms(cold.started_at)) / 1000;
    const coldBytes = cold.result!.export.total_bytes - (cold.result!.export.bytes_sparse ?? 0);
    // Two warm runs: the first predicts its repair from the cold one (no warm cutover measured yet on this Ferry), the
    // second from the first's (the steady state of a Ferry that has cut over before): both are printed.
    const warms: WarmState[] = [];
    for (let n = 1; n <= WARM_RUNS; n++) {
      await removeTarget(s);
      warms.push(await warmRun(s, extent));
      loads.push(`after warm ${n}: ${load()}`);
    }
    const f = (x: number) => x.toFixed(1);
    console.log(`bench:warm, commit ${commit}, ${os.cpus().length} CPUs, disk ${f(DISK / GIB)} GiB (${f(DATA / GIB)} GiB random data), 1% written between rounds; load average (1, 5, 15 min) ${loads.join('; ')}`);
    console.log(`  cold downtime ${f(coldDown)} s: copy ${f(coldDown - st.repair - st.import - st.boot)}, repair ${f(st.repair)}, import ${f(st.import)}, boot ${f(st.boot)}`);
    for (const [i, w] of warms.entries()) {
      const d = w.downtime!;
      const after = w.cutover!.last_delta_bytes ?? 0;
      const predicted = w.prediction!.seconds;
      const judged = i === warms.length - 1 ? 'target within 25%' : 'shown, not judged';
      console.log(`  warm ${i + 1} downtime ${f(d.seconds)} s: power-off ${f(d.parts.power_off)}, last delta ${f(d.parts.last_delta)}, repair ${f(d.parts.repair)}, import ${f(d.parts.import)}, boot ${f(d.parts.boot)} (${w.rounds.length} rounds: ${w.rounds.map((x) => `${x.bytes_copied} B in ${f(x.seconds)} s`).join(', ')})`);
      console.log(`    bytes after power-off: warm ${after}, cold ${coldBytes} (${((after / coldBytes) * 100).toFixed(2)}%; target <= 5%: ${after <= coldBytes * 0.05 ? 'met' : 'NOT met'})`);
      console.log(`    predicted ${f(predicted)} s against measured ${f(d.seconds)} s (${(((predicted - d.seconds) / d.seconds) * 100).toFixed(1)}%; ${judged}${judged.startsWith('target') ? `: ${Math.abs(predicted - d.seconds) <= 0.25 * d.seconds ? 'met' : 'NOT met'}` : ''}); ${w.prediction!.basis}`);
    }
  } finally {
    await removeTarget(s);
    await s.stop();
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
