// Import: a disk image into a storage pool and a domain defined around it (virtio disk and NIC, serial console,
// BIOS or UEFI firmware). POST /import/kvm and the last stage of a shape B migration job both call importDisk.
import { randomUUID } from 'node:crypto';
import { promises as fs, statSync } from 'node:fs';
import path from 'node:path';
import { imageInfo } from '../qemu';
import { inspectImage, qemuFormat } from '../image-format';
import { outputExtension } from '../schemas/common';
import { kvmUsable } from '../guestfs-env';
import { ApiError, fieldError } from '../errors';
import { awaitedLater, expectedError } from '../log';
import { checkName, MAC_PATTERN, NAME_PATTERN as NAME_OK } from './names';
import { nicBus } from './nic-layout';
import { defineDomain, domainExists, domainInfo } from './domains';
import { networkExists, nicSource } from './networks';
import { copyIntoPool, ensureDirPool, isLocalUri, poolTarget, putFile, volumeExists, volumeInfo } from './volumes';
import { parseXml, list, Many, XmlAttrs } from './xml';
import { configuredUri, Virsh } from './virsh';

/** The pool imports go to unless a request names one: FERRY_LIBVIRT_POOL (default "ferry"), a dir pool at
 *  FERRY_LIBVIRT_POOL_DIR (default /var/lib/libvirt/images/ferry) created on first use. */
export const defaultPool = () => process.env.FERRY_LIBVIRT_POOL || 'ferry';
export const defaultPoolDir = () => process.env.FERRY_LIBVIRT_POOL_DIR || '/var/lib/libvirt/images/ferry';

export interface ImportSpec {
  /** Disk images, boot disk first (a local path on the machine running this). */
  disks: { path: string; format?: string }[];
  /** The request field that named disk i, for a 400 about it (default `disks[i].path`). */
  diskField?: (i: number) => string;
  name: string;
  memoryMiB: number; cpus: number;
  /** Networks (libvirt network names, or bridges listed in FERRY_LIBVIRT_BRIDGES: nicSource), one NIC each. */
  networks: string[];
  /** The request field that named network i, for a 400 about it (default `networks[i]`). */
  networkField?: (i: number) => string;
  /** The NICs' MAC addresses, in the order of `networks` (a migrated guest keeps its own: its network configuration
   *  and DHCP reservations name them); libvirt picks one where missing. */
  macs?: (string | undefined)[];
  pool?: string;
  firmware?: 'bios' | 'uefi';
  onProgress?: (stage: string, pct: number) => void;
}

export interface ImportResult { domain: string; uuid: string; pool: string; volumes: { name: string; path: string | null; format: string | null; capacity: number | null }[]; firmware: 'bios' | 'uefi'; domain_type: string; interfaces: unknown[] }

/** `virsh capabilities`, as far as the domain type is read from it: each guest arch with its domain types. */
interface CapabilitiesDoc { capabilities: { guest?: Many<{ arch?: XmlAttrs & { domain?: Many<XmlAttrs> } }> } }

/** FERRY_LIBVIRT_DOMAIN_TYPE when set; else `kvm` when the host offers it for x86_64 guests (`virsh
 *  capabilities`) and KVM is known to work (FERRY_GUESTFS_KVM=1, as for libguestfs: /dev/kvm can exist and still
 *  not run guests), else `qemu` (TCG). */
export async function domainType(v: Virsh): Promise<string> {
  const forced = process.env.FERRY_LIBVIRT_DOMAIN_TYPE;
  if (forced === 'kvm' || forced === 'qemu') return forced;
  if (!kvmUsable()) return 'qemu';
  const caps = parseXml<CapabilitiesDoc>(await v.run(['capabilities'])).capabilities;
  const guest = list(caps.guest).find((g) => g.arch?.['@_name'] === 'x86_64');
  return list(guest?.arch?.domain).some((d) => d['@_type'] === 'kvm') ? 'kvm' : 'qemu';
}

/** A source NIC's MAC as libvirt writes it (VMware's manifests may use '-'); refused when it is not one. */
function macOf(mac: string | undefined, i: number): string | undefined {
  if (!mac) return undefined;
  const m = mac.replace(/-/g, ':').toLowerCase();
  if (!MAC_PATTERN.test(m)) throw new ApiError(400, `macs[${i}]: "${mac}" is not a MAC address`);
  return m;
}

