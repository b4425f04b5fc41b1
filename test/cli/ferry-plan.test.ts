// `ferry plan` as an operator runs a wave from a shell: a plan made from flags only (two VMs of the tiny real
// guest, the maps, options with a nested boot check), validated (no blockers: exit 0), started with --wait (the
// live view in a pipe: a new view only when something changed, one line per VM and a total bar) to the end (every
// VM completed: exit 0), then one VM rolled back with `ferry plan rollback` (an admin's key; a submit key gets
// 403); virsh and the plan's record checked.
// A reused proof (test/helpers/proofs.ts): the commands' output and what virsh and the API showed are its evidence,
// and with every input unchanged the same check() re-asserts the evidence of the last passing run; the stack starts
// only when it runs.
import { expect } from 'chai';
import { req } from '../helpers/http';
import type { PlanView } from '../helpers/api-types';
import { ferryCli } from '../helpers/procs';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { startPlanStack, type PlanStack } from '../plans/fixture';
import { fixtureInputs, reusedProof } from '../helpers/proofs';

const KEY = 'cli-plan-submit-key-0123456789';
const ADMIN = 'cli-plan-admin-key-0123456789';
type Cli = Awaited<ReturnType<typeof ferryCli>>;

/** The five commands' exits and output, the VMs' paths, and what virsh and the API showed after each. */
interface Evidence {
  vms: Record<'cli-a' | 'cli-b', string>; uri: string;
  created: Cli; validated: Cli; run: Cli; domstates: Record<string, string>;
  refused: Cli; rolled: Cli; status: Cli; domains: string[]; volumes: string[]; counts: PlanView['counts'];
}

async function run(disk: string): Promise<Evidence> {
  const s = await startPlanStack({ prefix: 'cliplan', workers: { w1: 2 }, env: { FERRY_API_KEYS: `ops:submit:${KEY},root:admin:${ADMIN}` } });
  try { return await planRun(s, disk); } finally { await s.stop(); }
}

async function planRun(s: PlanStack, disk: string): Promise<Evidence> {
  for (const [i, name] of ['cli-a', 'cli-b'].entries()) {
    await s.addVm({ name, host: 'DC0_H0', ds: 'LocalDS_0', mac: `00:50:56:06:00:0${i + 1}` }, { path: disk, bytes: TINY_GUEST_BYTES });
  }
  const env = { FERRY_URL: s.url, FERRY_API_KEY: KEY };
  const created = await ferryCli(['plan', 'create', '--name', 'cli run', '--vm', s.vm('cli-a'), '--vm', s.vm('cli-b'), '--virt-uri', s.lv.uri,
    '--network-map', `VM Network=${s.net}`, '--storage-map', `LocalDS_0=${s.lv.pool}`,
    '--option', 'power_off=force', '--option', `virt_test.expect=${TINY_GUEST_MARKER}`, '--option', 'virt_test.timeout_seconds=300', '--json'], env);
  if (created.code !== 0) throw new Error(`ferry plan create: exit ${created.code}: ${created.stderr}`);
  const id = (JSON.parse(created.stdout) as PlanView).id;
  const validated = await ferryCli(['plan', 'validate', id], env);
  const run = await ferryCli(['plan', 'start', id, '--wait', '--interval', '1'], env);
  const domstates: Record<string, string> = {};
  for (const n of ['cli-a', 'cli-b']) domstates[n] = (await s.lv.virsh(['domstate', n]).catch((err: Error) => err.message)).trim();
  // Rolling back is admin's (it deletes on the target): a submit key first, then an admin's.
  const refused = await ferryCli(['plan', 'rollback', id, s.vm('cli-a')], env);
  const rolled = await ferryCli(['plan', 'rollback', id, s.vm('cli-a')], { ...env, FERRY_API_KEY: ADMIN });
  const status = await ferryCli(['plan', 'status', id, '--json'], env);
  const e: Evidence = {
    vms: { 'cli-a': s.vm('cli-a'), 'cli-b': s.vm('cli-b') }, uri: s.lv.uri, created, validated, run, domstates, refused, rolled, status,
    domains: await s.domains(), volumes: await s.volumes(),
    counts: (await req<PlanView>(s.url, 'GET', `/plans/${id}`, undefined, { 'X-API-Key': KEY })).body.counts,
  };
  return JSON.parse(JSON.stringify(e)) as Evidence;
}

function check(e: Evidence) {
  expect(e.created.code, e.created.stderr).to.equal(0);
  const plan = JSON.parse(e.created.stdout) as PlanView;
  expect(plan.options.virt_test).to.deep.equal({ expect: TINY_GUEST_MARKER, timeout_seconds: 300 });
  expect(plan.destination).to.deep.include({ virt_uri: e.uri });

  expect(e.validated.code, e.validated.stdout + e.validated.stderr).to.equal(0);
  expect(e.validated.stdout).to.match(/no blockers/);

  expect(e.run.code, e.run.stdout + e.run.stderr).to.equal(0);
  const views = e.run.stdout.split(/^(?=plan cli run )/m).filter(Boolean);
  expect(views.length, 'a new view each time something changed').to.be.greaterThan(1);
  expect(views.some((v) => /cli-a\s+running/.test(v)), 'a view with a VM running').to.equal(true);
  const last = views[views.length - 1];
  expect(last).to.match(/^plan cli run completed: 2\/2 VMs done \[#+\]/);
  for (const n of ['cli-a', 'cli-b'] as const) expect(last).to.match(new RegExp(`${e.vms[n]}\\s+completed`));
  for (const n of ['cli-a', 'cli-b']) expect(e.domstates[n], n).to.equal('running');

  // A submit key gets the daemon's 403; an admin's rolls the VM back.
  expect(e.refused.code).to.equal(1);
  expect(e.refused.stderr).to.match(/403/);
  expect(e.rolled.code, e.rolled.stderr).to.equal(0);
  const status = JSON.parse(e.status.stdout) as PlanView;
  expect(Object.fromEntries(status.vms.map((x) => [x.vm_path, x.status]))).to.deep.equal({ [e.vms['cli-a']]: 'rolled_back', [e.vms['cli-b']]: 'completed' });
  expect(e.domains).to.not.include('cli-a');
  expect(e.domains).to.include('cli-b');
  expect(e.volumes.filter((x) => x.startsWith('cli-a'))).to.deep.equal([]);
  // The same through the API: the CLI showed what the daemon holds.
  expect(e.counts).to.deep.include({ rolled_back: 1, completed: 1 });
}

describe('the ferry command (a plan run to the end) @vm', function () {
  this.timeout(900_000);

  it('plan create from flags, validate (exit 0), start --wait to completed (exit 0, a live view per VM), rollback one VM', async () => {
    const disk = await ensureTinyGuest();
    await reusedProof({ name: 'cli-ferry-plan', entries: [__filename], extra: fixtureInputs(disk) }, () => run(disk), check);
  });
});
