// What the /virt tests share: a private Redis, the run's private libvirtd (test/helpers/libvirt.ts) and a daemon
// process pointed at it with FERRY_LIBVIRT_URI, its managed import pool in a temporary folder.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis } from '../helpers/redis';
import { startDaemonProc, testEnv, Proc } from '../helpers/procs';
import { req, until } from '../helpers/http';
import { openConsole, Virsh } from '../../shared/libvirt';
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
