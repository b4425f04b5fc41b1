// Windows guests: virtio driver injection, the way virt-v2v does it (convert/windows_virtio.ml), inside the fix
// stage's one GuestSession. From a virtio-win tree on the host (<driver>/<version>/<arch>/files):
//   - viostor.sys and vioscsi.sys go to %SystemRoot%\System32\drivers (the boot disk driver must be there),
//   - every driver that has the chosen version/arch goes to %SystemRoot%\Drivers\VirtIO\<driver>\,
//   - SYSTEM hive: Services\viostor|vioscsi as boot-start SCSI miniports, CriticalDeviceDatabase entries for the
//     virtio PCI ids, and (Windows 8/2012 and later, whose SYSTEM hive has a DriverDatabase) the DriverDatabase
//     entries virt-v2v writes, since those Windows versions no longer read the CriticalDeviceDatabase,
//   - SOFTWARE hive: %SystemRoot%\Drivers\VirtIO (and its driver folders) appended to DevicePath so Plug and Play
//     installs the other drivers (network, balloon, serial, ...) on first boot.
// Registry values are read with guestfish's hivex-* commands. They are written on a downloaded copy of the hive
// with hivexregedit --merge and uploaded back: guestfish passes a buffer argument as a C string (strlen of argv),
// so hivex-node-set-value cannot carry a NUL byte, and every REG_SZ (UTF-16LE) and most REG_DWORDs contain one.
import { execFile } from 'node:child_process';
import { promises as fs, Dirent } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { FixAction } from './guest';
import { GuestSession } from './guestfs';

export const VIRTIO_WIN_DEFAULT = '/usr/share/virtio-win';
export const HIVEXREGEDIT = process.env.HIVEXREGEDIT || 'hivexregedit';

// ---------------------------------------------------------------------------------------------------------------
// Registry values and .reg files (pure)

export const REG = { SZ: 1, EXPAND_SZ: 2, BINARY: 3, DWORD: 4, MULTI_SZ: 7 } as const;
export interface RegValue { name: string; type: number; data: Buffer }
/** A key (path below the hive root) and the values to set on it; other values of the key are kept. */
export interface RegKey { path: string[]; values?: RegValue[] }

const utf16z = (s: string) => Buffer.from(`${s}\0`, 'utf16le');
export const regValue = {
  sz: (name: string, s: string): RegValue => ({ name, type: REG.SZ, data: utf16z(s) }),
  expandSz: (name: string, s: string): RegValue => ({ name, type: REG.EXPAND_SZ, data: utf16z(s) }),
  multiSz: (name: string, list: string[]): RegValue => ({ name, type: REG.MULTI_SZ, data: Buffer.from(`${list.map((s) => `${s}\0`).join('')}\0`, 'utf16le') }),
  dword: (name: string, n: number): RegValue => { const data = Buffer.alloc(4); data.writeUInt32LE(n >>> 0); return { name, type: REG.DWORD, data }; },
  binary: (name: string, data: Buffer): RegValue => ({ name, type: REG.BINARY, data }),
};

/** Human-readable form of a value, for report details. */
export function describeValue(v: RegValue): string {
  const name = v.name || '(default)';
  if (v.type === REG.DWORD) return `${name}=dword:${v.data.readUInt32LE(0)}`;
  if (v.type === REG.SZ || v.type === REG.EXPAND_SZ) return `${name}=${v.type === REG.SZ ? 'sz' : 'expand_sz'}:"${v.data.toString('utf16le').replace(/\0$/, '')}"`;
  if (v.type === REG.MULTI_SZ) return `${name}=multi_sz:[${v.data.toString('utf16le').split('\0').filter(Boolean).map((s) => `"${s}"`).join(',')}]`;
  return `${name}=hex(${v.type}):${v.data.toString('hex')}`;
}

/** Adds every missing ancestor key (hivexregedit --merge creates one level at a time), keeping the order. */
export function withParents(keys: RegKey[]): RegKey[] {
  const out: RegKey[] = [];
  const seen = new Set<string>();
  const id = (p: string[]) => p.join('\\').toLowerCase();
  for (const k of keys) {
    for (let i = 1; i < k.path.length; i++) {
      const p = k.path.slice(0, i);
      if (!seen.has(id(p))) { seen.add(id(p)); out.push({ path: p }); }
    }
    if (!seen.has(id(k.path))) { seen.add(id(k.path)); out.push(k); }
    else { const prev = out.find((x) => id(x.path) === id(k.path))!; prev.values = [...(prev.values || []), ...(k.values || [])]; }
  }
  return out;
}

