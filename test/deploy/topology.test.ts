// Issue 38 item 5: the topology Ferry ships, run as processes. compose.yaml (resolved by docker-compose) and the
// Kubernetes manifests are read; they must declare the same services with the same commands, environment names
// and ports (each difference named below with why), so the topology runs once, from compose's declarations: every
// Ferry service as a process with exactly its declared command (the Dockerfile target's CMD when it declares none,
// on this checkout's `npm run build`), the image's ENV under the declared environment (secrets filled with test
// values) and its ports. Hosts are Linux namespaces joined by veth pairs (test/helpers/hosts.ts): the control
// services and Redis on one, the vSphere simulator on another (reached as 127.0.0.1, the one name its certificate
// holds, through a forwarder on each host that talks to it), every worker replica on a host of its own (each listening on the declared 9100), and a libvirt host
// `kvm1`, a private libvirtd with sshd in its namespaces, reached over `qemu+ssh://root@kvm1/system` with the key
// and known_hosts the declaration mounts at /root/.ssh. Each host has its own /etc/hosts, /run and /root, and the
// declared volumes and secrets at their declared paths. Then a shape B migration of the tiny real guest, and a
// plan of two VMs, both to kvm1; checked on kvm1 with virsh, in Redis and on the simulator. What cannot be
// honoured here is mapped in the tables below, each with why, and a declaration with no mapping fails the test.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, statSync, writeFileSync, type Dirent } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import IORedis from 'ioredis';
import yaml from 'js-yaml';
import { build } from '../../scripts/build';
import { managerFor, type Manager } from '../../domain/vsphere/client';
import { vmDetail } from '../../domain/vsphere/inventory';
import { JobStore } from '../../queue/store';
import { ensureTinyGuest, TINY_GUEST_BYTES, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { createPlanVm } from '../plans/fixture';
import { upload } from '../vsphere/fixture';
import { Lan, type Host, type HostProc } from '../helpers/hosts';
import { startOwnLibvirt, type TestLibvirt } from '../helpers/libvirt';
import { startSshd, type TestSshd } from '../helpers/sshd';
import { startProxy, type ProxyControl } from '../helpers/tcp-proxy';
import { vcsimBinary, type Vcsim } from '../helpers/vcsim';
import { req, until } from '../helpers/http';
import type { JobStatus, MigrationSubmitted, PlanView, Validation } from '../helpers/api-types';

const ROOT = path.resolve(__dirname, '..', '..');
const K8S = path.join(ROOT, 'deploy', 'k8s');
const KEY = { admin: 'topology-admin-key-0123456789abcdef', worker: 'topology-worker-key-0123456789abcd' };
const ADMIN = { 'x-api-key': KEY.admin };
const VCSIM = { username: 'ferry@vsphere.local', password: 'topology-vcsim-pass-1' };
const LIBVIRT_URI = 'qemu+ssh://root@kvm1/system';
const NETWORK = 'ferry-topo';
/** The manager as the services see it: the simulator's certificate names only localhost, 127.0.0.1 and ::1 (it is
 *  made by scripts/vcsim, a fixture key), so each host whose services talk to vSphere (FERRY_VSPHERE_CA declared)
 *  forwards its own 127.0.0.1:443 to the vcenter host (VSPHERE_FORWARD). A real manager's certificate names it. */
const VSPHERE_URL = 'https://127.0.0.1/sdk';

// ---- What the declarations say, and how each part is honoured here -------------------------------------------

/** Every key a Ferry service of the resolved compose.yaml may have, and what the test does with it. A key missing
 *  here fails the test: a new kind of declaration needs a decision. */
const SERVICE_KEYS: Record<string, string> = {
  command: 'run exactly, in the checkout (the image\'s WORKDIR /app holds dist/, package.json and node_modules)',
  environment: 'exactly the resolved values, over the image\'s ENV (the Dockerfile target\'s, inherited stages first)',
  ports: 'the container port, listened on at the host\'s address; publishing on the Docker host is not done: the test reaches the host\'s address',
  volumes: 'VOLUMES: each target mounted in the host\'s own mount namespace',
  secrets: 'the test\'s file copied to the declared target in the host\'s own /run or /root (mode 0400)',
  build: 'the Dockerfile target: its ENV and CMD applied, its packages are the machine\'s (scripts/setup.sh installs the same list)',
  image: 'names the build; nothing is pulled',
  depends_on: 'start order: Redis, then gateway, daemon, scheduler, notifier, then the workers',
  healthcheck: 'no container engine runs it here; the test asks each declared port\'s /health itself',
  restart: 'nothing restarts here: a service that exits fails the test',
  stop_grace_period: 'the stop is test/deploy/workers.test.ts\'s (a worker SIGTERMed with the manifest\'s numbers)',
  user: 'every process runs as the machine\'s root, in its own namespaces (user 0:0 where declared; the app image\'s `node` user is not made here)',
  privileged: 'root in its own namespaces with the machine\'s /dev: what privileged gives a container (NBD devices, mounts)',
};
/** Volume targets: what each is here. */
const VOLUMES: Record<string, string> = {
  '/srv/ferry': 'ferry-images: one folder of the test, mounted at /srv/ferry in every host that declares it (a named volume the containers share)',
  '/srv/scratch': 'ferry-scratch: one folder of the test, mounted at /srv/scratch (likewise shared by the replicas; Kubernetes gives each pod an emptyDir)',
  '/lib/modules': 'the machine\'s own /lib/modules, the host path the declaration names',
};
/** Services of compose.yaml not run from their declaration, and why. */
const NOT_RUN: Record<string, string> = {
  redis: 'the test\'s own redis-server, on the control host under the name `redis`, with the declared command (plus REDIS_EXTRA)',
  prometheus: 'not Ferry: its configuration is checked by test/deploy/prometheus.test.ts',
  grafana: 'not Ferry: its provisioning is checked by test/deploy/compose.test.ts',
};
/** Added to Redis's declared command: what the redis image's entrypoint adds without a configuration file
 *  (docker-library/redis: `--protected-mode no`), the declared port, and the volume redis-data:/data's folder. */
const REDIS_EXTRA = (dir: string) => ['--protected-mode', 'no', '--port', '6379', '--dir', dir];
/** Replicas beyond one, as compose.yaml's own example scales them (`--scale worker-migrate=2`). */
const REPLICAS: Record<string, number> = { 'worker-migrate': 2 };
/** Environment names only one of compose and Kubernetes declares for a service, and why. */
const ONLY_IN: Record<'compose' | 'k8s', Record<string, string>> = {
  compose: { HEALTH_PORT: 'read by the Dockerfile\'s HEALTHCHECK, which compose runs; Kubernetes probes /health with httpGet on the port' },
  k8s: { FERRY_WORKER_ID: 'the pod\'s name (fieldRef); under compose the default <hostname>-<pid> names the container' },
};
/** Variables whose literal value compose and Kubernetes must agree on where both declare them. */
const SAME_VALUE = ['FERRY_WORKER_CAPABILITIES', 'FERRY_EXECUTION_MODE', 'FERRY_WORKER_METRICS_PORT', 'FERRY_WORKER_CONCURRENCY', 'FERRY_SHUTDOWN_GRACE_SECONDS', 'FERRY_EXPORT_DIR', 'GATEWAY_PORT', 'DAEMON_PORT'];
const PORT_VARS = ['GATEWAY_PORT', 'DAEMON_PORT', 'FERRY_WORKER_METRICS_PORT'];

interface ComposeService {
  build?: { target?: string }; command?: string[]; environment?: Record<string, string>; ports?: { target: number }[];
  volumes?: ({ source?: string; target: string } | string)[]; secrets?: { source: string; target?: string }[]; [k: string]: unknown;
}
interface Compose { services: Record<string, ComposeService>; secrets: Record<string, { file: string }> }
interface K8sContainer { image: string; command: string[]; env?: { name: string; value?: string }[]; envFrom?: { configMapRef: { name: string } }[]; ports?: { containerPort: number }[] }
interface K8sDoc { kind: string; metadata: { name: string }; data?: Record<string, string>; spec?: { template?: { spec: { containers: K8sContainer[] } } } }

function resolveCompose(env: Record<string, string>): Compose {
  const r = spawnSync('docker-compose', ['-f', path.join(ROOT, 'compose.yaml'), 'config'], { cwd: ROOT, encoding: 'utf8', env: { PATH: process.env.PATH!, ...env } });
  expect(r.status, r.stderr).to.equal(0);
  return yaml.load(r.stdout) as Compose;
}

/** A Dockerfile target's ENV and CMD, its FROM chain's first (as the build inherits them). */
function imageOf(target: string): { env: Record<string, string>; cmd: string[] } {
  const text = readFileSync(path.join(ROOT, 'Dockerfile'), 'utf8').replace(/\\\n\s*/g, ' ');
  const stages = new Map(text.split(/^FROM /m).slice(1).map((s) => [/^(\S+)\s+AS\s+(\S+)/.exec(s)![2], { from: /^(\S+)/.exec(s)![1], text: s }]));
  const stage = stages.get(target);
  expect(stage, `Dockerfile target ${target}`).to.not.equal(undefined);
  const base = stages.has(stage!.from) ? imageOf(stage!.from) : { env: {}, cmd: [] };
  const env = { ...base.env };
  for (const m of stage!.text.matchAll(/^ENV (.+)$/gm)) for (const kv of m[1].trim().split(/\s+/)) { const i = kv.indexOf('='); env[kv.slice(0, i)] = kv.slice(i + 1); }
  const cmd = [...stage!.text.matchAll(/^CMD (\[.*\])$/gm)].map((m) => JSON.parse(m[1]) as string[]).pop() ?? base.cmd;
  return { env, cmd };
}

const k8sDocs = () => readdirSync(K8S).filter((f) => f.endsWith('.yaml')).flatMap((f) => yaml.loadAll(readFileSync(path.join(K8S, f), 'utf8')).filter(Boolean) as K8sDoc[]);
const targetOf = (image: string) => image.split(':')[0].replace(/^ferry-?/, '') || 'app';
const ferryServices = (c: Compose) => Object.entries(c.services).filter(([name, s]) => s.build && !(name in NOT_RUN));

/** A service as compose declares it: command, environment (image ENV under it), the ports it listens on. */
function composeView(s: ComposeService) {
  const image = imageOf(s.build!.target!);
  const env = { ...image.env, ...s.environment };
  return { command: s.command ?? image.cmd, names: Object.keys(s.environment ?? {}), env, ports: PORT_VARS.filter((v) => env[v]).map((v) => Number(env[v])) };
}

function k8sView(docs: K8sDoc[], name: string) {
  const d = docs.find((x) => x.kind === 'Deployment' && x.metadata.name === `ferry-${name}`);
  expect(d, `deploy/k8s Deployment ferry-${name}`).to.not.equal(undefined);
  const c = d!.spec!.template!.spec.containers[0];
  const fromMaps = (c.envFrom ?? []).flatMap((f) => Object.keys(docs.find((x) => x.kind === 'ConfigMap' && x.metadata.name === f.configMapRef.name)!.data!));
  const literal = Object.fromEntries((c.env ?? []).filter((e) => e.value !== undefined).map((e) => [e.name, e.value!]));
  return { command: c.command, names: [...fromMaps, ...(c.env ?? []).map((e) => e.name)], literal, ports: (c.ports ?? []).map((p) => p.containerPort), target: targetOf(c.image) };
}

describe('deploy: the topology as processes (compose.yaml and deploy/k8s, issue 38 item 5) @vm', function () {
  this.timeout(1_800_000);

  it('compose and Kubernetes declare the same Ferry services: command, environment names, ports (differences named)', () => {
    const c = resolveCompose({ FERRY_SECRET_KEY: 'x', FERRY_API_KEYS: 'ops:admin:x', GRAFANA_ADMIN_PASSWORD: 'x', FERRY_LIBVIRT_URI: LIBVIRT_URI,
      FERRY_VSPHERE_CA_FILE: path.join(ROOT, 'Dockerfile'), FERRY_LIBVIRT_SSH_KEY_FILE: path.join(ROOT, 'Dockerfile'), FERRY_LIBVIRT_KNOWN_HOSTS_FILE: path.join(ROOT, 'Dockerfile') });
    const docs = k8sDocs();
    const services = ferryServices(c);
    expect(Object.keys(c.services).filter((n) => !services.some(([s]) => s === n)), 'compose services neither run nor mapped').to.have.members(Object.keys(NOT_RUN));
    expect(docs.filter((d) => d.kind === 'Deployment').map((d) => d.metadata.name)).to.have.members(services.map(([n]) => `ferry-${n}`));
    for (const [name, s] of services) {
      const cv = composeView(s);
      const kv = k8sView(docs, name);
      expect(kv.target, `${name}: image`).to.equal(s.build!.target);
      // compose's command replaces the node image's CMD (its entrypoint execs it), Kubernetes' its ENTRYPOINT: the same process.
      expect(kv.command, `${name}: command`).to.deep.equal(cv.command);
      expect(cv.names.filter((n) => !kv.names.includes(n)), `${name}: only in compose`).to.satisfy((xs: string[]) => xs.every((x) => x in ONLY_IN.compose));
      expect(kv.names.filter((n) => !cv.names.includes(n)), `${name}: only in Kubernetes`).to.satisfy((xs: string[]) => xs.every((x) => x in ONLY_IN.k8s));
      for (const v of SAME_VALUE) if (v in kv.literal || v in (s.environment ?? {})) expect(kv.literal[v], `${name}: ${v}`).to.equal(s.environment?.[v]);
      expect(kv.ports, `${name}: ports`).to.have.members(cv.ports);
      expect((s.ports ?? []).map((p) => p.target), `${name}: compose ports`).to.satisfy((ps: number[]) => ps.every((p) => cv.ports.includes(p)));
      if (cv.env.HEALTH_PORT) expect(cv.ports, `${name}: HEALTH_PORT`).to.include(Number(cv.env.HEALTH_PORT));
    }
    // Every difference named is still one somewhere (a stale entry goes).
    const all = services.map(([n, s]) => ({ cv: composeView(s), kv: k8sView(docs, n) }));
    for (const x of Object.keys(ONLY_IN.compose)) expect(all.some((a) => a.cv.names.includes(x) && !a.kv.names.includes(x)), x).to.equal(true);
    for (const x of Object.keys(ONLY_IN.k8s)) expect(all.some((a) => a.kv.names.includes(x) && !a.cv.names.includes(x)), x).to.equal(true);
  });

  describe('every Ferry service of compose.yaml on hosts of its own, a migration and a plan to a libvirt host over qemu+ssh', () => {
    const t = {} as Topology;
    before(async function () { this.timeout(900_000); await startTopology(t); });
    after(async function () { this.timeout(120_000); await stopTopology(t); });

    it('runs every declared service with its command, environment and ports; each worker replica is a host of its own', async () => {
      for (const [name, s] of ferryServices(t.compose)) {
        for (const key of Object.keys(s)) expect(SERVICE_KEYS, `${name}: "${key}" has no mapping`).to.have.property(key);
        for (const v of s.volumes ?? []) expect(VOLUMES, `${name}: volume ${JSON.stringify(v)} has no mapping`).to.have.property(typeof v === 'string' ? v.split(':')[1] : v.target);
      }
      for (const p of t.procs) expect(p.proc.exitCode, `${p.host} exited:\n${p.logs.join('')}`).to.equal(null);
      // Each declared port answers /health (readiness, unauthenticated as the probes are) at its host's address.
      for (const [host, port] of t.ports) expect((await req(`http://${host.ip}:${port}`, 'GET', '/health')).status, `${host.name}:${port}`).to.equal(200);
      // Every worker replica registered, each named by its own host (the default id is <hostname>-<pid>).
      const workers = await until(async () => { const w = (await req<{ active: number; workers: { worker_id: string }[] }>(t.gateway, 'GET', '/workers', undefined, ADMIN)).body; return w.active === t.workerHosts.length && w; }, 120_000, 'every worker registered');
      expect(workers.workers.map((w) => w.worker_id.replace(/-\d+$/, ''))).to.have.members(t.workerHosts.map((h) => h.name));
      expect(await t.rc.zcard('ferry:workers')).to.equal(t.workerHosts.length);
    });

    it('a shape B migration of the tiny guest from the simulator to kvm1 over qemu+ssh: the domain boots there', async () => {
      const sample = startSampling(t);
      const r = await req<MigrationSubmitted>(t.daemon, 'POST', '/jobs/submit', {
        name: 'direct0', vm_path: '/DC0/vm/direct0', source: { type: 'vsphere' }, destination: { type: 'kvm' },
        options: { network_mapping: { 'VM Network': NETWORK }, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 600 } },
      }, ADMIN);
      expect(r.status, r.text).to.equal(200);
      const id = r.body.job_id;
      const j = await until(async () => { const x = (await req<JobStatus>(t.gateway, 'GET', `/jobs/${id}`, undefined, ADMIN)).body; return x.is_terminal && x; }, 1_200_000, 'the migration to end');
      const sizing = sample.stop();
      expect(j.state, JSON.stringify(j.state_history.slice(-3)) + workerLogs(t)).to.equal('COMPLETED');
      const rec = (await new JobStore(t.rc, 'ferry').get(id))!;
      expect(rec.state).to.equal('COMPLETED');
      const ran = t.workerHosts.find((h) => rec.worker_id!.replace(/-\d+$/, '') === h.name)!;
      expect(ran?.name, rec.worker_id!).to.match(/^worker-migrate-/);
      const res = rec.result as { domain: string; uuid: string; virt_uri: string; boot: { status: string } };
      expect(res).to.include({ domain: 'direct0', virt_uri: LIBVIRT_URI });
      expect(res.boot.status).to.equal('passed');
      // On kvm1: running, the UUID the job recorded, its disk in the default pool the import made, on the mapped network.
      expect((await t.lv.virsh(['domstate', 'direct0'])).trim()).to.equal('running');
      expect((await t.lv.virsh(['domuuid', 'direct0'])).trim()).to.equal(res.uuid);
      const xml = await t.lv.virsh(['dumpxml', 'direct0']);
      expect(xml).to.include('/var/lib/libvirt/images/ferry/').and.match(new RegExp(`<source network=['"]${NETWORK}['"]`));
      // Reached over ssh from the migration worker's own address, with the declared key.
      expect(t.sshd.log()).to.include(`Accepted publickey for root from ${ran.ip}`);
      // The source is untouched on the simulator: there, and still powered off.
      expect((await vmDetail(t.m, '/DC0/vm/direct0')).power_state).to.equal('poweredOff');
      const measured = sizing(ran);
      // The worker's own process, and below it the repair's appliance (a qemu far larger than the worker).
      expect(measured.host_peak_rss_mib, JSON.stringify(measured)).to.be.greaterThan(measured.worker_vmhwm_mib);
      t.sizing = { ...measured, worker: ran.name };
      console.log(`      sizing, one migration of the tiny guest (${TINY_GUEST_BYTES >> 20} MiB disk) on ${ran.name}: ${JSON.stringify(t.sizing)}`);
    });

    it('a plan of two VMs as shipped: the daemon (no libvirt key, FERRY_LIBVIRT_VIA=worker) validates through the migration workers, which then run both VMs', async () => {
      const vms = ['plan0', 'plan1'].map((n) => ({ vm_path: `/DC0/vm/${n}`, options: { virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 600 } } }));
      const c = await req(t.daemon, 'POST', '/plans', { id: 'topo', name: 'topo', vms, destination: { type: 'kvm', virt_uri: LIBVIRT_URI },
        // guest_preflight off: the guest read (an appliance per VM, per validate) is test/plans/guest-read-job's; CPU is scarce here.
        network_map: { 'VM Network': NETWORK }, storage_map: { LocalDS_0: t.lv.pool }, options: { power_off: 'force', guest_preflight: false } }, ADMIN);
      expect(c.status, c.text).to.equal(201);
      // The daemon holds no libvirt key: its target checks are virsh_call jobs on the migration workers (issue 38 item 2).
      expect(t.control.sh('ls -A /root/.ssh 2>/dev/null || true').trim(), 'the control host has no ssh key').to.equal('');
      const v = await req<Validation>(t.daemon, 'POST', '/plans/topo/validate', undefined, ADMIN);
      expect(v.status, v.text).to.equal(200);
      expect(v.body.blockers, v.text).to.equal(0);
      const jobs = new JobStore(t.rc, 'ferry');
      // The daemon's calls are left out of job lists unless asked for (issue 38: internal jobs), and kept minutes.
      const recs = await Promise.all((await jobs.list({ limit: 10_000, internal: true })).ids.map((id) => jobs.get(id)));
      const calls = recs.filter((r) => r?.spec.operation === 'virsh_call');
      expect(calls.length, 'virsh_call jobs of the validation').to.be.greaterThan(0);
      for (const r of calls) expect(r!.worker_id, r!.job_id).to.match(/^worker-migrate-[12]-/);
      const st = await req(t.daemon, 'POST', '/plans/topo/start', undefined, ADMIN);
      expect(st.status, st.text).to.equal(200);
      const p = await until(async () => { const x = (await req<PlanView>(t.daemon, 'GET', '/plans/topo', undefined, ADMIN)).body; return ['completed', 'failed', 'cancelled'].includes(x.status) && x; }, 1_500_000, 'the plan to end');
      expect(p.status, JSON.stringify(p.vms.map((x) => [x.vm_path, x.status, x.error])) + workerLogs(t)).to.equal('completed');
      const store = new JobStore(t.rc, 'ferry');
      for (const x of p.vms) {
        const name = x.vm_path.split('/').pop()!;
        expect(x.status, name).to.equal('completed');
        const rec = (await store.get(x.job_id!))!;
        expect(rec.state, name).to.equal('COMPLETED');
        expect(rec.worker_id, name).to.match(/^worker-migrate-[12]-/);
        expect((rec.result as { boot: { status: string } }).boot.status, name).to.equal('passed');
        expect((await t.lv.virsh(['domstate', name])).trim(), name).to.equal('running');
        expect((await t.lv.virsh(['domuuid', name])).trim(), name).to.equal((rec.result as { uuid: string }).uuid);
        expect(await t.lv.virsh(['dumpxml', name]), name).to.include(t.lv.poolDir);
        // power_off: force on a VM that is off: the source stays off, and there.
        expect((await vmDetail(t.m, x.vm_path)).power_state, name).to.equal('poweredOff');
      }
    });
  });
});

