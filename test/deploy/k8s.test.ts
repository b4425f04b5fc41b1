// Kubernetes manifests: every file parses, each service has a Deployment, only guest-repair workers are
// privileged, the worker scales on queue depth (KEDA and HPA); the MigrationJob CRD's schema (checked with ajv)
// accepts the examples and rejects the broken one; and a real gateway turns the same documents, sent as YAML,
// into convert jobs that a real worker runs with qemu-img.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import Ajv from 'ajv';
import { TestRedis } from '../helpers/redis';
import { Proc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobApiError } from '../helpers/http';
import type { JobStatus, Submitted } from '../helpers/api-types';
import { makeImage } from '../helpers/images';
import { nodeFlagsFor } from '../../platform/node-flags';

/** What every manifest names (metadata.name: not on a Kustomization). */
interface K8sDoc { apiVersion: string; kind: string; metadata?: { name?: string; namespace?: string } }
interface EnvVar { name: string; value?: string; valueFrom?: { secretKeyRef?: { name: string; key: string; optional?: boolean } } }
interface Container { command: string[]; env?: EnvVar[]; securityContext?: { privileged?: boolean } }
interface Deployment extends K8sDoc {
  metadata: { name: string };
  spec: { selector: { matchLabels: Record<string, string> }; template: { metadata: { labels?: Record<string, string> }; spec: { securityContext?: { runAsNonRoot?: boolean }; containers: Container[] } } };
}
interface Kustomization extends K8sDoc { resources: string[] }
interface ScaledObject extends K8sDoc { spec: { scaleTargetRef: { name: string }; triggers: Array<{ type: string; metadata: { query: string } }> } }
interface Hpa extends K8sDoc { spec: { scaleTargetRef: { kind: string; name: string }; metrics: Array<{ external: { metric: { name: string } } }> } }
interface ConfigMap extends K8sDoc { data: Record<string, string> }
/** The prometheus-adapter rules (the ConfigMap's config.yaml). */
interface AdapterRules { externalRules: Array<{ name: { as: string } }> }
/** An OpenAPI v3 schema node of the CRD. */
interface SchemaNode { type?: string; properties?: Record<string, SchemaNode>; required?: string[] }
interface Crd extends K8sDoc { spec: { group: string; names: { kind: string }; versions: Array<{ name: string; schema: { openAPIV3Schema: SchemaNode } }> } }
/** A MigrationJob resource (deploy/k8s/examples). */
interface MigrationJob extends K8sDoc { metadata: { name: string; namespace?: string }; spec: { source: { type: string; path: string }; output: { format: string; path: string } } }

const ROOT = path.resolve(__dirname, '..', '..');
const K8S = path.join(ROOT, 'deploy', 'k8s');
const files = (dir: string): string[] => readdirSync(dir, { withFileTypes: true }).flatMap((e) => e.isDirectory() ? files(path.join(dir, e.name)) : /\.ya?ml$/.test(e.name) ? [path.join(dir, e.name)] : []);
const docsOf = (f: string) => yaml.loadAll(readFileSync(f, 'utf8')).filter(Boolean) as K8sDoc[];
const examples = () => readdirSync(path.join(K8S, 'examples')).filter((f) => f.endsWith('.yaml')).map((f) => ({ file: f, broken: f.startsWith('broken'), text: readFileSync(path.join(K8S, 'examples', f), 'utf8') }));

