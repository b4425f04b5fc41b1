// compose.yaml and the Dockerfile. There is no Docker engine on the test machine, so nothing is built or run:
// Debian's docker-compose (1.29) validates and resolves the file (`config -q`), and the resolved file is checked
// for what operators rely on (scalable workers, health checks, no secret in the file, provisioned Grafana).
import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import yaml from 'js-yaml';
import { WORKER_NODE_FLAGS } from '../../platform/node-flags';

/** A volume as docker-compose 1.29 resolves it: the long form, or the short "source:target[:mode]". */
type Volume = string | { source: string; target: string };
/** A service of the resolved compose file, as far as read here. */
interface Service {
  environment: Record<string, string>; command: string[]; volumes: Volume[]; healthcheck?: { test?: string[] };
  ports?: { target: number }[]; privileged?: boolean; container_name?: string; build?: { target?: string };
}
/** `docker-compose config` output. */
interface ComposeFile { services: Record<string, Service> }
/** deploy/prometheus/prometheus.yml, as far as read here. */
interface PromConfig { scrape_configs: { job_name: string; dns_sd_configs?: { names: string[]; port: number }[] }[] }
/** Grafana's dashboard provisioning file. */
interface DashboardProviders { providers: { options: { path: string } }[] }

const ROOT = path.resolve(__dirname, '..', '..');
const COMPOSE = path.join(ROOT, 'compose.yaml');
const SECRETS = { FERRY_SECRET_KEY: 'test-only-secret-value', GRAFANA_ADMIN_PASSWORD: 'test-only-grafana-value', FERRY_API_KEYS: 'ops:admin:test-only-api-key-value' };
/** What an operator configures beside the secrets: the default libvirt host, and the files the migration worker
 *  gets as secrets (any existing file resolves here; nothing is mounted). */
const CONFIG = { FERRY_LIBVIRT_URI: 'qemu+ssh://root@kvm1.example/system', FERRY_VSPHERE_CA_FILE: COMPOSE, FERRY_LIBVIRT_SSH_KEY_FILE: COMPOSE, FERRY_LIBVIRT_KNOWN_HOSTS_FILE: COMPOSE };
const compose = (args: string[], env: Record<string, string> = {}) => {
  const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !(k in SECRETS) && !(k in CONFIG)));
  return spawnSync('docker-compose', ['-f', COMPOSE, ...args], { cwd: ROOT, encoding: 'utf8', env: { ...clean, ...CONFIG, ...env } });
};

