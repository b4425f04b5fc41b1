// Issue 35, item 3: one configuration. Every setting is declared once (platform/settings.ts) with its type, default,
// validation and doc line; code reads through it; docs/configuration.md is generated from it; compose.yaml and the
// Kubernetes manifests name only declared settings with valid values; and every process, started for real with a
// malformed value, stops at once with one line naming the variable, exit 2, leaving nothing in Redis, while the
// defaults still start it.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { NOT_SETTINGS, SETTINGS, SettingError, setting, settingNames, settingProblems, type Decl, type SettingName } from '../../platform/settings';
import { config } from '../../platform/config';
import { CONFIGURATION_DOC, renderSettingsDoc } from '../../scripts/gen-settings-doc';
import { createRedis } from '../../platform/redis';
import { TestRedis } from '../helpers/redis';
import { awaitWorkers, ferryCli, ferryConvert, startDaemonProc, startGatewayProc, startProcess, type Proc } from '../helpers/procs';
import { until } from '../helpers/http';

const ROOT = path.resolve(__dirname, '..', '..');
const isDeclared = (n: string): n is SettingName => Object.hasOwn(SETTINGS, n);

describe('settings: the declaration (platform/settings.ts)', () => {
  it('refuses a typo\'d number, naming the variable, what it must be and what it got', () => {
    expect(() => setting('FERRY_LEASE_SECONDS', { FERRY_LEASE_SECONDS: '3O' })).to.throw(SettingError, 'FERRY_LEASE_SECONDS must be a whole number from 1 to 3600, got "3O"');
    expect(() => setting('FERRY_LEASE_SECONDS', { FERRY_LEASE_SECONDS: '2.5' })).to.throw(SettingError, 'FERRY_LEASE_SECONDS');
    expect(() => setting('FERRY_LEASE_SECONDS', { FERRY_LEASE_SECONDS: '0' })).to.throw(SettingError, 'from 1 to 3600');
    expect(() => setting('FERRY_EXPORT_CHUNK_BYTES', { FERRY_EXPORT_CHUNK_BYTES: 'NaN' })).to.throw(SettingError, 'FERRY_EXPORT_CHUNK_BYTES');
    expect(setting('FERRY_LEASE_SECONDS', { FERRY_LEASE_SECONDS: ' 12 ' })).to.equal(12);
    expect(setting('FERRY_SOURCE_CHECK_SECONDS', { FERRY_SOURCE_CHECK_SECONDS: '0.5' })).to.equal(0.5);
  });

  it('applies the defaults when a variable is unset or empty', () => {
    expect(setting('FERRY_LEASE_SECONDS', {})).to.equal(30);
    expect(setting('FERRY_LEASE_SECONDS', { FERRY_LEASE_SECONDS: '' })).to.equal(30);
    expect(setting('FERRY_JOB_RETENTION', {})).to.equal(7 * 86_400_000);
    expect(setting('FERRY_WORKER_CAPABILITIES', {})).to.deep.equal(['img_tool']);
    expect(setting('FERRY_INPUT_ROOTS', { FERRY_INPUT_ROOTS: ' ' })).to.deep.equal([]);
    expect(setting('FERRY_GUEST_PREFLIGHT', {})).to.equal(true);
    expect(setting('FERRY_LIBVIRT_URI', {})).to.equal(undefined);
    expect(setting('LOG_LEVEL', {})).to.equal('info');
  });

  it('reads booleans, enums, durations, lists, URIs and paths, refusing what they are not', () => {
    expect(['1', 'TRUE', 'yes', 'On'].map((v) => setting('FERRY_GUESTFS_KVM', { FERRY_GUESTFS_KVM: v }))).to.deep.equal([true, true, true, true]);
    expect(['0', 'false', 'NO', 'off'].map((v) => setting('FERRY_GUEST_PREFLIGHT', { FERRY_GUEST_PREFLIGHT: v }))).to.deep.equal([false, false, false, false]);
    expect(() => setting('FERRY_INSECURE_NO_AUTH', { FERRY_INSECURE_NO_AUTH: 'sure' })).to.throw('FERRY_INSECURE_NO_AUTH must be 1, 0, true, false, yes, no, on or off, got "sure"');
    expect(() => setting('FERRY_EXECUTION_MODE', { FERRY_EXECUTION_MODE: 'process' })).to.throw('FERRY_EXECUTION_MODE must be one of PROCESS, CONTAINER, PRIVILEGED_CONTAINER');
    expect(setting('FERRY_WORKER_PRUNE_AFTER', { FERRY_WORKER_PRUNE_AFTER: '1h30m' })).to.equal(5_400_000);
    expect(() => setting('FERRY_JOB_RETENTION', { FERRY_JOB_RETENTION: '7 days' })).to.throw('FERRY_JOB_RETENTION must be a duration');
    expect(() => setting('JOB_TIMEOUT', { JOB_TIMEOUT: '200h' })).to.throw('JOB_TIMEOUT must be a duration such as 48h, 90m or 30s, at most 168h');
    expect(setting('FERRY_EXTRA_CAPABILITIES', { FERRY_EXTRA_CAPABILITIES: 'a_b, ,c ' })).to.deep.equal(['a_b', 'c']);
    expect(() => setting('FERRY_EXTRA_CAPABILITIES', { FERRY_EXTRA_CAPABILITIES: 'ok,Not-OK' })).to.throw('FERRY_EXTRA_CAPABILITIES must be capability names');
    expect(() => setting('FERRY_INPUT_ROOTS', { FERRY_INPUT_ROOTS: '/srv:data' })).to.throw('FERRY_INPUT_ROOTS must be absolute paths, separated by ":"');
    expect(() => setting('FERRY_LIBVIRT_URI', { FERRY_LIBVIRT_URI: 'kvm1.example' })).to.throw('FERRY_LIBVIRT_URI must be a libvirt URI');
    expect(() => setting('FERRY_LIBVIRT_POOL_DIR', { FERRY_LIBVIRT_POOL_DIR: 'images' })).to.throw('FERRY_LIBVIRT_POOL_DIR must be an absolute path');
    expect(setting('LOG_LEVEL', { LOG_LEVEL: 'WARN' })).to.equal('warn');
    expect(setting('FERRY_TRUSTED_PROXIES', { FERRY_TRUSTED_PROXIES: '10.0.0.0/8, ::1' })).to.deep.equal(['10.0.0.0/8', '::1']);
    expect(() => setting('FERRY_TRUSTED_PROXIES', { FERRY_TRUSTED_PROXIES: '10.0.0.300' })).to.throw('FERRY_TRUSTED_PROXIES must be IP addresses or CIDRs');
  });

  it('never shows a secret\'s value in its error', () => {
    const msg = (() => { try { setting('REDIS_URL', { REDIS_URL: 'http://u:hunter2-secret@redis:6379' }); } catch (e) { return (e as Error).message; } return ''; })();
    expect(msg).to.match(/^REDIS_URL must be a redis:\/\//).and.include('not shown');
    expect(msg).to.not.include('hunter2');
  });

  it('the configuration module reads through it: a bad value throws naming the variable, a good one is parsed', () => {
    const saved = process.env.FERRY_RETRY_BACKOFF_MS;
    try {
      process.env.FERRY_RETRY_BACKOFF_MS = '2s';
      expect(() => config.retryBackoffMs).to.throw('FERRY_RETRY_BACKOFF_MS must be a whole number');
      process.env.FERRY_RETRY_BACKOFF_MS = '250';
      expect(config.retryBackoffMs).to.equal(250);
    } finally {
      if (saved === undefined) delete process.env.FERRY_RETRY_BACKOFF_MS; else process.env.FERRY_RETRY_BACKOFF_MS = saved;
    }
  });

  it('settingProblems names every bad variable of an environment, in declaration order', () => {
    expect(settingProblems({ FERRY_LEASE_SECONDS: 'x', LOG_LEVEL: 'loud', FERRY_PREFIX: 'ok' }).map((m) => m.split(' ')[0])).to.deep.equal(['LOG_LEVEL', 'FERRY_LEASE_SECONDS']);
    expect(settingProblems({})).to.deep.equal([]);
  });

  it('every declaration has a doc line, and its default is a value it accepts', () => {
    for (const n of settingNames()) {
      const d = SETTINGS[n] as Decl<unknown>;
      expect(d.doc, n).to.match(/\S/);
      if (d.def === undefined || (Array.isArray(d.def) && !d.def.length)) continue;
      expect(setting(n, { [n]: d.defText }), n).to.deep.equal(d.def);
    }
  });
});

/** Every file under `dir` (recursively) whose name matches `re`. */
function filesUnder(dir: string, re: RegExp): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? (e.name === 'node_modules' || e.name === 'artifacts' ? [] : filesUnder(p, re)) : re.test(e.name) ? [p] : [];
  });
}

