// Plans watched live and plans that lose a worker, with real parts: the daemon and two workers as processes,
// the simulator, the tests' libvirtd, a real Redis. Each VM's disk holds random data, so its shape B job exports
// for real and fails at the guest inspection (fast, and a real job end to end; the rollback follows).
//  - a client on /ws and one on GET /plans/{id}/events/stream see the plan go from running to its final status,
//    and their last view shows what GET /plans/{id} shows;
//  - a worker SIGKILLed while it holds a VM's job and slots changes nothing but time: the plan ends with every
//    VM final, the killed job was requeued or failed as the job protocol says, the dead worker's slot leases are
//    gone from Redis, and the limits (1 per ESXi host) were never exceeded (sampled).
// Each test is a reused proof (test/helpers/proofs.ts): what it read while the plan ran is its evidence, and with
// every input unchanged the same check() re-asserts the evidence of the last passing run; the stack starts only
// when a proof runs fresh.
import { expect } from 'chai';
import yaml from 'js-yaml';
import { answer, req, until, type Answer } from '../helpers/http';
import { openSse } from '../helpers/sse';
import { openWs } from '../helpers/ws';
import { makeDisks } from '../vsphere/fixture';
import { PlanStack, startPlanStack } from './fixture';
import { reusedProof } from '../helpers/proofs';
import type { Frame } from '../helpers/sse';
import type { DaemonJob, PlanView } from '../helpers/api-types';

/** A message on the daemon's /ws: `plan_update` carries a plan view; the others are not read here. */
type WsMsg = { type: 'plan_update'; timestamp: string; data: PlanView } | { type: 'jobs' | 'job_update' | 'status' | 'metrics' | 'schedule_event'; timestamp: string; data: unknown };
type PlanUpdate = Extract<WsMsg, { type: 'plan_update' }> & { at: number };
/** A plan's SSE stream: `plan` frames carry the view, the last (`complete`) only the final status. */
type PlanFrame = PlanView | { status: string };
/** The parts of the OpenAPI document read here. */
interface OpenApiDoc { paths: Record<string, Record<string, { 'x-ferry-role'?: string }>>; servers: Array<{ url: string }> }

const FINAL = ['completed', 'failed', 'cancelled'];
const PREFIX = 'planlive';

/** `p`, or an error naming `what` after `ms` (a stream that never ends fails the test instead of hanging it). */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let t: NodeJS.Timeout;
  return Promise.race([p, new Promise<T>((_, rej) => { t = setTimeout(() => rej(new Error(`timed out waiting for ${what}`)), ms); })]).finally(() => clearTimeout(t));
}

const HOSTS: Record<string, string> = { a0: 'DC0_H0', a1: 'DC0_H0', b0: 'DC0_C0_H0', b1: 'DC0_C0_H0' };
const statuses = (p: Pick<PlanView, 'vms'>) => Object.fromEntries(p.vms.map((x) => [x.vm_path, x.status]));

/** What the watchers saw: both streams' frames, the WebSocket's plan updates, the plan as GET shows it at the end. */
interface WatchEvidence {
  created: Answer; unknownStream: number; started: Answer;
  sseStatus: number; frames: Frame<PlanFrame>[]; frames2: Frame<PlanFrame>[];
  end: PlanView; ups: PlanUpdate[]; reconnected: number; role?: string; servers: string[];
}

/** What the plan whose worker was killed left: the samples' highest counts, the killed job, the slot holders. */
interface KillEvidence {
  created: Answer; started: Answer;
  victim: { job: string; worker: string; host: string; vm: string };
  samples: number; max: Record<string, number>; end: PlanView;
  job: DaemonJob; history: string;
  /** the plan's slot holders still live once the slot lease passed (empty when all went) */
  leftAfter: Record<string, string[]>; victimHostHolders: string[];
}

async function startStack(): Promise<PlanStack> {
  const s = await startPlanStack({ prefix: PREFIX, workers: { w1: 2, w2: 2 }, leaseSeconds: 5 });
  const disks = makeDisks(s.dir, 2);
  let mac = 0x10;
  for (const [name, host] of Object.entries(HOSTS)) {
    await s.addVm({ name, host, ds: host === 'DC0_H0' ? 'LocalDS_0' : 'LocalDS_1', mac: `00:50:56:03:00:${(mac++).toString(16)}` }, { path: disks.sparse, bytes: disks.bytes });
  }
  return s;
}

