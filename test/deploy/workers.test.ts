// Issue 38: the deployment Ferry ships can run every operation. Read as an operator would: each worker image installs
// the packages of its capabilities, derived from scripts/programs.txt by the very line the Dockerfile runs (executed
// here against the build, as the image's build stage holds it); every worker compose.yaml and deploy/k8s declare runs
// on an image that has its capabilities' packages; every operation of domain/operations.ts is served by at least
// one worker in compose and one in Kubernetes; the migration worker has its secrets, configuration, disruption
// budget, resources and probes; and its stop, with the manifest's own numbers, hands a running job back in time.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import yaml from 'js-yaml';
import { OPERATIONS, migrateCapabilities } from '../../domain/operations';
import { canServe } from '../../platform/capabilities';
import { programList, packagesFor } from '../../platform/programs';
import { WORKER_NODE_FLAGS, nodeFlagsFor } from '../../platform/node-flags';
import { TestRedis } from '../helpers/redis';
import { startGatewayProc, startWorkerProc, testEnv, type Proc } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';

const ROOT = path.resolve(__dirname, '..', '..');
const K8S = path.join(ROOT, 'deploy', 'k8s');
const DOCKERFILE = readFileSync(path.join(ROOT, 'Dockerfile'), 'utf8');
const MIGRATE_CAPS = ['img_tool', 'vsphere_access', 'libvirt_access', 'mount_operations', 'lvm_tools', 'nbd_access'];

interface EnvVar { name: string; value?: string; valueFrom?: { secretKeyRef?: { name: string; key: string; optional?: boolean } } }
interface Probe { httpGet: { path: string; port: number } }
interface Container {
  image: string; command?: string[]; env?: EnvVar[]; readinessProbe?: Probe; livenessProbe?: Probe;
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> }; volumeMounts?: { name: string; mountPath: string }[];
}
interface Volume { name: string; secret?: { secretName: string; items?: { key: string; path: string }[] } }
interface K8sDoc {
  kind: string; metadata: { name: string };
  spec: { replicas?: number; maxUnavailable?: number; minAvailable?: number; selector?: { matchLabels: Record<string, string> };
    template?: { metadata: { labels: Record<string, string> }; spec: { terminationGracePeriodSeconds?: number; containers: Container[]; volumes?: Volume[] } } };
  data?: Record<string, string>;
}
interface ComposeService { build?: { target?: string }; command?: unknown; environment?: Record<string, string>; stop_grace_period?: string; secrets?: { source: string; target?: string }[] }

/** The worker stages of the Dockerfile: name, the capabilities its ARG names, and its install line. */
function imageStages() {
  return DOCKERFILE.split(/^FROM /m).map((s) => ({ name: /^\S+\s+AS\s+(\S+)/.exec(s)?.[1], text: s })).filter((s) => s.name && /FERRY_IMAGE_CAPABILITIES=/.test(s.text)).map((s) => ({
    name: s.name!, caps: /^ARG FERRY_IMAGE_CAPABILITIES=(\S+)$/m.exec(s.text)![1].split(','),
    install: /\$\((node dist\/platform\/programs\.js [^)]*)\)/.exec(s.text)![1],
  }));
}

const k8sDocs = () => readdirSync(K8S).filter((f) => f.endsWith('.yaml')).flatMap((f) => yaml.loadAll(readFileSync(path.join(K8S, f), 'utf8')).filter(Boolean) as K8sDoc[]);
/** A container's plain values, and the Secrets its other variables come from. */
const envOf = (c: Container): Record<string, string> => Object.fromEntries((c.env || []).filter((e) => e.value !== undefined).map((e) => [e.name, e.value!]));
const refsOf = (c: Container) => Object.fromEntries((c.env || []).filter((e) => e.valueFrom?.secretKeyRef).map((e) => [e.name, e.valueFrom!.secretKeyRef!]));
/** The k8s image name a Deployment runs, mapped to its Dockerfile target (ferry-worker-migrate -> worker-migrate). */
const targetOf = (image: string) => image.split(':')[0].replace(/^ferry-?/, '') || 'app';

