// The virtio-win driver tree on the host: where it is (a directory, or an ISO image unpacked for the time of the
// injection), which version directory fits the guest, and which drivers and files it holds.
import { execFile } from 'node:child_process';
import { promises as fs, Dirent } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { statIfExists } from '../../platform/files';
import { setting } from '../../platform/settings';

export const VIRTIO_WIN_DEFAULT = '/usr/share/virtio-win';

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
  const build = f.build ? `, build ${f.build}` : '';
  const seen = `${f.productName || 'unknown product'} (${f.major ?? '?'}.${f.minor ?? '?'}${build}, ${f.variant || 'variant unknown'})`;
  if (explicit !== undefined && explicit !== '') return explicitVersionDir(String(explicit), f, seen);
  const dir = inspectedVersionDir(f);
  if (!dir) return { error: `cannot tell which virtio-win version directory fits ${seen}; set windows_version` };
  return { dir, reason: `inspection: ${seen}` };
}

/** The version directory for an explicit windows_version `key`, or why it is not one. */
function explicitVersionDir(key: string, f: WindowsFacts, seen: string): { dir: string; reason: string } | { error: string } {
  let dir = WINDOWS_VERSION_DIRS[key];
  if (!dir) return { error: `windows_version ${key} is not one of ${Object.keys(WINDOWS_VERSION_DIRS).join(', ')}` };
  // 2012 covers both 2012 (6.2) and 2012 R2 (6.3): inspection tells them apart.
  if (key === '2012' && f.major === 6 && f.minor === 3) dir = '2k12R2';
  return { dir, reason: `windows_version ${key}; inspection: ${seen}` };
}

/** The version directory that inspection's facts point to, or undefined when they do not tell. */
function inspectedVersionDir(f: WindowsFacts): string | undefined {
  const server = f.variant && f.variant !== 'unknown' ? /server/i.test(f.variant) : /server/i.test(f.productName || '');
  const name = f.productName || '';
  let dir: string | undefined;
  if (f.major === 6 && f.minor !== undefined && f.minor >= 0 && f.minor <= 3) {
    dir = (server ? ['2k8', '2k8R2', '2k12', '2k12R2'] : ['vista', 'w7', 'w8', 'w8.1'])[f.minor];
  }
  else if (f.major === 10 && server) dir = server10Dir(name, f.build);
  else if (f.major === 10) {
    // Windows 11 keeps "Windows 10" in ProductName; its build number (22000 and later) tells it apart.
    dir = /windows 11/i.test(name) || (f.build ?? 0) >= 22000 ? 'w11' : 'w10';
  }
  return dir;
}

/** The directory of a Windows Server on kernel 10: the year in its product name, else the one its build number falls in. */
function server10Dir(name: string, build: number | undefined): string | undefined {
  let dir: string | undefined;
  const m = /\b(2016|2019|2022|2025)\b/.exec(name);
  if (m) dir = `2k${m[1].slice(2)}`;
  else if (build) dir = build >= 26100 ? '2k25' : build >= 20348 ? '2k22' : build >= 17763 ? '2k19' : build >= 14393 ? '2k16' : undefined;
  return dir;
}

/** The directory actually used: `wanted` when present, else the nearest older one of the same line. */
export function pickVersionDir(available: string[], wanted: string): { dir: string; fallback: boolean } | undefined {
  const has = (d: string) => available.find((a) => a.toLowerCase() === d.toLowerCase());
  if (has(wanted)) return { dir: has(wanted)!, fallback: false };
  const line = [SERVER_DIRS, CLIENT_DIRS].find((l) => l.some((d) => d.toLowerCase() === wanted.toLowerCase()));
  if (!line) return undefined;
  for (let i = line.findIndex((d) => d.toLowerCase() === wanted.toLowerCase()) - 1; i >= 0; i--) {
    if (has(line[i])) return { dir: has(line[i])!, fallback: true };
  }
  return undefined;
}

async function entries(dir: string): Promise<Dirent[]> { return fs.readdir(dir, { withFileTypes: true }).catch(() => []); }
/** `name` in `dir` regardless of case (virtio-win trees are not consistent: 2k12R2, NetKVM, Balloon). */
export async function findCi(dir: string, name: string, kind: 'dir' | 'file'): Promise<string | undefined> {
  for (const e of await entries(dir)) {
    if (e.name.toLowerCase() !== name.toLowerCase()) continue;
    const st = await statIfExists(path.join(dir, e.name));
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
/** Every driver of the tree that has <version>/<arch>, with its regular files (sorted). A directory that resolves
 *  outside the tree (a symbolic link in it, or in an ISO image) is skipped: only the tree's own files reach a guest,
 *  and files are taken only when they are regular files themselves (no links). */
export async function driverSet(tree: string, version: string, arch: string): Promise<DriverDir[]> {
  const out: DriverDir[] = [];
  const base = await fs.realpath(tree);
  for (const e of (await entries(tree)).sort((a, b) => a.name.localeCompare(b.name))) {
    if (!e.isDirectory()) continue;
    const v = await findCi(path.join(tree, e.name), version, 'dir');
    const a = v && await findCi(path.join(tree, e.name, v), arch, 'dir');
    if (!a) continue;
    const dir = await fs.realpath(path.join(tree, e.name, v, a));
    if (!dir.startsWith(base + path.sep)) continue;
    const files = (await entries(dir)).filter((f) => f.isFile()).map((f) => f.name).sort();
    if (files.length) out.push({ driver: e.name, dir, files });
  }
  return out;
}

/** Where the driver tree may be, in order: the virtio_win config key, FERRY_VIRTIO_WIN, the default. */
export function virtioWinCandidates(configured: string | undefined, env: NodeJS.ProcessEnv = process.env): { path: string; from: string }[] {
  const c = [
    { path: configured, from: 'virtio_win' },
    { path: setting('FERRY_VIRTIO_WIN', env), from: 'FERRY_VIRTIO_WIN' },
    { path: VIRTIO_WIN_DEFAULT, from: 'default' },
  ].filter((x): x is { path: string; from: string } => !!x.path);
  return c.filter((x, i) => c.findIndex((y) => path.resolve(y.path) === path.resolve(x.path)) === i);
}

/**
 * The first candidate that is a directory, or an ISO image (virtio-win is shipped as one), which is unpacked with
 * bsdtar into a private temporary directory that `cleanup` removes. Each candidate not used says why.
 */
export async function locateVirtioWin(
  cands: { path: string; from: string }[],
): Promise<{ root?: string; from?: string; looked: string[]; cleanup?: () => Promise<void> }> {
  const looked: string[] = [];
  for (const c of cands) {
    const st = await statIfExists(c.path);
    if (st?.isDirectory()) return { root: path.resolve(c.path), from: c.from, looked };
    if (st?.isFile() && /\.iso$/i.test(c.path)) {
      const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'ferry-virtio-win-'));
      const ok = await new Promise<string | undefined>((resolve) => execFile('bsdtar', ['-xf', c.path, '-C', dir], { maxBuffer: 1 << 20 },
        (e, _o, err) => resolve(e ? (String(err).trim() || e.message) : undefined)));
      if (ok === undefined) {
        return { root: dir, from: `${c.from}, unpacked from ${path.resolve(c.path)}`, looked, cleanup: () => fs.rm(dir, { recursive: true, force: true }) };
      }
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