// ---- The topology ---------------------------------------------------------------------------------------------

interface Topology {
  dir: string; lan: Lan; compose: Compose; procs: HostProc[]; rc: IORedis; m: Manager; lv: TestLibvirt; sshd: TestSshd;
  control: Host; vcenter: Host; kvm: Host; workerHosts: Host[]; ports: [Host, number][]; gateway: string; daemon: string;
  proxy: ProxyControl; libvirtStop: () => Promise<void>; vcsimDirs: string[]; sizing?: Record<string, unknown>;
}

async function startTopology(t: Topology) {
  t.dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-topology-'));
  t.procs = [];
  t.ports = [];
  build(path.join(ROOT, 'dist')); // the images' dist/, from this checkout (nothing compiled when current)
  const tiny = await ensureTinyGuest();
  t.lan = await new Lan().start();
  const n = t.lan.net;
  const hostsFile = path.join(t.dir, 'hosts');
  writeFileSync(hostsFile, `127.0.0.1 localhost\n${n}.1 control redis gateway daemon scheduler notifier\n${n}.2 vcenter\n${n}.20 kvm1\n`);
  // The libvirt host's libvirtd starts while the control and vcenter hosts and the simulator are made (each is
  // seconds of waiting on a process); kvm1 joins its namespaces once both are there.
  await Promise.all([
    startOwnLibvirt().then((own) => { t.lv = own.lv; t.libvirtStop = own.stop; }),
    (async () => {
      t.control = await t.lan.host('control', 1);
      t.vcenter = await t.lan.host('vcenter', 2);
      await startVcsim(t, hostsFile);
    })(),
  ]);
  t.kvm = t.lan.join('kvm1', libvirtdNamespace(t.lv), 20);
  await startKvm(t);
  t.compose = resolveCompose({
    FERRY_SECRET_KEY: 'topology-secret-key-0123456789abcdef', GRAFANA_ADMIN_PASSWORD: 'topology-grafana-pass', FERRY_API_KEYS: `ops:admin:${KEY.admin},workers:worker:${KEY.worker}`,
    FERRY_LIBVIRT_URI: LIBVIRT_URI, GOVC_URL: VSPHERE_URL, GOVC_USERNAME: VCSIM.username, GOVC_PASSWORD: VCSIM.password,
    FERRY_VSPHERE_CA_FILE: path.join(t.dir, 'vcsim.pem'), FERRY_LIBVIRT_SSH_KEY_FILE: t.sshd.key, FERRY_LIBVIRT_KNOWN_HOSTS_FILE: path.join(t.dir, 'known_hosts'),
  });
  // The control host: Redis (as `redis`), gateway, daemon, scheduler, notifier; each worker replica a host of its own.
  const services = ferryServices(t.compose);
  prepareHost(t, t.control, hostsFile, services.filter(([name]) => !isWorker(t.compose.services[name])).map(([, s]) => s), false);
  const redisDir = path.join(t.dir, 'redis-data');
  mkdirSync(redisDir);
  t.procs.push(t.control.start([...(t.compose.services.redis.command as string[]), ...REDIS_EXTRA(redisDir)], { PATH: process.env.PATH! }, ROOT));
  t.rc = new IORedis(`redis://${t.control.ip}:6379`, { maxRetriesPerRequest: 3 });
  t.rc.on('error', () => undefined); // refused until redis-server listens (awaited below); reconnects by itself
  await until(async () => (await t.rc.ping().catch(() => '')) === 'PONG', 30_000, 'redis on the control host');
  t.workerHosts = [];
  let last = 10;
  for (const [name, s] of services) {
    for (let i = 1; i <= (REPLICAS[name] ?? 1); i++) {
      const host = isWorker(s) ? await t.lan.host(REPLICAS[name] ? `${name}-${i}` : name, ++last) : t.control;
      if (isWorker(s)) { prepareHost(t, host, hostsFile, [s], true); t.workerHosts.push(host); }
      if (s.environment?.FERRY_VSPHERE_CA && !t.procs.some((p) => p.host === host.name && p.proc.spawnargs.includes(VSPHERE_FORWARD))) t.procs.push(host.start(['node', '-e', VSPHERE_FORWARD, '443', t.vcenter.ip], { PATH: process.env.PATH! }, ROOT));
      startService(t, host, s);
    }
  }
  t.gateway = `http://${n}.1:8000`;
  t.daemon = `http://${n}.1:8080`;
  // The source VMs go onto the simulator while the services start (they need only the simulator).
  const logs = () => t.procs.map((p) => p.logs.join('')).join('\n');
  const up = ([host, port]: [Host, number]) => until(async () => (await req(`http://${host.ip}:${port}`, 'GET', '/livez').catch(() => ({ status: 0 }))).status === 200, 180_000, `${host.name}:${port} up`)
    .catch((e: Error) => { throw new Error(`${e.message}\n${logs()}`); });
  await Promise.all([addSourceVms(t, tiny), ...t.ports.map(up)]);
}

