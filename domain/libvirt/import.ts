// Import: a disk image into a storage pool and a domain defined around it (virtio disk and NIC, serial console,
// BIOS or UEFI firmware). POST /import/kvm and the last stage of a shape B migration job both call importDisk.
// Each volume and the domain go into the job's ledger as they are made (ledger.ts), and nothing that exists is
// replaced: an import fails with a 409 on a name it did not make, and removes what it made when it fails.
import { randomUUID } from 'node:crypto';
import { promises as fs, statSync } from 'node:fs';
import path from 'node:path';
import { imageInfo } from '../qemu';
import { inspectImage, qemuFormat } from '../image-format';
import { outputExtension } from '../schemas/common';
import { kvmUsable } from '../guestfs-env';
import { ApiError, fieldError } from '../../platform/errors';
import { awaitedLater, expectedError, ignoreError } from '../../platform/log';
import { checkDomainName, checkName, MAC_PATTERN, NAME_PATTERN as NAME_OK } from './names';
import { nicBus } from './nic-layout';
import { defineDomain, domainExists, domainInfo, type DomainDoc } from './domains';
import { networkExists, nicSource } from './networks';
import { copyIntoPool, ensureDirPool, isLocalUri, poolTarget, putFile, volumeExists, volumeInfo } from './volumes';
import { parseXml, list, Many, XmlAttrs } from './xml';
import { configuredUri, LibvirtError, Virsh } from './virsh';
import { NO_LEDGER, type Ledger, type Made } from './ledger';
import { setting } from '../../platform/settings';
import { confineRequestImage } from '../image-confine';
import { confinePath } from './paths';
import type { ImportKvmInput } from '../schemas/virt';

/** The pool imports go to unless a request names one: FERRY_LIBVIRT_POOL (default "ferry"), a dir pool at
 *  FERRY_LIBVIRT_POOL_DIR (default /var/lib/libvirt/images/ferry) created on first use. */
export const defaultPool = () => setting('FERRY_LIBVIRT_POOL');
export const defaultPoolDir = () => setting('FERRY_LIBVIRT_POOL_DIR');

export interface ImportSpec {
  /** Disk images, boot disk first (a local path on the machine running this). `inPool`: the image is already a
   *  partial file in the local dir pool's folder, recorded in the ledger by its maker (one pass): it is taken
   *  under its volume name as it is, never copied. On another host (one pass there, remote-one-pass.ts) `path`
   *  is the volume's path in the pool there, the volume already has the name this import gives it, and `format`
   *  is given: nothing reads it here. */
  disks: { path: string; format?: string; inPool?: boolean }[];
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
  /** The job's ledger: each volume and the domain recorded as they are made (none: POST /import/kvm's answer says). */
  ledger?: Ledger;
}

export interface ImportResult {
  domain: string; uuid: string; pool: string;
  volumes: { name: string; key: string | null; path: string | null; format: string | null; capacity: number | null }[];
  firmware: 'bios' | 'uefi'; domain_type: string; interfaces: unknown[];
}

/** `virsh capabilities`, as far as the domain type is read from it: each guest arch with its domain types. */
interface CapabilitiesDoc { capabilities: { guest?: Many<{ arch?: XmlAttrs & { domain?: Many<XmlAttrs> } }> } }

/** FERRY_LIBVIRT_DOMAIN_TYPE when set; else `kvm` when the host offers it for x86_64 guests (`virsh
 *  capabilities`) and KVM is known to work (FERRY_GUESTFS_KVM=1, as for libguestfs: /dev/kvm can exist and still
 *  not run guests), else `qemu` (TCG). */
