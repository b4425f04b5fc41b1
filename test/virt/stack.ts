// What the /virt tests share: a private Redis, the run's private libvirtd (test/helpers/libvirt.ts) and a daemon
// process pointed at it with FERRY_LIBVIRT_URI, its managed import pool in a temporary folder.
import { mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis } from '../helpers/redis';
import { startDaemonProc, testEnv, Proc } from '../helpers/procs';
import { req, until } from '../helpers/http';
import { openConsole, Virsh } from '../../domain/libvirt';
import { execFileSync } from 'node:child_process';
import IORedis from 'ioredis';
import { releaseLibvirt, useLibvirt, TestLibvirt } from '../helpers/libvirt';

export interface VirtStack { redis: TestRedis; lv: TestLibvirt; daemon: Proc & { url: string }; dir: string; config: string; env: Record<string, string>; stop(): Promise<void> }

/** `daemonYaml`: the daemon's configuration file (auth on, say). */
export async function startVirtStack(extraEnv: Record<string, string> = {}, daemonYaml = 'daemon:\n  job_timeout: 2h\n'): Promise<VirtStack> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-virt-'));
  const config = path.join(dir, 'daemon.yaml');
  writeFileSync(config, daemonYaml);
  const redis = await new TestRedis().start();
  const lv = await useLibvirt();
  const env = { ...testEnv(redis.url), FERRY_HOST: '127.0.0.1', FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_POOL_DIR: path.join(dir, 'ferry-pool'), FERRY_LIBVIRT_DOMAIN_TYPE: 'qemu', ...extraEnv };
  const daemon = await startDaemonProc(env, config);
  return {
    redis, lv, daemon, dir, config, env,
    async stop() {
      await daemon.stop();
      await releaseLibvirt();
      await redis.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A request whose answer must be the success envelope; returns its data. */
export async function okData<T = unknown>(base: string, method: string, p: string, body?: unknown, status = 200): Promise<T> {
  const r = await req<{ status?: string; data: T } | undefined>(base, method, p, body);
  if (r.status !== status || r.body?.status !== 'success') throw new Error(`${method} ${p}: expected ${status} success, got ${r.status} ${r.text}`);
  return r.body.data;
}

/** Starts a domain paused (`start`, virsh by default), attaches its serial console, resumes it and waits until
 *  the console text has every one of `markers`; returns the text. */
export async function bootAndWatch(v: Virsh, name: string, markers: string | (string | RegExp)[], timeoutMs = 60000, start = () => v.run(['start', name, '--paused'])): Promise<string> {
  const want = Array.isArray(markers) ? markers : [markers];
  await start();
  const con = openConsole(v, name);
  let text = '';
  con.on('data', (t: string) => { text += t; });
  try {
    await new Promise<void>((resolve, reject) => { con.once('ready', resolve); con.once('close', (_c: number, e: string) => reject(new Error(`console closed: ${e}`))); });
    await v.run(['resume', name]);
    const seen = () => want.every((m) => (typeof m === 'string' ? text.includes(m) : m.test(text)));
    await until(() => seen(), timeoutMs, `${want.join(', ')} on ${name}'s console`)
      .catch((e: Error) => { throw new Error(`${e.message} (console so far: ${JSON.stringify(text.slice(-600))})`); });
    return text;
  } finally { con.close(); }
}

/** A PATH of symlinks to every program of this one but virsh (and those named in `also`, qemu-img say): the daemon
 *  then has no libvirt client at all. */
export function pathWithoutVirsh(dir: string, also: string[] = []): string {
  const bin = path.join(dir, ['bin-no-virsh', ...also].join('-'));
  mkdirSync(bin);
  for (const d of (process.env.PATH || '').split(':').filter(Boolean).reverse()) {
    let names: string[];
    try { names = readdirSync(d); } catch { continue; } // a PATH entry that does not exist adds nothing
    for (const n of names) {
      if (n.startsWith('virsh') || also.includes(n)) continue;
      try { symlinkSync(path.join(d, n), path.join(bin, n)); } catch { /* an earlier PATH entry's program wins, as in the shell */ }
    }
  }
  return bin;
}

/** A stack whose daemon reaches libvirt through workers (FERRY_LIBVIRT_VIA=worker): startVirtStack's daemon
 *  restarted with a PATH without virsh (nor the programs in `also`), a daemon in direct mode beside it (its own
 *  FERRY_PREFIX `directPrefix`) on the same libvirtd to compare answers with, and a Redis client. `stop` ends all. */
export async function startWorkerModeStack(env: Record<string, string>, directPrefix: string, also: string[] = []) {
  const s = await startVirtStack({ ...env, FERRY_LIBVIRT_VIA: 'worker' }, '{}\n');
  const rc = new IORedis(s.redis.url);
  await s.daemon.stop();
  const bare = pathWithoutVirsh(s.dir, also);
  const missing = ['virsh', ...also].map((n) => `command -v ${n}`).join(' || ');
  let found = '';
  try { found = execFileSync('sh', ['-c', missing], { env: { PATH: bare } }).toString(); } catch { /* none found: what is wanted */ }
  if (found) throw new Error(`the daemon's PATH still has ${found.trim()}`);
  // Both daemons start side by side (each is seconds of loading); they share nothing but Redis (the direct one has a prefix of its own).
  const [daemon, direct] = await Promise.all([
    startDaemonProc({ ...s.env, PATH: bare }, s.config),
    startDaemonProc({ ...s.env, FERRY_LIBVIRT_VIA: 'direct', FERRY_PREFIX: directPrefix }, s.config),
  ]);
  return {
    s, rc, daemon, direct,
    async stop() {
      await direct.stop();
      await daemon.stop();
      rc.disconnect();
      await s.stop();
    },
  };
}