const isWorker = (s: ComposeService) => !!s.environment?.FERRY_WORKER_CAPABILITIES;
/** A host's 127.0.0.1:<port> forwarded to <address>:<port> (VSPHERE_URL says why). */
const VSPHERE_FORWARD = "const net = require('node:net'); const [port, to] = process.argv.slice(1); net.createServer((c) => { const u = net.connect(Number(port), to); c.pipe(u).pipe(c); c.on('error', () => u.destroy()); u.on('error', () => c.destroy()); }).listen(Number(port), '127.0.0.1');";

/** A service on `host`: the declared command (or the target's CMD), the image's ENV under the declared environment. */
function startService(t: Topology, host: Host, s: ComposeService) {
  const v = composeView(s);
  // Only what the image gives a process beside its ENV: the machine's PATH (its programs stand in for the image's) and HOME.
  const p = host.start(v.command, { PATH: process.env.PATH!, HOME: '/root', ...v.env }, ROOT);
  t.procs.push(p);
  for (const port of v.ports) t.ports.push([host, port]);
}

/** The host's own /etc/hosts, /run, /root and /srv; the declared volumes and secrets at their targets; a worker's
 *  own /tmp last (the test's folder is under the machine's /tmp, which the host then no longer sees; a checkout
 *  there is bound back). */
