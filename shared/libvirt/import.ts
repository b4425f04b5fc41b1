// Import: a disk image into a storage pool and a domain defined around it (virtio disk and NIC, serial console,
// BIOS or UEFI firmware). POST /import/kvm and the last stage of a shape B migration job both call importDisk.
import { statSync } from 'node:fs';
import path from 'node:path';
import { imageInfo } from '../qemu';
import { ApiError } from '../errors';
import { checkName } from './names';
import { defineDomain, domainExists, domainInfo } from './domains';
import { networkExists } from './networks';
import { ensureDirPool, putFile, volumeExists, volumeInfo } from './volumes';
import { parseXml, list } from './xml';
import { Virsh } from './virsh';

/** The pool imports go to unless a request names one: FERRY_LIBVIRT_POOL (default "ferry"), a dir pool at
 *  FERRY_LIBVIRT_POOL_DIR (default /var/lib/libvirt/images/ferry) created on first use. */
export const defaultPool = () => process.env.FERRY_LIBVIRT_POOL || 'ferry';
export const defaultPoolDir = () => process.env.FERRY_LIBVIRT_POOL_DIR || '/var/lib/libvirt/images/ferry';

export interface ImportSpec {
  /** Disk images, boot disk first (a local path on the machine running this). */
  disks: { path: string; format?: string }[];
  name: string;
  memoryMiB: number; cpus: number;
  /** Networks (libvirt network names, or bridge names when no such network exists), one NIC each. */
  networks: string[];
  pool?: string;
  firmware?: 'bios' | 'uefi';
  onProgress?: (stage: string, pct: number) => void;
}

export interface ImportResult { domain: string; uuid: string; pool: string; volumes: { name: string; path: string | null; format: string | null; capacity: number | null }[]; firmware: 'bios' | 'uefi'; domain_type: string; interfaces: unknown[] }

/** `kvm` when the host offers it for x86_64 guests, else `qemu` (TCG), read from `virsh capabilities`. */
export async function domainType(v: Virsh): Promise<string> {
  const caps = parseXml(await v.run(['capabilities'])).capabilities;
  const guest = list(caps.guest).find((g: any) => g.arch?.['@_name'] === 'x86_64');
  return list(guest?.arch?.domain).some((d: any) => d['@_type'] === 'kvm') ? 'kvm' : 'qemu';
}

/** The <domain> document of an import (built as an object; every value escaped by the XML builder). */
export function importDomainDoc(o: { name: string; type: string; memoryMiB: number; cpus: number; firmware: 'bios' | 'uefi'; disks: { path: string; format: string }[]; nics: { type: 'network' | 'bridge'; source: string }[] }) {
  const letters = 'abcdefghijklmnopqrstuvwxyz';
  return { domain: {
    '@_type': o.type, name: o.name,
    memory: { '@_unit': 'MiB', '#text': String(o.memoryMiB) }, currentMemory: { '@_unit': 'MiB', '#text': String(o.memoryMiB) },
    vcpu: String(o.cpus),
    os: { ...(o.firmware === 'uefi' ? { '@_firmware': 'efi' } : {}), type: { '@_arch': 'x86_64', '@_machine': 'q35', '#text': 'hvm' }, boot: { '@_dev': 'hd' } },
    features: { acpi: '', apic: '' },
    on_poweroff: 'destroy', on_reboot: 'restart', on_crash: 'destroy',
    devices: {
      disk: o.disks.map((d, i) => ({ '@_type': 'file', '@_device': 'disk', driver: { '@_name': 'qemu', '@_type': d.format }, source: { '@_file': d.path }, target: { '@_dev': `vd${letters[i]}`, '@_bus': 'virtio' } })),
      interface: o.nics.map((n) => ({ '@_type': n.type, source: n.type === 'network' ? { '@_network': n.source } : { '@_bridge': n.source }, model: { '@_type': 'virtio' } })),
      serial: { '@_type': 'pty', target: { '@_port': '0' } },
      console: { '@_type': 'pty', target: { '@_type': 'serial', '@_port': '0' } },
      memballoon: { '@_model': 'virtio' },
    },
  } };
}

export async function importDisk(v: Virsh, s: ImportSpec): Promise<ImportResult> {
  checkName(s.name, 'vm_name');
  if (!s.disks.length) throw new ApiError(400, 'an import needs at least one disk');
  if (await domainExists(v, s.name)) throw new ApiError(409, `a domain named ${s.name} already exists`);
  const pool = s.pool || defaultPool();
  checkName(pool, 'pool');
  if (!s.pool) await ensureDirPool(v, pool, defaultPoolDir());
  const nics = [];
  for (const n of s.networks) nics.push({ type: (await networkExists(v, checkName(n, 'network'))) ? 'network' as const : 'bridge' as const, source: n });
  const vols: { path: string; format: string; name: string }[] = [];
  for (const [i, d] of s.disks.entries()) {
    const info = await imageInfo(d.path, d.format);
    const volName = `${s.name}${i ? `-disk${i}` : ''}.${info.format === 'raw' ? 'img' : info.format}`;
    if (await volumeExists(v, pool, volName)) throw new ApiError(409, `volume ${volName} already exists in pool ${pool}`);
    s.onProgress?.(`copying ${path.basename(d.path)}`, (i / s.disks.length) * 100);
    await putFile(v, pool, volName, d.path, info.format, statSync(d.path).size);
    const vi = await volumeInfo(v, pool, volName);
    vols.push({ path: vi.path!, format: info.format, name: volName });
  }
  const type = await domainType(v);
  const firmware = s.firmware || 'bios';
  await defineDomain(v, importDomainDoc({ name: s.name, type, memoryMiB: s.memoryMiB, cpus: s.cpus, firmware, disks: vols, nics }));
  const info = await domainInfo(v, s.name);
  return {
    domain: s.name, uuid: info.uuid!, pool, firmware, domain_type: type, interfaces: info.interfaces,
    volumes: await Promise.all(vols.map(async (x) => { const vi = await volumeInfo(v, pool, x.name); return { name: vi.name, path: vi.path, format: vi.format, capacity: vi.capacity }; })),
  };
}