async function watch(s: PlanStack): Promise<WatchEvidence> {
  const B = s.url;
  const created = answer(await req(B, 'POST', '/plans', s.plan('watch', ['a0', 'b0'], { limits: { per_plan: 2 } })));
  if (created.status !== 201) throw new Error(`POST /plans: ${created.status} ${created.text}`);
  const unknownStream = (await req(B, 'GET', '/plans/nope/events/stream')).status;
  const ws = openWs<WsMsg>(B.replace(/^http/, 'ws') + '/ws');
  await ws.opened;
  const sse = openSse<PlanFrame>(`${B}/plans/watch/events/stream`);
  const sse2 = openSse<PlanFrame>(`${B}/api/v1/plans/watch/events/stream`);
  // The stream opens with the current view (the plan not started yet) before the start.
  await sse.waitFor((f) => f.some((x) => x.event === 'plan'));
  const started = answer(await req(B, 'POST', '/plans/watch/start'));
  // Each stream ends by itself once the plan is final.
  await within(Promise.all([sse.closed, sse2.closed]), 300_000, 'the plan streams to end');
  const end = await s.get('watch');
  // The WebSocket's last plan_update is the final status (it may trail the streams' end by a coalescing period).
  const ups: PlanUpdate[] = await until(() => {
    const u = ws.msgs.filter((x): x is PlanUpdate => x.type === 'plan_update' && x.data.id === 'watch');
    return u.length > 0 && u[u.length - 1].data.status === end.status && u;
  }, 10_000, 'the final plan_update');
  ws.ws.close();
  // A client that reconnects to a final plan (EventSource sends Last-Event-ID).
  const again = openSse(`${B}/plans/watch/events/stream`, '1');
  await again.closed;
  const doc = yaml.load((await req(B, 'GET', '/openapi.yaml')).text) as OpenApiDoc;
  const e: WatchEvidence = {
    created, unknownStream, started, sseStatus: sse.status, frames: sse.frames, frames2: sse2.frames, end, ups, reconnected: again.status,
    role: doc.paths['/plans/{id}/events/stream']?.get?.['x-ferry-role'], servers: doc.servers.map((x) => x.url),
  };
  return JSON.parse(JSON.stringify(e)) as WatchEvidence;
}

function checkWatch(e: WatchEvidence) {
  expect(e.created.status, e.created.text).to.equal(201);
  expect(e.unknownStream).to.equal(404);
  expect(e.sseStatus).to.equal(200);
  expect(e.frames[0].data).to.include({ id: 'watch', status: 'pending' });
  expect(e.started.status, e.started.text).to.equal(200);
  const end = e.end;
  expect(end.status).to.be.oneOf(FINAL);
  const planFrames = e.frames.filter((f) => f.event === 'plan').map((f) => f.data as PlanView);
  expect(planFrames.map((p) => p.status)).to.include('running');
  const last = planFrames[planFrames.length - 1];
  expect(last.status).to.equal(end.status);
  expect(statuses(last)).to.deep.equal(statuses(end));
  expect(last.counts).to.deep.equal(end.counts);
  expect(e.frames[e.frames.length - 1]).to.deep.include({ event: 'complete', data: { status: end.status } });
  expect(e.frames2[e.frames2.length - 1]).to.deep.include({ event: 'complete', data: { status: end.status } });
  // Each frame is a real change: no two in a row are the same view.
  for (let i = 1; i < planFrames.length; i++) expect(JSON.stringify({ ...planFrames[i], updated_at: 0 }), `frame ${i}`).to.not.equal(JSON.stringify({ ...planFrames[i - 1], updated_at: 0 }));
  // A VM's own progress shows in the plan: some view had a VM running with its job's stage.
  expect(planFrames.some((p) => p.vms.some((x) => x.status === 'running' && x.job_id))).to.equal(true);

  // The WebSocket saw the same plan go from running to the final status, its last view matching the GET.
  const ups = e.ups;
  expect(ups.map((u) => u.data.status)).to.include('running');
  expect(ups[ups.length - 1].data.status).to.equal(end.status);
  expect(ups[ups.length - 1]).to.have.property('timestamp');
  expect(statuses(ups[ups.length - 1].data)).to.deep.equal(statuses(end));
  // Coalesced: at most one update per plan per 500 ms (a little slack for timers).
  for (let i = 1; i < ups.length; i++) expect(ups[i].at - ups[i - 1].at, `update ${i}`).to.be.at.least(400);

  // A client that reconnects to a final plan is told the stream is over.
  expect(e.reconnected).to.equal(204);
  // The route is in the OpenAPI document, role read; the document's servers give both forms, / and /api/v1.
  expect(e.role).to.equal('read');
  expect(e.servers).to.include('/api/v1');
}