function prepareHost(t: Topology, host: Host, hostsFile: string, services: ComposeService[], ownTmp: boolean) {
  host.sh('mount --bind "$1" /etc/hosts && mount -t tmpfs -o mode=0755 ferry-run /run && mount -t tmpfs -o mode=0700 ferry-root /root && mount -t tmpfs ferry-srv /srv', hostsFile);
  for (const v of services.flatMap((s) => s.volumes ?? [])) {
    const [source, target] = typeof v === 'string' ? v.split(':') : [v.source ?? '', v.target];
    if (target === source) continue; // a host path at the same place (/lib/modules): the machine's own
    const dir = path.join(t.dir, 'volumes', path.basename(target));
    mkdirSync(dir, { recursive: true });
    host.sh('mkdir -p "$2" && mount --bind "$1" "$2"', dir, target);
  }
  placeSecrets(host, t.compose, [...new Set(services.flatMap((s) => (s.secrets ?? []).map((x) => x.source)))], undefined, services);
  if (ownTmp) {
    const tmp = path.join(t.dir, 'tmp', host.name);
    mkdirSync(tmp, { recursive: true, mode: 0o1777 });
    // A checkout under /tmp (a fresh clone there) stays visible at its path: kept aside on the host's /run, then
    // bound back inside the host's own /tmp.
    const under = path.relative('/tmp', ROOT);
    if (under.startsWith('..') || path.isAbsolute(under)) host.sh('mount --bind "$1" /tmp', tmp);
    else host.sh('mkdir -p /run/ferry-checkout && mount --bind "$2" /run/ferry-checkout && mount --bind "$1" /tmp && mkdir -p "$2" && mount --bind /run/ferry-checkout "$2"', tmp, ROOT);
  }
}

