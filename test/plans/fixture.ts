// Plan tests' parts. Source VMs shaped on the simulator as an operator's datacenter would have them: disks on
// either datastore, VMs on several ESXi hosts, snapshots, an RDM, a multi-writer disk, a USB controller, a NIC on
// a network the plan does not map, hot-plug, a running VM (created through Ferry's own SOAP client). And the
// stack plans run on (startPlanStack): a private Redis, the simulator, the tests' libvirtd with a network for the
// VMs, the daemon(s) and shape B workers as processes.
import IORedis from 'ioredis';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { managerFor, managerName, type Manager } from '../../domain/vsphere/client';
import { waitForTask } from '../../domain/vsphere/actions';
import { el, esc, moref } from '../../domain/vsphere/xml';
import { keys } from '../../platform/redis';
import { Slots } from '../../queue/slots';
import type { PlanView } from '../../orchestration/plan-view';
import { DC, upload } from '../vsphere/fixture';
import { TestRedis } from '../helpers/redis';
import { Proc, startDaemonProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req } from '../helpers/http';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { releaseLibvirt, TestLibvirt, useLibvirt, virshNames } from '../helpers/libvirt';

export interface PlanVmSpec {
  name: string;
  disks: { ds: string; file: string; bytes: number; rdm?: boolean; sharing?: string; mode?: string }[];
  network?: string; mac?: string; host?: string; guestId?: string; firmware?: 'bios' | 'efi';
  usb?: boolean; cpuHotAdd?: boolean; memoryMB?: number;
  /** an inventory folder below vm/ (made when missing) */
  folder?: string;
}

const dev = (op: string, body: string, fileOp = '') => `<deviceChange><operation>${op}</operation>${fileOp ? `<fileOperation>${fileOp}</fileOperation>` : ''}${body}</deviceChange>`;

function diskXml(d: PlanVmSpec['disks'][number], i: number) {
  const file = esc(`[${d.ds}] ${d.file}`);
  const backing = d.rdm
    ? `<backing xsi:type="VirtualDiskRawDiskMappingVer1BackingInfo"><fileName>${file}</fileName><deviceName>/vmfs/devices/disks/naa.600${i}</deviceName><compatibilityMode>physicalMode</compatibilityMode><diskMode>independent_persistent</diskMode></backing>`
    : `<backing xsi:type="VirtualDiskFlatVer2BackingInfo"><fileName>${file}</fileName><diskMode>${d.mode ?? 'persistent'}</diskMode><thinProvisioned>true</thinProvisioned>${d.sharing ? `<sharing>${d.sharing}</sharing>` : ''}</backing>`;
  return dev('add', `<device xsi:type="VirtualDisk"><key>${-1 - i}</key>${backing}<controllerKey>-100</controllerKey><unitNumber>${i}</unitNumber><capacityInKB>${Math.ceil(d.bytes / 1024)}</capacityInKB></device>`, d.rdm ? '' : 'create');
}

export async function createPlanVm(m: Manager, s: PlanVmSpec): Promise<string> {
  const sc = await m.serviceContent();
  const find = async (p: string) => moref(await m.call('FindByInventoryPath', sc.searchIndex, el('inventoryPath', p)))!;
  let folder = await find(`${DC}/vm`);
  if (s.folder) folder = (await m.call('FindByInventoryPath', sc.searchIndex, el('inventoryPath', `${DC}/vm/${s.folder}`)).then(moref)) ?? moref(await m.call('CreateFolder', folder, el('name', s.folder)))!;
  const host = s.host ?? 'DC0_H0';
  const cluster = host.startsWith('DC0_C0_');
  const pool = await find(cluster ? `${DC}/host/DC0_C0/Resources` : `${DC}/host/${host}/Resources`);
  const hostRef = cluster ? await find(`${DC}/host/DC0_C0/${host}`) : undefined;
  const changes = [
    dev('add', '<device xsi:type="ParaVirtualSCSIController"><key>-100</key><busNumber>0</busNumber><sharedBus>noSharing</sharedBus></device>'),
    ...s.disks.map(diskXml),
    dev('add', `<device xsi:type="VirtualVmxnet3"><key>-200</key><backing xsi:type="VirtualEthernetCardNetworkBackingInfo"><deviceName>${esc(s.network ?? 'VM Network')}</deviceName></backing><addressType>manual</addressType><macAddress>${s.mac ?? '00:50:56:aa:bb:01'}</macAddress></device>`),
    ...(s.usb ? [dev('add', '<device xsi:type="VirtualUSBController"><key>-400</key><autoConnectDevices>false</autoConnectDevices><ehciEnabled>true</ehciEnabled></device>')] : []),
  ].join('');
  const spec = `<config>${el('name', s.name)}${el('guestId', s.guestId ?? 'debian10_64Guest')}<files><vmPathName>[${s.disks[0]?.ds ?? 'LocalDS_0'}]</vmPathName></files>${el('numCPUs', 1)}${el('memoryMB', s.memoryMB ?? 256)}${s.cpuHotAdd ? el('cpuHotAddEnabled', true) : ''}${changes}${el('firmware', s.firmware ?? 'bios')}</config>`;
  const task = moref(await m.call('CreateVM_Task', folder, spec + `<pool type="ResourcePool">${esc(pool.value)}</pool>` + (hostRef ? `<host type="HostSystem">${esc(hostRef.value)}</host>` : '')))!;
  await waitForTask(m, task, `creating VM ${s.name}`);
  return `/${DC}/vm/${s.folder ? `${s.folder}/` : ''}${s.name}`;
}