const quoteReg = (s: string) => `"${s.replace(/\\/g, '\\\\').replace(/"/g, '\\"')}"`;
/** A regedit-format file for hivexregedit --merge; every value is written as hex(type) bytes, so nothing is re-encoded. */
export function regFile(prefix: string, keys: RegKey[]): string {
  const lines = ['Windows Registry Editor Version 5.00', ''];
  for (const k of withParents(keys)) {
    if (k.path.some((p) => !p || /[\\\]\r\n]/.test(p))) throw new Error(`invalid registry key name in ${k.path.join('\\')}`);
    lines.push(`[${prefix}\\${k.path.join('\\')}]`);
    for (const v of k.values || []) lines.push(`${v.name === '' ? '@' : quoteReg(v.name)}=hex(${v.type.toString(16)}):${[...v.data].map((b) => b.toString(16).padStart(2, '0')).join(',')}`);
    lines.push('');
  }
  return lines.join('\n');
}

/** DevicePath with `add` appended (entries already there, compared case-insensitively, are not repeated). */
export function extendDevicePath(old: string | undefined, add: string[]): { value: string; added: string[] } {
  const parts = (old || '').split(';').filter(Boolean);
  const have = new Set(parts.map((p) => p.toLowerCase()));
  const added = add.filter((a) => !have.has(a.toLowerCase()) && have.add(a.toLowerCase()));
  return { value: [...parts, ...added].join(';'), added };
}

// ---------------------------------------------------------------------------------------------------------------
// Version, architecture and driver tree (pure, or host filesystem only)

/** windows_version key -> virtio-win version directory. */
export const WINDOWS_VERSION_DIRS: Record<string, string> = { 2012: '2k12', 2016: '2k16', 2019: '2k19', 2022: '2k22', 10: 'w10', 11: 'w11' };
/** Version directories oldest first; a missing one falls back to the nearest older one of the same line. */
export const SERVER_DIRS = ['2k3', '2k8', '2k8R2', '2k12', '2k12R2', '2k16', '2k19', '2k22', '2k25'];
export const CLIENT_DIRS = ['xp', 'vista', 'w7', 'w8', 'w8.1', 'w10', 'w11'];
export const ARCH_DIRS: Record<string, string> = { x86_64: 'amd64', amd64: 'amd64', i386: 'x86', i686: 'x86', x86: 'x86', aarch64: 'ARM64', arm64: 'ARM64' };

export interface WindowsFacts {
  major?: number; minor?: number; variant?: string; productName?: string; build?: number; arch?: string;
}

/** The virtio-win version directory for a guest: an explicit windows_version wins; otherwise inspection decides. */
export function windowsVersionDir(explicit: string | number | undefined, f: WindowsFacts): { dir: string; reason: string } | { error: string } {
  const seen = `${f.productName || 'unknown product'} (${f.major ?? '?'}.${f.minor ?? '?'}${f.build ? `, build ${f.build}` : ''}, ${f.variant || 'variant unknown'})`;
  if (explicit !== undefined && explicit !== '') {
    const key = String(explicit);
    let dir = WINDOWS_VERSION_DIRS[key];
    if (!dir) return { error: `windows_version ${key} is not one of ${Object.keys(WINDOWS_VERSION_DIRS).join(', ')}` };
    // 2012 covers both 2012 (6.2) and 2012 R2 (6.3): inspection tells them apart.
    if (key === '2012' && f.major === 6 && f.minor === 3) dir = '2k12R2';
    return { dir, reason: `windows_version ${key}; inspection: ${seen}` };
  }
  const server = f.variant && f.variant !== 'unknown' ? /server/i.test(f.variant) : /server/i.test(f.productName || '');
  const name = f.productName || '';
  let dir: string | undefined;
  if (f.major === 6 && f.minor !== undefined && f.minor >= 0 && f.minor <= 3) dir = (server ? ['2k8', '2k8R2', '2k12', '2k12R2'] : ['vista', 'w7', 'w8', 'w8.1'])[f.minor];
  else if (f.major === 10 && server) {
    const m = /\b(2016|2019|2022|2025)\b/.exec(name);
    if (m) dir = `2k${m[1].slice(2)}`;
    else if (f.build) dir = f.build >= 26100 ? '2k25' : f.build >= 20348 ? '2k22' : f.build >= 17763 ? '2k19' : f.build >= 14393 ? '2k16' : undefined;
  } else if (f.major === 10) {
    // Windows 11 keeps "Windows 10" in ProductName; its build number (22000 and later) tells it apart.
    dir = /windows 11/i.test(name) || (f.build ?? 0) >= 22000 ? 'w11' : 'w10';
  }
  if (!dir) return { error: `cannot tell which virtio-win version directory fits ${seen}; set windows_version` };
  return { dir, reason: `inspection: ${seen}` };
}