export async function domainType(v: Virsh): Promise<string> {
  const forced = setting('FERRY_LIBVIRT_DOMAIN_TYPE');
  if (forced) return forced;
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
export function importDomainDoc(o: {
  name: string; uuid?: string; type: string; memoryMiB: number; cpus: number; firmware: 'bios' | 'uefi';
  disks: { path: string; format: string }[]; nics: { type: 'network' | 'bridge'; source: string; mac?: string }[];
}) {
  const letters = 'abcdefghijklmnopqrstuvwxyz';
  return { domain: {
    '@_type': o.type, name: o.name, ...(o.uuid ? { uuid: o.uuid } : {}),
    memory: { '@_unit': 'MiB', '#text': String(o.memoryMiB) }, currentMemory: { '@_unit': 'MiB', '#text': String(o.memoryMiB) },
    vcpu: String(o.cpus),
    // UEFI without Secure Boot: the secure-boot builds of OVMF need SMM, which TCG guests here do not get.
    os: {
      ...(o.firmware === 'uefi'
        ? { '@_firmware': 'efi', firmware: { feature: [{ '@_enabled': 'no', '@_name': 'secure-boot' }, { '@_enabled': 'no', '@_name': 'enrolled-keys' }] } }
        : {}),
      type: { '@_arch': 'x86_64', '@_machine': 'q35', '#text': 'hvm' }, boot: { '@_dev': 'hd' },
    },
    features: { acpi: '', apic: '' },
    on_poweroff: 'destroy', on_reboot: 'restart', on_crash: 'destroy',
    devices: {
      disk: o.disks.map((d, i) => ({
        '@_type': 'file', '@_device': 'disk', driver: { '@_name': 'qemu', '@_type': d.format }, source: { '@_file': d.path },
        target: { '@_dev': `vd${letters[i]}`, '@_bus': 'virtio' },
      })),
      // Each NIC alone behind its own PCIe root port (nic-layout.ts), so the guest names it what Ferry's repair
      // named its configuration. libvirt adds the root ports the disks and the balloon need after these.
      controller: [
        { '@_type': 'pci', '@_index': '0', '@_model': 'pcie-root' },
        ...o.nics.map((_, i) => ({ '@_type': 'pci', '@_index': String(nicBus(i)), '@_model': 'pcie-root-port' })),
      ],
      interface: o.nics.map((n, i) => ({
        '@_type': n.type, ...(n.mac ? { mac: { '@_address': n.mac } } : {}),
        source: n.type === 'network' ? { '@_network': n.source } : { '@_bridge': n.source }, model: { '@_type': 'virtio' },
        address: { '@_type': 'pci', '@_domain': '0x0000', '@_bus': `0x${nicBus(i).toString(16).padStart(2, '0')}`, '@_slot': '0x00', '@_function': '0x0' },
      })),
      serial: { '@_type': 'pty', target: { '@_port': '0' } },
      console: { '@_type': 'pty', target: { '@_type': 'serial', '@_port': '0' } },
      memballoon: { '@_model': 'virtio' },
    },
  } };
}

/** Records what was just made in the job's ledger; when the attempt no longer holds its job, removes it again
 *  (made here a moment ago, so certainly this import's) and throws. */
async function recordOrUndo(ledger: Ledger, e: Made, undo: () => Promise<unknown>) {
  try { await ledger.record(e); } catch (err) {
    await undo().catch(ignoreError(`the ${e.kind} was made but is in no ledger, so no rollback removes it: remove it by hand`,
      { id: e.id, virt_uri: e.virt_uri }));
    throw err;
  }
}

/** The copy's hard link under the volume's name: unlike a rename it fails when the name was taken since the check.
 *  A filesystem without hard links gets the check again and a rename. */
async function linkNew(part: string, dest: string, taken: () => Error) {
  try { await fs.link(part, dest); } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'EEXIST') throw taken();
    if (code !== 'EPERM' && code !== 'ENOTSUP' && code !== 'EOPNOTSUPP') throw e;
    if (await fs.access(dest).then(() => true, () => false)) throw taken();
    await fs.rename(part, dest);
  }
}

interface Placing {
  pool: string; dirPool: string | null; target: { type: string; path: string | null } | null;
  vol: { name: string; format: string }; file: string; part?: string;
}

/** Each disk's format: the one given, else the header's (read by Ferry), so qemu-img never probes; a disk already
 *  in its volume on another host is not read here. */
