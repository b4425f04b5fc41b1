// A real Prometheus scraping a real gateway, daemon and worker: after a few real jobs (noop, a failing noop, a
// small qemu-img conversion, one that no worker can serve), every PromQL expression in the Grafana dashboards and
// the alert rules is evaluated through Prometheus's HTTP API. Each must parse; the core panels must return data.
// Also `promtool check config` on both shipped configs and `promtool test rules`.
import { expect } from 'chai';
import { execFileSync, spawn, ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { TestRedis, freePort, waitForPort } from '../helpers/redis';
import { Proc, startGatewayProc, startProcess, startWorkerWithMetrics, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';
import { makeImage } from '../helpers/images';
import { tolerate } from '../helpers/teardown';

const ROOT = path.resolve(__dirname, '..', '..');
const PROM_DIR = path.join(ROOT, 'deploy', 'prometheus');
const GRAFANA_DIR = path.join(ROOT, 'deploy', 'grafana');

/** Every JSON file under deploy/grafana, recursively. */
function dashboardFiles(dir = GRAFANA_DIR): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => e.isDirectory() ? dashboardFiles(path.join(dir, e.name)) : e.name.endsWith('.json') ? [path.join(dir, e.name)] : []);
}

interface Target { file: string; panel: string; legend: string; expr: string }
/** A Grafana dashboard panel (a row holds its own panels), as these tests read it. */
interface Panel { type?: string; title: string; datasource?: { uid?: string }; targets?: Array<{ expr?: string; legendFormat?: string }>; panels?: Panel[] }
interface Dashboard { uid: string; panels: Panel[] }
/** Prometheus HTTP API: one series of an instant query, [time, value]. */
interface PromSample { metric: Record<string, string>; value: [number, string] }
/** Prometheus HTTP API: GET /api/v1/targets, /api/v1/rules, /api/v1/alerts. */
interface PromTargets { data: { activeTargets: Array<{ health: string }> } }
interface PromRules { data: { groups: Array<{ rules: Array<{ name: string; health: string; lastError?: string; lastEvaluation?: string }> }> } }
interface PromAlerts { data: { alerts: Array<{ labels: Record<string, string>; state: string }> } }
/** A Prometheus rule file (deploy/prometheus/rules/*.yml). */
interface RuleFile { groups: Array<{ rules: Array<{ alert?: string; record?: string; expr: string }> }> }
/** The Kubernetes objects the scaling manifests hold, with the fields read here. */
interface ScaledObject { metadata: { name: string }; spec: { triggers: Array<{ metadata: { query: string } }> } }
interface K8sObject { kind: string; data: Record<string, string> }
/** Dashboards proven by their own test against what they show (a plan run: test/deploy/plan-metrics.test.ts). */
const OWN_TEST = new Set(['ferry-plans.json']);
function dashboardTargets(): Target[] {
  const out: Target[] = [];
  for (const file of dashboardFiles().filter((f) => !OWN_TEST.has(path.basename(f)))) {
    const d = JSON.parse(readFileSync(file, 'utf8')) as Dashboard;
    const walk = (panels: Panel[] | undefined) => {
      for (const p of panels || []) {
        for (const t of p.targets || []) if (t.expr) out.push({ file: path.basename(file), panel: p.title, legend: t.legendFormat || '', expr: t.expr });
        walk(p.panels);
      }
    };
    walk(d.panels);
  }
  return out;
}

/** Grafana's interval variables, as Grafana would substitute them for a 1 s scrape interval. */
const substitute = (expr: string) => expr.replace(/\$__rate_interval|\$__interval|\$__range/g, '30s');

/** Targets allowed to be empty in this run, and why. Every other dashboard target must return data. */
const MAY_BE_EMPTY: Record<string, string> = {
  'max(svc_redis_info{field="maxmemory"} > 0)': 'the test Redis has no maxmemory',
};