/** The directory actually used: `wanted` when present, else the nearest older one of the same line. */
export function pickVersionDir(available: string[], wanted: string): { dir: string; fallback: boolean } | undefined {
  const has = (d: string) => available.find((a) => a.toLowerCase() === d.toLowerCase());
  if (has(wanted)) return { dir: has(wanted)!, fallback: false };
  const line = [SERVER_DIRS, CLIENT_DIRS].find((l) => l.some((d) => d.toLowerCase() === wanted.toLowerCase()));
  if (!line) return undefined;
  for (let i = line.findIndex((d) => d.toLowerCase() === wanted.toLowerCase()) - 1; i >= 0; i--) if (has(line[i])) return { dir: has(line[i])!, fallback: true };
  return undefined;
}

async function entries(dir: string): Promise<Dirent[]> { return fs.readdir(dir, { withFileTypes: true }).catch(() => []); }
/** `name` in `dir` regardless of case (virtio-win trees are not consistent: 2k12R2, NetKVM, Balloon). */
export async function findCi(dir: string, name: string, kind: 'dir' | 'file'): Promise<string | undefined> {
  for (const e of await entries(dir)) {
    if (e.name.toLowerCase() !== name.toLowerCase()) continue;
    const st = await fs.stat(path.join(dir, e.name)).catch(() => undefined);
    if (st && (kind === 'dir' ? st.isDirectory() : st.isFile())) return e.name;
  }
  return undefined;
}

/** Version directories that `driver` has for `arch` in the tree. */
export async function driverVersions(tree: string, driver: string, arch: string): Promise<string[]> {
  const d = await findCi(tree, driver, 'dir');
  if (!d) return [];
  const out: string[] = [];
  for (const v of await entries(path.join(tree, d))) if (await findCi(path.join(tree, d, v.name), arch, 'dir')) out.push(v.name);
  return out;
}

export interface DriverDir { driver: string; dir: string; files: string[] }
/** Every driver of the tree that has <version>/<arch>, with its regular files (sorted). */
export async function driverSet(tree: string, version: string, arch: string): Promise<DriverDir[]> {
  const out: DriverDir[] = [];
  for (const e of (await entries(tree)).sort((a, b) => a.name.localeCompare(b.name))) {
    if (!e.isDirectory()) continue;
    const v = await findCi(path.join(tree, e.name), version, 'dir');
    const a = v && await findCi(path.join(tree, e.name, v), arch, 'dir');
    if (!a) continue;
    const dir = path.join(tree, e.name, v!, a);
    const files = (await entries(dir)).filter((f) => f.isFile()).map((f) => f.name).sort();
    if (files.length) out.push({ driver: e.name, dir, files });
  }
  return out;
}

/** Where the driver tree may be, in order: the virtio_win config key, FERRY_VIRTIO_WIN, the default. */
export function virtioWinCandidates(configured: string | undefined, env: NodeJS.ProcessEnv = process.env): { path: string; from: string }[] {
  const c = [
    { path: configured, from: 'virtio_win' }, { path: env.FERRY_VIRTIO_WIN, from: 'FERRY_VIRTIO_WIN' }, { path: VIRTIO_WIN_DEFAULT, from: 'default' },
  ].filter((x): x is { path: string; from: string } => !!x.path);
  return c.filter((x, i) => c.findIndex((y) => path.resolve(y.path) === path.resolve(x.path)) === i);
}

/**
 * The first candidate that is a directory, or an ISO image (virtio-win is shipped as one), which is unpacked with
 * bsdtar into a private temporary directory that `cleanup` removes. Each candidate not used says why.
 */
