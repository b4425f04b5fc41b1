// What preflight needs to know about a source VM, read from vSphere properties (no disk is read): disks with
// their datastore, mode, sharing and backing kind, NICs with network and MAC, special devices, hot-plug, fault
// tolerance, encryption, its ESXi host and sizes. Two property calls per VM (vmDetail names the networks).
import type { Manager } from '../vsphere/client';
import { retrieve } from '../vsphere/properties';
import { DeviceBackingXml, VirtualDeviceXml, virtualDevices, vmDetail } from '../vsphere/inventory';
import { bool, moref, num, text, xsiType, type XmlValue } from '../vsphere/xml';

export interface FactDisk { label: string; datastore: string; file: string; capacity_bytes: number; backing: string; mode: string; sharing: string }
export interface VmFacts {
  vm_path: string; name: string; power_state: string; guest_id: string; firmware: string; secure_boot: boolean;
  esxi_host: string; disks: FactDisk[]; nics: { label: string; network: string; mac: string }[];
  devices: string[]; cpu_hot_add: boolean; memory_hot_add: boolean; fault_tolerance: boolean; encrypted: boolean;
  snapshots: number; committed_bytes: number; provisioned_bytes: number; memory_mb: number;
  /** every snapshot's name, the whole tree (a backup tool's or an operator's; preflight names them) */
  snapshot_names: string[];
  /** config.changeTrackingEnabled: changed-block tracking, which warm rounds need */
  cbt: boolean;
}

const EXTRA = ['config.hardware.device', 'runtime.host', 'config.cpuHotAddEnabled', 'config.memoryHotAddEnabled', 'config.ftInfo',
  'config.keyId', 'config.bootOptions.efiSecureBootEnabled', 'summary.storage.committed', 'summary.storage.uncommitted', 'config.changeTrackingEnabled'];

/** "[LocalDS_0] vm/disk.vmdk" -> "LocalDS_0". */
export const datastoreOf = (file: string) => /^\[([^\]]+)\]/.exec(file)?.[1] ?? '';

/** The VM's virtual disks with their datastore, size, backing kind, mode and sharing. */
function factDisks(devs: VirtualDeviceXml[]): FactDisk[] {
  const disks: FactDisk[] = [];
  for (const dev of devs.filter((x) => xsiType(x) === 'VirtualDisk')) {
    const b: DeviceBackingXml = dev.backing ?? {};
    const file = text(b.fileName) ?? '';
    const kb = num(dev.capacityInKB) ?? 0;
    disks.push({
      label: text(dev.deviceInfo?.label) ?? 'disk', file, datastore: datastoreOf(file), capacity_bytes: num(dev.capacityInBytes) ?? kb * 1024,
      backing: xsiType(b) ?? '', mode: text(b.diskMode) ?? 'persistent', sharing: text(b.sharing) ?? 'sharingNone',
    });
  }
  return disks;
}

/** The name of the VM's ESXi host (its moref value when the name is not read; '' without a host). */
async function hostNameOf(m: Manager, runtimeHost: XmlValue | undefined): Promise<string> {
  const host = moref(runtimeHost);
  let hostName = host?.value ?? '';
  if (host) {
    const [h] = await retrieve(m, [host], [{ type: 'HostSystem', paths: ['name'] }]);
    hostName = text(h?.props.name) ?? host.value;
  }
  return hostName;
}

export async function vmFacts(m: Manager, vmPath: string): Promise<VmFacts> {
  const d = await vmDetail(m, vmPath);
  const [me] = await retrieve(m, [d.moref], [{ type: 'VirtualMachine', paths: EXTRA }]);
  const p = me?.props ?? {};
  const devs = virtualDevices(p['config.hardware.device']);
  const disks = factDisks(devs);
  const hostName = await hostNameOf(m, p['runtime.host']);
  const committed = num(p['summary.storage.committed']) ?? 0;
  return {
    vm_path: vmPath, name: d.name, power_state: d.power_state, guest_id: d.guest_id, firmware: d.firmware,
    secure_boot: bool(p['config.bootOptions.efiSecureBootEnabled']) ?? false, esxi_host: hostName, disks,
    nics: d.nics.map((n) => ({ label: n.label, network: n.network, mac: n.mac.toLowerCase() })),
    devices: devs.map((x) => xsiType(x) ?? ''),
    cpu_hot_add: bool(p['config.cpuHotAddEnabled']) ?? false, memory_hot_add: bool(p['config.memoryHotAddEnabled']) ?? false,
    fault_tolerance: p['config.ftInfo'] !== undefined && p['config.ftInfo'] !== '', encrypted: p['config.keyId'] !== undefined && p['config.keyId'] !== '',
    snapshots: countTree(d.snapshots), snapshot_names: namesOf(d.snapshots), cbt: bool(p['config.changeTrackingEnabled']) ?? false,
    committed_bytes: committed, memory_mb: d.hardware.memory_mb, provisioned_bytes: disks.reduce((a, x) => a + x.capacity_bytes, 0),
  };
}

interface Tree { name: string; children: Tree[] }
const countTree = (l: Tree[]): number => l.reduce((n, s) => n + 1 + countTree(s.children), 0);
const namesOf = (l: Tree[]): string[] => l.flatMap((s) => [s.name, ...namesOf(s.children)]);
