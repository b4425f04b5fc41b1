// options.remove_source is checked again when the source would be removed, not only when the plan starts (docs/plans.md
// "What each role may do through a plan"): two plans with remove_source, each started by an admin key, each
// migrating the tiny real guest to the end (exported, repaired, imported, its boot seen). While their jobs run,
// the daemon is restarted with other keys: one starter's key now has role submit, the other's is gone. Both
// migrations complete, and neither source is removed: both VMs are still in the simulator's inventory, each VM
// says why (`source: remove_failed`), and no removal was claimed nor any remove_source job submitted.
// A reused proof (test/helpers/proofs.ts): what the test read is its evidence, and with every input unchanged the
// same check() re-asserts the evidence of the last passing run; the stack starts only when it runs.
import { expect } from 'chai';
import path from 'node:path';
import { req, until } from '../helpers/http';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { vmDetail } from '../../domain/vsphere/inventory';
import { keys } from '../../platform/redis';
import { startDaemonProc } from '../helpers/procs';
import { PlanStack, startPlanStack } from './fixture';
import { fixtureInputs, reusedProof } from '../helpers/proofs';
import type { PlanView } from '../helpers/api-types';

const PREFIX = 'planrsstarter';
const K = { ops: 'rs-ops-admin-key-0123456789', ops2: 'rs-ops2-admin-key-012345678', opsNow: 'rs-ops-submit-key-012345678' };

const as = (key: string) => ({ 'x-api-key': key });
const PLANS = [['demoted', 'k0', K.ops], ['revoked', 'k1', K.ops2]] as const;

/** Per plan: the create and start answers, the plan as it ended, what is left of the removal, the VM on both sides. */
interface PlanEvidence {
  created: number; started: { status: number; text: string; role?: string | null }; plan: PlanView;
  removeJobs: number; inInventory: string; onTarget: string;
}
type Evidence = Record<'demoted' | 'revoked', PlanEvidence>;

async function run(tiny: string): Promise<Evidence> {
  const s = await startPlanStack({ prefix: PREFIX, workers: { w1: 2 }, env: { FERRY_API_KEYS: `ops:admin:${K.ops},ops2:admin:${K.ops2}` } });
  try { return await demoteMidRun(s, tiny); } finally { await s.stop(); }
}

async function demoteMidRun(s: PlanStack, tiny: string): Promise<Evidence> {
  await s.addVm({ name: 'k0', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:08:00:10' }, { path: tiny, bytes: TINY_GUEST_BYTES });
  await s.addVm({ name: 'k1', host: 'DC0_C0_H0', ds: 'LocalDS_1', mac: '00:50:56:08:00:11' }, { path: tiny, bytes: TINY_GUEST_BYTES });
  const options = { power_off: 'force', remove_source: true, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 180 } };
  const asked: Record<string, Pick<PlanEvidence, 'created' | 'started'>> = {};
  for (const [id, vm, key] of PLANS) {
    const created = (await req(s.url, 'POST', '/plans', s.plan(id, [vm], { options }), as(key))).status;
    const st = await req<PlanView>(s.url, 'POST', `/plans/${id}/start`, undefined, as(key));
    asked[id] = { created, started: { status: st.status, text: st.text, role: st.body.started_by?.role } };
  }
  // Both jobs under way, then the daemon comes back with ops demoted to submit and ops2's key gone.
  for (const [id] of PLANS) await until(async () => (await req<PlanView>(s.url, 'GET', `/plans/${id}`, undefined, as(K.ops))).body.vms[0].job_id, 120_000, `${id}'s job`);
  const old = s.daemons[0];
  await old.stop();
  const now = await startDaemonProc({ ...s.env, FERRY_API_KEYS: `ops:submit:${K.opsNow}` }, path.join(s.dir, 'daemon.yaml'));
  s.daemons.push(now);
  const get = async (id: string) => (await req<PlanView>(now.url, 'GET', `/plans/${id}`, undefined, as(K.opsNow))).body;

  const e: Partial<Evidence> = {};
  for (const [id, vm] of PLANS) {
    const plan = await until(async () => { const x = await get(id); return ['completed', 'failed', 'cancelled'].includes(x.status) && x; }, 1_200_000, `plan ${id} to end`);
    e[id] = {
      ...asked[id], plan,
      removeJobs: await s.rc.exists(keys(PREFIX).job(`${plan.vms[0].job_id}.remove_source`)),
      inInventory: await vmDetail(s.m, s.vm(vm)).then((d) => d.name, (err: Error) => err.message),
      onTarget: (await s.lv.virsh(['domstate', vm])).trim(),
    };
  }
  return JSON.parse(JSON.stringify(e)) as Evidence;
}

function check(e: Evidence) {
  for (const [id, vm, why] of [['demoted', 'k0', /starter "ops" has role submit/], ['revoked', 'k1', /starter "ops2" has no API key on this daemon/]] as const) {
    const x = e[id];
    expect(x.created, id).to.equal(201);
    expect(x.started.status, x.started.text).to.equal(200);
    expect(x.started.role, `${id}: started by an admin`).to.equal('admin');
    const v = x.plan.vms[0];
    expect(v.status, v.error!).to.equal('completed');
    expect(v.source?.action, id).to.equal('remove_failed');
    expect(v.source?.detail, id).to.match(why);
    expect((v.actions ?? []).filter((a) => a.action === 'remove_source'), `${id}: no removal claimed`).to.deep.equal([]);
    expect(x.removeJobs, `${id}: no remove_source job`).to.equal(0);
    // The simulator still has the source; the migrated domain runs on the target.
    expect(x.inInventory, `${vm} in the simulator's inventory`).to.equal(vm);
    expect(x.onTarget, `${vm} on the target`).to.equal('running');
  }
}

describe('plans: remove_source needs the starter to be admin when the source would go, not only at start @vm', function () {
  this.timeout(1_800_000);

  it('a starter demoted to submit, and one whose key was removed, keep their sources after the migrations complete', async () => {
    const tiny = await ensureTinyGuest();
    await reusedProof({ name: 'plans-remove-source-starter', entries: [__filename], extra: fixtureInputs(tiny) }, () => run(tiny), check);
  });
});
