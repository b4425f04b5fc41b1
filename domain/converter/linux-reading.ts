// Ferry's own reading of a Debian guest, in place of libguestfs's `inspect-os` (issue 34 item 4). Under TCG
// `inspect-os` costs 9-15 s of a repair stage bounded at 45 s: it mounts and probes every file system, parses files
// through Augeas and reads the package database. What the repair needs of it is a function of a few files, read
// here in 1-3 s: os-release and debian_version (the distribution and its version as libguestfs reports them for
// Debian: the version and product name from /etc/debian_version), /etc/fstab resolved onto the appliance's
// devices (the mount points), /etc/hostname and dpkg's status file (the hypervisor tools installed).
//
// It claims only what it can read for certain: exactly one Linux root, Debian (dpkg), every fstab entry that names
// a device resolved onto one of the guest's file systems. Anything else (several systems, another distribution, a
// file system another OS may live on, an entry it cannot resolve) is declined with the reason, and the caller
// runs `inspect-os` as before. The guest tests compare both readings on the same disks.
import type { GuestSession } from './guestfs';
import type { GuestInfo } from './types';
import { classifySpec, resolveSpec, type FstabContext } from './fstab';
import { HV_TOOL_PACKAGES } from './linux/tools';

/** File systems a Linux root may be on (the types the repair handles). */
const ROOT_TYPES = new Set(['ext2', 'ext3', 'ext4', 'xfs', 'btrfs']);
/** File systems another operating system may live on: their guest goes to libguestfs's inspection. */
const FOREIGN_TYPES = new Set(['ntfs', 'hfs', 'hfsplus', 'apfs', 'ufs', 'zfs_member', 'zfs']);

export type Reading = { info: GuestInfo } | { why: string };

