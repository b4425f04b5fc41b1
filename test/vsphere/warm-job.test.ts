// Issue 37: the manual cutover of a warm shape B job submitted on its own (not by a plan), on both API dialects:
// the daemon's POST /jobs/{id}/cutover (here through `ferry job cutover`) and the 8000 API's POST
// /jobs/{job_id}/cutover. The request is recorded on the job (Redis `warm_cutover`) by the caller's key name, the
// job powers its VM off, copies the last delta, boots on the target and leaves no snapshot; a read key is refused
// (403), an unknown job is 404, and a cold job or an ended one is 409 on both APIs.
import { expect } from 'chai';
import { req, until } from '../helpers/http';
import { ferryCli, startGatewayProc } from '../helpers/procs';
import { TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { tinyFlatGuest } from './flat-guest';
import { createPlanVm, type PlanStack, startPlanStack } from '../plans/fixture';
import { powerOn, upload } from './fixture';
import { vmDetail } from '../../domain/vsphere/inventory';
import type { WarmState } from '../../domain/warm-predict';

const K = { ops: 'wj-ops-submit-key-0123456789', gw: 'wj-gw-submit-key-01234567890', viewer: 'wj-viewer-read-key-012345678' };
const BYTES = 32 * 1024 * 1024;
interface Rec { status: string; error?: string; result?: { warm: WarmState; boot: { status: string } } }

describe('warm migration: a job submitted on its own cuts over by hand, on both APIs (issue 37) @vm', function () {
  this.timeout(1_800_000);
  let s: PlanStack;
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  const as = (key: string) => ({ 'x-api-key': key });
  const warmOf = async (id: string) => JSON.parse((await s.rc.hget(`warmjob:job:${id}`, 'warm')) ?? 'null') as WarmState | null;
  const asked = async (id: string) => JSON.parse((await s.rc.hget(`warmjob:job:${id}`, 'warm_cutover')) ?? 'null') as { at: string; by: string | null } | null;
  const record = async (id: string) => (await req<Rec>(s.url, 'GET', `/jobs/${id}/record`, undefined, as(K.viewer))).body;
  const submit = async (vm: string, options: Record<string, unknown>) => {
    const r = await req<{ job_id: string }>(s.url, 'POST', '/jobs/submit', { vm_path: s.vm(vm), source: { type: 'vsphere' }, destination: { type: 'kvm', virt_uri: s.lv.uri }, options: { power_off: 'force', network_mapping: { 'VM Network': s.net }, ...options } }, as(K.ops));
    expect(r.status, r.text).to.be.oneOf([200, 201]);
    return r.body.job_id;
  };
  const addVm = async (name: string, mac: string, flat: { desc: string; extent: string }) => {
    await createPlanVm(s.m, { name, mac, disks: [{ ds: 'LocalDS_0', file: `${name}/boot.vmdk`, bytes: BYTES }] });
    await upload(s.v, flat.desc, `${name}/boot.vmdk`);
    await upload(s.v, flat.extent, `${name}/boot-flat.vmdk`);
    await powerOn(s.m, s.vm(name));
  };

  before(async function () {
    this.timeout(300_000);
    s = await startPlanStack({ prefix: 'warmjob', workers: { wj: 2 }, env: { FERRY_API_KEYS: `ops:submit:${K.ops},gwops:submit:${K.gw},viewer:read:${K.viewer}` } });
    const gwStarted = startGatewayProc(s.env);
    gwStarted.catch(() => undefined); // its failure is awaited below, not an unhandled rejection meanwhile
    const flat = await tinyFlatGuest(s.dir, BYTES);
    // Both VMs side by side, while the gateway starts.
    [gw] = await Promise.all([gwStarted, addVm('ja', '00:50:56:37:01:01', flat), addVm('jb', '00:50:56:37:01:02', flat)]);
  });
  after(async () => {
    // The domains these jobs made (the stack removes only those of its addVm) go from the run's shared libvirtd.
    for (const n of s ? (await s.domains()).filter((x) => x === 'ja' || x === 'jb') : []) {
      if ((await s.lv.virsh(['domstate', n])).trim() !== 'shut off') await s.lv.virsh(['destroy', n]);
      await s.lv.virsh(['undefine', n, '--nvram', '--remove-all-storage']);
    }
    await gw?.stop();
    await s?.stop();
  });

  it('refuses what is not a running warm job: 404 unknown, 409 a cold job, 403 a read key, on both APIs', async () => {
    for (const [base, p, key] of [[s.url, '/jobs', K.ops], [s.url, '/api/v1/jobs', K.ops], [gw.url, '/jobs', K.gw]] as const) {
      const r = await req<unknown>(base, 'POST', `${p}/00000000-0000-4000-8000-000000000000/cutover`, undefined, as(key));
      expect(r.status, `${base}${p}: ${r.text}`).to.equal(404);
    }
    // A cold job (of a VM that does not exist: it fails at once and copies nothing).
    const cold = await submit('nosuchvm', {});
    for (const [base, key] of [[s.url, K.ops], [gw.url, K.gw]] as const) {
      const r = await req<unknown>(base, 'POST', `/jobs/${cold}/cutover`, undefined, as(key));
      expect(r.status, r.text).to.equal(409);
      expect(r.text).to.match(/not a warm migration/);
      expect((await req(base, 'POST', `/jobs/${cold}/cutover`, undefined, as(K.viewer))).status, 'a read key').to.equal(403);
    }
    expect(await asked(cold), 'nothing recorded on the cold job').to.equal(null);
  });

  it('two warm jobs wait after round 1; each cuts over when asked (ferry job cutover, the 8000 API), by the caller\'s key name, and boots', async () => {
    const options = { warm: { precopy_interval: 3600 }, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 } };
    const ids = { ja: await submit('ja', options), jb: await submit('jb', options) };
    for (const id of Object.values(ids)) await until(async () => { const w = await warmOf(id); return w?.status === 'copying' && w.rounds.length >= 1; }, 600_000, `job ${id}: round 1 done`);
    // One hour between rounds: without the request nothing would happen now.
    expect((await vmDetail(s.m, s.vm('ja'))).power_state).to.equal('poweredOn');

    const cli = await ferryCli(['job', 'cutover', ids.ja], { FERRY_URL: s.url, FERRY_API_KEY: K.ops });
    expect(cli.code, cli.stderr).to.equal(0);
    expect(cli.stdout).to.match(new RegExp(`cutover of job ${ids.ja} requested by ops`));
    const g = await req<{ state: string; cutover_requested: { by: string } }>(gw.url, 'POST', `/jobs/${ids.jb}/cutover`, undefined, as(K.gw));
    expect(g.status, g.text).to.equal(200);
    expect(g.body.cutover_requested.by).to.equal('gwops');
    for (const [vm, by] of [['ja', 'ops'], ['jb', 'gwops']] as const) {
      expect((await asked(ids[vm]))?.by, `${vm}: recorded on the job`).to.equal(by);
    }
    // Asked again before it ends: 409 (already requested, or already cutting over), and the first request stands.
    const again = await req<{ error: string }>(s.url, 'POST', `/jobs/${ids.jb}/cutover`, undefined, as(K.ops));
    expect(again.status, again.text).to.equal(409);
    expect(again.body.error).to.match(/already (requested at .* by gwops|cutting over)/);
    expect((await asked(ids.jb))?.by, 'the first request is not overwritten').to.equal('gwops');

    for (const [vm, by] of [['ja', 'ops'], ['jb', 'gwops']] as const) {
      const r = await until(async () => { const x = await record(ids[vm]); return ['completed', 'failed', 'cancelled'].includes(x.status) && x; }, 1_200_000, `job ${vm} to end`);
      expect(r.status, `${vm}: ${r.error}`).to.equal('completed');
      const w = r.result!.warm;
      expect(w.cutover!.reason).to.equal(`cutover requested by ${by} at ${(await asked(ids[vm]))?.at}`);
      expect(w.rounds.length, 'round 1, then the last delta at cutover').to.equal(2);
      expect(r.result!.boot.status).to.equal('passed');
      const d = await vmDetail(s.m, s.vm(vm));
      expect(d.power_state, `${vm}: powered off at cutover`).to.equal('poweredOff');
      expect(d.snapshots, `${vm}: no snapshot left`).to.deep.equal([]);
      expect((await s.lv.virsh(['domstate', vm])).trim(), `${vm} on the target`).to.equal('running');
    }
    // Ended: a second request is a conflict on both APIs, and the first request stays as it was.
    for (const [base, key] of [[s.url, K.ops], [gw.url, K.gw]] as const) {
      const r = await req(base, 'POST', `/jobs/${ids.ja}/cutover`, undefined, as(key));
      expect(r.status, r.text).to.equal(409);
    }
    expect((await asked(ids.ja))?.by).to.equal('ops');
  });
});