describe('deploy: Prometheus and Grafana against the running services', function () {
  this.timeout(150000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-prom-'));
  const procs: Proc[] = [];
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let prom: ChildProcess | undefined;
  let promUrl = '';
  const promLogs: string[] = [];

  const query = async (expr: string) => {
    const r = await fetch(`${promUrl}/api/v1/query?query=${encodeURIComponent(expr)}`);
    return { http: r.status, ...(await r.json()) as { status: string; error?: string; data?: { resultType: string; result: PromSample[] } } };
  };
  const waitState = (id: string) => until(async () => {
    const r = await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`);
    return ['COMPLETED', 'FAILED', 'CANCELLED'].includes(r.body?.state) && r.body;
  }, 60000, `job ${id} to finish`);

  before(async () => {
    await redis.start();
    const env = testEnv(redis.url);
    gw = await startGatewayProc(env);
    const daemonPort = await freePort();
    const daemon = startProcess('services/daemon/main.ts', ['-addr', `127.0.0.1:${daemonPort}`], env);
    procs.push(daemon);
    const worker = await startWorkerWithMetrics(env, 'prom-worker', ['img_tool']);
    procs.push(worker);
    const workerPort = worker.metricsPort;
    await waitForPort(daemonPort, 30000).catch((e: Error) => { throw new Error(`${e.message}\n${daemon.logs.join('')}`); });

    // Prometheus with the project's rule files and a 1 s scrape interval, on a free port.
    const promPort = await freePort();
    promUrl = `http://127.0.0.1:${promPort}`;
    const cfg = {
      global: { scrape_interval: '1s', evaluation_interval: '1s' },
      rule_files: [path.join(PROM_DIR, 'rules', '*.yml')],
      scrape_configs: [
        { job_name: 'gateway', static_configs: [{ targets: [`127.0.0.1:${gw.port}`] }] },
        { job_name: 'daemon', static_configs: [{ targets: [`127.0.0.1:${daemonPort}`] }] },
        { job_name: 'worker', static_configs: [{ targets: [`127.0.0.1:${workerPort}`] }] },
      ],
    };
    writeFileSync(path.join(dir, 'prometheus.yml'), yaml.dump(cfg));
    execFileSync('promtool', ['check', 'config', path.join(dir, 'prometheus.yml')], { stdio: 'pipe' });
    prom = spawn('prometheus', [`--config.file=${path.join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${path.join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${promPort}`, '--log.level=warn'], { stdio: ['ignore', 'pipe', 'pipe'] });
    prom.stderr!.on('data', (b: Buffer) => promLogs.push(b.toString()));
    await until(async () => (await fetch(`${promUrl}/-/ready`)).ok, 30000, `prometheus ready\n${promLogs.join('')}`);
    await until(async () => {
      const r = await fetch(`${promUrl}/api/v1/targets`).then((x) => x.json()) as PromTargets;
      return r.data.activeTargets.length === 3 && r.data.activeTargets.every((t) => t.health === 'up');
    }, 30000, 'all three targets up');

    // Real jobs: noops, one that fails, a conversion, and one no worker can serve (needs lvm_tools).
    const vmdk = makeImage(dir, 'prom-disk', 'vmdk', 8);
    const submit = async (body: object) => { const r = await req(gw.url, 'POST', '/jobs?queue=true', body); expect(r.status, JSON.stringify(r.body)).to.equal(201); };
    for (let i = 0; i < 3; i++) await submit({ job_id: `noop-${i}`, operation: 'noop', parameters: { steps: 2, sleep_ms: 200 } });
    await submit({ job_id: 'noop-fail', operation: 'noop', parameters: { fail: 'drill' }, execution_policy: { retry_count: 0 } });
    await submit({ job_id: 'conv', operation: 'convert', image: { path: vmdk, format: 'vmdk' }, parameters: { output_format: 'qcow2', output_dir: path.join(dir, 'out') } });
    await submit({ job_id: 'stuck', operation: 'noop', requirements: { capabilities: ['lvm_tools'] } });
    for (const id of ['noop-0', 'noop-1', 'noop-2', 'conv']) expect((await waitState(id)).state).to.equal('COMPLETED');
    expect((await waitState('noop-fail')).state).to.equal('FAILED');
    // An SSE client open while Prometheus scrapes.
    const sse = await fetch(`${gw.url}/jobs/stuck/events/stream`);
    (globalThis as typeof globalThis & { __ferrySse?: Response }).__ferrySse = sse;
    await until(async () => {
      const r = await query('max(svc_migration_total{status="completed"})');
      return Number(r.data?.result[0]?.value[1]) >= 4;
    }, 20000, 'completed jobs scraped');
    await until(async () => Number((await query('sum(svc_sse_clients)')).data?.result[0]?.value[1]) >= 1, 10000, 'SSE client scraped');
    await new Promise((r) => setTimeout(r, 2500)); // a few more scrapes so 30 s rates have two points after the jobs
  });

  after(async () => {
    await (globalThis as typeof globalThis & { __ferrySse?: Response }).__ferrySse?.body?.cancel().catch(tolerate('closing the SSE stream'));
    if (prom && prom.exitCode === null) { const gone = new Promise((r) => prom!.once('exit', r)); prom.kill('SIGTERM'); await gone; }
    await Promise.all(procs.map((p) => p.stop()));
    await gw?.stop();
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('promtool accepts both shipped configs and the alert rules pass their unit tests', () => {
    for (const f of ['prometheus.yml', 'prometheus.local.yml']) {
      const out = execFileSync('promtool', ['check', 'config', path.join(PROM_DIR, f)], { encoding: 'utf8' });
      expect(out).to.match(/SUCCESS: .* is valid prometheus config file syntax/);
    }
    const tests = readdirSync(path.join(PROM_DIR, 'tests')).filter((f) => f.endsWith('.yml')).map((f) => path.join(PROM_DIR, 'tests', f));
    expect(tests).to.have.length.above(0);
    const out = execFileSync('promtool', ['test', 'rules', ...tests], { encoding: 'utf8' });
    expect(out).to.include('SUCCESS');
  });

  it('Grafana provisioning points the dashboards at the provisioned datasource', () => {
    const ds = yaml.load(readFileSync(path.join(GRAFANA_DIR, 'provisioning', 'datasources', 'prometheus.yml'), 'utf8')) as { datasources: Array<{ uid: string }> };
    const uid = ds.datasources[0].uid;
    const files = dashboardFiles();
    expect(files.length).to.be.greaterThan(0);
    for (const f of files) {
      const d = JSON.parse(readFileSync(f, 'utf8')) as Dashboard;
      expect(d.uid, f).to.be.a('string');
      const walk = (ps: Panel[] | undefined): void => ps?.forEach((p) => {
        if (p.type !== 'row') expect(p.datasource?.uid, `${f}: ${p.title}`).to.equal(uid);
        walk(p.panels);
      });
      walk(d.panels);
    }
  });

  it('every dashboard query parses, and every core panel returns data', async () => {
    const targets = dashboardTargets();
    expect(targets.length).to.be.greaterThan(25);
    const failures: string[] = [];
    for (const t of targets) {
      const r = await query(substitute(t.expr));
      if (r.status !== 'success') { failures.push(`${t.panel} [${t.expr}]: ${r.error}`); continue; }
      if (!MAY_BE_EMPTY[t.expr] && !r.data!.result.length) failures.push(`${t.panel} [${t.expr}]: no data`);
    }
    expect(failures, failures.join('\n')).to.deep.equal([]);
  });

  it('the panels show what happened: jobs by status, bytes converted, waits, workers per capability', async () => {
    const v = async (e: string) => Number((await query(e)).data!.result[0]?.value[1]);
    expect(await v('max(svc_migration_total{status="completed"})')).to.equal(4);
    expect(await v('max(svc_migration_total{status="failed"})')).to.equal(1);
    expect(await v('sum(ferry_worker_bytes_converted_total)')).to.be.greaterThan(0);
    expect(await v('sum(svc_job_wait_seconds_count{job="worker"})')).to.equal(5);
    expect(await v('max(svc_workers_active_by_capability{capability="img_tool"})')).to.equal(1);
    expect(await v('min(svc_redis_up)')).to.equal(1);
    expect(await v('sum(ferry_worker_jobs_total{operation="convert",outcome="completed"})')).to.equal(1);
  });

  it('the autoscaling queries (KEDA ScaledObject, prometheus-adapter rule) parse and return the queue depth', async () => {
    const k8s = path.join(ROOT, 'deploy', 'k8s', 'scaling');
    const keda = yaml.loadAll(readFileSync(path.join(k8s, 'keda-scaledobject.yaml'), 'utf8')) as ScaledObject[];
    for (const so of keda) {
      const r = await query(so.spec.triggers[0].metadata.query);
      expect(r.status, `${so.metadata.name}: ${r.error}`).to.equal('success');
      if (so.metadata.name === 'ferry-worker') expect(r.data!.result.length, so.metadata.name).to.equal(1);
    }
    const adapter = (yaml.loadAll(readFileSync(path.join(k8s, 'hpa.yaml'), 'utf8')) as K8sObject[]).find((d) => d.kind === 'ConfigMap')!;
    const rule = (yaml.load(adapter.data['config.yaml']) as { externalRules: Array<{ metricsQuery: string }> }).externalRules[0];
    const r = await query(rule.metricsQuery.replace('<<.LabelMatchers>>', 'queue="jobs.lvm_tools"'));
    expect(r.status, r.error).to.equal('success');
    expect(Number(r.data!.result[0]?.value[1])).to.equal(1); // the stuck job
  });

  it('every alert expression parses and evaluates; the no-matching-worker condition holds for the stuck queue', async () => {
    const files = readdirSync(path.join(PROM_DIR, 'rules')).filter((f) => f.endsWith('.yml'));
    const rules = files.flatMap((f) => (yaml.load(readFileSync(path.join(PROM_DIR, 'rules', f), 'utf8')) as RuleFile).groups.flatMap((g) => g.rules));
    expect(rules.length).to.be.greaterThan(5);
    for (const rule of rules) {
      const r = await query(rule.expr);
      expect(r.status, `${rule.alert}: ${r.error}`).to.equal('success');
    }
    // Prometheus itself loaded and evaluated every rule without error.
    const loaded = await until(async () => {
      const r = await fetch(`${promUrl}/api/v1/rules`).then((x) => x.json()) as PromRules;
      const all = r.data.groups.flatMap((g) => g.rules);
      return all.length === rules.length && all.every((x) => x.lastEvaluation && !x.lastEvaluation.startsWith('0001')) && all;
    }, 10000, 'all rules evaluated');
    expect(loaded.filter((x) => x.health !== 'ok').map((x) => `${x.name}: ${x.lastError}`)).to.deep.equal([]);
    const noWorker = rules.find((x) => x.alert === 'FerryQueueNoMatchingWorker')!;
    const r = await query(noWorker.expr);
    expect(r.data!.result.map((x) => x.metric.queue)).to.deep.equal(['jobs.lvm_tools']);
    // ... and the alert is pending (its `for` has not elapsed).
    const alerts = await fetch(`${promUrl}/api/v1/alerts`).then((x) => x.json()) as PromAlerts;
    expect(alerts.data.alerts.filter((a) => a.labels.alertname === 'FerryQueueNoMatchingWorker').map((a) => [a.labels.queue, a.state])).to.deep.equal([['jobs.lvm_tools', 'pending']]);
  });
});