export async function snapshot(m: Manager, vmPath: string, name: string) {
  const sc = await m.serviceContent();
  const vm = moref(await m.call('FindByInventoryPath', sc.searchIndex, el('inventoryPath', vmPath.slice(1))))!;
  await waitForTask(m, moref(await m.call('CreateSnapshot_Task', vm, `${el('name', name)}${el('memory', false)}${el('quiesce', false)}`))!, `snapshot of ${vmPath}`);
}

/** What a shape B job needs of a worker. */
export const PLAN_CAPS = ['vsphere_access', 'img_tool', 'mount_operations', 'libvirt_access'];

export interface PlanStackOptions {
  /** Redis key prefix; also names the temp folder and the libvirt network (`ferry-<prefix>`). Unique per file. */
  prefix: string;
  /** Worker ids and their --concurrency. */
  workers: Record<string, number>;
  /** Daemon replicas on the same Redis (default 1). */
  daemons?: number;
  /** The simulator's model (default: two datastores, no VMs of its own; a standalone host and a cluster of 3). */
  vcsim?: string[];
  /** FERRY_LEASE_SECONDS (default 10). */
  leaseSeconds?: number;
  /** More of the daemon's YAML config, after `daemon: {job_timeout: 1h}`. */
  config?: string;
  /** The target network's name (default `ferry-<prefix>`); "VM Network", the source's, makes the wizard pre-fill the map. */
  net?: string;
  /** More environment for the daemon and the workers (API keys, a second libvirt URI). */
  env?: Record<string, string>;
}

export interface PlanStack {
  v: Vcsim; lv: TestLibvirt; m: Manager; rc: IORedis; dir: string; env: Record<string, string>;
  /** The first daemon's URL, all daemons, and the workers by id. */
  url: string; daemons: (Proc & { url: string; port: number })[]; workers: Record<string, Proc>;
  /** The libvirt network the plans map "VM Network" onto, and the manager's name in slot names. */
  net: string; manager: string;
  /** `/DC0/vm/<name>` */
  vm(name: string): string;
  /** A VM with one disk, `<name>/<name>.vmdk` on `ds` (uploaded from `disk`), on ESXi host `host`. */
  addVm(s: { name: string; host: string; ds: string; mac: string; network?: string }, disk: { path: string; bytes: number }): Promise<string>;
  /** A create body: these VMs to the tests' libvirtd, "VM Network" and both datastores mapped, power_off force. */
  plan(id: string, names: string[], extra?: Record<string, unknown>): Record<string, unknown>;
  get(id: string): Promise<PlanView>;
  /** Live holders of a slot name (`esxi:<manager>:<host>`, `datastore:<manager>:<ds>`, `plan:<id>`, ...). */
  holders(name: string): Promise<string[]>;
  domains(): Promise<string[]>;
  volumes(): Promise<string[]>;
  /** Everything stopped; the domains of the VMs added here removed from the shared libvirtd. */
  stop(): Promise<void>;
}

const warn = (what: string) => (e: Error) => console.warn(`      (${what}: ${e.message.trim()})`);

/** The stack, started; call stop() in an after hook. A start that fails stops what it had started. */
export async function startPlanStack(o: PlanStackOptions): Promise<PlanStack> {
  const undo: (() => Promise<unknown>)[] = [];
  const stopAll = async () => { for (const f of undo.splice(0).reverse()) await f().catch(warn('stopping the plan stack')); };
  try {
    return await build(o, undo, stopAll);
  } catch (e) {
    await stopAll();
    throw e;
  }
}