/** Copies compose secrets into a host: at each service's declared target (default /run/secrets/<name>), or into `dir`. */
function placeSecrets(host: Host, c: Compose, names: string[], dir?: string, services: ComposeService[] = Object.values(c.services)) {
  for (const name of names) {
    const decl = services.flatMap((s) => s.secrets ?? []).find((x) => x.source === name)!;
    const target = dir ? path.join(dir, path.basename(decl.target ?? name)) : decl.target ?? `/run/secrets/${name}`;
    host.sh('mkdir -p "$(dirname "$2")" && cp "$1" "$2" && chmod 0400 "$2"', c.secrets[name].file, target);
  }
}

/** The pid of the namespace init of a libvirtd from startOwnLibvirt (libvirtd-ns.sh with its folder, in another
 *  network namespace than this process: `unshare`, its parent, has the same arguments). */
function libvirtdNamespace(lv: TestLibvirt): number {
  const mine = readlinkSync('/proc/self/ns/net');
  for (const p of readdirSync('/proc').filter((x) => /^\d+$/.test(x))) {
    try {
      const args = readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
      if (args.some((a, i) => a.endsWith('libvirtd-ns.sh') && args[i + 1] === lv.dir) && readlinkSync(`/proc/${p}/ns/net`) !== mine) return Number(p);
    } catch { /* a process that ended */ }
  }
  throw new Error(`no libvirtd-ns.sh for ${lv.dir}`);
}

