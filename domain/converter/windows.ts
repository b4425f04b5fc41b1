// Windows guests: virtio driver injection, the way virt-v2v does it (convert/windows_virtio.ml), inside the fix
// stage's one GuestSession. From a virtio-win tree on the host (<driver>/<version>/<arch>/files):
//   - viostor.sys and vioscsi.sys go to %SystemRoot%\System32\drivers (the boot disk driver must be there),
//   - every driver that has the chosen version/arch goes to %SystemRoot%\Drivers\VirtIO\<driver>\,
//   - SYSTEM hive: Services\viostor|vioscsi as boot-start SCSI miniports, CriticalDeviceDatabase entries for the
//     virtio PCI ids, and (Windows 8/2012 and later, whose SYSTEM hive has a DriverDatabase) the DriverDatabase
//     entries virt-v2v writes, since those Windows versions no longer read the CriticalDeviceDatabase,
//   - SOFTWARE hive: %SystemRoot%\Drivers\VirtIO (and its driver folders) appended to DevicePath so Plug and Play
//     installs the other drivers (network, balloon, serial, ...) on first boot.
// Registry values are read in the guest and written on a downloaded copy of each hive (registry.ts); the driver
// tree is found and read on the host (virtio-win.ts).
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { FixAction } from './types';
import { GuestSession } from './guestfs';
import { HIVEXREGEDIT, HiveReader, RegKey, hasHivexregedit, hivexregedit, regFile, regValue, describeValue, extendDevicePath } from './registry';
import {
  ARCH_DIRS, DriverDir, WindowsFacts, driverSet, driverVersions, locateVirtioWin, pickVersionDir, underSystemRoot, virtioWinCandidates, windowsVersionDir,
} from './virtio-win';

// ---------------------------------------------------------------------------------------------------------------
// Registry edits (pure)

export const SCSI_CLASS_GUID = '{4D36E97B-E325-11CE-BFC1-08002BE10318}';
/** Legacy and modern (virtio 1.0) PCI ids of the two boot disk drivers. */
export const BOOT_DRIVERS: Record<string, string[]> = {
  viostor: ['VEN_1AF4&DEV_1001&SUBSYS_00021AF4&REV_00', 'VEN_1AF4&DEV_1042&SUBSYS_11001AF4&REV_01'],
  vioscsi: ['VEN_1AF4&DEV_1004&SUBSYS_00081AF4&REV_00', 'VEN_1AF4&DEV_1048&SUBSYS_11001AF4&REV_01'],
};
// Version of a DriverDatabase package entry, as virt-v2v writes it (needed by Windows-Kernel-Pnp on 10/2016).
const DDB_VERSION = Buffer.concat([
  Buffer.from([0x00, 0xff, 0x09, 0x00, 0, 0, 0, 0, 0x7b, 0xe9, 0x36, 0x4d, 0x25, 0xe3, 0xce, 0x11, 0xbf, 0xc1, 0x08, 0x00, 0x2b, 0xe1, 0x03, 0x18]),
  Buffer.alloc(24),
]);

/** SYSTEM hive edits that make `drivers` (viostor/vioscsi) load at boot and bind to the virtio disk. */
export function systemHiveEdits(controlSet: string, drivers: string[], driverDatabase: boolean): RegKey[] {
  const keys: RegKey[] = [];
  for (const drv of drivers) {
    keys.push({ path: [controlSet, 'Services', drv], values: [
      regValue.dword('Type', 1), regValue.dword('Start', 0), regValue.dword('ErrorControl', 1),
      regValue.sz('Group', 'SCSI miniport'), regValue.expandSz('ImagePath', `system32\\drivers\\${drv}.sys`),
    ] });
    for (const id of BOOT_DRIVERS[drv]) {
      keys.push({
        path: [controlSet, 'Control', 'CriticalDeviceDatabase', `pci#${id.toLowerCase()}`],
        values: [regValue.sz('Service', drv), regValue.sz('ClassGUID', SCSI_CLASS_GUID)],
      });
    }
    if (driverDatabase) {
      const inf = `ferry-${drv}.inf`;
      const label = `${inf}_tmp`;
      const conf = `ferry_${drv}_conf`;
      keys.push({
        path: ['DriverDatabase', 'DriverInfFiles', inf],
        values: [regValue.multiSz('', [label]), regValue.sz('Active', label), regValue.multiSz('Configurations', [conf])],
      });
      keys.push({ path: ['DriverDatabase', 'DriverPackages', label], values: [regValue.binary('Version', DDB_VERSION)] });
      keys.push({
        path: ['DriverDatabase', 'DriverPackages', label, 'Configurations', conf],
        values: [regValue.dword('ConfigFlags', 0), regValue.sz('Service', drv)],
      });
      for (const id of BOOT_DRIVERS[drv]) {
        keys.push({ path: ['DriverDatabase', 'DeviceIds', 'PCI', id], values: [regValue.binary(inf, Buffer.from([0x01, 0xff, 0x00, 0x00]))] });
        keys.push({ path: ['DriverDatabase', 'DriverPackages', label, 'Descriptors', 'PCI', id], values: [regValue.sz('Configuration', conf)] });
      }
    }
  }
  return keys;
}