describe('settings: one place', () => {
  const product = [...['services', 'orchestration', 'queue', 'domain', 'platform'].flatMap((d) => filesUnder(path.join(ROOT, d), /\.(ts|js)$/)), path.join(ROOT, 'scripts', 'cluster.ts')]
    .filter((f) => !f.endsWith(path.join('platform', 'settings.ts')));

  it('no product file reads a variable from the environment except through the declaration (the system\'s PATH, TMPDIR, XDG_RUNTIME_DIR aside)', () => {
    const reads: string[] = [];
    for (const f of product) {
      readFileSync(f, 'utf8').split('\n').forEach((line, i) => {
        // A read: process.env.NAME, env.NAME or env['NAME'] not being assigned.
        for (const m of line.matchAll(/\b(?:process\.)?env(?:\.([A-Z][A-Z0-9_]*)\b|\[['"]([A-Z][A-Z0-9_]*)['"]\])(?!\s*=[^=])/g)) {
          const name = m[1] ?? m[2];
          if (!['PATH', 'TMPDIR', 'XDG_RUNTIME_DIR'].includes(name)) reads.push(`${path.relative(ROOT, f)}:${i + 1}: ${name}`);
        }
      });
    }
    // scripts/cluster.ts logs the REDIS_URL it has just set for its services.
    expect(reads.filter((r) => !r.startsWith('scripts/cluster.ts') || !r.endsWith('REDIS_URL'))).to.deep.equal([]);
  });

  it('every FERRY_* name in the code, tests, scripts and deployment files is a declared setting or listed as not one', () => {
    const files = [...['services', 'orchestration', 'queue', 'domain', 'platform', 'scripts', 'test', 'deploy'].flatMap((d) => filesUnder(path.join(ROOT, d), /\.(ts|js|mjs|cjs|sh|bash|ya?ml)$/)),
      path.join(ROOT, 'compose.yaml'), path.join(ROOT, 'Dockerfile')];
    const unknown = new Set<string>();
    for (const f of files) for (const m of readFileSync(f, 'utf8').matchAll(/\bFERRY_[A-Z0-9_]*[A-Z0-9]\b/g)) if (!isDeclared(m[0]) && !(m[0] in NOT_SETTINGS)) unknown.add(`${m[0]} (${path.relative(ROOT, f)})`);
    expect([...unknown]).to.deep.equal([]);
  });

  it('docs/configuration.md is what scripts/gen-settings-doc.ts generates (run it after changing a setting)', () => {
    const doc = readFileSync(CONFIGURATION_DOC, 'utf8');
    expect(doc === renderSettingsDoc(), 'docs/configuration.md is stale: npx tsx scripts/gen-settings-doc.ts').to.equal(true);
    for (const n of settingNames()) expect(doc, n).to.include(`| \`${n}\``);
  });
});

/** A compose value as compose resolves it without the variable set: `${X:-d}` is d, `${X:?...}` and `${X}` come
 *  from the operator (undefined: not checked here), anything else is literal. */
function composeValue(v: unknown): string | undefined {
  const s = String(v);
  const m = /^\$\{[A-Z0-9_]+(:?[-?])([^}]*)\}$/.exec(s);
  if (!m) return s.includes('${') ? undefined : s;
  return m[1].endsWith('-') ? m[2] : undefined;
}

/** A compose mapping with its YAML merge keys (`<<: *anchor`) applied, as compose applies them. */
function merged(o: Record<string, unknown>): Record<string, unknown> {
  const { '<<': base, ...rest } = o;
  const bases = (base === undefined ? [] : Array.isArray(base) ? base : [base]) as Record<string, unknown>[];
  return Object.assign({}, ...bases.map(merged), rest) as Record<string, unknown>;
}

/** Names and literal values the Kubernetes manifests give Ferry's containers: env entries and the ConfigMap. */
function k8sEnv(doc: unknown, out: { where: string; name: string; value?: string }[], where: string): void {
  if (!doc || typeof doc !== 'object') return;
  const o = doc as Record<string, unknown>;
  if (o.kind === 'ConfigMap' && (o.metadata as { name?: string } | undefined)?.name === 'ferry-config' && o.data) for (const [name, value] of Object.entries(o.data as Record<string, unknown>)) out.push({ where, name, value: String(value) });
  if (Array.isArray(o.env)) for (const e of o.env as { name: string; value?: string | number | boolean }[]) out.push({ where, name: e.name, value: e.value === undefined ? undefined : String(e.value) });
  for (const v of Object.values(o)) if (v && typeof v === 'object') for (const x of Array.isArray(v) ? v : [v]) k8sEnv(x, out, where);
}

describe('settings: compose.yaml and deploy/k8s name declared settings with valid values', () => {
  const check = (entries: { where: string; name: string; value?: string }[]) => {
    const bad: string[] = [];
    for (const e of entries) {
      if (!isDeclared(e.name)) { bad.push(`${e.where}: ${e.name} is not a declared setting`); continue; }
      if (e.value === undefined) continue;
      try { setting(e.name, { [e.name]: e.value }); } catch (err) { bad.push(`${e.where}: ${(err as Error).message}`); }
    }
    return bad;
  };

  it('compose.yaml: every Ferry service\'s environment', () => {
    const doc = yaml.load(readFileSync(path.join(ROOT, 'compose.yaml'), 'utf8')) as { services: Record<string, Record<string, unknown>> };
    const services = Object.entries(doc.services).map(([name, s]) => [name, merged(s)] as const).filter(([, s]) => typeof s.image === 'string' && s.image.includes('ferry'));
    expect(services.map(([name]) => name)).to.include.members(['gateway', 'daemon', 'scheduler', 'notifier', 'worker', 'worker-migrate']);
    const entries = services.flatMap(([svc, s]) => Object.entries(merged((s.environment ?? {}) as Record<string, unknown>)).map(([name, v]) => ({ where: svc, name, value: composeValue(v) })));
    expect(entries.length).to.be.greaterThan(30);
    expect(check(entries)).to.deep.equal([]);
  });

  it('deploy/k8s: every container env entry and the ferry-config ConfigMap', () => {
    const entries: { where: string; name: string; value?: string }[] = [];
    for (const f of filesUnder(path.join(ROOT, 'deploy', 'k8s'), /\.ya?ml$/)) for (const d of yaml.loadAll(readFileSync(f, 'utf8'))) k8sEnv(d, entries, path.relative(ROOT, f));
    const ferry = entries.filter((e) => !/^(GF_|REDIS_ARGS)/.test(e.name));
    expect(ferry.some((e) => e.name === 'FERRY_LIBVIRT_URI')).to.equal(true);
    expect(check(ferry)).to.deep.equal([]);
  });
});

interface Run { code: number | null; stdout: string; stderr: string }
/** A service's entry point as a real process (through tsx, as the test helpers start them), run until it exits. */
function runScript(script: string, args: string[], env: Record<string, string>): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', path.join(ROOT, script), ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (s: string) => { stdout += s; });
    child.stderr.setEncoding('utf8').on('data', (s: string) => { stderr += s; });
    const t = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`${script} did not exit within 120 s\n${stdout}${stderr}`)); }, 120_000);
    child.on('error', reject);
    child.on('close', (code) => { clearTimeout(t); resolve({ code, stdout, stderr }); });
  });
}

