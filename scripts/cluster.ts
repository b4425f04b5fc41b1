// `npm start`: the whole local cluster in one terminal. Starts a private redis-server (append-only, data under
// .data/redis, or $FERRY_DATA_DIR/redis) unless REDIS_URL is set, then every service as its own process; Ctrl-C stops them in order
// (workers first, so they finish or hand back their jobs, then the rest, then Redis).
// Compiled (dist/scripts/cluster.js, what `npm start` runs after `npm run build`) it starts each service as
// `node dist/services/<name>/main.js`, as the image does; from source (`npm run dev`) through tsx.
import '../platform/check-settings'; // first: a bad setting stops the cluster before any service starts
import { spawn, ChildProcess } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { isSet, setting } from '../platform/settings';
import { nodeFlagsFor } from '../platform/node-flags';

const COMPILED = __filename.endsWith('.js');
/** Where the services' code is (the checkout, or dist/), and the package root (.data lives there). */
const CODE = path.resolve(__dirname, '..');
const ROOT = COMPILED ? path.resolve(CODE, '..') : CODE;
const entry = (script: string) => [...nodeFlagsFor(script),
  ...(COMPILED ? [path.join(CODE, script.replace(/\.ts$/, '.js'))] : ['--import', 'tsx', path.join(CODE, script)])];
const env = process.env;

interface Svc { name: string; script: string; args?: string[]; env?: Record<string, string>; stopFirst?: boolean }

/** The services of the local cluster. Later services add themselves here. Every service inherits this
 *  environment, so GOVC_URL, GOVC_USERNAME, GOVC_PASSWORD, GOVC_INSECURE (and FERRY_VSPHERE_CA) reach the daemon
 *  (/vms/*) and worker-1 (export jobs: vsphere_access). */
export const SERVICES: Svc[] = [
  { name: 'gateway', script: 'services/gateway/main.ts' },
  { name: 'daemon', script: 'services/daemon/main.ts' },
  { name: 'scheduler', script: 'services/scheduler/main.ts' },
  { name: 'notifier', script: 'services/notifier/main.ts' },
  { name: 'worker-1', script: 'services/worker/main.ts', args: ['--id', 'local-worker-1', '--capabilities', 'img_tool,vsphere_access', '--metrics-port', String(setting('WORKER1_METRICS_PORT'))], stopFirst: true },
  { name: 'worker-2', script: 'services/worker/main.ts', args: ['--id', 'local-worker-2', '--capabilities', 'img_tool,nbd_access,mount_operations,lvm_tools,libvirt_access,vsphere_access', '--execution-mode', 'PRIVILEGED_CONTAINER', '--metrics-port', String(setting('WORKER2_METRICS_PORT'))], stopFirst: true },
];

function portOpen(port: number): Promise<boolean> {
  return new Promise((r) => {
    const c = net.connect(port, '127.0.0.1');
    c.once('connect', () => { c.destroy(); r(true); });
    c.once('error', () => r(false));
  });
}

