// Plans watched live and plans that lose a worker, with real parts: the daemon and two workers as processes,
// the simulator, the tests' libvirtd, a real Redis. Each VM's disk holds random data, so its shape B job exports
// for real and fails at the guest inspection (fast, and a real job end to end; the rollback follows).
//  - a client on /ws and one on GET /plans/{id}/events/stream see the plan go from running to its final status,
//    and their last view shows what GET /plans/{id} shows;
//  - a worker SIGKILLed while it holds a VM's job and slots changes nothing but time: the plan ends with every
//    VM final, the killed job was requeued or failed as the job protocol says, the dead worker's slot leases are
//    gone from Redis, and the limits (1 per ESXi host) were never exceeded (sampled).
import { expect } from 'chai';
import yaml from 'js-yaml';
import { req, until } from '../helpers/http';
import { openSse } from '../helpers/sse';
import { openWs } from '../helpers/ws';
import { makeDisks } from '../vsphere/fixture';
import { PlanStack, startPlanStack } from './fixture';
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

describe('plans: live events and a worker killed mid-plan @vm', function () {
  this.timeout(600_000);
  let s: PlanStack;
  let B: string;
  const HOSTS: Record<string, string> = { a0: 'DC0_H0', a1: 'DC0_H0', b0: 'DC0_C0_H0', b1: 'DC0_C0_H0' };
  const plan = (id: string, vms: string[], extra: Record<string, unknown> = {}) => s.plan(id, vms, extra);
  const get = (id: string) => s.get(id);
  const statuses = (p: Pick<PlanView, 'vms'>) => Object.fromEntries(p.vms.map((x) => [x.vm_path, x.status]));

  before(async function () {
    this.timeout(300_000);
    s = await startPlanStack({ prefix: PREFIX, workers: { w1: 2, w2: 2 }, leaseSeconds: 5 });
    B = s.url;
    const disks = makeDisks(s.dir, 2);
    let mac = 0x10;
    for (const [name, host] of Object.entries(HOSTS)) {
      await s.addVm({ name, host, ds: host === 'DC0_H0' ? 'LocalDS_0' : 'LocalDS_1', mac: `00:50:56:03:00:${(mac++).toString(16)}` }, { path: disks.sparse, bytes: disks.bytes });
    }
  });
  after(async () => { await s?.stop(); });

  it('plan_update on /ws and the plan SSE stream (both path forms) show the plan from running to final, ending with what GET shows', async () => {
    const c = await req(B, 'POST', '/plans', plan('watch', ['a0', 'b0'], { limits: { per_plan: 2 } }));
    expect(c.status, c.text).to.equal(201);
    expect((await req(B, 'GET', '/plans/nope/events/stream')).status).to.equal(404);
    const ws = openWs<WsMsg>(B.replace(/^http/, 'ws') + '/ws');
    await ws.opened;
    const sse = openSse<PlanFrame>(`${B}/plans/watch/events/stream`);
    const sse2 = openSse<PlanFrame>(`${B}/api/v1/plans/watch/events/stream`);
    // The stream opens with the current view: the plan not started yet.
    await sse.waitFor((f) => f.some((x) => x.event === 'plan'));
    expect(sse.status).to.equal(200);
    expect(sse.frames[0].data).to.include({ id: 'watch', status: 'pending' });
    const st = await req(B, 'POST', '/plans/watch/start');
    expect(st.status, st.text).to.equal(200);

    // Each stream ends by itself once the plan is final.
    await within(Promise.all([sse.closed, sse2.closed]), 300_000, 'the plan streams to end');
    const end = await get('watch');
    expect(end.status).to.be.oneOf(FINAL);
    const planFrames = sse.frames.filter((f) => f.event === 'plan').map((f) => f.data as PlanView);
    expect(planFrames.map((p) => p.status)).to.include('running');
    const last = planFrames[planFrames.length - 1];
    expect(last.status).to.equal(end.status);
    expect(statuses(last)).to.deep.equal(statuses(end));
    expect(last.counts).to.deep.equal(end.counts);
    expect(sse.frames[sse.frames.length - 1]).to.deep.include({ event: 'complete', data: { status: end.status } });
    expect(sse2.frames[sse2.frames.length - 1]).to.deep.include({ event: 'complete', data: { status: end.status } });
    // Each frame is a real change: no two in a row are the same view.
    for (let i = 1; i < planFrames.length; i++) expect(JSON.stringify({ ...planFrames[i], updated_at: 0 }), `frame ${i}`).to.not.equal(JSON.stringify({ ...planFrames[i - 1], updated_at: 0 }));
    // A VM's own progress shows in the plan: some view had a VM running with its job's stage.
    expect(planFrames.some((p) => p.vms.some((x) => x.status === 'running' && x.job_id))).to.equal(true);

    // The WebSocket saw the same plan go from running to the final status, its last view matching the GET.
    const ups: PlanUpdate[] = await until(() => {
      const u = ws.msgs.filter((x): x is PlanUpdate => x.type === 'plan_update' && x.data.id === 'watch');
      return u.length > 0 && u[u.length - 1].data.status === end.status && u;
    }, 10_000, 'the final plan_update');
    expect(ups.map((u) => u.data.status)).to.include('running');
    expect(ups[ups.length - 1]).to.have.property('timestamp');
    expect(statuses(ups[ups.length - 1].data)).to.deep.equal(statuses(end));
    // Coalesced: at most one update per plan per 500 ms (a little slack for timers).
    for (let i = 1; i < ups.length; i++) expect(ups[i].at - ups[i - 1].at, `update ${i}`).to.be.at.least(400);
    ws.ws.close();

    // A client that reconnects to a final plan (EventSource sends Last-Event-ID) is told the stream is over.
    const again = openSse(`${B}/plans/watch/events/stream`, '1');
    await again.closed;
    expect(again.status).to.equal(204);
    // The route is in the OpenAPI document, role read.
    const doc = yaml.load((await req(B, 'GET', '/openapi.yaml')).text) as OpenApiDoc;
    // (one path per route; the document's servers give both forms, / and /api/v1, as sse2 used above)
    expect(doc.paths['/plans/{id}/events/stream']?.get?.['x-ferry-role']).to.equal('read');
    expect(doc.servers.map((x) => x.url)).to.include('/api/v1');
  });

  it('a worker SIGKILLed while it holds a VM job and its slots changes nothing but time', async () => {
    const c = await req(B, 'POST', '/plans', plan('kill', Object.keys(HOSTS), { limits: { per_plan: 4, per_esxi_host: 1 } }));
    expect(c.status, c.text).to.equal(201);
    const st = await req(B, 'POST', '/plans/kill/start');
    expect(st.status, st.text).to.equal(200);
    const hostSlots = ['DC0_H0', 'DC0_C0_H0'].map((h) => `esxi:${s.manager}:${h}`);
    const max: Record<string, number> = {};
    let samples = 0;
    const sample = async () => {
      for (const k of hostSlots) max[k] = Math.max(max[k] ?? 0, (await s.holders(k)).length);
      // And from the jobs' side: RUNNING jobs per ESXi host.
      const p = await get('kill');
      const running: Record<string, number> = {};
      for (const x of p.vms) if (x.job_status === 'running') { const h = HOSTS[x.vm_path.split('/').pop()!]; running[h] = (running[h] ?? 0) + 1; }
      for (const [h, n] of Object.entries(running)) max[`jobs:${h}`] = Math.max(max[`jobs:${h}`] ?? 0, n);
      samples++;
      return p;
    };

    // A job RUNNING on a worker that holds its ESXi host slot: kill that worker.
    const victim = await until(async () => {
      await sample();
      for (const x of (await get('kill')).vms) {
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

    let p: PlanView;
    for (;;) {
      p = await sample();
      if (FINAL.includes(p.status)) break;
      await new Promise((r) => setTimeout(r, 150));
    }
    expect(samples).to.be.greaterThan(5);
    for (const [k, n] of Object.entries(max)) expect(n, `${k} (max over ${samples} samples)`).to.be.at.most(1);

    // Every VM ended final (these jobs fail at the guest inspection, so each is rolled back).
    for (const x of p.vms) expect(x.status, `${x.vm_path}: ${x.error}`).to.be.oneOf(['rolled_back', 'failed', 'completed']);
    // The killed job: its lease was lost and the protocol requeued it (then it ran again and ended) or failed it.
    const job = (await req<DaemonJob>(B, 'GET', `/jobs/${victim.job}`)).body;
    expect(job.status).to.be.oneOf(['failed', 'completed']);
    // (the record's state history, as stored: the reasons of its transitions)
    const hist = (await s.rc.hget(`${PREFIX}:job:${victim.job}`, 'history')) || '';
    console.log(`      the killed job: ${job.status}; ${JSON.stringify(job.error)}`);
    expect(hist, 'the history names the lost lease').to.match(new RegExp(`worker ${victim.worker} lost its lease|lease expired`));
    // No slot lease of the plan stays live: the dead worker's go with their lease (a requeued job that ran again
    // under the same id released them itself), within the slot lease (3 x FERRY_LEASE_SECONDS).
    const names = [...hostSlots, 'plan:kill', `datastore:${s.manager}:LocalDS_0`, `datastore:${s.manager}:LocalDS_1`, `target:${s.lv.uri}`];
    const left = async () => { const out: Record<string, string[]> = {}; for (const k of names) { const h = await s.holders(k); if (h.length) out[k] = h; } return out; };
    console.log(`      slot holders live when the plan ended: ${JSON.stringify(await left())}`);
    await until(async () => !Object.keys(await left()).length, 20_000, 'every slot lease of the plan to be gone');
    expect(await s.holders(`esxi:${s.manager}:${victim.host}`)).to.not.include(victim.job);
  });
});