describe('deploy: Kubernetes manifests and MigrationJob', function () {
  this.timeout(90000);
  const all = files(K8S).flatMap((f) => docsOf(f).map((d) => ({ file: path.relative(K8S, f), doc: d })));
  const find = <T extends K8sDoc = K8sDoc>(kind: string, name: string | undefined) => all.find((x) => x.doc.kind === kind && x.doc.metadata?.name === name)?.doc as T | undefined;

  it('every manifest parses and names its apiVersion, kind and metadata.name', () => {
    expect(all.length).to.be.greaterThan(15);
    for (const { file, doc } of all) {
      expect(doc.apiVersion, file).to.be.a('string');
      expect(doc.kind, file).to.be.a('string');
      if (doc.kind !== 'Kustomization') expect(doc.metadata?.name, file).to.be.a('string');
    }
    // The kustomization lists files that exist.
    const k = (find('Kustomization', undefined) || all.find((x) => x.doc.kind === 'Kustomization')!.doc) as Kustomization;
    for (const r of k.resources) expect(existsSync(path.join(K8S, r)), r).to.equal(true);
  });

  it('has a Deployment per service; only workers with nbd_access/mount_operations are privileged', () => {
    const deployments = all.filter((x) => x.doc.kind === 'Deployment').map((x) => x.doc as Deployment);
    const names = deployments.map((d) => d.metadata.name);
    expect(names).to.include.members(['ferry-gateway', 'ferry-daemon', 'ferry-scheduler', 'ferry-notifier', 'ferry-worker', 'ferry-worker-guest']);
    for (const d of deployments) {
      const c = d.spec.template.spec.containers[0];
      expect(d.spec.selector.matchLabels, d.metadata.name).to.deep.include(d.spec.template.metadata.labels ? { 'app.kubernetes.io/name': d.metadata.name } : {});
      const caps = String(c.env?.find((e) => e.name === 'FERRY_WORKER_CAPABILITIES')?.value || '').split(',');
      const needsPrivilege = caps.includes('nbd_access') || caps.includes('mount_operations');
      expect(c.securityContext?.privileged === true, `${d.metadata.name} privileged`).to.equal(needsPrivilege);
      if (!needsPrivilege) expect(d.spec.template.spec.securityContext?.runAsNonRoot, `${d.metadata.name} non-root`).to.equal(true);
      // No secret values inline: secrets only through secretKeyRef.
      for (const e of c.env || []) if (/SECRET|PASSWORD|API_KEYS/.test(e.name)) expect(e.valueFrom?.secretKeyRef, e.name).to.not.be.oneOf([null, undefined]);
      // The compiled entry point (npm run build, as the image has it), built from a source that exists, after the
      // service's own node flags (platform/node-flags.ts).
      const entry = c.command[c.command.length - 1];
      expect(entry).to.match(/^dist\/services\/\w+\/main\.js$/);
      expect(c.command).to.deep.equal(['node', ...nodeFlagsFor(entry), entry]);
      expect(existsSync(path.join(ROOT, entry.replace(/^dist\//, '').replace(/\.js$/, '.ts'))), c.command.join(' ')).to.equal(true);
      // Pods that listen (gateway, daemon, workers' metrics ports) require API keys from the Secret.
      if (/gateway|daemon|worker/.test(d.metadata.name)) expect(c.env!.find((e) => e.name === 'FERRY_API_KEYS')?.valueFrom?.secretKeyRef, `${d.metadata.name} FERRY_API_KEYS`).to.include({ name: 'ferry-secrets', optional: false });
    }
  });

  it('scales the worker on queue depth: a KEDA ScaledObject and an HPA alternative', () => {
    const so = find<ScaledObject>('ScaledObject', 'ferry-worker')!;
    expect(so.spec.scaleTargetRef.name).to.equal('ferry-worker');
    expect(find('Deployment', so.spec.scaleTargetRef.name)).to.not.be.oneOf([null, undefined]);
    expect(so.spec.triggers[0].type).to.equal('prometheus');
    expect(so.spec.triggers[0].metadata.query).to.include('svc_queue_depth');
    const hpa = find<Hpa>('HorizontalPodAutoscaler', 'ferry-worker')!;
    expect(hpa.apiVersion).to.equal('autoscaling/v2');
    expect(hpa.spec.scaleTargetRef).to.include({ kind: 'Deployment', name: 'ferry-worker' });
    const rules = yaml.load(find<ConfigMap>('ConfigMap', 'ferry-prometheus-adapter-rules')!.data['config.yaml']) as AdapterRules;
    expect(rules.externalRules[0].name.as).to.equal(hpa.spec.metrics[0].external.metric.name);
  });

  describe('the MigrationJob CRD schema', () => {
    const crd = find<Crd>('CustomResourceDefinition', 'migrationjobs.ferry.io')!;
    const ajv = new Ajv({ strict: false, allErrors: true });
    const check = ajv.compile(crd.spec.versions[0].schema.openAPIV3Schema);

    it('is the ferry.io/v1 MigrationJob with the fields of the manifest seed', () => {
      expect(crd.spec.names.kind).to.equal('MigrationJob');
      const spec = crd.spec.versions[0].schema.openAPIV3Schema.properties!.spec.properties!;
      expect(Object.keys(spec)).to.have.members(['source', 'output', 'options', 'resources']);
      expect(Object.keys(spec.source.properties!)).to.have.members(['type', 'path']);
      expect(Object.keys(spec.output.properties!)).to.have.members(['format', 'path']);
      expect(Object.keys(spec.options.properties!)).to.have.members(['fstabMode', 'regenInitramfs', 'updateGrub', 'compress']);
      expect(Object.keys(spec.resources.properties!.requests.properties!)).to.have.members(['memory', 'cpu']);
      expect(Object.keys(spec.resources.properties!.limits.properties!)).to.have.members(['memory', 'cpu']);
    });

    it('accepts the examples and rejects the broken one, naming what is wrong', () => {
      const ex = examples();
      expect(ex.filter((e) => !e.broken).length).to.be.greaterThan(1);
      expect(ex.filter((e) => e.broken).length).to.equal(1);
      for (const e of ex) {
        const doc = yaml.load(e.text) as MigrationJob;
        expect(doc.apiVersion, e.file).to.equal(`${crd.spec.group}/${crd.spec.versions[0].name}`);
        const ok = check(doc);
        expect(ok, `${e.file}: ${ajv.errorsText(check.errors)}`).to.equal(!e.broken);
        if (e.broken) {
          const where = check.errors!.map((x) => x.instancePath);
          expect(where).to.include.members(['/spec/source', '/spec/source/path', '/spec/output/format', '/spec/options/fstabMode']);
        }
      }
    });
  });

  describe('the gateway accepts MigrationJob documents', () => {
    const redis = new TestRedis();
    const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-k8s-'));
    let gw: Awaited<ReturnType<typeof startGatewayProc>>;
    let worker: Proc;
    before(async () => {
      await redis.start();
      const env = testEnv(redis.url);
      gw = await startGatewayProc(env);
      worker = await startWorkerProc(env, 'k8s-worker', ['img_tool']);
    });
    after(async () => {
      await worker?.kill();
      await gw?.stop();
      await redis.stop();
      rmSync(dir, { recursive: true, force: true });
    });
    const postYaml = <T = unknown>(text: string) => req<T>(gw.url, 'POST', '/migrationjobs', text, { 'content-type': 'application/yaml' });

    it('refuses the broken example with a 400 naming its fields, like the CRD does', async () => {
      const broken = examples().find((e) => e.broken)!;
      const r = await postYaml<JobApiError>(broken.text);
      expect(r.status).to.equal(400);
      const fields = r.body.error.fields!.map((f) => f.field);
      expect(fields).to.include.members(['spec.source.type', 'spec.source.path', 'spec.output.format', 'spec.options.fstabMode']);
      expect((await postYaml('spec: [unclosed')).status).to.equal(400);
      expect((await postYaml('')).status).to.equal(400);
    });

    it('accepts every shipped example as a queued convert job', async () => {
      for (const e of examples().filter((x) => !x.broken)) {
        const doc = yaml.load(e.text) as MigrationJob;
        const r = await postYaml<Submitted>(e.text);
        expect(r.status, JSON.stringify(r.body)).to.equal(201);
        const id = `${doc.metadata.namespace || 'default'}.${doc.metadata.name}`;
        expect(r.body).to.include({ job_id: id, state: 'QUEUED' });
        const job = await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`);
        expect(job.body.spec).to.deep.include({ operation: 'convert', image: { path: doc.spec.source.path, format: doc.spec.source.type } });
        expect(job.body.spec.parameters).to.include({ output_format: doc.spec.output.format, output_path: doc.spec.output.path });
        // The sources do not exist here: cancel so the worker does not spend retries on them.
        await req(gw.url, 'POST', `/jobs/${id}/cancel`);
      }
    });

    it('runs a MigrationJob (YAML) to a real converted image; the same resource twice is a 409', async () => {
      const vmdk = makeImage(dir, 'mj-disk', 'vmdk', 8);
      const out = path.join(dir, 'out', 'mj-disk.qcow2');
      const text = yaml.dump({ apiVersion: 'ferry.io/v1', kind: 'MigrationJob', metadata: { name: 'mj-disk', namespace: 'e2e' },
        spec: { source: { type: 'vmdk', path: vmdk }, output: { format: 'qcow2', path: out }, options: { compress: true, fstabMode: 'preserve' }, resources: { requests: { memory: '1Gi', cpu: '500m' } } } });
      const r = await postYaml<Submitted>(text);
      expect(r.status, JSON.stringify(r.body)).to.equal(201);
      expect(r.headers.get('location')).to.equal('/jobs/e2e.mj-disk');
      const done = await until(async () => { const j = await req<JobStatus>(gw.url, 'GET', '/jobs/e2e.mj-disk'); return j.body.is_terminal && j.body; }, 60000, 'MigrationJob job to finish');
      expect(done.state, JSON.stringify(done.state_history)).to.equal('COMPLETED');
      const info = JSON.parse(execFileSync('qemu-img', ['info', '--output=json', out], { encoding: 'utf8' })) as { format: string };
      expect(info.format).to.equal('qcow2');
      execFileSync('qemu-img', ['compare', '-f', 'vmdk', '-F', 'qcow2', vmdk, out]);
      const again = await postYaml(text);
      expect(again.status).to.equal(409);
      // JSON works too, and the route is documented in the OpenAPI document.
      const json = await req(gw.url, 'POST', '/migrationjobs', { ...(yaml.load(text) as object), metadata: { name: 'mj-json', namespace: 'e2e' } });
      expect(json.status).to.equal(201);
      await req(gw.url, 'POST', '/jobs/e2e.mj-json/cancel');
    });
  });
});