function diskFormats(v: Virsh, s: ImportSpec) {
  return Promise.all(s.disks.map((d, i) => (remoteInPool(v, d) ? Promise.resolve({ format: qemuFormat(d.format!) })
    : (d.format ? Promise.resolve(qemuFormat(d.format)) : inspectImage(d.path).then((h) => h.format))
      .then((fmt) => imageInfo(d.path, fmt))).catch((e: Error) => {
      throw fieldError(400, s.diskField?.(i) ?? `disks[${i}].path`, `${d.path} is not a disk image qemu-img can read (${e.message})`);
    })));
}

/** Every volume name the import gives must be free, except a remote one-pass disk's, which must be that volume. */
async function checkVolumeNames(v: Virsh, s: ImportSpec, pool: string, dirPool: string | null, vols: { name: string }[]) {
  for (const [i, vol] of vols.entries()) {
    if (remoteInPool(v, s.disks[i])) { await ownRemoteVolume(v, pool, vol.name, s.disks[i].path); continue; }
    // In a local dir pool a volume is a file of the folder: the same answer without a round trip.
    const taken = dirPool ? await fs.access(path.join(dirPool, vol.name)).then(() => true, () => false) : await volumeExists(v, pool, vol.name);
    if (taken) throw new ApiError(409, `volume ${vol.name} already exists in pool ${pool}`);
  }
}

/** A disk the job already wrote into its volume on another host (one pass there). */
const remoteInPool = (v: Virsh, d: ImportSpec['disks'][number]) => !!d.inPool && !isLocalUri(v.uri);

/** The volume a remote one-pass disk is in must be the one this import names, at the path the job wrote. */
async function ownRemoteVolume(v: Virsh, pool: string, name: string, file: string) {
  const info = await volumeInfo(v, pool, name).catch((e: unknown) => {
    throw e instanceof LibvirtError && e.status === 404 ? new ApiError(500, `volume ${name} the job wrote is gone from pool ${pool} on ${v.uri}`) : e;
  });
  if (info.path !== file) throw new ApiError(500, `volume ${name} in pool ${pool} on ${v.uri} is at ${info.path}, not at ${file} where the job wrote it`);
}

/** One disk into its volume, the volume recorded in the ledger the moment it exists (its key; in a dir pool its
 *  path). Returns how to remove it again. A volume name taken meanwhile is a 409, never replaced: the local copy
 *  is linked (linkNew), elsewhere vol-create-as refuses a name that exists. */
async function placeOne(v: Virsh, ledger: Ledger, p: Placing): Promise<() => Promise<unknown>> {
  const taken = () => new ApiError(409, `volume ${p.vol.name} already exists in pool ${p.pool}`);
  if (p.dirPool && p.part) {
    const dest = path.join(p.dirPool, p.vol.name);
    await linkNew(p.part, dest, taken);
    const undo = () => fs.rm(dest, { force: true });
    await recordOrUndo(ledger, { kind: 'volume', id: dest, name: p.vol.name, virt_uri: v.uri, pool: p.pool }, undo);
    await fs.rm(p.part, { force: true });
    return undo;
  }
  const size = statSync(p.file).size;
  await v.run(['vol-create-as', p.pool, p.vol.name, String(size), '--format', p.vol.format])
    .catch((e) => { throw e instanceof LibvirtError && e.status === 409 ? taken() : e; });
  const info = await volumeInfo(v, p.pool, p.vol.name);
  const key = info.key ?? info.path; // libvirt gives every volume a key; its path names it as well
  if (!key) {
    await v.run(['vol-delete', '--pool', p.pool, p.vol.name]);
    throw new ApiError(500, `libvirt gave volume ${p.vol.name} in pool ${p.pool} neither a key nor a path: it cannot be recorded, so it was removed`);
  }
  const undo = () => v.run(['vol-delete', key]);
  await recordOrUndo(ledger, { kind: 'volume', id: key, name: p.vol.name, virt_uri: v.uri, pool: p.pool }, undo);
  await putFile(v, p.pool, p.vol.name, p.file, p.vol.format, size, { exists: true, target: p.target, refresh: false });
  return undo;
}

/** In a local dir pool each disk's copy starts as soon as the folder is known, beside the checks (bench:virt
 *  compares the whole import with a bare cp): into a hidden partial file, recorded in the ledger before it is
 *  made (its name is random, so it can only be this import's). */