// ---------------------------------------------------------------------------------------------------------------
// The guest side

const one = (s: string | undefined) => (s ?? '').trim();

/**
 * The guest's own spelling of `p` (ntfs-3g is case-sensitive, Windows is not). case-sensitive-path accepts a
 * missing last component only, so the parent is resolved first and missing components are kept as given.
 */
export async function guestPathCi(g: GuestSession, p: string): Promise<string> {
  const r = await g.tryCmd('case-sensitive-path', p);
  if (r !== undefined) return one(r);
  const parent = path.posix.dirname(p);
  if (parent === p) return p;
  return path.posix.join(await guestPathCi(g, parent), path.posix.basename(p));
}




export interface WindowsFixOptions { dry_run: boolean; backup: boolean; windows_version?: string; virtio_win?: string; env?: NodeJS.ProcessEnv }

/**
 * Injects the virtio drivers into the inspected, mounted Windows guest `root`. Every step is reported through
 * `act` (action "inject_virtio_drivers", with a `step` field). Returns true when the guest was modified.
 */
export async function injectVirtioDrivers(g: GuestSession, root: string, o: WindowsFixOptions, act: (a: FixAction) => void): Promise<boolean> {
  const A = 'inject_virtio_drivers';
  const would = o.dry_run ? 'would_do' : 'done';
  const step = (s: string, status: FixAction['status'], detail: string, extra: Record<string, unknown> = {}) => act({
    action: A, step: s, status, detail, ...extra,
  });

  // 1. The driver tree (an ISO is unpacked for the time of the injection).
  const src = await locateVirtioWin(virtioWinCandidates(o.virtio_win, o.env));
  if (!src.root) {
    step('source', 'warning', `no virtio-win driver tree found (looked in ${src.looked.join('; ')}); `
      + `Windows ${o.windows_version || 'version unknown'} drivers not injected`, { looked: src.looked });
    return false;
  }
  try {
    return await injectFrom(g, root, o, { root: src.root, from: src.from! }, step, would);
  } finally { await src.cleanup?.(); }
}

type Step = (s: string, status: FixAction['status'], detail: string, extra?: Record<string, unknown>) => void;

/** 2. What the guest is: its systemroot, hives and control set, version facts, DevicePath and whether the SYSTEM
 *  hive has a DriverDatabase; null without a systemroot. */
async function readWindowsGuest(g: GuestSession, root: string) {
  const get = async (c: string) => one(await g.tryCmd(c, root)) || undefined;
  const systemroot = await get('inspect-get-windows-systemroot');
  const controlSet = await get('inspect-get-windows-current-control-set');
  const systemHive = await get('inspect-get-windows-system-hive');
  const softwareHive = await get('inspect-get-windows-software-hive');
  const num = (s?: string) => (s !== undefined && /^\d+$/.test(s) ? Number(s) : undefined);
  const facts: WindowsFacts = {
    major: num(await get('inspect-get-major-version')), minor: num(await get('inspect-get-minor-version')),
    variant: await get('inspect-get-product-variant'), productName: await get('inspect-get-product-name'), arch: await get('inspect-get-arch'),
  };
  if (!systemroot) return null;
  const reader = new HiveReader(g);
  let devicePath: string | undefined;
  if (softwareHive) {
    try {
      const r = await reader.open(softwareHive);
      const cv = await reader.node(r, ['Microsoft', 'Windows NT', 'CurrentVersion']);
      if (cv) facts.build = num(await reader.string(cv, 'CurrentBuildNumber'));
      const wcv = await reader.node(r, ['Microsoft', 'Windows', 'CurrentVersion']);
      if (wcv) devicePath = await reader.string(wcv, 'DevicePath');
    } finally { await reader.close(); }
  }
  let driverDatabase = false;
  if (systemHive) {
    try { driverDatabase = !!(await reader.node(await reader.open(systemHive), ['DriverDatabase'])); } finally { await reader.close(); }
  }

  return { systemroot, controlSet, systemHive, softwareHive, facts, devicePath, driverDatabase };
}