export async function locateVirtioWin(cands: { path: string; from: string }[]): Promise<{ root?: string; from?: string; looked: string[]; cleanup?: () => Promise<void> }> {
  const looked: string[] = [];
  for (const c of cands) {
    const st = await fs.stat(c.path).catch(() => undefined);
    if (st?.isDirectory()) return { root: path.resolve(c.path), from: c.from, looked };
    if (st?.isFile() && /\.iso$/i.test(c.path)) {
      const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'ferry-virtio-win-'));
      const ok = await new Promise<string | undefined>((resolve) => execFile('bsdtar', ['-xf', c.path, '-C', dir], { maxBuffer: 1 << 20 }, (e, _o, err) => resolve(e ? (String(err).trim() || e.message) : undefined)));
      if (ok === undefined) return { root: dir, from: `${c.from}, unpacked from ${path.resolve(c.path)}`, looked, cleanup: () => fs.rm(dir, { recursive: true, force: true }) };
      await fs.rm(dir, { recursive: true, force: true });
      looked.push(`${c.path} (${c.from}: an ISO image bsdtar could not unpack: ${ok.split('\n')[0]})`);
      continue;
    }
    looked.push(`${c.path} (${c.from}: ${!st ? 'does not exist' : 'neither a directory nor an .iso image'})`);
  }
  return { looked };
}

/** A guest path below the systemroot from a Windows-style relative path ("System32\\drivers"). */
export function underSystemRoot(systemroot: string, winPath: string): string {
  return path.posix.join(systemroot, ...winPath.split(/[\\/]+/).filter(Boolean));
}

// ---------------------------------------------------------------------------------------------------------------
// Registry edits (pure)

export const SCSI_CLASS_GUID = '{4D36E97B-E325-11CE-BFC1-08002BE10318}';
/** Legacy and modern (virtio 1.0) PCI ids of the two boot disk drivers. */
export const BOOT_DRIVERS: Record<string, string[]> = {
  viostor: ['VEN_1AF4&DEV_1001&SUBSYS_00021AF4&REV_00', 'VEN_1AF4&DEV_1042&SUBSYS_11001AF4&REV_01'],
  vioscsi: ['VEN_1AF4&DEV_1004&SUBSYS_00081AF4&REV_00', 'VEN_1AF4&DEV_1048&SUBSYS_11001AF4&REV_01'],
};
// Version of a DriverDatabase package entry, as virt-v2v writes it (needed by Windows-Kernel-Pnp on 10/2016).
const DDB_VERSION = Buffer.concat([Buffer.from([0x00, 0xff, 0x09, 0x00, 0, 0, 0, 0, 0x7b, 0xe9, 0x36, 0x4d, 0x25, 0xe3, 0xce, 0x11, 0xbf, 0xc1, 0x08, 0x00, 0x2b, 0xe1, 0x03, 0x18]), Buffer.alloc(24)]);

/** SYSTEM hive edits that make `drivers` (viostor/vioscsi) load at boot and bind to the virtio disk. */
export function systemHiveEdits(controlSet: string, drivers: string[], driverDatabase: boolean): RegKey[] {
  const keys: RegKey[] = [];
  for (const drv of drivers) {
    keys.push({ path: [controlSet, 'Services', drv], values: [
      regValue.dword('Type', 1), regValue.dword('Start', 0), regValue.dword('ErrorControl', 1),
      regValue.sz('Group', 'SCSI miniport'), regValue.expandSz('ImagePath', `system32\\drivers\\${drv}.sys`),
    ] });
    for (const id of BOOT_DRIVERS[drv]) {
      keys.push({ path: [controlSet, 'Control', 'CriticalDeviceDatabase', `pci#${id.toLowerCase()}`], values: [regValue.sz('Service', drv), regValue.sz('ClassGUID', SCSI_CLASS_GUID)] });
    }
    if (driverDatabase) {
      const inf = `ferry-${drv}.inf`;
      const label = `${inf}_tmp`;
      const conf = `ferry_${drv}_conf`;
      keys.push({ path: ['DriverDatabase', 'DriverInfFiles', inf], values: [regValue.multiSz('', [label]), regValue.sz('Active', label), regValue.multiSz('Configurations', [conf])] });
      keys.push({ path: ['DriverDatabase', 'DriverPackages', label], values: [regValue.binary('Version', DDB_VERSION)] });
      keys.push({ path: ['DriverDatabase', 'DriverPackages', label, 'Configurations', conf], values: [regValue.dword('ConfigFlags', 0), regValue.sz('Service', drv)] });
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

/** Read-only navigation of a hive with guestfish's hivex-* commands (one hivex handle per session). */
export class HiveReader {
  constructor(private g: GuestSession) {}
  async open(hive: string): Promise<string> { await this.g.cmd('hivex-open', hive); return one(await this.g.cmd('hivex-root')); }
  async close(): Promise<void> { await this.g.tryCmd('hivex-close'); }
  /** The node at `names` below `from`, or undefined. */
  async node(from: string, names: string[]): Promise<string | undefined> {
    let n = from;
    for (const name of names) {
      n = one(await this.g.cmd('hivex-node-get-child', n, name));
      if (!n || n === '0') return undefined;
    }
    return n;
  }
  async value(node: string, key: string): Promise<{ handle: string; type: number } | undefined> {
    const v = one(await this.g.cmd('hivex-node-get-value', node, key));
    if (!v || v === '0') return undefined;
    return { handle: v, type: Number(one(await this.g.cmd('hivex-value-type', v))) };
  }
  /** A REG_SZ / REG_EXPAND_SZ value as text (guestfish prints a newline after it). */
  async string(node: string, key: string): Promise<string | undefined> {
    const v = await this.value(node, key);
    if (!v) return undefined;
    const out = await this.g.cmd('hivex-value-utf8', v.handle);
    return out.endsWith('\n') ? out.slice(0, -1) : out;
  }
}

async function hivexregedit(hive: string, prefix: string, reg: string): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    execFile(HIVEXREGEDIT, ['--merge', '--prefix', prefix, hive, reg], (e, _out, err) => {
      if (!e) return resolve();
      reject(new Error((e as any).code === 'ENOENT' ? `${HIVEXREGEDIT} is not installed (Debian package libwin-hivex-perl)` : `hivexregedit --merge failed: ${String(err).trim() || e.message}`));
    });
  });
}