function earlyCopies(v: Virsh, s: ImportSpec, pool: string, targetP: Promise<{ type: string; path: string | null } | null>, signal: AbortSignal) {
  const ledger = s.ledger ?? NO_LEDGER;
  return awaitedLater(targetP.then((t) => (t?.type === 'dir' && t.path ? s.disks.map((d) => {
    if (d.inPool) {
      if (path.dirname(d.path) !== t.path) throw new ApiError(500, `${d.path} is not in the folder of pool ${pool} (${t.path})`);
      return { part: d.path, done: Promise.resolve() };
    }
    const part = path.join(t.path!, `.${s.name}.${randomUUID().slice(0, 8)}.ferry-partial`);
    const made = ledger.record({ kind: 'volume', id: part, name: path.basename(part), virt_uri: v.uri, pool });
    return { part, done: awaitedLater(made.then(() => copyIntoPool(d.path, part, pool, signal))) };
  }) : null)));
}

/** The checks before an import (no domain of that name, the images readable, free volume names, the networks)
 *  and the disks put into the pool under their volume names (placeOne): the early copies (earlyCopies) renamed
 *  once every check has passed, elsewhere uploads after the checks. On failure everything this call made goes. */
async function placeDisks(v: Virsh, s: ImportSpec, pool: string) {
  const targetP = (s.pool ? Promise.resolve() : ensureDirPool(v, pool, defaultPoolDir())).then(() => (isLocalUri(v.uri) ? poolTarget(v, pool) : null));
  const abort = new AbortController();
  const early = earlyCopies(v, s, pool, targetP, abort.signal);
  const placed: (() => Promise<unknown>)[] = [];
  try {
    // The checks are independent round trips: run together, they cost one.
    const [exists, infos, target, nics, type] = await Promise.all([
      domainExists(v, s.name),
      diskFormats(v, s),
      targetP,
      Promise.all(s.networks.map(async (n, i) => ({ ...(await nicSource(v, n, s.networkField?.(i) ?? `networks[${i}]`)), mac: macOf(s.macs?.[i], i) }))),
      domainType(v),
    ]);
    if (exists) throw new ApiError(409, `a domain named ${s.name} already exists`);
    const dirPool = target?.type === 'dir' && target.path ? target.path : null;
    const vols = infos.map((info, i) => ({ name: `${s.name}${i ? `-disk${i}` : ''}.${outputExtension(info.format)}`, format: info.format }));
    await checkVolumeNames(v, s, pool, dirPool, vols);
    const copies = await early;
    if (!copies && s.disks.some((d) => d.inPool && !remoteInPool(v, d))) {
      throw new ApiError(500, `pool ${pool} is not a local dir pool, so a disk already in its folder cannot be taken`);
    }
    for (const [i, d] of s.disks.entries()) {
      s.onProgress?.(`copying ${path.basename(d.path)}`, (i / s.disks.length) * 100);
      if (copies) await copies[i].done;
      if (remoteInPool(v, d)) continue; // made and recorded by the job; a failed import leaves it to the job's retry or rollback
      placed.push(await placeOne(v, s.ledger ?? NO_LEDGER, { pool, dirPool, target, vol: vols[i], file: d.path, part: copies?.[i].part }));
    }
    return { dirPool, vols, type, nics, placed };
  } catch (e) {
    abort.abort();
    const copies = await early.catch(expectedError('the pool folder was never known, so no copy was started'));
    for (const c of copies || []) {
      await c.done.catch(expectedError('the copy was stopped because the import failed, whose error is the one reported'));
      await fs.rm(c.part, { force: true });
    }
    await undoAll(placed);
    throw e;
  }
}

/** Removes what this import placed, after a failure (whose error is the one reported). */
async function undoAll(placed: (() => Promise<unknown>)[]) {
  for (const undo of placed) await undo().catch(ignoreError('a volume this failed import made stays; it is in the job\'s ledger, so its rollback removes it'));
}

/** A domain around the placed disks, under a UUID Ferry chose: recorded in the ledger before the definition
 *  (nothing else can have it), confirmed after it (an attempt that lost its job undefines it again). libvirt
 *  refuses to define a name another domain has, so nothing is replaced. */