let composeCache: Record<string, ComposeService> | undefined;
/** compose.yaml as docker-compose resolves it (once: docker-compose takes seconds on a loaded machine). */
function composeServices(): Record<string, ComposeService> {
  if (composeCache) return composeCache;
  const env = { ...process.env, FERRY_SECRET_KEY: 'x', FERRY_API_KEYS: 'ops:admin:x', GRAFANA_ADMIN_PASSWORD: 'x', FERRY_LIBVIRT_URI: 'qemu+ssh://root@kvm1.example/system',
    FERRY_VSPHERE_CA_FILE: path.join(ROOT, 'Dockerfile'), FERRY_LIBVIRT_SSH_KEY_FILE: path.join(ROOT, 'Dockerfile'), FERRY_LIBVIRT_KNOWN_HOSTS_FILE: path.join(ROOT, 'Dockerfile') };
  const r = spawnSync('docker-compose', ['-f', path.join(ROOT, 'compose.yaml'), 'config'], { cwd: ROOT, encoding: 'utf8', env });
  expect(r.status, r.stderr).to.equal(0);
  return (composeCache = (yaml.load(r.stdout) as { services: Record<string, ComposeService> }).services);
}

/** The workers a deployment declares: name, capabilities, execution mode, image target. */
type Declared = { name: string; capabilities: string[]; execution_mode: string; target: string };
function composeWorkers(): Declared[] {
  return Object.entries(composeServices()).filter(([, s]) => s.environment?.FERRY_WORKER_CAPABILITIES).map(([name, s]) => ({
    name, capabilities: s.environment!.FERRY_WORKER_CAPABILITIES.split(','), execution_mode: s.environment!.FERRY_EXECUTION_MODE, target: s.build!.target!,
  }));
}
function k8sWorkers(): Declared[] {
  return k8sDocs().filter((d) => d.kind === 'Deployment').map((d) => ({ d, c: d.spec.template!.spec.containers[0] })).filter(({ c }) => envOf(c).FERRY_WORKER_CAPABILITIES).map(({ d, c }) => ({
    name: d.metadata.name, capabilities: envOf(c).FERRY_WORKER_CAPABILITIES.split(','), execution_mode: envOf(c).FERRY_EXECUTION_MODE, target: targetOf(c.image),
  }));
}

/** What each operation requires, at most (migrate: every stage on, so its fix stage's mount_operations too). */
const requirements = () => Object.entries(OPERATIONS).map(([op, def]) => ({ op, capabilities: op === 'migrate' ? migrateCapabilities({ manifest: { pipeline: { fix: { enabled: true } } } }) : def.capabilities }));

