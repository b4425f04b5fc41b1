// The inventory: every VM with its inventory path (one PropertyCollector round trip through a ContainerView),
// a VM found by path (SearchIndex.FindByInventoryPath) or by unique name, and one VM's detail: hardware,
// disks with their backing chains, CD-ROMs, NICs with network and MAC, firmware and snapshots.
import type { Manager } from './client';
import { VsphereError } from './errors';
import { retrieve, retrieveInventory, type ObjectContent } from './properties';
import { arr, child, el, moref, MoRef, num, text, XmlValue, xsiType } from './xml';

export interface VmSummary {
  name: string; path: string; power_state: string; num_cpu: number; memory_mb: number; storage: number;
  guest_os: string; ip_address: string; template: boolean; datastores: string[]; networks: string[]; moref: string;
}

const LIST_PATHS = ['name', 'parent', 'runtime.powerState', 'summary.config.numCpu', 'summary.config.memorySizeMB', 'summary.config.guestFullName',
  'summary.config.template', 'summary.guest.ipAddress', 'summary.storage.committed', 'datastore', 'network'];

/** The morefs of an ArrayOfManagedObjectReference property. */
const refs = (v: XmlValue | undefined): MoRef[] => arr(child(v, 'ManagedObjectReference')).map(moref).filter((r): r is MoRef => !!r);

/** Every VM with its path and the names of its datastores and networks, in one RetrievePropertiesEx (VMs,
 *  folders, datacenters, datastores and networks through one view): the dashboard filters on them. */
export async function listVms(m: Manager): Promise<VmSummary[]> {
  const sc = await m.serviceContent();
  const objs = await retrieveInventory(m, [
    { type: 'VirtualMachine', paths: LIST_PATHS },
    { type: 'Folder', paths: ['name', 'parent'] },
    { type: 'Datacenter', paths: ['name', 'parent'] },
    { type: 'Datastore', paths: ['name'] },
    { type: 'Network', paths: ['name'] },
    { type: 'DistributedVirtualPortgroup', paths: ['name'] },
  ]);
  const nodes = new Map(objs.map((o) => [`${o.obj.type}:${o.obj.value}`, { name: text(o.props.name) ?? '', parent: moref(o.props.parent) }]));
  const pathOf = (start: MoRef | undefined): string | null => {
    const names: string[] = [];
    for (let cur = start, n = 0; cur && n < 64; n++) {
      if (cur.type === sc.rootFolder.type && cur.value === sc.rootFolder.value) return '/' + names.reverse().join('/');
      const node = nodes.get(`${cur.type}:${cur.value}`);
      if (!node) return null; // in a vApp or outside what the view holds
      names.push(node.name);
      cur = node.parent;
    }
    return null;
  };
  const nameOf = (r: MoRef) => nodes.get(`${r.type}:${r.value}`)?.name ?? r.value;
  const vms: VmSummary[] = [];
  for (const o of objs) {
    if (o.obj.type !== 'VirtualMachine') continue;
    const path = pathOf(o.obj);
    if (!path) continue;
    const p = o.props;
    vms.push({
      name: text(p.name) ?? '', path, power_state: text(p['runtime.powerState']) ?? 'unknown',
      num_cpu: num(p['summary.config.numCpu']) ?? 0, memory_mb: num(p['summary.config.memorySizeMB']) ?? 0,
      storage: num(p['summary.storage.committed']) ?? 0, guest_os: text(p['summary.config.guestFullName']) ?? '',
      ip_address: text(p['summary.guest.ipAddress']) ?? '', template: text(p['summary.config.template']) === 'true',
      datastores: refs(p.datastore).map(nameOf), networks: refs(p.network).map(nameOf), moref: o.obj.value,
    });
  }
  return vms.sort((a, b) => a.path.localeCompare(b.path));
}

/** The VM at an inventory path (`/<datacenter>/vm/<folder>/<name>`), or a not_found error naming it. */
export async function findVm(m: Manager, vmPath: string): Promise<MoRef> {
  const sc = await m.serviceContent();
  const inv = vmPath.replace(/^\/+/, '').replace(/\/+$/, '');
  const found = moref(await m.call('FindByInventoryPath', sc.searchIndex, el('inventoryPath', inv)));
  if (!found || found.type !== 'VirtualMachine') throw new VsphereError('not_found', `no VM at ${vmPath} on vSphere manager ${m.name}`);
  return found;
}