/** The simulator on the vcenter host's port 443, and the test's way to it: a proxy on 127.0.0.1 (the name its
 *  certificate holds). */
async function startVcsim(t: Topology, hostsFile: string) {
  t.vcenter.sh('mount --bind "$1" /etc/hosts', hostsFile);
  const ca = path.join(t.dir, 'vcsim.pem');
  const p = t.vcenter.start([await vcsimBinary(), '-l', '0.0.0.0:443', '-cert-out', ca, '-username', VCSIM.username, '-password', VCSIM.password, '-ds', '2', '-vm', '0'], { PATH: process.env.PATH! }, ROOT);
  t.procs.push(p);
  const ready = await until(() => {
    const line = p.logs.join('').split('\n').find((l) => l.startsWith('{'));
    return line ? JSON.parse(line) as { datastores: Record<string, string> } : undefined;
  }, 60_000, 'vcsim started');
  t.vcsimDirs = Object.values(ready.datastores);
  t.proxy = await startProxy(443, t.vcenter.ip);
  t.m = managerFor({ url: `https://127.0.0.1:${t.proxy.port}/sdk`, ...VCSIM, ca: readFileSync(ca, 'utf8') });
}

/** kvm1: the libvirtd's socket where a system connection looks for it, the mapped network, sshd on port 22. */
async function startKvm(t: Topology) {
  t.kvm.sh('ln -sf "$1" /run/libvirt/libvirt-sock', path.join(t.lv.sockDir, 'libvirt-sock'));
  writeFileSync(path.join(t.dir, 'net.xml'), `<network><name>${NETWORK}</name><bridge name="virbrtopo0"/></network>`);
  await t.lv.virsh(['net-define', path.join(t.dir, 'net.xml')]);
  await t.lv.virsh(['net-start', NETWORK]);
  t.sshd = await startSshd(path.join(t.dir, 'ssh'), { wrap: ['nsenter', '-t', String(t.kvm.pid), '-m', '-n', '--'], listen: '0.0.0.0', port: 22 });
  writeFileSync(path.join(t.dir, 'known_hosts'), `kvm1 ${readFileSync(t.sshd.hostKey, 'utf8')}`);
}