async function build(o: PlanStackOptions, undo: (() => Promise<unknown>)[], stop: () => Promise<void>): Promise<PlanStack> {
  const dir = mkdtempSync(path.join(os.tmpdir(), `ferry-${o.prefix}-`));
  undo.push(() => Promise.resolve(rmSync(dir, { recursive: true, force: true })));
  const redis = new TestRedis();
  undo.push(() => redis.stop());
  await redis.start();
  const lv = await useLibvirt();
  undo.push(() => releaseLibvirt());
  const v = await startVcsim({ args: o.vcsim ?? ['-ds', '2', '-vm', '0'] });
  undo.push(() => v.stop());
  const m = managerFor({ url: v.url, username: v.username, password: v.password, ca: readFileSync(v.caFile, 'utf8') });
  const virsh = (args: string[]) => lv.virsh(args);
  const list = (args: string[]) => virshNames(lv, args);
  const net = o.net ?? `ferry-${o.prefix}`;
  if (!(await list(['net-list', '--all', '--name'])).includes(net)) {
    writeFileSync(path.join(dir, 'net.xml'), `<network><name>${net}</name><bridge name="vb-${o.prefix.slice(0, 12)}"/></network>`);
    await virsh(['net-define', path.join(dir, 'net.xml')]);
  }
  undo.push(() => virsh(['net-undefine', net]));
  if (!(await list(['net-list', '--name'])).includes(net)) await virsh(['net-start', net]);
  undo.push(() => virsh(['net-destroy', net]));
  // The domains a plan made of the VMs added here go when the stack stops: the libvirtd is the whole run's.
  const added: string[] = [];
  undo.push(async () => {
    const left = new Set(await list(['list', '--all', '--name']));
    for (const n of added.filter((x) => left.has(x))) {
      if ((await virsh(['domstate', n])).trim() !== 'shut off') await virsh(['destroy', n]);
      await virsh(['undefine', n, '--nvram', '--remove-all-storage']);
    }
  });
  const cfg = path.join(dir, 'daemon.yaml');
  writeFileSync(cfg, `daemon:\n  job_timeout: 1h\n${o.config ?? ''}`);
  const env = {
    ...testEnv(redis.url, o.prefix), FERRY_HOST: '127.0.0.1', FERRY_LEASE_SECONDS: String(o.leaseSeconds ?? 10),
    GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: v.password, FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1',
    FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_POOL: lv.pool, FERRY_LIBVIRT_POOL_DIR: lv.poolDir, FERRY_EXPORT_DIR: path.join(dir, 'exports'),
    // The manager's own limit (default 4) above every plan limit the tests set: the plan's limits are what binds.
    FERRY_EXPORTS_PER_MANAGER: '16', ...o.env,
  };
  const daemons: (Proc & { url: string; port: number })[] = [];
  const workers: Record<string, Proc> = {};
  undo.push(() => Promise.all([...daemons, ...Object.values(workers)].map((p) => p.kill())));
  for (let i = 0; i < (o.daemons ?? 1); i++) daemons.push(await startDaemonProc(env, cfg));
  for (const [id, n] of Object.entries(o.workers)) workers[id] = await startWorkerProc(env, id, PLAN_CAPS, ['--concurrency', String(n)]);
  const rc = new IORedis(redis.url);
  undo.push(() => Promise.resolve(rc.disconnect()));
  const slots = new Slots(rc, keys(o.prefix));
  const vm = (n: string) => `/${DC}/vm/${n}`;
  return {
    v, lv, m, rc, dir, env, url: daemons[0].url, daemons, workers, net, manager: managerName(v.url), vm, stop,
    async addVm(s, disk) {
      await createPlanVm(m, { name: s.name, host: s.host, network: s.network, mac: s.mac, disks: [{ ds: s.ds, file: `${s.name}/${s.name}.vmdk`, bytes: disk.bytes }] });
      await upload(v, disk.path, `${s.name}/${s.name}.vmdk`, s.ds);
      added.push(s.name);
      return vm(s.name);
    },
    plan: (id, names, extra = {}) => ({
      id, name: id, vms: names.map(vm), destination: { type: 'kvm', virt_uri: lv.uri },
      network_map: { 'VM Network': net }, storage_map: { LocalDS_0: lv.pool, LocalDS_1: lv.pool }, options: { power_off: 'force' }, ...extra,
    }),
    get: async (id) => (await req<PlanView>(daemons[0].url, 'GET', `/plans/${id}`)).body,
    holders: (name) => slots.holders(name),
    domains: () => list(['list', '--all', '--name']),
    volumes: async () => { await virsh(['pool-refresh', lv.pool]); return list(['vol-list', lv.pool]); },
  };
}