/** 3. Which version/arch directory of the driver tree, and its drivers; null (with the step saying why) when none fits. */
async function pickDriverSet(o: WindowsFixOptions, facts: WindowsFacts, src: { root: string; from: string }, step: Step) {
  const ver = windowsVersionDir(o.windows_version, facts);
  if ('error' in ver) { step('version', 'warning', `${ver.error}; drivers not injected`); return null; }
  const arch = facts.arch && ARCH_DIRS[facts.arch];
  if (!arch) { step('version', 'warning', `guest architecture ${facts.arch || 'unknown'} has no virtio-win directory; drivers not injected`); return null; }
  const available = await driverVersions(src.root, 'viostor', arch);
  const picked = pickVersionDir(available, ver.dir);
  if (!picked) {
    step('version', 'warning', `${src.root} has no viostor driver for ${ver.dir}/${arch} or an older version of that line `
      + `(it has: ${available.join(', ') || 'none'}); drivers not injected`);
    return null;
  }
  const set = await driverSet(src.root, picked.dir, arch);
  const versionDetail = `${picked.dir}/${arch} from ${src.root} (${src.from}); ${ver.reason}`;
  if (picked.fallback) {
    step('version', 'warning', `${ver.dir}/${arch} is not in ${src.root}; using the nearest older ${picked.dir}/${arch} (${ver.reason})`, {
      wanted: ver.dir, version_dir: picked.dir, arch,
    });
  } else step('version', 'done', versionDetail, { version_dir: picked.dir, arch, source: src.root });
  const missing = ['viostor', 'vioscsi'].filter((d) => !set.some((s) => s.driver.toLowerCase() === d));
  if (missing.length) step('version', 'warning', `${missing.join(', ')} not available for ${picked.dir}/${arch}`);

  return set;
}

type Upload = (from: string, to: string) => Promise<void>;

/** 4a. Copies each boot disk driver's .sys into System32\drivers (`driversDir`); returns the drivers copied. */
async function copyBootDrivers(
  g: GuestSession, set: DriverDir[], driversDir: string, ci: (p: string) => Promise<string>, upload: Upload, step: Step, would: 'would_do' | 'done',
): Promise<string[]> {
  const bootDrivers: string[] = [];
  if (!(await g.isDir(driversDir))) step('boot_drivers', 'warning', `${driversDir} is not a directory in the guest; boot drivers not copied`);
  else {
    for (const d of set.filter((s) => BOOT_DRIVERS[s.driver.toLowerCase()])) {
      const drv = d.driver.toLowerCase();
      const sys = d.files.find((f) => f.toLowerCase() === `${drv}.sys`);
      if (!sys) { step('boot_drivers', 'warning', `${d.dir} has no ${drv}.sys`); continue; }
      const to = await ci(`${driversDir}/${drv}.sys`);
      await upload(path.join(d.dir, sys), to);
      bootDrivers.push(drv);
      step('boot_drivers', would, `${path.join(d.dir, sys)} -> ${to}`, { driver: drv, file: to });
    }
  }
  return bootDrivers;
}

/** 4b. Copies every driver's files into the guest's driver store (`storeDir`); returns the files copied per driver. */
async function copyToDriverStore(
  g: GuestSession, o: WindowsFixOptions, set: DriverDir[], storeDir: string, upload: Upload, step: Step, would: 'would_do' | 'done',
): Promise<Record<string, string[]>> {
  const copied: Record<string, string[]> = {};
  for (const d of set) {
    const to = `${storeDir}/${d.driver}`;
    if (!o.dry_run) await g.cmd('mkdir-p', to);
    for (const f of d.files) await upload(path.join(d.dir, f), `${to}/${f}`);
    copied[d.driver] = d.files;
    step('driver_store', would, `${d.driver}: ${d.files.length} file(s) (${d.files.join(', ')}) from ${d.dir} -> ${to}`, {
      driver: d.driver, dir: to, files: d.files,
    });
  }
  return copied;
}

type WindowsGuest = NonNullable<Awaited<ReturnType<typeof readWindowsGuest>>>;
/** The registry edits' two actions: back a hive up (its backup's path, when made), merge keys into it. */
interface HiveEdit {
  backup: (hive: string) => Promise<string | undefined>;
  merge: (hive: string, prefix: string, keys: RegKey[]) => Promise<void>;
}