async function killWorker(s: PlanStack): Promise<KillEvidence> {
  const B = s.url;
  const created = answer(await req(B, 'POST', '/plans', s.plan('kill', Object.keys(HOSTS), { limits: { per_plan: 4, per_esxi_host: 1 } })));
  if (created.status !== 201) throw new Error(`POST /plans: ${created.status} ${created.text}`);
  const started = answer(await req(B, 'POST', '/plans/kill/start'));
  const hostSlots = ['DC0_H0', 'DC0_C0_H0'].map((h) => `esxi:${s.manager}:${h}`);
  const max: Record<string, number> = {};
  let samples = 0;
  const sample = async () => {
    for (const k of hostSlots) max[k] = Math.max(max[k] ?? 0, (await s.holders(k)).length);
    // And from the jobs' side: RUNNING jobs per ESXi host.
    const p = await s.get('kill');
    const running: Record<string, number> = {};
    for (const x of p.vms) if (x.job_status === 'running') { const h = HOSTS[x.vm_path.split('/').pop()!]; running[h] = (running[h] ?? 0) + 1; }
    for (const [h, n] of Object.entries(running)) max[`jobs:${h}`] = Math.max(max[`jobs:${h}`] ?? 0, n);
    samples++;
    return p;
  };

  // A job RUNNING on a worker that holds its ESXi host slot: kill that worker.
  const victim = await until(async () => {
    await sample();
    for (const x of (await s.get('kill')).vms) {
      if (!x.job_id) continue;
      const h = await s.rc.hgetall(`${PREFIX}:job:${x.job_id}`);
      if (h.state !== 'RUNNING' || !s.workers[h.worker_id]) continue;
      const host = HOSTS[x.vm_path.split('/').pop()!];
      if ((await s.holders(`esxi:${s.manager}:${host}`)).includes(x.job_id)) return { job: x.job_id, worker: h.worker_id, host, vm: x.vm_path };
    }
    return null;
  }, 120_000, 'a plan job running with its slots');
  await s.workers[victim.worker].kill();
  console.log(`      SIGKILLed ${victim.worker} holding job ${victim.job} (${victim.vm}, ESXi host ${victim.host})`);

  let end: PlanView;
  for (;;) {
    end = await sample();
    if (FINAL.includes(end.status)) break;
    await new Promise((r) => setTimeout(r, 150));
  }
  const job = (await req<DaemonJob>(B, 'GET', `/jobs/${victim.job}`)).body;
  console.log(`      the killed job: ${job.status}; ${JSON.stringify(job.error)}`);
  // (the record's state history, as stored: the reasons of its transitions)
  const history = (await s.rc.hget(`${PREFIX}:job:${victim.job}`, 'history')) || '';
  // The plan's slot leases, until they are gone or the slot lease (3 x FERRY_LEASE_SECONDS) has long passed.
  const names = [...hostSlots, 'plan:kill', `datastore:${s.manager}:LocalDS_0`, `datastore:${s.manager}:LocalDS_1`, `target:${s.lv.uri}`];
  const left = async () => { const out: Record<string, string[]> = {}; for (const k of names) { const h = await s.holders(k); if (h.length) out[k] = h; } return out; };
  console.log(`      slot holders live when the plan ended: ${JSON.stringify(await left())}`);
  const leftAfter = await until(async () => { const l = await left(); return !Object.keys(l).length && l; }, 20_000, 'every slot lease of the plan to be gone').catch(() => left());
  const victimHostHolders = await s.holders(`esxi:${s.manager}:${victim.host}`);
  const e: KillEvidence = { created, started, victim, samples, max, end, job, history, leftAfter, victimHostHolders };
  return JSON.parse(JSON.stringify(e)) as KillEvidence;
}

function checkKill(e: KillEvidence) {
  expect(e.created.status, e.created.text).to.equal(201);
  expect(e.started.status, e.started.text).to.equal(200);
  expect(e.samples).to.be.greaterThan(5);
  for (const [k, n] of Object.entries(e.max)) expect(n, `${k} (max over ${e.samples} samples)`).to.be.at.most(1);
  expect(e.end.status).to.be.oneOf(FINAL);
  // Every VM ended final (these jobs fail at the guest inspection, so each is rolled back).
  for (const x of e.end.vms) expect(x.status, `${x.vm_path}: ${x.error}`).to.be.oneOf(['rolled_back', 'failed', 'completed']);
  // The killed job: its lease was lost and the protocol requeued it (then it ran again and ended) or failed it.
  expect(e.job.status).to.be.oneOf(['failed', 'completed']);
  expect(e.history, 'the history names the lost lease').to.match(new RegExp(`worker ${e.victim.worker} lost its lease|lease expired`));
  // No slot lease of the plan stays live: the dead worker's go with their lease (a requeued job that ran again
  // under the same id released them itself), within the slot lease (3 x FERRY_LEASE_SECONDS).
  expect(e.leftAfter, 'slot leases of the plan still live after the slot lease').to.deep.equal({});
  expect(e.victimHostHolders).to.not.include(e.victim.job);
}

describe('plans: live events and a worker killed mid-plan @vm', function () {
  this.timeout(900_000);
  let s: PlanStack | undefined;
  /** The stack both proofs share, started by the first that runs fresh. */
  const stack = async () => (s ??= await startStack());
  after(async () => { await s?.stop(); });

  it('plan_update on /ws and the plan SSE stream (both path forms) show the plan from running to final, ending with what GET shows', async () => {
    await reusedProof({ name: 'plans-live-watch', entries: [__filename] }, async () => watch(await stack()), checkWatch);
  });

  it('a worker SIGKILLed while it holds a VM job and its slots changes nothing but time', async () => {
    await reusedProof({ name: 'plans-live-kill', entries: [__filename] }, async () => killWorker(await stack()), checkKill);
  });
});