/** The <domain> document of an import (built as an object; every value escaped by the XML builder). */
export function importDomainDoc(o: { name: string; type: string; memoryMiB: number; cpus: number; firmware: 'bios' | 'uefi'; disks: { path: string; format: string }[]; nics: { type: 'network' | 'bridge'; source: string; mac?: string }[] }) {
  const letters = 'abcdefghijklmnopqrstuvwxyz';
  return { domain: {
    '@_type': o.type, name: o.name,
    memory: { '@_unit': 'MiB', '#text': String(o.memoryMiB) }, currentMemory: { '@_unit': 'MiB', '#text': String(o.memoryMiB) },
    vcpu: String(o.cpus),
    // UEFI without Secure Boot: the secure-boot builds of OVMF need SMM, which TCG guests here do not get.
    os: { ...(o.firmware === 'uefi' ? { '@_firmware': 'efi', firmware: { feature: [{ '@_enabled': 'no', '@_name': 'secure-boot' }, { '@_enabled': 'no', '@_name': 'enrolled-keys' }] } } : {}), type: { '@_arch': 'x86_64', '@_machine': 'q35', '#text': 'hvm' }, boot: { '@_dev': 'hd' } },
    features: { acpi: '', apic: '' },
    on_poweroff: 'destroy', on_reboot: 'restart', on_crash: 'destroy',
    devices: {
      disk: o.disks.map((d, i) => ({ '@_type': 'file', '@_device': 'disk', driver: { '@_name': 'qemu', '@_type': d.format }, source: { '@_file': d.path }, target: { '@_dev': `vd${letters[i]}`, '@_bus': 'virtio' } })),
      // Each NIC alone behind its own PCIe root port (nic-layout.ts), so the guest names it what Ferry's repair
      // named its configuration. libvirt adds the root ports the disks and the balloon need after these.
      controller: [{ '@_type': 'pci', '@_index': '0', '@_model': 'pcie-root' }, ...o.nics.map((_, i) => ({ '@_type': 'pci', '@_index': String(nicBus(i)), '@_model': 'pcie-root-port' }))],
      interface: o.nics.map((n, i) => ({
        '@_type': n.type, ...(n.mac ? { mac: { '@_address': n.mac } } : {}), source: n.type === 'network' ? { '@_network': n.source } : { '@_bridge': n.source }, model: { '@_type': 'virtio' },
        address: { '@_type': 'pci', '@_domain': '0x0000', '@_bus': `0x${nicBus(i).toString(16).padStart(2, '0')}`, '@_slot': '0x00', '@_function': '0x0' },
      })),
      serial: { '@_type': 'pty', target: { '@_port': '0' } },
      console: { '@_type': 'pty', target: { '@_type': 'serial', '@_port': '0' } },
      memballoon: { '@_model': 'virtio' },
    },
  } };
}

/** The checks before an import (no domain of that name, the images readable, free volume names, the networks)
 *  and the disks put into the pool under their volume names. In a local dir pool each disk's copy starts as soon
 *  as the folder is known, beside the checks (bench:virt compares the whole import with a bare cp): into a hidden
 *  partial file, renamed to its volume's name once every check has passed, removed when one fails. Elsewhere the
 *  disks are uploaded after the checks. */
async function placeDisks(v: Virsh, s: ImportSpec, pool: string) {
  const targetP = (s.pool ? Promise.resolve() : ensureDirPool(v, pool, defaultPoolDir())).then(() => (isLocalUri(v.uri) ? poolTarget(v, pool) : null));
  const abort = new AbortController();
  const early = awaitedLater(targetP.then((t) => (t?.type === 'dir' && t.path ? s.disks.map((d) => {
    const part = path.join(t.path!, `.${s.name}.${randomUUID().slice(0, 8)}.ferry-partial`);
    return { part, done: awaitedLater(copyIntoPool(d.path, part, pool, abort.signal)) };
  }) : null)));
  try {
    // The checks are independent round trips: run together, they cost one.
    const [exists, infos, target, nics, type] = await Promise.all([
      domainExists(v, s.name),
      // The format given, else the header's (read by Ferry): qemu-img never probes.
      Promise.all(s.disks.map((d, i) => (d.format ? Promise.resolve(qemuFormat(d.format)) : inspectImage(d.path).then((h) => h.format))
        .then((fmt) => imageInfo(d.path, fmt)).catch((e: Error) => {
          throw fieldError(400, s.diskField?.(i) ?? `disks[${i}].path`, `${d.path} is not a disk image qemu-img can read (${e.message})`);
        }))),
      targetP,
      Promise.all(s.networks.map(async (n, i) => ({ ...(await nicSource(v, n, s.networkField?.(i) ?? `networks[${i}]`)), mac: macOf(s.macs?.[i], i) }))),
      domainType(v),
    ]);
    if (exists) throw new ApiError(409, `a domain named ${s.name} already exists`);
    const dirPool = target?.type === 'dir' && target.path ? target.path : null;
    const vols = infos.map((info, i) => ({ name: `${s.name}${i ? `-disk${i}` : ''}.${outputExtension(info.format)}`, format: info.format }));
    for (const vol of vols) {
      // In a local dir pool a volume is a file of the folder: the same answer without a round trip.
      const taken = dirPool ? await fs.access(path.join(dirPool, vol.name)).then(() => true, () => false) : await volumeExists(v, pool, vol.name);
      if (taken) throw new ApiError(409, `volume ${vol.name} already exists in pool ${pool}`);
    }
    const copies = await early;
    for (const [i, d] of s.disks.entries()) {
      s.onProgress?.(`copying ${path.basename(d.path)}`, (i / s.disks.length) * 100);
      if (copies && dirPool) { await copies[i].done; await fs.rename(copies[i].part, path.join(dirPool, vols[i].name)); }
      else await putFile(v, pool, vols[i].name, d.path, vols[i].format, statSync(d.path).size, { exists: false, target, refresh: false });
    }
    return { dirPool, vols, type, nics };
  } catch (e) {
    abort.abort();
    const copies = await early.catch(expectedError('the pool folder was never known, so no copy was started'));
    for (const c of copies || []) {
      await c.done.catch(expectedError('the copy was stopped because the import failed, whose error is the one reported'));
      await fs.rm(c.part, { force: true });
    }
    throw e;
  }
}