async function hasHivexregedit(): Promise<boolean> {
  return new Promise((resolve) => execFile(HIVEXREGEDIT, ['--help'], (e) => resolve(!e || (e as any).code !== 'ENOENT')));
}

export interface WindowsFixOptions { dry_run: boolean; backup: boolean; windows_version?: string; virtio_win?: string; env?: NodeJS.ProcessEnv }

/**
 * Injects the virtio drivers into the inspected, mounted Windows guest `root`. Every step is reported through
 * `act` (action "inject_virtio_drivers", with a `step` field). Returns true when the guest was modified.
 */
export async function injectVirtioDrivers(g: GuestSession, root: string, o: WindowsFixOptions, act: (a: FixAction) => void): Promise<boolean> {
  const A = 'inject_virtio_drivers';
  const would = o.dry_run ? 'would_do' : 'done';
  const step = (s: string, status: FixAction['status'], detail: string, extra: Record<string, unknown> = {}) => act({ action: A, step: s, status, detail, ...extra });

  // 1. The driver tree (an ISO is unpacked for the time of the injection).
  const src = await locateVirtioWin(virtioWinCandidates(o.virtio_win, o.env));
  if (!src.root) {
    step('source', 'warning', `no virtio-win driver tree found (looked in ${src.looked.join('; ')}); Windows ${o.windows_version || 'version unknown'} drivers not injected`, { looked: src.looked });
    return false;
  }
  try {
    return await injectFrom(g, root, o, { root: src.root, from: src.from! }, step, would);
  } finally { await src.cleanup?.(); }
}