/** The path of the only VM with this name; not_found when there is none, a clear error when several share it. */
export async function pathByName(m: Manager, name: string): Promise<string> {
  const hits = (await listVms(m)).filter((v) => v.name === name);
  if (!hits.length) throw new VsphereError('not_found', `no VM named ${name} on vSphere manager ${m.name}`);
  if (hits.length > 1) throw new VsphereError('state',
    `${hits.length} VMs are named ${name} on vSphere manager ${m.name} (${hits.map((h) => h.path).join(', ')}); give path instead`);
  return hits[0].path;
}

export interface DiskBacking { fileName: string; datastore?: string; parent?: DiskBacking }
export interface VmDisk { key: number; label: string; capacity_kb: number; capacity_bytes: number; file_path: string; chain: string[]; controller_key?: number;
  unit_number?: number }
export interface VmNic { key: number; label: string; mac: string; network: string; adapter: string }
export interface VmCdrom { key: number; label: string; backing: string }
export interface VmSnapshot { name: string; description: string; created: string; id: string; children: VmSnapshot[] }

export interface VmDetail {
  name: string; path: string; uuid: string; instance_uuid: string; power_state: string; tools_status: string;
  guest_id: string; guest_os: string; ip_address: string; firmware: string; /* 'bios', 'efi', or what a newer vSphere names */
  hardware: { num_cpu: number; memory_mb: number; num_virtual_disks: number; version: string };
  disks: VmDisk[]; nics: VmNic[]; cdroms: VmCdrom[]; snapshots: VmSnapshot[]; current_snapshot: string | null;
  datacenter: string; moref: MoRef;
}

const DETAIL_PATHS = ['name', 'config.uuid', 'config.instanceUuid', 'runtime.powerState', 'guest.toolsRunningStatus', 'guest.ipAddress',
  'config.guestId', 'config.guestFullName', 'config.firmware', 'config.version', 'config.hardware.numCPU', 'config.hardware.memoryMB',
  'config.hardware.device', 'snapshot'];

/** The parts of a vim25 VirtualDevice (and its subtypes) and of its backing that Ferry reads; leaves are the
 *  parser's strings. */
export interface DeviceBackingXml {
  '@_type'?: string; fileName?: XmlValue; parent?: DeviceBackingXml; diskMode?: XmlValue; sharing?: XmlValue;
  deviceName?: XmlValue; opaqueNetworkId?: XmlValue; port?: { portgroupKey?: XmlValue }; changeId?: XmlValue;
}
export interface VirtualDeviceXml {
  '@_type'?: string; key?: XmlValue; deviceInfo?: { label?: XmlValue }; backing?: DeviceBackingXml; macAddress?: XmlValue;
  capacityInKB?: XmlValue; capacityInBytes?: XmlValue; controllerKey?: XmlValue; unitNumber?: XmlValue;
}

/** The devices of a `config.hardware.device` property (an ArrayOfVirtualDevice). The cast declares the shape of
 *  the parsed tree; an element that is missing (or text where an element was expected) reads as undefined. */
export function virtualDevices(v: XmlValue | undefined): VirtualDeviceXml[] {
  return arr((v as { VirtualDevice?: VirtualDeviceXml | VirtualDeviceXml[] } | undefined)?.VirtualDevice);
}

function backingChain(b: DeviceBackingXml | undefined): string[] {
  const out: string[] = [];
  for (let cur = b, n = 0; cur && n < 256; cur = cur.parent, n++) if (text(cur.fileName)) out.push(text(cur.fileName)!);
  return out;
}

function snapshots(list: XmlValue | undefined): VmSnapshot[] {
  return arr(list).map((s) => ({
    name: text(child(s, 'name')) ?? '', description: text(child(s, 'description')) ?? '', created: text(child(s, 'createTime')) ?? '',
    id: text(child(s, 'id')) ?? '',
    children: snapshots(child(s, 'childSnapshotList')),
  }));
}