/** direct0 (the shape B job's), plan0 and plan1 (the plan's): each the tiny guest, on LocalDS_0, NIC on VM Network. */
async function addSourceVms(t: Topology, tiny: string) {
  const vc = { url: `https://127.0.0.1:${t.proxy.port}/sdk`, caFile: path.join(t.dir, 'vcsim.pem') } as Vcsim;
  let mac = 0x30;
  for (const name of ['direct0', 'plan0', 'plan1']) {
    await createPlanVm(t.m, { name, host: 'DC0_H0', mac: `00:50:56:07:00:${(mac++).toString(16)}`, disks: [{ ds: 'LocalDS_0', file: `${name}/${name}.vmdk`, bytes: TINY_GUEST_BYTES }] });
    await upload(vc, tiny, `${name}/${name}.vmdk`, 'LocalDS_0');
  }
}

async function stopTopology(t: Topology) {
  await t.lan?.stop();
  await t.sshd?.stop();
  t.rc?.disconnect();
  await t.proxy?.close();
  await t.libvirtStop?.();
  for (const d of t.vcsimDirs ?? []) rmSync(d, { recursive: true, force: true });
  if (t.dir) rmSync(t.dir, { recursive: true, force: true });
}

const workerLogs = (t: Topology) => `\n${t.procs.filter((p) => /^worker/.test(p.host)).map((p) => `--- ${p.host}:\n${p.logs.slice(-40).join('')}`).join('\n')}`;

