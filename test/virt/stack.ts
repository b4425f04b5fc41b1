// What the /virt tests share: a private Redis, the run's private libvirtd (test/helpers/libvirt.ts) and a daemon
// process pointed at it with FERRY_LIBVIRT_URI, its managed import pool in a temporary folder.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis } from '../helpers/redis';
import { startDaemonProc, testEnv, Proc } from '../helpers/procs';
import { req } from '../helpers/http';
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
export async function okData(base: string, method: string, p: string, body?: unknown, status = 200) {
  const r = await req(base, method, p, body);
  if (r.status !== status || r.body?.status !== 'success') throw new Error(`${method} ${p}: expected ${status} success, got ${r.status} ${r.text}`);
  return r.body.data;
}