/** One VM in detail (one call for the VM and the names of its networks). */
export async function vmDetail(m: Manager, vmPath: string): Promise<VmDetail> {
  const vm = await findVm(m, vmPath);
  const traverse = '<selectSet xsi:type="TraversalSpec"><name>net</name><type>VirtualMachine</type><path>network</path><skip>false</skip></selectSet>';
  const objs = await retrieve(m, [vm], [
    { type: 'VirtualMachine', paths: DETAIL_PATHS },
    { type: 'Network', paths: ['name'] },
    { type: 'DistributedVirtualPortgroup', paths: ['name', 'key'] },
  ], traverse);
  const me = objs.find((o) => o.obj.type === 'VirtualMachine');
  if (!me) throw new VsphereError('not_found', `no VM at ${vmPath} on vSphere manager ${m.name}`);
  const portgroups = new Map(objs.filter((o) => o.obj.type === 'DistributedVirtualPortgroup').map(
    (o) => [text(o.props.key) ?? o.obj.value, text(o.props.name) ?? '']));
  const p = me.props;
  return detailOf(vmPath, vm, p, detailDevices(virtualDevices(p['config.hardware.device']), portgroups));
}

/** The VM's disks (with their backing chain), CD-ROMs and NICs (named by network, or by portgroup key or opaque id). */
function detailDevices(devices: VirtualDeviceXml[], portgroups: Map<string, string>) {
  const disks: VmDisk[] = [];
  const nics: VmNic[] = [];
  const cdroms: VmCdrom[] = [];
  for (const d of devices) {
    const type = xsiType(d) ?? '';
    const key = num(d.key) ?? 0;
    const label = text(d.deviceInfo?.label) ?? `${type} ${key}`;
    if (type === 'VirtualDisk') {
      const chain = backingChain(d.backing);
      const kb = num(d.capacityInKB) ?? 0;
      disks.push({ key, label, capacity_kb: kb, capacity_bytes: num(d.capacityInBytes) ?? kb * 1024, file_path: chain[0] ?? '', chain,
        controller_key: num(d.controllerKey), unit_number: num(d.unitNumber) });
    } else if (type === 'VirtualCdrom') {
      cdroms.push({ key, label, backing: xsiType(d.backing) ?? '' });
    } else if (d.macAddress !== undefined) {
      const b: DeviceBackingXml = d.backing ?? {};
      const pgKey = text(b.port?.portgroupKey);
      nics.push({ key, label, mac: text(d.macAddress) ?? '', adapter: type.replace(/^Virtual/, '').toLowerCase(), network: text(b.deviceName) ??
        (pgKey ? portgroups.get(pgKey) ?? pgKey : text(b.opaqueNetworkId) ?? '') });
    }
  }
  return { disks, nics, cdroms };
}

/** The VmDetail of the VM's properties and its devices (missing properties read as empty or their defaults). */
function detailOf(vmPath: string, vm: MoRef, p: ObjectContent['props'], devices: Pick<VmDetail, 'disks' | 'nics' | 'cdroms'>): VmDetail {
  const { disks, nics, cdroms } = devices;
  const snap = p.snapshot;
  return {
    name: text(p.name) ?? '', path: vmPath, uuid: text(p['config.uuid']) ?? '', instance_uuid: text(p['config.instanceUuid']) ?? '',
    power_state: text(p['runtime.powerState']) ?? 'unknown', tools_status: text(p['guest.toolsRunningStatus']) ?? 'guestToolsNotRunning',
    guest_id: text(p['config.guestId']) ?? '', guest_os: text(p['config.guestFullName']) ?? '', ip_address: text(p['guest.ipAddress']) ?? '',
    firmware: text(p['config.firmware']) ?? 'bios',
    hardware: { num_cpu: num(p['config.hardware.numCPU']) ?? 0, memory_mb: num(p['config.hardware.memoryMB']) ?? 0, num_virtual_disks: disks.length,
      version: text(p['config.version']) ?? '' },
    disks, nics, cdroms, snapshots: snapshots(child(snap, 'rootSnapshotList')), current_snapshot: moref(child(snap, 'currentSnapshot'))?.value ?? null,
    datacenter: datacenterOf(vmPath), moref: vm,
  };
}

/** The datacenter's inventory path (the dcPath of datastore URLs): everything before "/vm/". */
export function datacenterOf(vmPath: string): string {
  const i = vmPath.indexOf('/vm/');
  return (i > 0 ? vmPath.slice(0, i) : vmPath).replace(/^\/+/, '');
}