describe('deploy: worker images, the workers declared, and the operations they serve (issue 38)', function () {
  this.timeout(300_000);

  it("each worker image installs exactly its capabilities' packages, by the Dockerfile's own line run against the build", () => {
    const b = spawnSync('npm', ['run', 'build'], { cwd: ROOT, encoding: 'utf8' });
    expect(b.status, b.stdout + b.stderr).to.equal(0);
    const stages = imageStages();
    expect(stages.map((s) => s.name)).to.have.members(['worker', 'worker-migrate']);
    for (const s of stages) {
      // The command the image build runs, with the stage's ARG, from dist/ (as the app stage holds it).
      const r = spawnSync('sh', ['-c', s.install], { cwd: ROOT, encoding: 'utf8', env: { ...process.env, FERRY_IMAGE_CAPABILITIES: s.caps.join(','), NODE_OPTIONS: '' } });
      expect(r.status, r.stderr).to.equal(0);
      const installed = r.stdout.trim().split('\n');
      // Every entry of programs.txt that one of the stage's capabilities needs has its package installed, and
      // nothing else is (no package only the set-up or the tests need).
      const wanted = programList().filter((e) => e.capabilities.some((c) => s.caps.includes(c))).map((e) => e.package);
      expect(installed, s.name).to.have.members([...new Set(wanted)]);
      expect(installed, s.name).to.deep.equal(packagesFor(s.caps));
    }
    const migrate = stages.find((s) => s.name === 'worker-migrate')!;
    expect(migrate.caps).to.have.members(MIGRATE_CAPS);
    // What the issue lists for a whole migration: libguestfs, qemu-utils, libvirt-clients, nbdkit, libnbd-bin, OVMF, OpenSSH's client.
    expect(packagesFor(migrate.caps)).to.include.members(['libguestfs-tools', 'qemu-utils', 'libvirt-clients', 'nbdkit', 'libnbd-bin', 'ovmf', 'openssh-client']);
  });

  it('every worker declared in compose and Kubernetes runs on an image that has its capabilities\' packages', () => {
    const stages = new Map(imageStages().map((s) => [s.name, s.caps]));
    for (const w of [...composeWorkers(), ...k8sWorkers()]) {
      const caps = stages.get(w.target);
      expect(caps, `${w.name}: image target ${w.target}`).to.be.an('array');
      expect(packagesFor(caps!), w.name).to.include.members(packagesFor(w.capabilities));
    }
  });

  it('every operation of domain/operations.ts is served by a worker declared in compose and one in Kubernetes', () => {
    for (const [where, workers] of [['compose.yaml', composeWorkers()], ['deploy/k8s', k8sWorkers()]] as const) {
      for (const r of requirements()) {
        const by = workers.filter((w) => canServe(w, { capabilities: r.capabilities }));
        expect(by.length, `${where}: ${r.op} (${r.capabilities.join(', ') || 'no capabilities'})`).to.be.greaterThan(0);
      }
    }
    // The migration workers serve the operations only they can (vSphere and libvirt).
    for (const op of ['export', 'import_kvm', 'migrate_vm']) {
      const caps = OPERATIONS[op].capabilities;
      expect(composeWorkers().filter((w) => canServe(w, { capabilities: caps })).map((w) => w.name), op).to.deep.equal(['worker-migrate']);
      expect(k8sWorkers().filter((w) => canServe(w, { capabilities: caps })).map((w) => w.name), op).to.deep.equal(['ferry-worker-migrate']);
    }
  });

  it("every launch of a worker starts node with the worker's flags (platform/node-flags.ts)", () => {
    const entryAt = (argv: string[]) => argv.findIndex((a) => /services\/worker\/main\.[jt]s$/.test(a));
    /** The node flags of a command line: what comes before the worker's entry script. */
    const flagsOf = (argv: string[]) => argv.slice(0, Math.max(0, entryAt(argv)));
    const workerCmds = [...DOCKERFILE.matchAll(/^CMD (\[.*\])$/gm)].map((m) => JSON.parse(m[1]) as string[]).filter((c) => entryAt(c) >= 0);
    expect(workerCmds, 'a CMD per worker stage').to.have.length(imageStages().length);
    // Kubernetes' commands are held whole by k8s.test.ts (every Deployment's is node, nodeFlagsFor(entry), entry).
    const npmWorker = (JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts.worker.split(' ');
    for (const argv of [...workerCmds, npmWorker]) {
      expect(flagsOf(argv), argv.join(' ')).to.include.members([...WORKER_NODE_FLAGS]);
    }
    // compose's workers run their image's CMD: none replaces it with a command of its own.
    for (const [name, s] of Object.entries(composeServices())) if (s.environment?.FERRY_WORKER_CAPABILITIES) expect(s.command, name).to.equal(undefined);
    // `npm start` and the tests' processes take them from nodeFlagsFor: from source and compiled, the worker only.
    for (const w of ['services/worker/main.ts', '/srv/ferry/dist/services/worker/main.js']) expect(nodeFlagsFor(w), w).to.deep.equal(WORKER_NODE_FLAGS);
    for (const other of ['services/gateway/main.ts', 'dist/services/daemon/main.js', 'services/worker/runner.ts']) expect(nodeFlagsFor(other), other).to.deep.equal([]);
  });

  it('the migration worker: secrets, configuration, a disruption budget, resources, and separate probes', () => {
    const docs = k8sDocs();
    const dep = docs.find((d) => d.kind === 'Deployment' && d.metadata.name === 'ferry-worker-migrate')!;
    const c = dep.spec.template!.spec.containers[0];
    const env = envOf(c);
    expect(env.FERRY_WORKER_CAPABILITIES.split(',')).to.have.members(MIGRATE_CAPS);
    const refs = refsOf(c);
    for (const [name, secret, optional] of [['FERRY_SECRET_KEY', 'ferry-secrets', false], ['FERRY_API_KEYS', 'ferry-secrets', false], ['GOVC_PASSWORD', 'ferry-vsphere', true]] as const) expect(refs[name], name).to.deep.equal({ name: secret, key: name, optional });
    // The vSphere CA and the SSH key and known_hosts are files from Secrets, where the code and ssh read them.
    const mountOf = (vol: string) => c.volumeMounts!.find((m) => m.name === vol)!.mountPath;
    const vols = new Map(dep.spec.template!.spec.volumes!.map((v) => [v.name, v]));
    expect(vols.get('vsphere-ca')!.secret!.secretName).to.equal('ferry-vsphere');
    expect(path.join(mountOf('vsphere-ca'), vols.get('vsphere-ca')!.secret!.items![0].path)).to.equal(env.FERRY_VSPHERE_CA);
    expect(vols.get('libvirt-ssh')!.secret!.secretName).to.equal('ferry-libvirt-ssh');
    expect(mountOf('libvirt-ssh')).to.equal('/root/.ssh');
    expect(vols.get('libvirt-ssh')!.secret!.items!.map((i) => i.path)).to.have.members(['id_ed25519', 'known_hosts']);
    // FERRY_LIBVIRT_URI(S) and the manager come from the configuration every pod reads.
    const cfg = docs.find((d) => d.kind === 'ConfigMap' && d.metadata.name === 'ferry-config')!.data!;
    for (const k of ['FERRY_LIBVIRT_URI', 'FERRY_LIBVIRT_URIS', 'GOVC_URL']) expect(cfg[k], k).to.be.a('string').and.not.equal('');
    // Scalable, and a drain takes one at a time.
    const pdb = docs.find((d) => d.kind === 'PodDisruptionBudget' && d.metadata.name === 'ferry-worker-migrate')!;
    expect(pdb.spec.selector!.matchLabels).to.deep.equal(dep.spec.selector!.matchLabels);
    expect(pdb.spec.maxUnavailable ?? 0).to.be.greaterThan(0);
    expect(c.resources!.requests).to.include.keys('cpu', 'memory');
    expect(c.resources!.limits).to.include.keys('memory');
    // Liveness apart from readiness in every Deployment that has probes.
    for (const d of docs.filter((x) => x.kind === 'Deployment')) {
      const k = d.spec.template!.spec.containers[0];
      if (k.readinessProbe) expect(k.livenessProbe!.httpGet.path, d.metadata.name).to.not.equal(k.readinessProbe.httpGet.path);
    }
    // compose: the same worker, its secrets where ssh and the code look.
    const cm = composeServices()['worker-migrate'];
    expect(cm.environment!.FERRY_WORKER_CAPABILITIES.split(',')).to.have.members(MIGRATE_CAPS);
    expect(cm.secrets!.map((s) => s.target || `/run/secrets/${s.source}`)).to.have.members([cm.environment!.FERRY_VSPHERE_CA, '/root/.ssh/id_ed25519', '/root/.ssh/known_hosts']);
  });

  describe("the migration worker's stop, with the manifest's numbers", () => {
    const redis = new TestRedis();
    const procs: Proc[] = [];
    before(() => redis.start());
    after(async () => { await Promise.all(procs.map((p) => p.kill())); await redis.stop(); });

    it('SIGTERM: the running job handed back (QUEUED, no attempt counted) and exit within terminationGracePeriodSeconds', async () => {
      const dep = k8sDocs().find((d) => d.kind === 'Deployment' && d.metadata.name === 'ferry-worker-migrate')!;
      const env = envOf(dep.spec.template!.spec.containers[0]);
      const grace = Number(env.FERRY_SHUTDOWN_GRACE_SECONDS);
      const limit = dep.spec.template!.spec.terminationGracePeriodSeconds!;
      expect(grace + 10, 'the worker\'s bounded exit fits in the pod\'s grace').to.be.lessThan(limit);
      const base = { ...testEnv(redis.url, 'mstop'), FERRY_SHUTDOWN_GRACE_SECONDS: String(grace) };
      const gw = await startGatewayProc(base);
      procs.push(gw);
      const w = await startWorkerProc(base, 'migrate-stop', MIGRATE_CAPS, ['--execution-mode', env.FERRY_EXECUTION_MODE]);
      procs.push(w);
      const sub = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'long-1', operation: 'noop', parameters: { sleep_ms: 3_600_000 } });
      expect(sub.status, JSON.stringify(sub.body)).to.equal(201);
      await until(async () => (await req<JobStatus>(gw.url, 'GET', '/jobs/long-1')).body.state === 'RUNNING', 120_000, `long-1 running\n${w.logs.join('')}`);
      const t0 = Date.now();
      const exited = new Promise<number | null>((r) => w.proc.once('exit', (code) => r(code)));
      w.proc.kill('SIGTERM');
      const code = await exited;
      const took = (Date.now() - t0) / 1000;
      expect(code, w.logs.join('')).to.equal(0);
      expect(took).to.be.lessThan(limit);
      const j = (await req<JobStatus>(gw.url, 'GET', '/jobs/long-1')).body;
      expect(j.state).to.equal('QUEUED');
      expect(j.attempts).to.equal(0);
      expect(JSON.stringify(j.state_history)).to.include('handed back by worker migrate-stop');
    });
  });
});