async function main() {
  const children: { svc: Svc; proc: ChildProcess }[] = [];
  let stopping = false;
  let redis: ChildProcess | undefined;
  if (!isSet('REDIS_URL')) {
    const port = setting('FERRY_REDIS_PORT');
    if (await portOpen(port)) {
      console.log(`[cluster] REDIS_URL is not set and port ${port} is taken; set REDIS_URL or FERRY_REDIS_PORT`);
      process.exit(1);
    }
    const dir = path.join(path.resolve(setting('FERRY_DATA_DIR') ?? path.join(ROOT, '.data')), 'redis');
    mkdirSync(dir, { recursive: true });
    redis = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--appendonly', 'yes', '--maxmemory-policy', 'noeviction',
      // Job records (hashes with a spec and a history of a few hundred bytes) stay compact: docs/queue.md.
      '--hash-max-listpack-value', '1024'], { stdio: 'ignore', detached: true });
    // In a process group of its own, so a Ctrl-C (SIGINT to the terminal's whole group) does not stop Redis before the
    // workers have handed their jobs back; stopAll stops it last, and it goes with this process however that ends.
    const own = redis;
    process.on('exit', () => { if (own.exitCode === null && !own.signalCode) own.kill('SIGTERM'); });
    for (let i = 0; i < 100 && !(await portOpen(port)); i++) await new Promise((r) => setTimeout(r, 100));
    env.REDIS_URL = `redis://127.0.0.1:${port}`;
    console.log(`[cluster] started a private redis-server on ${env.REDIS_URL} (append-only, data in ${dir.startsWith(ROOT + path.sep) ? path.relative(ROOT, dir) : dir})`);
  } else {
    console.log(`[cluster] using REDIS_URL ${setting('REDIS_URL').replace(/\/\/[^@]*@/, '//***@')}`);
  }
  const govcUrl = setting('GOVC_URL');
  if (govcUrl) {
    let shown = govcUrl;
    try { const u = new URL(/^[a-z]+:\/\//i.test(shown) ? shown : `https://${shown}`); u.username = ''; u.password = ''; shown = u.href; } catch { /* shown as given */ }
    console.log(`[cluster] vSphere manager from GOVC_URL: ${shown} (user ${setting('GOVC_USERNAME') || 'from GOVC_URL'}${setting('GOVC_INSECURE') ? ', insecure TLS' : ''})`);
  } else {
    console.log('[cluster] no GOVC_URL: /vms/* and export jobs need a manager_url per request or job');
  }
  for (const svc of SERVICES) {
    const proc = spawn(process.execPath, [...entry(svc.script), ...(svc.args || [])], { cwd: ROOT, env: { ...env, ...svc.env }, stdio: ['ignore', 'pipe', 'pipe'] });
    const prefix = `[${svc.name}] `;
    for (const s of [proc.stdout, proc.stderr]) {
      let buf = '';
      s.setEncoding('utf8').on('data', (d: string) => {
        buf += d;
        const lines = buf.split('\n');
        buf = lines.pop()!;
        for (const l of lines) if (!l.startsWith('npm warn')) process.stdout.write(prefix + l + '\n');
      });
    }
    // A service that dies is never silent, and the cluster does not run on without it (issue 38: workers that
    // died on a port in use left jobs queued forever): everything stops and `npm start` exits 1, naming it.
    proc.on('exit', (code, sig) => {
      if (stopping) return;
      console.log(`[cluster] ${svc.name} exited unexpectedly (${sig || `exit code ${code}`}): stopping every service; npm start exits 1`);
      void stopAll(1);
    });
    children.push({ svc, proc });
  }
  console.log(`[cluster] gateway on http://localhost:${setting('GATEWAY_PORT')}${SERVICES.some((s) => s.name === 'daemon') ? `, daemon on http://localhost:${setting('DAEMON_PORT')}` : ''}; Ctrl-C stops everything`);

  const stopAll = async (exitCode = 0) => {
    if (stopping) return;
    stopping = true;
    console.log('[cluster] stopping: workers finish or hand back their jobs, then the other services');
    const stop = (list: typeof children) => Promise.all(list.map(({ proc }) => new Promise<void>((r) => {
      if (proc.exitCode !== null || proc.signalCode) return r();
      proc.once('exit', () => r());
      proc.kill('SIGTERM');
      setTimeout(() => proc.kill('SIGKILL'), 60_000).unref();
    })));
    await stop(children.filter((c) => c.svc.stopFirst));
    await stop(children.filter((c) => !c.svc.stopFirst));
    if (redis) {
      await new Promise<void>((r) => { redis.once('exit', () => r()); redis.kill('SIGTERM'); });
      console.log('[cluster] redis-server stopped');
    }
    process.exit(exitCode);
  };
  // stopAll only waits for exits: it has nothing that rejects
  process.on('SIGINT', () => void stopAll(0));
  process.on('SIGTERM', () => void stopAll(0));
  process.on('SIGHUP', () => void stopAll(0)); // the terminal closed: Redis, in its own group, gets no hangup of its own
}

if (require.main === module) main().catch((e: Error) => { console.error(`[cluster] could not start: ${e.stack || e.message}`); process.exit(1); });
