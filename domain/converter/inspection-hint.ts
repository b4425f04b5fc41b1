// The plan preflight's inspection, reused by the repair (docs/pipeline.md, "Inspection reused from the preflight").
// libguestfs's `inspect-os` costs 11-13 s of a 35-45 s repair under TCG, and a plan's preflight already ran it on the
// same disks. What inspection concludes (the root, the mount points, the OS, its version and hostname, the
// package format and the hypervisor tools installed) is a function of a few files and the file systems' UUIDs,
// so the preflight records those beside its conclusions: the UUID of every device it names and the sha256 of
// every file inspection reads. The repair takes the conclusions only when every UUID and every digest is the same
// on the disks it repairs; anything else (the guest changed since, a disk in another order) and it inspects as
// always, saying why.
import type { GuestSession } from './guestfs';
import type { GuestInfo } from './types';
import { HV_TOOL_PACKAGES } from './linux/tools';

/** What the preflight read, with device names as the job's appliance sees the VM's disks (its first disk sda). */
export interface InspectionHint {
  os: 'linux'; distro?: string; version?: string; product_name?: string; hostname?: string;
  package_format: string; root: string;
  mountpoints: Record<string, string>;
  /** file system UUID of each device named above (a btrfs subvolume: its file system's) */
  uuids: Record<string, string>;
  hypervisor_packages: string[];
  /** sha256 of each file inspection reads, null where it is absent */
  evidence: Record<string, string | null>;
}

/** The files libguestfs's Linux inspection reads for the facts the hint carries. */
const EVIDENCE = ['/etc/fstab', '/etc/os-release', '/usr/lib/os-release', '/etc/lsb-release', '/etc/debian_version', '/etc/redhat-release',
  '/etc/system-release', '/etc/SuSE-release', '/etc/hostname', '/etc/HOSTNAME', '/etc/sysconfig/network', '/etc/mdadm.conf', '/etc/mdadm/mdadm.conf',
  '/etc/crypttab'];
/** The package database the installed hypervisor tools are read from, by package format; other formats get no hint. */
const PACKAGE_DBS: Record<string, string[]> = {
  deb: ['/var/lib/dpkg/status'],
  rpm: ['/var/lib/rpm/rpmdb.sqlite', '/var/lib/rpm/Packages', '/usr/lib/sysimage/rpm/rpmdb.sqlite'],
  apk: ['/lib/apk/db/installed'],
};

/** The disk under a device name: btrfsvol:/dev/sda2/@home is on /dev/sda2. */
export const fsDevice = (dev: string): string => /^btrfsvol:(\/dev\/[^/]+)/.exec(dev)?.[1] ?? dev;

/** libguestfs's name of the appliance's i-th disk: sda..sdz, sdaa... */
export function diskName(i: number): string {
  let s = '';
  for (let n = i + 1; n > 0; n = Math.floor((n - 1) / 26)) s = String.fromCharCode(97 + ((n - 1) % 26)) + s;
  return `/dev/sd${s}`;
}

/** `dev` with the VM's disks (`disks`, as the preflight's shared appliance named them) renamed to the job's
 *  (the VM's first disk sda); undefined for a disk that is not the VM's. LVs and md devices keep their names. */
export function jobDevice(dev: string, disks: string[]): string | undefined {
  let ok = true;
  const out = dev.replace(/\/dev\/sd[a-z]+(?=\d|\/|$)/, (d) => {
    const i = disks.indexOf(d);
    if (i < 0) ok = false;
    return diskName(i);
  });
  return ok ? out : undefined;
}

/** sha256 of each file of `paths`, null where it is absent (read in the mounted guest). */
async function digests(g: GuestSession, paths: string[]): Promise<Record<string, string | null>> {
  const out: Record<string, string | null> = {};
  // One call a file: the checksum fails where there is no file (absent, or a directory).
  for (const p of paths) out[p] = (await g.tryCmd('checksum', 'sha256', p))?.trim() ?? null;
  return out;
}

const evidenceFiles = (format: string) => [...EVIDENCE, ...(PACKAGE_DBS[format] ?? [])];

/** The preflight's hint for the guest inspected in `info` (mounted), its disks named `disks` in the preflight's
 *  appliance; undefined where the repair could not take it (not Linux, a package format without a database file
 *  here, a device without a UUID). */
export async function inspectionHint(g: GuestSession, info: GuestInfo, disks: string[]): Promise<InspectionHint | undefined> {
  if (info.os !== 'linux' || !info.package_format || !PACKAGE_DBS[info.package_format]) return undefined;
  let root: string | undefined;
  const mountpoints: Record<string, string> = {};
  const uuids: Record<string, string> = {};
  // '' is the root itself, which fstab may not list.
  for (const [mp, dev] of [['', info.root_device], ...Object.entries(info.mountpoints)]) {
    const job = jobDevice(dev, disks);
    const uuid = (await g.blkid(fsDevice(dev))).UUID;
    if (!job || !uuid) return undefined;
    if (mp) mountpoints[mp] = job;
    else root = job;
    uuids[fsDevice(job)] = uuid;
  }
  return {
    os: 'linux', distro: info.distro, version: info.version, product_name: info.product_name, hostname: info.hostname, package_format: info.package_format,
    root: root!, mountpoints, uuids, hypervisor_packages: info.hypervisor_tools.filter((t) => HV_TOOL_PACKAGES.includes(t)),
    evidence: await digests(g, evidenceFiles(info.package_format)),
  };
}

/** The facts of `hint` as the start of a GuestInfo, when every device it names holds the file system it names;
 *  else why not. Nothing is mounted yet. */
export async function hintedInfo(g: GuestSession, hint: InspectionHint): Promise<{ info?: GuestInfo; why?: string }> {
  for (const [dev, uuid] of Object.entries(hint.uuids)) {
    const got = (await g.blkid(dev)).UUID;
    if (got !== uuid) return { why: `${dev} ${got ? `holds the file system ${got}` : 'has no file system'}, not ${uuid} as in the preflight` };
  }
  return { info: {
    os: hint.os, distro: hint.distro, version: hint.version, product_name: hint.product_name, hostname: hint.hostname, root_device: hint.root,
    mountpoints: { ...hint.mountpoints }, filesystems: {}, lvm: false, kernels: [], hypervisor_tools: [...hint.hypervisor_packages],
    package_format: hint.package_format,
  } };
}

/** Why the mounted guest is not the one the preflight read (a file inspection reads differs), or undefined. */
export async function evidenceDiffers(g: GuestSession, hint: InspectionHint): Promise<string | undefined> {
  const now = await digests(g, Object.keys(hint.evidence));
  const changed = Object.keys(hint.evidence).filter((p) => now[p] !== hint.evidence[p]);
  return changed.length ? `${changed.join(', ')} changed since the preflight` : undefined;
}