// ---- Sizing: what one migration takes on the worker that runs it ---------------------------------------------

/** Samples, every 500 ms until stopped, each migration worker host as a container's figures would be taken: every
 *  process in the host's network namespace but its vSphere forwarder (the worker, qemu-img, and the guestfish
 *  server that forks away from the worker with its appliance's qemu): resident memory summed, and each process's
 *  CPU time as last seen (a process that lives less than a sample is missed: a lower bound); and the scratch it
 *  writes (the shared scratch volume and the host's own /tmp, allocated blocks). On stop: a function giving one
 *  host's figures with its worker process's VmHWM. */
function startSampling(t: Topology) {
  const peaks = new Map<string, { rss: number; scratch: number }>();
  const cpu = new Map<string, Map<number, number>>();
  const hosts = t.workerHosts.filter((x) => x.name.startsWith('worker-migrate'));
  const pidOf = (h: Host, worker: boolean) => t.procs.find((p) => p.host === h.name && p.proc.spawnargs.some((a) => a.endsWith('/worker/main.js')) === worker)!.proc.pid!;
  const tick = () => {
    const byNs = processesByNetns();
    const scratch0 = du(path.join(t.dir, 'volumes', 'scratch'));
    for (const h of hosts) {
      const pids = (byNs.get(readlinkSync(`/proc/${h.pid}/ns/net`)) ?? []).filter((pid) => pid !== pidOf(h, false) && pid !== h.pid);
      const seen = cpu.get(h.name) ?? new Map<number, number>();
      for (const pid of pids) seen.set(pid, Math.max(seen.get(pid) ?? 0, cpuTicks(pid)));
      cpu.set(h.name, seen);
      const rss = pids.reduce((sum, pid) => sum + rssOf(pid), 0);
      const scratch = scratch0 + du(path.join(t.dir, 'tmp', h.name));
      const was = peaks.get(h.name) ?? { rss: 0, scratch: 0 };
      peaks.set(h.name, { rss: Math.max(was.rss, rss), scratch: Math.max(was.scratch, scratch) });
    }
  };
  const timer = setInterval(tick, 500);
  return {
    stop: () => {
      clearInterval(timer);
      tick();
      return (h: Host) => {
        const hwm = Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${pidOf(h, true)}/status`, 'utf8'))![1]);
        const mib = (b: number) => Math.round(b / 1048576);
        const ticks = [...cpu.get(h.name)!.values()].reduce((a, b) => a + b, 0);
        return { worker_vmhwm_mib: Math.round(hwm / 1024), host_peak_rss_mib: mib(peaks.get(h.name)!.rss), host_cpu_seconds: ticks / 100, scratch_peak_mib: mib(peaks.get(h.name)!.scratch) };
      };
    },
  };
}

/** utime + stime of a process, in clock ticks (0 once it has ended). */
function cpuTicks(pid: number): number {
  try { const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' '); return Number(f[11]) + Number(f[12]); } catch { return 0; }
}

/** Every process, by the network namespace it is in. */
function processesByNetns(): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const p of readdirSync('/proc').filter((x) => /^\d+$/.test(x))) {
    try { const ns = readlinkSync(`/proc/${p}/ns/net`); out.set(ns, [...(out.get(ns) ?? []), Number(p)]); } catch { /* a process that ended */ }
  }
  return out;
}

function rssOf(pid: number): number {
  try { return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) * 1024; } catch { return 0; }
}

/** Bytes allocated under `dir` (files being written and removed meanwhile are skipped). */
function du(dir: string): number {
  let total = 0;
  let entries: Dirent[];
  try { entries = readdirSync(dir, { withFileTypes: true }); } catch { return 0; }
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) total += du(p);
    else try { total += statSync(p).blocks * 512; } catch { /* removed meanwhile */ }
  }
  return total;
}