async function injectFrom(g: GuestSession, root: string, o: WindowsFixOptions, src: { root: string; from: string }, step: (s: string, status: FixAction['status'], detail: string, extra?: Record<string, unknown>) => void, would: 'would_do' | 'done'): Promise<boolean> {
  // 2. What the guest is.
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
  if (!systemroot) { step('source', 'warning', 'inspection found no Windows systemroot; drivers not injected'); return false; }
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

  // 3. Which version/arch directory.
  const ver = windowsVersionDir(o.windows_version, facts);
  if ('error' in ver) { step('version', 'warning', `${ver.error}; drivers not injected`); return false; }
  const arch = facts.arch && ARCH_DIRS[facts.arch];
  if (!arch) { step('version', 'warning', `guest architecture ${facts.arch || 'unknown'} has no virtio-win directory; drivers not injected`); return false; }
  const available = await driverVersions(src.root, 'viostor', arch);
  const picked = pickVersionDir(available, ver.dir);
  if (!picked) {
    step('version', 'warning', `${src.root} has no viostor driver for ${ver.dir}/${arch} or an older version of that line (it has: ${available.join(', ') || 'none'}); drivers not injected`);
    return false;
  }
  const set = await driverSet(src.root, picked.dir, arch);
  const versionDetail = `${picked.dir}/${arch} from ${src.root} (${src.from}); ${ver.reason}`;
  if (picked.fallback) step('version', 'warning', `${ver.dir}/${arch} is not in ${src.root}; using the nearest older ${picked.dir}/${arch} (${ver.reason})`, { wanted: ver.dir, version_dir: picked.dir, arch });
  else step('version', 'done', versionDetail, { version_dir: picked.dir, arch, source: src.root });
  const missing = ['viostor', 'vioscsi'].filter((d) => !set.some((s) => s.driver.toLowerCase() === d));
  if (missing.length) step('version', 'warning', `${missing.join(', ')} not available for ${picked.dir}/${arch}`);

  if (!o.dry_run && !(await hasHivexregedit())) {
    step('registry', 'warning', `${HIVEXREGEDIT} is not installed on this host (Debian package libwin-hivex-perl); nothing injected, since drivers without their registry entries would not load`);
    return false;
  }

  // 4. Files. case-sensitive-path finds the real spelling of existing components (System32\drivers vs Drivers).
  const ci = (p: string) => guestPathCi(g, p);
  let modified = false;
  const upload = async (from: string, to: string) => { if (!o.dry_run) { await g.cmd('upload', from, to); modified = true; } };
  const driversDir = await ci(underSystemRoot(systemroot, 'System32\\drivers'));
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
  const storeDir = await ci(underSystemRoot(systemroot, 'Drivers\\VirtIO'));
  const copied: Record<string, string[]> = {};
  for (const d of set) {
    const to = `${storeDir}/${d.driver}`;
    if (!o.dry_run) await g.cmd('mkdir-p', to);
    for (const f of d.files) await upload(path.join(d.dir, f), `${to}/${f}`);
    copied[d.driver] = d.files;
    step('driver_store', would, `${d.driver}: ${d.files.length} file(s) (${d.files.join(', ')}) from ${d.dir} -> ${to}`, { driver: d.driver, dir: to, files: d.files });
  }

  // 5. Registry.
  const backup = async (hive: string) => {
    if (!o.backup || o.dry_run) return undefined;
    const to = `${hive}.ferry-backup`;
    await g.cmd('cp-a', hive, to);
    return to;
  };
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
  const keyList = (prefix: string, keys: RegKey[]) => keys.map((k) => `${prefix}\\${k.path.join('\\')} {${(k.values || []).map(describeValue).join(', ')}}`);

  if (!bootDrivers.length) step('system_hive', 'warning', 'no boot disk driver was copied; SYSTEM hive left as it is');
  else if (!systemHive || !controlSet) step('system_hive', 'warning', `inspection found no ${!systemHive ? 'SYSTEM hive' : 'current control set'}; boot drivers copied but not registered, the guest will not boot from a virtio disk`);
  else {
    const keys = systemHiveEdits(controlSet, bootDrivers, driverDatabase);
    const bak = await backup(systemHive);
    await merge(systemHive, 'HKLM\\SYSTEM', keys);
    step('system_hive', would, `${systemHive}${bak ? ` (backup ${bak})` : ''}: ${keyList('HKLM\\SYSTEM', keys).join('; ')}`, { hive: systemHive, backup: bak, keys: keys.map((k) => k.path.join('\\')), driver_database: driverDatabase });
  }

  const winStore = '%SystemRoot%\\Drivers\\VirtIO';
  const add = [winStore, ...Object.keys(copied).map((d) => `${winStore}\\${d}`)];
  if (!softwareHive) step('software_hive', 'warning', 'inspection found no SOFTWARE hive; DevicePath not extended, Plug and Play will not find the other drivers by itself');
  else {
    const dp = extendDevicePath(devicePath ?? '%SystemRoot%\\inf', add);
    if (!dp.added.length) step('software_hive', 'skipped', `DevicePath already lists ${add.join(';')}`);
    else {
      const keys: RegKey[] = [{ path: ['Microsoft', 'Windows', 'CurrentVersion'], values: [regValue.expandSz('DevicePath', dp.value)] }];
      const bak = await backup(softwareHive);
      await merge(softwareHive, 'HKLM\\SOFTWARE', keys);
      step('software_hive', would, `${softwareHive}${bak ? ` (backup ${bak})` : ''}: HKLM\\SOFTWARE\\Microsoft\\Windows\\CurrentVersion DevicePath "${devicePath ?? '(absent)'}" -> "${dp.value}"`, { hive: softwareHive, backup: bak, device_path: dp.value });
    }
  }
  return modified;
}