export async function importDisk(v: Virsh, s: ImportSpec): Promise<ImportResult> {
  checkName(s.name, 'vm_name');
  if (!s.disks.length) throw new ApiError(400, 'an import needs at least one disk');
  const pool = s.pool || defaultPool();
  checkName(pool, 'pool');
  const { dirPool, vols, type, nics } = await placeDisks(v, s, pool);
  const firmware = s.firmware || 'bios';
  const define = async (paths: string[]) => {
    await defineDomain(v, importDomainDoc({ name: s.name, type, memoryMiB: s.memoryMiB, cpus: s.cpus, firmware, disks: vols.map((x, i) => ({ path: paths[i], format: x.format })), nics }));
    return domainInfo(v, s.name);
  };
  const described = v.run(['pool-refresh', pool]).then(() => Promise.all(vols.map((x) => volumeInfo(v, pool, x.name))));
  // In a dir pool the disks' paths are known: the domain is defined while libvirt refreshes and describes the
  // volumes (a definition only names the files).
  const [vis, info] = await Promise.all([described, dirPool ? define(vols.map((x) => path.join(dirPool, x.name))) : described.then((vi) => define(vi.map((x) => x.path!)))]);
  return {
    domain: s.name, uuid: info.uuid!, pool, firmware, domain_type: type, interfaces: info.interfaces,
    volumes: vis.map((x) => ({ name: x.name, path: x.path, format: x.format, capacity: x.capacity })),
  };
}

/** The last stage of a shape B migration job: the exported (and converted) disks imported on
 *  `destination.virt_uri` (qemu+ssh:// for another host), each source NIC's network mapped through
 *  `options.network_mapping` onto a target network or bridge. A source network without a mapping keeps its name
 *  when the target has a network of that name; otherwise the job fails naming it. */
export async function importForMigration(o: {
  virtUri?: string; name: string; disks: { path: string; format?: string }[]; memoryMiB: number; cpus: number;
  sourceNetworks: string[]; sourceMacs?: (string | undefined)[]; networkMapping: Record<string, string>; firmware?: 'bios' | 'uefi'; pool?: string;
  onProgress?: (stage: string, pct: number) => void;
}): Promise<ImportResult & { virt_uri: string }> {
  const v = new Virsh(o.virtUri || configuredUri());
  const networks: string[] = [];
  const fields: string[] = [];
  for (const src of o.sourceNetworks) {
    const target = o.networkMapping[src];
    if (target) { networks.push(target); fields.push(`options.network_mapping[${JSON.stringify(src)}]`); continue; }
    if (NAME_OK.test(src) && (await networkExists(v, src))) { networks.push(src); fields.push('options.network_mapping'); continue; }
    throw new ApiError(400, `options.network_mapping has no target for the source network "${src}" and ${v.uri} has no network of that name`);
  }
  const r = await importDisk(v, { disks: o.disks, name: o.name, memoryMiB: o.memoryMiB, cpus: o.cpus, networks, networkField: (i) => fields[i], macs: o.sourceMacs, firmware: o.firmware, pool: o.pool, onProgress: o.onProgress });
  return { ...r, virt_uri: v.uri };
}
