// Source VMs for plan tests, shaped on the simulator as an operator's datacenter would have them: disks on either
// datastore, VMs on several ESXi hosts, snapshots, an RDM, a multi-writer disk, a USB controller, a NIC on a
// network the plan does not map, hot-plug, a running VM. Created through Ferry's own SOAP client.
import type { Manager } from '../../shared/vsphere/client';
import { waitForTask } from '../../shared/vsphere/actions';
import { el, esc, moref } from '../../shared/vsphere/xml';
import { DC } from '../vsphere/fixture';

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