describe('settings: every process stops at start on a malformed value, and starts on the defaults', function () {
  this.timeout(600_000);
  const PREFIX = 'settings';
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-settings-'));
  const cfg = path.join(dir, 'daemon.yaml');
  const procs: Proc[] = [];
  let base: Record<string, string>;
  before(async () => {
    await redis.start();
    writeFileSync(cfg, '{}\n');
    // Only what a process needs to find its Redis and keep its keys apart: every other setting at its default.
    base = { REDIS_URL: redis.url, FERRY_PREFIX: PREFIX };
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  const keysInRedis = async () => {
    const r = createRedis({ url: redis.url });
    try { return await r.keys(`${PREFIX}:*`); } finally { r.disconnect(); }
  };
  /** One line on stderr, naming the process, the variable and what it must be; exit 2. */
  const expectRefused = (r: Run, who: string, variable: string, must: string) => {
    expect(r.code, r.stdout + r.stderr).to.equal(2);
    const lines = r.stderr.trim().split('\n');
    expect(lines, r.stderr).to.have.length(1);
    expect(lines[0]).to.match(new RegExp(`^${who}: invalid configuration: ${variable} must be ${must}`));
  };

  const CASES: [string, string, string[], string, string, string][] = [
    ['gateway', 'services/gateway/main.ts', [], 'FERRY_LEASE_SECONDS', '3O', 'a whole number from 1 to 3600, got "3O"'],
    ['daemon', 'services/daemon/main.ts', ['--config', cfg], 'FERRY_RATE_LIMIT', 'lots', 'a whole number from 0 to'],
    ['worker', 'services/worker/main.ts', ['--id', 'bad-settings'], 'FERRY_WORKER_CONCURRENCY', 'two', 'a whole number from 1 to 64'],
    ['scheduler', 'services/scheduler/main.ts', ['--config', cfg], 'FERRY_JOB_RETENTION', '7 days', 'a duration'],
    ['notifier', 'services/notifier/main.ts', ['--config', cfg], 'FERRY_WEBHOOK_ALLOW_LOOPBACK', 'maybe', '1, 0, true, false'],
    ['cluster', 'scripts/cluster.ts', [], 'FERRY_REDIS_PORT', '70000', 'a TCP port from 0 to 65535'],
  ];
  for (const [who, script, args, variable, value, must] of CASES) {
    it(`${who}: ${variable}=${value} stops it with exit 2 and one line naming ${variable}`, async () => {
      expectRefused(await runScript(script, args, { ...base, [variable]: value }), who, variable, must);
    });
  }

  it('ferry-convert: FERRY_GUESTFS_LAUNCH_SECONDS=5min stops it before reading its configuration', async () => {
    const r = await ferryConvert(['--config', path.join(dir, 'none.yaml')], { FERRY_GUESTFS_LAUNCH_SECONDS: '5min' });
    expectRefused(r, 'ferry-convert', 'FERRY_GUESTFS_LAUNCH_SECONDS', 'a number from 0.1 to 86400');
  });

  it('ferry: FERRY_URL without a scheme stops it before any request', async () => {
    expectRefused(await ferryCli(['vms'], { FERRY_URL: 'localhost:8080' }), 'ferry', 'FERRY_URL', 'an http:// or https:// URL');
  });

  it('a refused start left nothing in Redis (no worker registered, no queue made)', async () => {
    expect(await keysInRedis()).to.deep.equal([]);
  });

  it('on the defaults, the gateway, daemon, a worker, the scheduler and the notifier start', async () => {
    const gw = await startGatewayProc(base);
    procs.push(gw);
    const daemon = await startDaemonProc(base, cfg);
    procs.push(daemon);
    // No --capabilities: FERRY_WORKER_CAPABILITIES's default (img_tool) is what it registers with.
    const worker = startProcess('services/worker/main.ts', ['--id', 'defaults'], base);
    procs.push(worker);
    await awaitWorkers(gw.url, [worker]);
    const r = createRedis({ url: redis.url });
    try { expect(await r.hget(`${PREFIX}:worker:defaults`, 'capabilities')).to.include('img_tool'); } finally { r.disconnect(); }
    for (const svc of ['scheduler', 'notifier']) {
      const p = startProcess(`services/${svc}/main.ts`, ['--config', cfg], { ...base, LOG_LEVEL: 'info' });
      procs.push(p);
      await until(() => {
        if (p.proc.exitCode !== null) throw Object.assign(new Error(`${svc} exited ${p.proc.exitCode}: ${p.logs.join('')}`), { fatal: true });
        return p.logs.join('').includes(`"msg":"${svc} running"`);
      }, 120_000, `${svc} running`);
    }
    for (const p of procs) expect(p.proc.exitCode, p.logs.join('')).to.equal(null);
  });
});