describe('deploy: compose.yaml and Dockerfile', function () {
  this.timeout(30000);
  let resolved: ComposeFile;
  before(() => {
    const r = compose(['config'], SECRETS);
    expect(r.status, r.stderr).to.equal(0);
    resolved = yaml.load(r.stdout) as ComposeFile;
  });

  it('docker-compose -f compose.yaml config -q accepts the file', () => {
    const r = compose(['config', '-q'], SECRETS);
    expect(r.status, r.stderr).to.equal(0);
  });

  it('refuses to resolve without the secrets from the environment (none are in the file)', () => {
    const r = compose(['config', '-q']);
    expect(r.status).to.not.equal(0);
    expect(r.stderr).to.match(/FERRY_SECRET_KEY|GRAFANA_ADMIN_PASSWORD|FERRY_API_KEYS/);
    const text = readFileSync(COMPOSE, 'utf8');
    for (const v of Object.values(SECRETS)) expect(text).to.not.include(v);
    // Every secret-looking variable is a ${...} reference.
    for (const m of text.matchAll(/^\s*([A-Z_]*(PASSWORD|SECRET|API_KEYS|TOKEN)[A-Z_]*):\s*(.*)$/gm)) expect(m[3], m[1]).to.match(/^\$\{[A-Z_]+(:[-?][^}]*)?\}$/);
  });

  it('requires API keys: services listen on every address there, which Ferry refuses without keys', () => {
    const { FERRY_API_KEYS: _, ...others } = SECRETS;
    const r = compose(['config', '-q'], others);
    expect(r.status).to.not.equal(0);
    expect(r.stderr).to.include('FERRY_API_KEYS');
    for (const name of ['gateway', 'daemon', 'worker', 'worker-guest', 'worker-migrate']) expect(resolved.services[name].environment.FERRY_API_KEYS, name).to.equal(SECRETS.FERRY_API_KEYS);
  });

  it('has every service, with health checks, Redis append-only with noeviction', () => {
    const s = resolved.services;
    expect(Object.keys(s)).to.include.members(['redis', 'gateway', 'daemon', 'scheduler', 'notifier', 'worker', 'worker-guest', 'worker-migrate', 'prometheus', 'grafana']);
    for (const [name, svc] of Object.entries(s)) expect(svc.healthcheck?.test, `${name} health check`).to.not.be.oneOf([null, undefined]);
    const redisCmd = s.redis.command.join(' ');
    expect(redisCmd).to.match(/--appendonly yes/).and.to.match(/--maxmemory-policy noeviction/).and.to.match(/--hash-max-listpack-value 1024/);
    expect(s.gateway.ports!.map((p) => p.target)).to.include(8000);
    expect(s.daemon.ports!.map((p) => p.target)).to.include(8080);
  });

  it('workers can be scaled (no container_name, no published port) and only guest workers are privileged', () => {
    const w = resolved.services.worker;
    expect(w.container_name).to.equal(undefined);
    expect(w.ports).to.equal(undefined);
    expect(w.privileged).to.not.equal(true);
    expect(w.environment.FERRY_WORKER_CAPABILITIES).to.equal('img_tool');
    const g = resolved.services['worker-guest'];
    expect(g.privileged).to.equal(true);
    expect(g.environment.FERRY_WORKER_CAPABILITIES).to.include('nbd_access').and.to.include('mount_operations');
    for (const name of ['gateway', 'daemon', 'scheduler', 'notifier']) expect(resolved.services[name].privileged, name).to.not.equal(true);
    // Prometheus finds the replicas through the compose DNS names of both worker services.
    const prom = yaml.load(readFileSync(path.join(ROOT, 'deploy/prometheus/prometheus.yml'), 'utf8')) as PromConfig;
    const job = prom.scrape_configs.find((j) => j.job_name === 'worker')!;
    expect(job.dns_sd_configs![0].names).to.have.members(['worker', 'worker-guest', 'worker-migrate']);
    expect(job.dns_sd_configs![0].port).to.equal(Number(w.environment.FERRY_WORKER_METRICS_PORT));
  });

  it('Grafana gets the provisioning and dashboards mounted where the provider looks', () => {
    const g = resolved.services.grafana;
    const norm = (v: Volume) => (typeof v === 'string' ? v : `${v.source}:${v.target}`).replace(/:(ro|rw)$/, '');
    const vols: string[] = g.volumes.map(norm);
    const provider = yaml.load(readFileSync(path.join(ROOT, 'deploy/grafana/provisioning/dashboards/ferry.yml'), 'utf8')) as DashboardProviders;
    const dashPath = provider.providers[0].options.path;
    expect(vols.some((v) => v.endsWith(`deploy/grafana/dashboards:${dashPath}`))).to.equal(true, vols.join(', '));
    expect(vols.some((v) => v.endsWith('deploy/grafana/provisioning:/etc/grafana/provisioning'))).to.equal(true);
    const promVols: string[] = resolved.services.prometheus.volumes.map(norm);
    expect(promVols.some((v) => v.endsWith('deploy/prometheus:/etc/prometheus'))).to.equal(true);
  });

  it("the Dockerfile is multi-stage, runs the compiled code as non-root, and the worker images install their capabilities' packages", () => {
    const text = readFileSync(path.join(ROOT, 'Dockerfile'), 'utf8');
    const stages = [...text.matchAll(/^FROM\s+\S+\s+AS\s+(\S+)/gmi)].map((m) => m[1]);
    expect(stages).to.include.members(['deps', 'app', 'worker', 'worker-migrate']);
    const targets = new Set(Object.values(resolved.services).map((s) => s.build?.target).filter(Boolean));
    for (const t of targets) expect(stages, `compose target ${t}`).to.include(t);
    const stage = (name: string) => text.split(/^FROM /m).find((s) => new RegExp(`AS ${name}\\s`).test(s))!;
    expect(stage('app')).to.match(/^USER node$/m);
    // The worker stages install their capabilities' packages from scripts/programs.txt (test/deploy/workers.test.ts
    // runs that line and checks what it installs).
    for (const t of ['worker', 'worker-migrate']) expect(stage(t), t).to.match(/apt-get install -y --no-install-recommends \$\(node dist\/platform\/programs\.js packages "\$FERRY_IMAGE_CAPABILITIES"\)/);
    expect(stage('worker').trim().split('\n').filter((l) => /^USER /.test(l)).pop()).to.equal('USER node');
    // Everything COPY'd into the image exists.
    for (const m of text.matchAll(/^COPY (?!--from)(.+) \S+$/gm)) for (const src of m[1].split(/\s+/)) expect(existsSync(path.join(ROOT, src)), src).to.equal(true);
    // Every service runs the compiled code with plain node (no tsx in the image), from a source that exists.
    expect(stage('app')).to.match(/^CMD \["node", "dist\/services\/gateway\/main\.js"\]$/m);
    // The worker with its node flags (platform/node-flags.ts), as the Dockerfile writes a CMD.
    expect(stage('worker').split('\n')).to.include(`CMD ${JSON.stringify(['node', ...WORKER_NODE_FLAGS, 'dist/services/worker/main.js']).replace(/","/g, '", "')}`);
    expect(text).to.not.match(/--import", "tsx"|tsx\/cjs/);
    for (const name of ['gateway', 'daemon', 'scheduler', 'notifier']) {
      const cmd: string[] = resolved.services[name].command;
      expect(cmd.join(' '), name).to.match(/^node dist\/services\/\w+\/main\.js$/);
      expect(existsSync(path.join(ROOT, cmd[1].replace(/^dist\//, '').replace(/\.js$/, '.ts'))), cmd.join(' ')).to.equal(true);
    }
    execFileSync('docker-compose', ['version'], { stdio: 'ignore' });
  });
});