async function defineNew(v: Virsh, ledger: Ledger, name: string, doc: (uuid: string) => DomainDoc) {
  const uuid = randomUUID();
  const entry: Made = { kind: 'domain', id: uuid, name, virt_uri: v.uri };
  await ledger.record(entry);
  await defineDomain(v, doc(uuid));
  await recordOrUndo(ledger, entry, () => v.run(['undefine', '--nvram', uuid]));
  return domainInfo(v, uuid);
}

export async function importDisk(v: Virsh, s: ImportSpec): Promise<ImportResult> {
  checkDomainName(s.name, 'vm_name');
  if (!s.disks.length) throw new ApiError(400, 'an import needs at least one disk');
  const pool = s.pool || defaultPool();
  checkName(pool, 'pool');
  const { dirPool, vols, type, nics, placed } = await placeDisks(v, s, pool);
  const firmware = s.firmware || 'bios';
  const define = (paths: string[]) => defineNew(v, s.ledger ?? NO_LEDGER, s.name, (uuid) => importDomainDoc({
    name: s.name, uuid, type, memoryMiB: s.memoryMiB, cpus: s.cpus, firmware, disks: vols.map((x, i) => ({ path: paths[i], format: x.format })), nics,
  }));
  const described = v.run(['pool-refresh', pool]).then(() => Promise.all(vols.map((x) => volumeInfo(v, pool, x.name))));
  // In a dir pool the disks' paths are known: the domain is defined while libvirt refreshes and describes the
  // volumes (a definition only names the files).
  const [vis, info] = await Promise.all([
    described,
    dirPool ? define(vols.map((x) => path.join(dirPool, x.name))) : described.then((vi) => define(vi.map((x) => x.path!))),
  ])
    .catch(async (e) => { await undoAll(placed); throw e; });
  return {
    domain: s.name, uuid: info.uuid!, pool, firmware, domain_type: type, interfaces: info.interfaces,
    volumes: vis.map((x) => ({ name: x.name, key: x.key, path: x.path, format: x.format, capacity: x.capacity })),
  };
}

/** The last stage of a shape B migration job: the exported (and converted) disks imported on
 *  `destination.virt_uri` (qemu+ssh:// for another host), each source NIC's network mapped through
 *  `options.network_mapping` onto a target network or bridge. A source network without a mapping keeps its name
 *  when the target has a network of that name; otherwise the job fails naming it. */
export async function importForMigration(o: {
  virtUri?: string; name: string; disks: ImportSpec['disks']; memoryMiB: number; cpus: number;
  sourceNetworks: string[]; sourceMacs?: (string | undefined)[]; networkMapping: Record<string, string>; firmware?: 'bios' | 'uefi'; pool?: string;
  onProgress?: (stage: string, pct: number) => void; ledger?: Ledger;
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
  const r = await importDisk(v, {
    disks: o.disks, name: o.name, memoryMiB: o.memoryMiB, cpus: o.cpus, networks, networkField: (i) => fields[i], macs: o.sourceMacs,
    firmware: o.firmware, pool: o.pool, onProgress: o.onProgress, ledger: o.ledger,
  });
  return { ...r, virt_uri: v.uri };
}

/** POST /import/kvm's work, where it runs (the daemon with virsh, or a worker's virt_files job): the image confined
 *  to this machine's input roots and its header read by Ferry, then imported. A disk copied into the pool would
 *  resolve a reference against the pool's folder, so the image must reference nothing. */
export async function importRequest(v: Virsh, body: ImportKvmInput, ledger?: Ledger): Promise<ImportResult> {
  const image = await confinePath(body.image_path, 'input', 'image_path');
  const { format } = await confineRequestImage({ field: 'image_path', path: image, selfContained: true });
  return importDisk(v, {
    disks: [{ path: image, format }], diskField: () => 'image_path', name: body.vm_name, memoryMiB: body.memory, cpus: body.cpus,
    networks: body.network ? [body.network] : [], networkField: () => 'network', pool: body.pool, firmware: body.firmware, ledger,
  });
}
