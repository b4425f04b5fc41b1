// The "Migration plans" dashboard against a real plan: a real Prometheus scrapes two real daemons (replicas) while
// a plan runs real shape B jobs against vcsim and the tests' libvirtd. Its VMs' disks hold random data, so each
// job exports and then fails at guest inspection (and is rolled back), and one VM is blocked by
// preflight (a NIC on an unmapped network): enough to move every mtv_* figure. Every query of
// deploy/grafana/dashboards/ferry-plans.json must parse and return data during the run; both replicas report the
// same figures; the stuck-VM alert loads in Prometheus and its promtool unit test passes.
import { expect } from 'chai';
import { execFileSync, spawn, ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import yaml from 'js-yaml';
import { freePort } from '../helpers/redis';
import { req, until } from '../helpers/http';
import { makeDisks } from '../vsphere/fixture';
import { PlanStack, startPlanStack } from '../plans/fixture';
import type { PlanView } from '../helpers/api-types';
import type { ProgressEvent } from '../../domain/schemas/job';

const ROOT = path.resolve(__dirname, '..', '..');
const PROM_DIR = path.join(ROOT, 'deploy', 'prometheus');
const DASHBOARD = path.join(ROOT, 'deploy', 'grafana', 'dashboards', 'ferry-plans.json');
const PLAN = 'met-wave';

interface Target { panel: string; expr: string }
/** A Grafana dashboard panel (or row) as far as read here: its queries and nested panels. */
interface Panel { title: string; targets?: { expr?: string }[]; panels?: Panel[] }
/** One series of a Prometheus instant query: labels and [time, value]. */
interface Sample { metric: Record<string, string>; value: [number, string] }
/** Prometheus GET /api/v1/targets. */
interface PromTargets { data: { activeTargets: { health: string }[] } }
/** Prometheus GET /api/v1/rules. */
interface PromRule { name: string; health: string; lastError?: string; lastEvaluation?: string }
interface PromRules { data: { groups: { rules: PromRule[] }[] } }
/** A Prometheus rules file. */
interface RulesFile { groups: { rules: { alert?: string; record?: string; expr: string }[] }[] }
function targets(): Target[] {
  const d = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as { panels?: Panel[] };
  const out: Target[] = [];
  const walk = (ps: Panel[] | undefined) => ps?.forEach((p) => { for (const t of p.targets || []) if (t.expr) out.push({ panel: p.title, expr: t.expr }); walk(p.panels); });
  walk(d.panels);
  return out;
}
/** As Grafana substitutes them: the plan variable (a repeated row's value) and the intervals for a 1 s scrape. */
const substitute = (e: string) => e.replace(/\$plan/g, PLAN).replace(/\$__rate_interval|\$__interval|\$__range/g, '30s');

describe('deploy: the Migration plans dashboard on a real plan run @vm', function () {
  this.timeout(600_000);
  let s: PlanStack;
  let B: string;
  let prom: ChildProcess | undefined;
  let promUrl = '';
  const promLogs: string[] = [];

  const query = async (expr: string) => {
    const r = await fetch(`${promUrl}/api/v1/query?query=${encodeURIComponent(expr)}`);
    return { http: r.status, ...(await r.json()) as { status: string; error?: string; data?: { resultType: string; result: Sample[] } } };
  };
  const value = async (e: string) => Number((await query(e)).data?.result[0]?.value[1]);

  before(async function () {
    this.timeout(300_000);
    // Two daemon replicas on one Redis: both run the plan runner, both must report the same figures.
    s = await startPlanStack({ prefix: 'planmet', daemons: 2, workers: { mw1: 1 } });
    B = s.url;
    const disks = makeDisks(s.dir, 2);
    for (const [name, host, ds, mac] of [['m0', 'DC0_H0', 'LocalDS_0', '10'], ['m1', 'DC0_C0_H0', 'LocalDS_1', '11']]) {
      await s.addVm({ name, host, ds, mac: `00:50:56:03:00:${mac}` }, { path: disks.sparse, bytes: disks.bytes });
    }
    await s.addVm({ name: 'mu', host: 'DC0_H0', ds: 'LocalDS_0', network: 'DC0_DVPG0', mac: '00:50:56:03:00:99' }, { path: disks.sparse, bytes: disks.bytes });

    const promPort = await freePort();
    promUrl = `http://127.0.0.1:${promPort}`;
    writeFileSync(path.join(s.dir, 'prometheus.yml'), yaml.dump({
      global: { scrape_interval: '1s', evaluation_interval: '1s' },
      rule_files: [path.join(PROM_DIR, 'rules', '*.yml')],
      scrape_configs: [{ job_name: 'daemon', static_configs: [{ targets: s.daemons.map((d) => `127.0.0.1:${d.port}`) }] }],
    }));
    prom = spawn('prometheus', [`--config.file=${path.join(s.dir, 'prometheus.yml')}`, `--storage.tsdb.path=${path.join(s.dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${promPort}`, '--log.level=warn'], { stdio: ['ignore', 'pipe', 'pipe'] });
    prom.stderr!.on('data', (b: Buffer) => promLogs.push(b.toString()));
    await until(async () => (await fetch(`${promUrl}/-/ready`)).ok, 30000, `prometheus ready\n${promLogs.join('')}`);
    await until(async () => {
      const r = await fetch(`${promUrl}/api/v1/targets`).then((x) => x.json()) as PromTargets;
      return r.data.activeTargets.length === 2 && r.data.activeTargets.every((t) => t.health === 'up');
    }, 30000, 'both daemons scraped');
  });

  after(async () => {
    if (prom && prom.exitCode === null) { const gone = new Promise((r) => prom!.once('exit', r)); prom.kill('SIGTERM'); await gone; }
    await s?.stop();
  });

  it('every query of the dashboard parses and returns data while the plan runs; the figures match the plan; both replicas agree', async () => {
    const ts = targets();
    expect(ts.length).to.be.greaterThan(10);
    const c = await req(B, 'POST', '/plans', s.plan(PLAN, ['m0', 'm1', 'mu'], { limits: { per_plan: 1 } }));
    expect(c.status, c.text).to.equal(201);
    const st = await req(B, 'POST', `/plans/${PLAN}/start`);
    expect(st.status, st.text).to.equal(200);

    // Every query, over and over while the plan runs, then once more after its end has been scraped.
    const errors = new Set<string>();
    const seen = new Set<string>();
    const stages = new Set<string>();
    const sweep = async () => {
      for (const t of ts) {
        const r = await query(substitute(t.expr));
        if (r.status !== 'success') errors.add(`${t.panel} [${t.expr}]: ${r.error}`);
        else if (r.data!.result.length) seen.add(t.expr);
      }
      for (const x of (await query(`max by (stage) (mtv_plan_vm_stage_seconds{plan="${PLAN}"})`)).data?.result ?? []) stages.add(x.metric.stage);
    };
    let p: PlanView;
    for (;;) {
      p = (await req<PlanView>(B, 'GET', `/plans/${PLAN}`)).body;
      await sweep();
      if (['completed', 'failed', 'cancelled'].includes(p.status)) break;
    }
    expect(p.status, JSON.stringify(p.vms.map((x) => [x.vm_path, x.status, x.error]))).to.equal('failed');
    expect(Object.fromEntries(p.vms.map((x) => [x.vm_path.split('/').pop(), x.status]))).to.deep.equal({ m0: 'rolled_back', m1: 'rolled_back', mu: 'blocked' });
    await until(async () => (await value(`min(mtv_plans_status{plan="${PLAN}",status="failed"})`)) === 1, 20000, 'the plan\'s end scraped from both daemons');
    await sweep();

    expect([...errors], [...errors].join('\n')).to.deep.equal([]);
    const never = ts.filter((t) => !seen.has(t.expr)).map((t) => `${t.panel} [${t.expr}]`);
    expect(never, `never returned data:\n${never.join('\n')}`).to.deep.equal([]);
    expect(stages.size, 'a running VM\'s stage was scraped').to.be.greaterThan(0);

    // The figures are the plan's.
    expect(await value(`max(mtv_planned_vms_total{plan="${PLAN}"})`)).to.equal(3);
    expect(await value(`max(mtv_migrated_vms_total{plan="${PLAN}"})`)).to.equal(0);
    for (const [status, n] of Object.entries({ rolled_back: 2, failed: 0, blocked: 1, running: 0, pending: 0, completed: 0 })) {
      expect(await value(`max(mtv_workload_migrations_status_total{plan="${PLAN}",status="${status}"})`), status).to.equal(n);
    }
    expect(await value(`sum(max by (status) (mtv_migration_duration_seconds_count{plan="${PLAN}"}))`)).to.equal(2);
    expect(await value(`max(mtv_plan_findings{plan="${PLAN}",rule="network_unmapped",severity="blocker",overridden="false"})`)).to.equal(1);
    // Bytes: both jobs exported their disk before failing at inspection; the figure is the exports' counts.
    const jobs = p.vms.flatMap((x) => x.jobs);
    expect(jobs.length).to.equal(2);
    const exported = await Promise.all(jobs.map(async (j) => {
      const rows = await s.rc.xrange(`planmet:job:${j}:events`, '-', '+');
      return Math.max(0, ...rows.map(([, f]) => Number((JSON.parse(f[1]) as ProgressEvent).details?.bytes_downloaded ?? 0)));
    }));
    expect(exported.every((b) => b > 0), `bytes exported per job: ${exported.join(', ')}`).to.equal(true);
    expect(await value(`max(mtv_migration_data_transferred_bytes{plan="${PLAN}"})`)).to.equal(exported[0] + exported[1]);
    // Nothing is running any more: no stage series.
    expect((await query(`mtv_plan_vm_stage_seconds{plan="${PLAN}"}`)).data!.result).to.deep.equal([]);

    // Both replicas report every mtv_* series, with the same values.
    const perInstance = await query(`count by (instance) ({__name__=~"mtv_.*", plan="${PLAN}"})`);
    const counts = perInstance.data!.result.map((x) => Number(x.value[1]));
    expect(counts).to.have.length(2);
    expect(counts[0]).to.equal(counts[1]);
    // (the metric's name copied into a label `m`: vector matching ignores __name__)
    const series = `label_replace({__name__=~"mtv_.*", __name__!="mtv_plan_vm_stage_seconds", plan="${PLAN}"}, "m", "$1", "__name__", "(.*)")`;
    const by = 'by (m, status, rule, severity, overridden, le)';
    const differ = await query(`max ${by} (${series}) - min ${by} (${series}) != 0`);
    expect(differ.status, differ.error).to.equal('success');
    expect(differ.data!.result).to.deep.equal([]);
    const compared = await query(`count(max ${by} (${series}) - min ${by} (${series}))`);
    expect(Number(compared.data!.result[0]?.value[1]), 'series compared').to.be.greaterThan(20);
  });

  it('the stuck-VM alert loads and evaluates in Prometheus, and its promtool unit test passes', async () => {
    const rules = (yaml.load(readFileSync(path.join(PROM_DIR, 'rules', 'plans.yml'), 'utf8')) as RulesFile).groups.flatMap((g) => g.rules);
    const stuck = rules.find((r) => r.alert === 'FerryPlanVmStuckInStage');
    expect(stuck, 'FerryPlanVmStuckInStage in rules/plans.yml').to.be.an('object');
    const r = await query(stuck!.expr);
    expect(r.status, r.error).to.equal('success');
    const loaded = await until(async () => {
      const x = await fetch(`${promUrl}/api/v1/rules`).then((y) => y.json()) as PromRules;
      const rule = x.data.groups.flatMap((g) => g.rules).find((y) => y.name === 'FerryPlanVmStuckInStage');
      // (Prometheus gives every rule a lastEvaluation, "0001-..." before the first: never an empty one)
      return (rule?.lastEvaluation && !rule.lastEvaluation.startsWith('0001') && rule) as PromRule | false | undefined;
    }, 10000, 'FerryPlanVmStuckInStage evaluated');
    expect(loaded.health, loaded.lastError).to.equal('ok');
    const out = execFileSync('promtool', ['test', 'rules', path.join(PROM_DIR, 'tests', 'plans_test.yml')], { encoding: 'utf8' });
    expect(out).to.include('SUCCESS');
  });
});
