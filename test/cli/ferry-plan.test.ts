// `ferry plan` as an operator runs a wave from a shell: a plan made from flags only (two VMs of the tiny real
// guest, the maps, options with a nested boot check), validated (no blockers: exit 0), started with --wait (the
// live view in a pipe: a new view only when something changed, one line per VM and a total bar) to the end (every
// VM completed: exit 0), then one VM rolled back with `ferry plan rollback` (an admin's key; a submit key gets
// 403); virsh and the plan's record checked.
import { expect } from 'chai';
import { req } from '../helpers/http';
import type { PlanView } from '../helpers/api-types';
import { ferryCli } from '../helpers/procs';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { startPlanStack, type PlanStack } from '../plans/fixture';

const KEY = 'cli-plan-submit-key-0123456789';
const ADMIN = 'cli-plan-admin-key-0123456789';

describe('the ferry command (a plan run to the end) @vm', function () {
  this.timeout(900_000);
  let s: PlanStack;
  let env: Record<string, string>;

  before(async function () {
    this.timeout(600_000);
    const disk = await ensureTinyGuest();
    s = await startPlanStack({ prefix: 'cliplan', workers: { w1: 2 }, env: { FERRY_API_KEYS: `ops:submit:${KEY},root:admin:${ADMIN}` } });
    for (const [i, name] of ['cli-a', 'cli-b'].entries()) {
      await s.addVm({ name, host: 'DC0_H0', ds: 'LocalDS_0', mac: `00:50:56:06:00:0${i + 1}` }, { path: disk, bytes: TINY_GUEST_BYTES });
    }
    env = { FERRY_URL: s.url, FERRY_API_KEY: KEY };
  });
  after(async () => { await s?.stop(); });

  it('plan create from flags, validate (exit 0), start --wait to completed (exit 0, a live view per VM), rollback one VM', async () => {
    const created = await ferryCli(['plan', 'create', '--name', 'cli run', '--vm', s.vm('cli-a'), '--vm', s.vm('cli-b'), '--virt-uri', s.lv.uri,
      '--network-map', `VM Network=${s.net}`, '--storage-map', `LocalDS_0=${s.lv.pool}`,
      '--option', 'power_off=force', '--option', `virt_test.expect=${TINY_GUEST_MARKER}`, '--option', 'virt_test.timeout_seconds=300', '--json'], env);
    expect(created.code, created.stderr).to.equal(0);
    const plan = JSON.parse(created.stdout) as PlanView;
    expect(plan.options.virt_test).to.deep.equal({ expect: TINY_GUEST_MARKER, timeout_seconds: 300 });
    expect(plan.destination).to.deep.include({ virt_uri: s.lv.uri });

    const validated = await ferryCli(['plan', 'validate', plan.id], env);
    expect(validated.code, validated.stdout + validated.stderr).to.equal(0);
    expect(validated.stdout).to.match(/no blockers/);

    const run = await ferryCli(['plan', 'start', plan.id, '--wait', '--interval', '1'], env);
    expect(run.code, run.stdout + run.stderr).to.equal(0);
    const views = run.stdout.split(/^(?=plan cli run )/m).filter(Boolean);
    expect(views.length, 'a new view each time something changed').to.be.greaterThan(1);
    expect(views.some((v) => /cli-a\s+running/.test(v)), 'a view with a VM running').to.equal(true);
    const last = views[views.length - 1];
    expect(last).to.match(/^plan cli run completed: 2\/2 VMs done \[#+\]/);
    for (const n of ['cli-a', 'cli-b']) expect(last).to.match(new RegExp(`${s.vm(n)}\\s+completed`));
    for (const n of ['cli-a', 'cli-b']) expect((await s.lv.virsh(['domstate', n])).trim(), n).to.equal('running');

    // Rolling back is admin's (it deletes on the target): a submit key gets the daemon's 403.
    const refused = await ferryCli(['plan', 'rollback', plan.id, s.vm('cli-a')], env);
    expect(refused.code).to.equal(1);
    expect(refused.stderr).to.match(/403/);
    const rolled = await ferryCli(['plan', 'rollback', plan.id, s.vm('cli-a')], { ...env, FERRY_API_KEY: ADMIN });
    expect(rolled.code, rolled.stderr).to.equal(0);
    const status = JSON.parse((await ferryCli(['plan', 'status', plan.id, '--json'], env)).stdout) as PlanView;
    expect(Object.fromEntries(status.vms.map((x) => [x.vm_path, x.status]))).to.deep.equal({ [s.vm('cli-a')]: 'rolled_back', [s.vm('cli-b')]: 'completed' });
    const domains = await s.domains();
    expect(domains).to.not.include('cli-a');
    expect(domains).to.include('cli-b');
    expect((await s.volumes()).filter((x) => x.startsWith('cli-a'))).to.deep.equal([]);
    // The same through the API: the CLI showed what the daemon holds.
    expect((await req<PlanView>(s.url, 'GET', `/plans/${plan.id}`, undefined, { 'X-API-Key': KEY })).body.counts).to.deep.include({ rolled_back: 1, completed: 1 });
  });
});
