// The stack most security tests stand on, set up and torn down in one place: a private redis-server, a temporary
// folder with the daemon's configuration file, a gateway and a daemon (each optional) started as real processes,
// and a Redis client for reading what they stored. `useStack` registers the describe's before and after hooks;
// the file's own before hooks (registered after it) run once the stack is up and add their processes with `add`,
// which the stack stops with its own.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import IORedis from 'ioredis';
import { TestRedis } from './redis';
import { Proc, startDaemonProc, startGatewayProc, testEnv } from './procs';

type Service = Proc & { port: number; url: string };

export interface Stack {
  redis: TestRedis;
  /** The temporary folder (removed afterwards) and the daemon's configuration file in it. */
  dir: string;
  config: string;
  /** What the gateway and the daemon were started with (testEnv, then StackOptions.env). */
  env: Record<string, string>;
  /** Set once the before hook ran, when started (StackOptions.gateway, .daemon). */
  gw: Service;
  dm: Service;
  /** A client of the stack's Redis; its errors are ignored, as a test may stop Redis on purpose. */
  rc: IORedis;
  /** Every process the stack stops afterwards (SIGKILL: nothing of theirs is checked after the tests). */
  procs: Proc[];
  add<T extends Proc>(p: T | Promise<T>): Promise<T>;
}

export interface StackOptions {
  /** Names the temporary folder (ferry-<name>-). */
  name: string;
  /** FERRY_PREFIX of every process (testEnv's default otherwise). */
  prefix?: string;
  /** The daemon's configuration file; a function is called once the hooks before the stack's have run (a port
   *  they picked). */
  daemonYaml?: string | (() => string);
  /** Added to testEnv for both services; a function gets the stack first (its folder, say). */
  env?: Record<string, string> | ((s: Stack) => Record<string, string>);
  /** Run once the folder and Redis are there, before the services start (a keys file, a receiver to point at). */
  prepare?: (s: Stack) => void | Promise<void>;
  /** The gateway's own additions to env, or false for no gateway; likewise the daemon. */
  gateway?: Record<string, string> | false;
  daemon?: Record<string, string> | false;
}

/** Registers the stack's before and after hooks in the calling describe; returns the stack they fill in. */
export function useStack(o: StackOptions): Stack {
  const s = {
    redis: new TestRedis(), procs: [] as Proc[], env: {},
    async add<T extends Proc>(p: T | Promise<T>): Promise<T> { const started = await p; s.procs.push(started); return started; },
  } as unknown as Stack; // the rest is set in before(), which runs before any test or later hook reads it
  before(async function () {
    this.timeout(120_000);
    s.dir = mkdtempSync(path.join(os.tmpdir(), `ferry-${o.name}-`));
    s.config = path.join(s.dir, 'daemon.yaml');
    writeFileSync(s.config, (typeof o.daemonYaml === 'function' ? o.daemonYaml() : o.daemonYaml) ?? 'daemon:\n  job_timeout: 1h\n');
    await s.redis.start();
    s.rc = new IORedis(s.redis.url);
    s.rc.on('error', () => undefined); // reconnects by itself when a test restarts Redis
    await o.prepare?.(s);
    s.env = { ...testEnv(s.redis.url, o.prefix), ...(typeof o.env === 'function' ? o.env(s) : o.env) };
    const [gw, dm] = await Promise.all([
      o.gateway === false ? undefined : s.add(startGatewayProc({ ...s.env, ...o.gateway })),
      o.daemon === false ? undefined : s.add(startDaemonProc({ ...s.env, ...o.daemon }, s.config)),
    ]);
    if (gw) s.gw = gw;
    if (dm) s.dm = dm;
  });
  after(async () => {
    await Promise.all(s.procs.map((p) => p.kill()));
    s.rc?.disconnect();
    await s.redis.stop();
    if (s.dir) rmSync(s.dir, { recursive: true, force: true });
  });
  return s;
}