/** KEY=value lines (os-release), quotes taken off. */
export function keyValues(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const l of text.split('\n')) {
    const m = /^\s*([A-Z_][A-Z0-9_]*)=(.*)$/.exec(l);
    if (m) out[m[1]] = m[2].trim().replace(/^(["'])(.*)\1$/, '$2');
  }
  return out;
}

/** The installed packages among `wanted`, from dpkg's status file as `grep '^(Package|Status): '` prints it. */
export function installedDebs(lines: string[], wanted: string[]): string[] {
  const installed = new Set<string>();
  let pkg: string | undefined;
  for (const l of lines) {
    const m = /^(Package|Status): (.*)$/.exec(l);
    if (m?.[1] === 'Package') pkg = m[2].trim();
    else if (m && pkg && m[2].trim() === 'install ok installed') installed.add(pkg);
  }
  return wanted.filter((p) => installed.has(p));
}

/** The appliance's name of an LVM device-mapper name: /dev/mapper/rhel-root is /dev/rhel/root ("--" is a "-"). */
export function mapperToLv(spec: string): string | undefined {
  const m = /^\/dev\/mapper\/((?:[^-]|--)+)-((?:[^-]|--)+)$/.exec(spec);
  return m ? `/dev/${m[1].replace(/--/g, '-')}/${m[2].replace(/--/g, '-')}` : undefined;
}

interface Ids { uuid?: string; label?: string; partuuid?: string; partlabel?: string }
const ID_KEYS: Record<string, keyof Ids> = { UUID: 'uuid', LABEL: 'label', PARTUUID: 'partuuid', PARTLABEL: 'partlabel' };

/** The device an fstab spec names, among `filesystems`; `ids` read lazily (blkid costs ~0.3 s a device). */
async function resolveDevice(spec: string, opts: string, ctx: FstabContext, filesystems: string[],
  ids: () => Promise<Record<string, Ids>>): Promise<string | undefined> {
  let dev: string | undefined;
  const tagged = /^(UUID|LABEL|PARTUUID|PARTLABEL)=(.+)$/.exec(spec) ?? /^\/dev\/disk\/by-(uuid|label|partuuid|partlabel)\/(.+)$/.exec(spec);
  if (tagged) {
    const key = ID_KEYS[tagged[1].toUpperCase()], value = tagged[2].replace(/^"(.*)"$/, '$1');
    dev = Object.entries(await ids()).find(([, v]) => v[key] === value)?.[0];
  } else if (spec.startsWith('/dev/mapper/')) dev = mapperToLv(spec);
  else if (classifySpec(spec) === 'other') dev = spec;
  else dev = resolveSpec(spec, ctx);
  const subvol = /(?:^|,)subvol=\/?([^,]+)/.exec(opts)?.[1];
  if (dev && subvol) dev = `btrfsvol:${dev}/${subvol}`;
  return dev && filesystems.includes(dev) ? dev : undefined;
}

/** The guest's mount points from its /etc/fstab, or why an entry that names a device could not be resolved. */
async function mountpointsOf(g: GuestSession, fstab: string, root: string, filesystems: Record<string, string>): Promise<Record<string, string> | string> {
  const ctx: FstabContext = { disks: g.lines(await g.cmd('list-devices')), ids: {} };
  let idCache: Record<string, Ids> | undefined;
  const ids = async () => {
    if (idCache) return idCache;
    idCache = {};
    for (const d of Object.keys(filesystems).filter((x) => !x.startsWith('btrfsvol:'))) {
      const b = await g.blkid(d);
      idCache[d] = { uuid: b.UUID, label: b.LABEL, partuuid: b.PART_ENTRY_UUID, partlabel: b.PART_ENTRY_NAME };
    }
    return idCache;
  };
  const mps: Record<string, string> = {};
  for (const line of fstab.split('\n')) {
    const [spec, mp, type = '', opts = ''] = line.replace(/#.*/, '').trim().split(/\s+/);
    if (!spec || !mp?.startsWith('/') || type === 'swap' || classifySpec(spec, type) === 'pseudo') continue;
    const dev = await resolveDevice(spec, opts, ctx, Object.keys(filesystems), ids);
    if (!dev) return `its /etc/fstab names ${spec} for ${mp}, which Ferry's reading does not resolve`;
    mps[mp] = dev;
  }
  if (mps['/'] && mps['/'] !== root) return `its /etc/fstab mounts ${mps['/']} at /, not the root found (${root})`;
  mps['/'] = root;
  return mps;
}

/** Whether the file system `dev` (mounted at / for the look) is a Linux root: /etc/fstab and an os-release. */
async function isLinuxRoot(g: GuestSession, dev: string): Promise<boolean> {
  if (await g.tryCmd('mount-ro', dev, '/') === undefined) return false;
  try {
    const etc = new Set(g.lines(await g.tryCmd('ls', '/etc')));
    return etc.has('fstab') && (etc.has('os-release') || await g.isFile('/usr/lib/os-release'));
  } finally { await g.cmd('umount-all'); }
}

/** The facts of the Debian root `root` (mounted at /), or why Ferry's reading declines it. */
async function debianFacts(g: GuestSession, root: string, filesystems: Record<string, string>): Promise<Reading> {
  // An os-release symlink is read at its target (a relative link resolves inside the guest; /usr/lib is where
  // systemd's spec puts the file).
  const osRelease = await g.read((await g.tryCmd('is-symlink', '/etc/os-release'))?.trim() === 'true' ? '/usr/lib/os-release' : '/etc/os-release');
  const id = keyValues(osRelease).ID;
  if (id !== 'debian') return { why: `the distribution is "${id ?? 'unnamed'}": Ferry reads Debian guests itself` };
  const debVersion = (await g.tryCmd('cat', '/etc/debian_version'))?.trim() ?? '';
  const v = /^(\d+)\.(\d+)/.exec(debVersion);
  if (!v) return { why: `/etc/debian_version says "${debVersion}", not a release number` };
  const mountpoints = await mountpointsOf(g, await g.read('/etc/fstab'), root, filesystems);
  if (typeof mountpoints === 'string') return { why: mountpoints };
  const hostname = (await g.tryCmd('head-n', '1', '/etc/hostname'))?.trim() || undefined;
  const status = await g.tryCmd('grep', '^(Package|Status): ', '/var/lib/dpkg/status', 'extended:true');
  return { info: {
    os: 'linux', distro: 'debian', version: `${Number(v[1])}.${Number(v[2])}`, product_name: debVersion, hostname, root_device: root, mountpoints,
    filesystems: {}, lvm: false, kernels: [], hypervisor_tools: installedDebs(g.lines(status), HV_TOOL_PACKAGES), package_format: 'deb',
  } };
}

/** Ferry's reading of the guest on the appliance's disks (`filesystems`: list-filesystems), nothing mounted before
 *  or after; or why it declines (the caller then runs libguestfs's inspection). */
export async function readLinuxGuest(g: GuestSession, filesystems: Record<string, string>): Promise<Reading> {
  const foreign = Object.entries(filesystems).find(([, t]) => FOREIGN_TYPES.has(t));
  if (foreign) return { why: `${foreign[0]} holds ${foreign[1]}, where another system may live` };
  const roots: string[] = [];
  for (const [dev, type] of Object.entries(filesystems)) if (ROOT_TYPES.has(type) && await isLinuxRoot(g, dev)) roots.push(dev);
  if (!roots.length) return { why: 'Ferry\'s reading found no Linux root' };
  if (roots.length > 1) return { why: `the disks hold ${roots.length} systems (${roots.join(', ')})` };
  await g.cmd('mount-ro', roots[0], '/');
  try { return await debianFacts(g, roots[0], filesystems); } finally { await g.cmd('umount-all'); }
}