/** 5a. Registers the copied boot drivers in the SYSTEM hive, or says why it is left as it is. */
async function registerBootDrivers(guest: WindowsGuest, bootDrivers: string[], hives: HiveEdit, step: Step, would: 'would_do' | 'done'): Promise<void> {
  const { systemHive, controlSet, driverDatabase } = guest;
  const { backup, merge } = hives;
  const keyList = (prefix: string, keys: RegKey[]) => keys.map((k) => `${prefix}\\${k.path.join('\\')} {${(k.values || []).map(describeValue).join(', ')}}`);

  if (!bootDrivers.length) step('system_hive', 'warning', 'no boot disk driver was copied; SYSTEM hive left as it is');
  else if (!systemHive || !controlSet) {
    step('system_hive', 'warning', `inspection found no ${!systemHive ? 'SYSTEM hive' : 'current control set'}; `
      + 'boot drivers copied but not registered, the guest will not boot from a virtio disk');
  } else {
    const keys = systemHiveEdits(controlSet, bootDrivers, driverDatabase);
    const bak = await backup(systemHive);
    await merge(systemHive, 'HKLM\\SYSTEM', keys);
    step('system_hive', would, `${systemHive}${bak ? ` (backup ${bak})` : ''}: ${keyList('HKLM\\SYSTEM', keys).join('; ')}`, {
      hive: systemHive, backup: bak, keys: keys.map((k) => k.path.join('\\')), driver_database: driverDatabase,
    });
  }
}

/** 5b. Adds the driver store folders to the SOFTWARE hive's DevicePath, or says why it is not extended. */
async function extendGuestDevicePath(
  guest: WindowsGuest, copied: Record<string, string[]>, hives: HiveEdit, step: Step, would: 'would_do' | 'done',
): Promise<void> {
  const { softwareHive, devicePath } = guest;
  const { backup, merge } = hives;
  const winStore = '%SystemRoot%\\Drivers\\VirtIO';
  const add = [winStore, ...Object.keys(copied).map((d) => `${winStore}\\${d}`)];
  if (!softwareHive) {
    step('software_hive', 'warning', 'inspection found no SOFTWARE hive; DevicePath not extended, Plug and Play will not find the other drivers by itself');
  } else {
    const dp = extendDevicePath(devicePath ?? '%SystemRoot%\\inf', add);
    if (!dp.added.length) step('software_hive', 'skipped', `DevicePath already lists ${add.join(';')}`);
    else {
      const keys: RegKey[] = [{ path: ['Microsoft', 'Windows', 'CurrentVersion'], values: [regValue.expandSz('DevicePath', dp.value)] }];
      const bak = await backup(softwareHive);
      await merge(softwareHive, 'HKLM\\SOFTWARE', keys);
      step('software_hive', would, `${softwareHive}${bak ? ` (backup ${bak})` : ''}: `
        + `HKLM\\SOFTWARE\\Microsoft\\Windows\\CurrentVersion DevicePath "${devicePath ?? '(absent)'}" -> "${dp.value}"`, {
        hive: softwareHive, backup: bak, device_path: dp.value,
      });
    }
  }
}

async function injectFrom(
  g: GuestSession, root: string, o: WindowsFixOptions, src: { root: string; from: string }, step: Step, would: 'would_do' | 'done',
): Promise<boolean> {
  const guest = await readWindowsGuest(g, root);
  if (!guest) { step('source', 'warning', 'inspection found no Windows systemroot; drivers not injected'); return false; }
  const { systemroot, facts } = guest;
  const set = await pickDriverSet(o, facts, src, step);
  if (!set) return false;

  if (!o.dry_run && !(await hasHivexregedit())) {
    step('registry', 'warning', `${HIVEXREGEDIT} is not installed on this host (Debian package libwin-hivex-perl); `
      + 'nothing injected, since drivers without their registry entries would not load');
    return false;
  }

  // 4. Files. case-sensitive-path finds the real spelling of existing components (System32\drivers vs Drivers).
  const ci = (p: string) => guestPathCi(g, p);
  let modified = false;
  const upload = async (from: string, to: string) => { if (!o.dry_run) { await g.cmd('upload', from, to); modified = true; } };
  const driversDir = await ci(underSystemRoot(systemroot, 'System32\\drivers'));
  const bootDrivers = await copyBootDrivers(g, set, driversDir, ci, upload, step, would);
  const storeDir = await ci(underSystemRoot(systemroot, 'Drivers\\VirtIO'));
  const copied = await copyToDriverStore(g, o, set, storeDir, upload, step, would);

  // 5. Registry.
  const backup = async (hive: string) => (o.backup && !o.dry_run ? g.backup(hive) : undefined);
  const merge = async (hive: string, prefix: string, keys: RegKey[]) => {
    if (o.dry_run) return;
    const tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'ferry-hive-'));
    try {
      const local = path.join(tmp, path.basename(hive));
      await g.cmd('download', hive, local);
      await fs.writeFile(`${local}.reg`, regFile(prefix, keys));
      await hivexregedit(local, prefix, `${local}.reg`);
      await g.cmd('upload', local, hive);
      modified = true;
    } finally { await fs.rm(tmp, { recursive: true, force: true }); }
  };
  const hives: HiveEdit = { backup, merge };
  await registerBootDrivers(guest, bootDrivers, hives, step, would);
  await extendGuestDevicePath(guest, copied, hives, step, would);
  return modified;
}
