// Real disks on the simulator: qemu-img makes them (a monolithicSparse disk, a monolithicFlat descriptor+extent
// pair, a snapshot delta over a flat base), they are uploaded through the manager's /folder PUT as a user
// would, and VMs are created whose disks are those files (CreateVM_Task through Ferry's own SOAP client).
import { execFileSync } from 'node:child_process';
import { createHash, randomFillSync } from 'node:crypto';
import { createReadStream, mkdirSync, promises as fs, readFileSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { request } from 'undici';
import { agentFor, Manager } from '../../domain/vsphere/client';
import { waitForTask } from '../../domain/vsphere/actions';
import { arr, child, el, esc, moref, text } from '../../domain/vsphere/xml';
import { retrieve } from '../../domain/vsphere/properties';
import type { Vcsim } from '../helpers/vcsim';

export const DC = 'DC0';
export const DS = 'LocalDS_0';

/** A raw image of `mib` MiB with data in places (random blocks, zero runs), then converted to vmdk flavours. */
export function makeDisks(dir: string, mib: number) {
  const raw = path.join(dir, 'src.raw');
  const buf = Buffer.alloc(mib * 1024 * 1024);
  for (let off = 0; off < buf.length; off += 256 * 1024) {
    if ((off / (256 * 1024)) % 3 !== 2) randomFillSync(buf, off, 128 * 1024);
  }
  buf.write('FERRY-TEST-DISK', 0);
  writeFileSync(raw, buf);
  const sparse = path.join(dir, 'sparse.vmdk');
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=monolithicSparse', raw, sparse]);
  const flatDir = path.join(dir, 'flat');
  mkdirSync(flatDir, { recursive: true });
  const flat = path.join(flatDir, 'data.vmdk');
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=monolithicFlat', raw, flat]);
  return { raw, sparse, flat, flatExtent: path.join(flatDir, 'data-flat.vmdk'), bytes: buf.length };
}

/** A delta (monolithicSparse with a parent hint) over a monolithicFlat base, with some blocks changed. */
export function makeSnapshotChain(dir: string, mib: number) {
  const d = path.join(dir, 'chain');
  mkdirSync(d, { recursive: true });
  const raw = path.join(d, 'base.raw');
  const buf = Buffer.alloc(mib * 1024 * 1024);
  randomFillSync(buf, 0, buf.length / 2);
  writeFileSync(raw, buf);
  const base = path.join(d, 'base.vmdk');
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=monolithicFlat', raw, base]);
  const delta = path.join(d, 'base-000001.vmdk');
  execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', '-o', 'subformat=monolithicSparse', '-b', 'base.vmdk', '-F', 'vmdk', delta], { cwd: d });
  execFileSync('qemu-io', ['-f', 'vmdk', '-c', 'write -P 0x5a 1M 512k', delta]);
  return { base, baseExtent: path.join(d, 'base-flat.vmdk'), delta, bytes: buf.length };
}

/** PUT a local file to [datastore] remotePath through the manager's /folder URL. */
export async function upload(v: Vcsim, local: string, remotePath: string, ds = DS) {
  const u = new URL(v.url);
  u.pathname = '/folder/' + remotePath.split('/').map(encodeURIComponent).join('/');
  u.search = new URLSearchParams({ dcPath: DC, dsName: ds }).toString();
  const res = await request(u, { method: 'PUT', dispatcher: agentFor(false, readFileSync(v.caFile, 'utf8')), body: createReadStream(local), headers: { 'content-length': String(statSync(local).size) } });
  await res.body.dump();
  if (res.statusCode >= 300) throw new Error(`upload ${remotePath}: HTTP ${res.statusCode}`);
}

export interface VmSpec {
  name: string;
  /** datastore paths (inside DS) of each disk's top file, with its virtual size */
  disks: { file: string; bytes: number }[];
  cdrom?: boolean;
  firmware?: 'bios' | 'efi';
  guestId?: string;
  cpus?: number;
  memoryMB?: number;
  mac?: string;
}

/** Creates a VM (powered off) whose disks are created empty by the simulator, to be overwritten by uploads. */
export async function createVm(m: Manager, s: VmSpec) {
  const sc = await m.serviceContent();
  const find = async (p: string) => moref(await m.call('FindByInventoryPath', sc.searchIndex, el('inventoryPath', p)))!;
  const folder = await find(`${DC}/vm`);
  const pool = await find(`${DC}/host/DC0_H0/Resources`);
  const dev = (op: string, body: string, fileOp = '') => `<deviceChange><operation>${op}</operation>${fileOp ? `<fileOperation>${fileOp}</fileOperation>` : ''}${body}</deviceChange>`;
  const changes = [
    dev('add', '<device xsi:type="ParaVirtualSCSIController"><key>-100</key><busNumber>0</busNumber><sharedBus>noSharing</sharedBus></device>'),
    ...s.disks.map((d, i) => dev('add', `<device xsi:type="VirtualDisk"><key>${-1 - i}</key><backing xsi:type="VirtualDiskFlatVer2BackingInfo"><fileName>${esc(`[${DS}] ${d.file}`)}</fileName><diskMode>persistent</diskMode><thinProvisioned>true</thinProvisioned></backing><controllerKey>-100</controllerKey><unitNumber>${i}</unitNumber><capacityInKB>${Math.ceil(d.bytes / 1024)}</capacityInKB></device>`, 'create')),
    dev('add', `<device xsi:type="VirtualVmxnet3"><key>-200</key><backing xsi:type="VirtualEthernetCardNetworkBackingInfo"><deviceName>VM Network</deviceName></backing><addressType>manual</addressType><macAddress>${s.mac ?? '00:50:56:aa:bb:01'}</macAddress></device>`),
    ...(s.cdrom ? [dev('add', '<device xsi:type="VirtualCdrom"><key>-300</key><backing xsi:type="VirtualCdromRemotePassthroughBackingInfo"><deviceName></deviceName><exclusive>false</exclusive></backing><controllerKey>200</controllerKey><unitNumber>0</unitNumber></device>')] : []),
  ].join('');
  const spec = `<config>${el('name', s.name)}${el('guestId', s.guestId ?? 'debian10_64Guest')}<files><vmPathName>[${DS}]</vmPathName></files>${el('numCPUs', s.cpus ?? 2)}${el('memoryMB', s.memoryMB ?? 2048)}${changes}${el('firmware', s.firmware ?? 'bios')}</config>`;
  const task = moref(await m.call('CreateVM_Task', folder, spec + `<pool type="ResourcePool">${esc(pool.value)}</pool>`))!;
  await waitForTask(m, task, `creating VM ${s.name}`);
  return `/${DC}/vm/${s.name}`;
}

export async function sha256(file: string) {
  return createHash('sha256').update(await fs.readFile(file)).digest('hex');
}

/** Powers a VM on (a task), as an operator would before Ferry is asked to export it. */
export async function powerOn(m: Manager, vmPath: string) {
  const sc = await m.serviceContent();
  const vm = moref(await m.call('FindByInventoryPath', sc.searchIndex, el('inventoryPath', vmPath.slice(1))))!;
  await waitForTask(m, moref(await m.call('PowerOnVM_Task', vm))!, `power-on of ${vmPath}`);
}

/** A VM with one sparse disk of `mib` MiB (random data), uploaded. */
export async function tinyVm(v: Vcsim, m: Manager, dir: string, name: string, mib: number) {
  const d = path.join(dir, name);
  mkdirSync(d, { recursive: true });
  const disks = makeDisks(d, mib);
  const p = await createVm(m, { name, disks: [{ file: `${name}/${name}.vmdk`, bytes: disks.bytes }] });
  await upload(v, disks.sparse, `${name}/${name}.vmdk`);
  return { path: p, sparse: disks.sparse, raw: disks.raw };
}

/** The sessions open on a simulator other than `m`'s own (SessionManager.sessionList less currentSession): what
 *  other processes (a daemon, ferry-convert) hold there. */
export async function otherSessions(m: Manager): Promise<string[]> {
  const sc = await m.serviceContent();
  const [o] = await retrieve(m, [sc.sessionManager], [{ type: 'SessionManager', paths: ['sessionList', 'currentSession'] }]);
  const own = text(child(o.props.currentSession, 'key'));
  return arr(child(o.props.sessionList, 'UserSession')).map((x) => text(child(x, 'key'))!).filter((k) => k !== own);
}
