// Ferry's real services as child processes, the way an operator runs them. Node loads TypeScript through
// tsx's loader (`node --import tsx`), so each service is one process and a SIGKILL really kills it; compiled
// JavaScript (test/deploy/build.test.ts) runs with plain node.
import { spawn, ChildProcess } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { freePort, TestRedis, waitForPort } from './redis';
import { nodeFlagsFor } from '../../platform/node-flags';
import { req, until } from './http';

const ROOT = path.resolve(__dirname, '..', '..');

export interface Proc { proc: ChildProcess; port?: number; logs: string[]; stop(signal?: NodeJS.Signals): Promise<void>; kill(): Promise<void>; workerId?: string }

/** `script` is relative to the checkout, or absolute; a .js file (the compiled build) runs with plain node. */
export function startProcess(script: string, args: string[], env: Record<string, string>, cwd = ROOT): Proc {
  // The service's own flags, as every launch gives them; FERRY_NODE_ARGS: extra node flags for every service
  // started here (the benchmarks' --cpu-prof, say).
  const nodeArgs = [...nodeFlagsFor(script), ...(process.env.FERRY_NODE_ARGS || '').split(' ').filter(Boolean)];
  const loader = script.endsWith('.ts') ? ['--import', 'tsx'] : [];
  const proc = spawn(process.execPath, [...nodeArgs, ...loader, path.resolve(ROOT, script), ...args], { cwd, env: { ...process.env, LOG_LEVEL: 'warn', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  const logs: string[] = [];
  const keep = (b: Buffer) => { logs.push(b.toString()); if (logs.length > 500) logs.shift(); if (process.env.FERRY_TEST_LOGS) process.stderr.write(b); };
  proc.stdout.on('data', keep);
  proc.stderr.on('data', keep);
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  return {
    proc, logs,
    async stop(signal: NodeJS.Signals = 'SIGTERM') {
      if (proc.exitCode !== null || proc.signalCode) return;
      proc.kill(signal);
      await Promise.race([exited, new Promise((r) => setTimeout(r, 20000))]);
      if (proc.exitCode === null && !proc.signalCode) { proc.kill('SIGKILL'); await exited; }
    },
    async kill() {
      if (proc.exitCode !== null || proc.signalCode) return;
      proc.kill('SIGKILL');
      await exited;
    },
  };
}

export const testEnv = (redisUrl: string, prefix = 'ferry'): Record<string, string> => ({
  REDIS_URL: redisUrl,
  FERRY_PREFIX: prefix,
  FERRY_LEASE_SECONDS: '2',
  FERRY_HEARTBEAT_SECONDS: '1',
  FERRY_RETRY_BACKOFF_MS: '200',
  FERRY_SHUTDOWN_GRACE_SECONDS: '5',
  FERRY_RECONCILE_SECONDS: '2',
  // The plan tests' VMs have blank disks; the guest-level preflight (an appliance per validation) is tested in
  // test/plans/guest-preflight.test.ts, which turns it on.
  FERRY_GUEST_PREFLIGHT: '0',
});

export async function startGatewayProc(env: Record<string, string>): Promise<Proc & { port: number; url: string }> {
  const port = await freePort();
  const p = startProcess('services/gateway/main.ts', [], { ...env, GATEWAY_PORT: String(port), FERRY_HOST: '127.0.0.1' });
  await waitForPort(port, 60000).catch((e: Error) => { throw new Error(`${e.message}\n${p.logs.join('')}`); });
  return Object.assign(p, { port, url: `http://127.0.0.1:${port}` });
}

/** The daemon (8080) on a free port with a config file. */
export async function startDaemonProc(env: Record<string, string>, config: string): Promise<Proc & { port: number; url: string }> {
  const port = await freePort();
  const p = startProcess('services/daemon/main.ts', ['-addr', `127.0.0.1:${port}`, '--config', config], env);
  await waitForPort(port, 60000).catch((e: Error) => { throw new Error(`${e.message}\n${p.logs.join('')}`); });
  return Object.assign(p, { port, url: `http://127.0.0.1:${port}` });
}

export function startWorkerProc(env: Record<string, string>, id: string, caps: string[], extra: string[] = []): Promise<Proc> {
  // a promise like the other start helpers (callers await them alike); a worker has no port to wait for
  return Promise.resolve(Object.assign(startProcess('services/worker/main.ts', ['--id', id, '--capabilities', caps.join(','), ...extra], { ...env }), { workerId: id }));
}

/** Waits until `base`'s GET /workers (the gateway's or the daemon's; `headers`: a key when auth is on) lists
 *  every one of `workers` active, by its id (a worker killed earlier stays listed active until its heartbeat is
 *  stale, 300 s, so a count would be met by the dead one: it once made a test wait 280 s, another pass too early);
 *  by the count when a worker's id is unknown. A worker starting on a loaded machine can take a minute (tsx
 *  compiles it on load); one that exits fails the wait at once, and any failure carries the workers' own output. */
export async function awaitWorkers(base: string, workers: Proc[], headers: Record<string, string> = {}, timeoutMs = 120000): Promise<void> {
  const output = () => workers.map((w) => `--- worker (exit ${w.proc.exitCode ?? w.proc.signalCode ?? 'none'}):\n${w.logs.join('')}`).join('\n');
  await until(async () => {
    const dead = workers.find((w) => w.proc.exitCode !== null || w.proc.signalCode);
    if (dead) throw Object.assign(new Error('a worker exited before registering'), { fatal: true });
    const body = (await req<{ active?: number; workers?: { worker_id?: string; active?: boolean }[] } | undefined>(base, 'GET', '/workers', undefined, headers)).body;
    if (!workers.every((w) => w.workerId) || !Array.isArray(body?.workers)) return body?.active === workers.length;
    const live = new Set(body.workers.filter((w) => w.active).map((w) => w.worker_id));
    return workers.every((w) => live.has(w.workerId));
  }, timeoutMs, `${workers.length} worker(s) registered`).catch((e: Error) => { throw new Error(`${e.message}\n${output()}`); });
}

/** A worker with its own /metrics port. A free port can be taken by another process before the worker binds it,
 *  so a worker that does not open its port is replaced on a new port (three tries). */
export async function startWorkerWithMetrics(env: Record<string, string>, id: string, caps: string[], extra: string[] = []): Promise<Proc & { metricsPort: number }> {
  let last = '';
  for (let i = 0; i < 3; i++) {
    const port = await freePort();
    const p = await startWorkerProc(env, id, caps, [...extra, '--metrics-port', String(port)]);
    try {
      await waitForPort(port, 60000);
      return Object.assign(p, { metricsPort: port });
    } catch (e) {
      last = `${(e as Error).message}\n${p.logs.join('')}`;
      await p.kill();
    }
  }
  throw new Error(`worker ${id} did not open a metrics port: ${last}`);
}


export interface CommandRun { code: number | null; stdout: string; stderr: string }

/** A real command of package.json's bin as a child process with its own environment (no TTY: stdio are pipes). */
function runBin(bin: string, args: string[], env: Record<string, string>): Promise<CommandRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(path.join(ROOT, bin), args, { env: { PATH: process.env.PATH!, HOME: process.env.HOME || '/root', TMPDIR: os.tmpdir(), ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (s) => { stdout += s; });
    child.stderr.setEncoding('utf8').on('data', (s) => { stderr += s; });
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** The `ferry-convert` command. */
export const ferryConvert = (args: string[], env: Record<string, string> = {}) => runBin('services/converter/ferry-convert.js', args, env);
/** The `ferry` command (FERRY_URL and FERRY_API_KEY in `env`). */
export const ferryCli = (args: string[], env: Record<string, string> = {}) => runBin('services/cli/ferry.js', args, env);

/** A private Redis, a gateway and one worker with `caps` (`extra`: more environment for both, e.g. storage
 *  roots), waited for until the gateway lists the worker. */
export async function startStack(workerId: string, caps: string[], extra: Record<string, string> = {}): Promise<{ gw: Proc & { port: number; url: string }; stop(): Promise<void> }> {
  const redis = new TestRedis();
  await redis.start();
  const env = { ...testEnv(redis.url), ...extra };
  const gw = await startGatewayProc(env);
  const worker = await startWorkerProc(env, workerId, caps);
  const stop = async () => { await worker.kill(); await gw.stop(); await redis.stop(); };
  // A worker that never registers fails the start; what was started goes with it (no caller gets a stop to call).
  await awaitWorkers(gw.url, [worker]).catch(async (e: Error) => { await stop(); throw e; });
  return { gw, stop };
}

/** Resolves with the exit code of a process expected to stop by itself (a refused start). */
export function exitCode(p: Proc, timeoutMs = 30000): Promise<number | null> {
  if (p.proc.exitCode !== null) return Promise.resolve(p.proc.exitCode);
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`process did not exit within ${timeoutMs} ms\n${p.logs.join('')}`)), timeoutMs);
    p.proc.once('exit', (code) => { clearTimeout(t); resolve(code); });
  });
}
