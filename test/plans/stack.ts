// The stack plan tests run against: a real Redis, the vSphere simulator (two datastores, no VMs of its own), the
// tests' libvirtd with an isolated network of the test's own, the daemon and workers as processes. Each VM's disk
// holds random data (small, made by qemu-img from random blocks), so its shape B job exports for real and then
// fails at the guest inspection: a real job end to end in seconds rather than the minutes a guest repair and a
// boot under TCG take. Used by test/plans/run.test.ts and test/dashboard/wizard.test.ts.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis } from '../helpers/redis';
import { Proc, startDaemonProc, startWorkerProc, testEnv } from '../helpers/procs';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { releaseLibvirt, TestLibvirt, useLibvirt } from '../helpers/libvirt';
import { managerFor } from '../../shared/vsphere/client';
import { makeDisks, upload } from '../vsphere/fixture';
import { createPlanVm, type PlanVmSpec } from './fixture';

export const PLAN_CAPS = ['vsphere_access', 'img_tool', 'mount_operations', 'libvirt_access'];

export interface PlanStack {
  v: Vcsim; lv: TestLibvirt; m: ReturnType<typeof managerFor>; dir: string; env: Record<string, string>;
  url: string; redisUrl: string; procs: Proc[];
  /** domains defined on the target */
  domains(): Promise<string[]>;
  /** volumes of the target pool (refreshed first) */
  volumes(): Promise<string[]>;
  stop(): Promise<void>;
}

export type StackVm = Omit<PlanVmSpec, 'disks'> & { ds?: string };

export interface PlanStackOptions {
  prefix: string;
  /** the target network: its name and its bridge */
  net: { name: string; bridge: string };
  /** the VMs: a random-data disk each, on `disks[0].ds` (bytes filled in), `host` as given */
  vms: StackVm[];
  daemonYaml?: string;
  env?: Record<string, string>;
  workers?: { id: string; concurrency: number }[];
}

export async function startPlanStack(o: PlanStackOptions): Promise<PlanStack> {
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), `ferry-${o.prefix}-`));
  const [v, lv] = await Promise.all([startVcsim({ args: ['-ds', '2', '-vm', '0'] }), useLibvirt(), redis.start()]);
  const m = managerFor({ url: v.url, username: v.username, password: v.password, ca: readFileSync(v.caFile, 'utf8') });
  const disks = makeDisks(dir, 2);
  for (const s of o.vms) {
    const { ds: given, ...spec } = s;
    const ds = given ?? (s.host && s.host !== 'DC0_H0' ? 'LocalDS_1' : 'LocalDS_0');
    await createPlanVm(m, { ...spec, disks: [{ ds, file: `${s.name}/${s.name}.vmdk`, bytes: disks.bytes }] });
    await upload(v, disks.sparse, `${s.name}/${s.name}.vmdk`, ds);
  }
  const netXml = path.join(dir, 'net.xml');
  writeFileSync(netXml, `<network><name>${o.net.name}</name><bridge name="${o.net.bridge}"/></network>`);
  // A network left by an interrupted run of the same test is reused as it is.
  await lv.virsh(['net-define', netXml]).catch((e: Error) => console.warn(`      net-define ${o.net.name}: ${e.message} (reused)`));
  await lv.virsh(['net-start', o.net.name]).catch((e: Error) => console.warn(`      net-start ${o.net.name}: ${e.message} (already active)`));
  const cfg = path.join(dir, 'daemon.yaml');
  writeFileSync(cfg, o.daemonYaml ?? 'daemon:\n  job_timeout: 1h\n');
  const env = {
    ...testEnv(redis.url, o.prefix), FERRY_HOST: '127.0.0.1', FERRY_LEASE_SECONDS: '10',
    GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: v.password, FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1',
    FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_POOL: lv.pool, FERRY_LIBVIRT_POOL_DIR: lv.poolDir, FERRY_EXPORT_DIR: path.join(dir, 'exports'),
    ...o.env,
  };
  const daemon = await startDaemonProc(env, cfg);
  const procs: Proc[] = [daemon];
  for (const w of o.workers ?? [{ id: 'w1', concurrency: 2 }]) procs.push(await startWorkerProc(env, w.id, PLAN_CAPS, ['--concurrency', String(w.concurrency)]));
  const names = (out: string) => out.split('\n').map((s) => s.trim()).filter(Boolean);
  return {
    v, lv, m, dir, env, url: daemon.url, redisUrl: redis.url, procs,
    domains: async () => names(await lv.virsh(['list', '--all', '--name'])),
    volumes: async () => { await lv.virsh(['pool-refresh', lv.pool]); return names(await lv.virsh(['vol-list', lv.pool])).map((l) => l.split(/\s+/)[0]).filter((x) => x !== 'Name' && !/^-+$/.test(x)); },
    stop: async () => {
      await Promise.all(procs.map((p) => p.kill()));
      await lv.virsh(['net-destroy', o.net.name]).catch((e: Error) => console.warn(`      net-destroy ${o.net.name}: ${e.message}`));
      await lv.virsh(['net-undefine', o.net.name]).catch((e: Error) => console.warn(`      net-undefine ${o.net.name}: ${e.message}`));
      await v.stop();
      await redis.stop();
      await releaseLibvirt();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
