// Storage roots (docs/security.md): every path a job names is resolved (symlinks too) and must lie inside a
// configured root: FERRY_INPUT_ROOTS for what is read, FERRY_OUTPUT_ROOTS for what is written (colon-separated).
// Defaults: the system temp directory (/tmp: the README's first job), /srv (site data; compose's volume is
// /srv/ferry) and FERRY_DATA_DIR when set. /dev, /proc, /sys and block or character devices are refused unless the root that
// holds them is itself in /dev, /proc or /sys. The gateway and daemon check at submission (400 naming the
// field), workers again right before they open anything (the job fails, not retried), on the resolved path.
// Outputs are never replaced unless the job says overwrite, except the job's own output of an earlier attempt.
import { promises as fs, realpathSync, Stats } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ApiError, OperationError } from './errors';
import { setting } from './settings';

/** input_tree: read from an input root, a directory or a regular file (a driver tree, or the ISO image holding it). */
export type PathKind = 'input' | 'input_tree' | 'output' | 'output_dir';
/** A path a job names: `field` as the API names it (parameters.output_path, image.path...). */
export interface JobPath { field: string; path: string; kind: PathKind }

export interface Roots { input: string[]; output: string[] }

const SYSTEM = ['/dev', '/proc', '/sys'];

function realOrResolved(p: string): string {
  try { return realpathSync(p); } catch { return path.resolve(p); }
}

/** The roots a setting lists (absolute paths, platform/settings.ts), or `dflt` when it lists none. */
function list(given: string[], dflt: string[]): string[] {
  return [...new Set((given.length ? given : dflt).map(realOrResolved))];
}

export function defaultRoots(env: NodeJS.ProcessEnv = process.env): string[] {
  return [os.tmpdir(), '/srv', ...(setting('FERRY_DATA_DIR', env) ? [path.resolve(setting('FERRY_DATA_DIR', env)!)] : [])];
}

export function configuredRoots(env: NodeJS.ProcessEnv = process.env): Roots {
  return {
    input: list(setting('FERRY_INPUT_ROOTS', env), defaultRoots(env)),
    output: list(setting('FERRY_OUTPUT_ROOTS', env), defaultRoots(env)),
  };
}

const inside = (p: string, root: string) => root === '/' || p === root || p.startsWith(root + '/');
const isSystem = (p: string) => SYSTEM.some((s) => inside(p, s));

/** The real path of `p`: realpath of the path itself when it exists, else of its nearest existing parent with
 *  the rest appended (an output not yet written). */
export async function resolveReal(p: string): Promise<{ real: string; stat: Stats | null }> {
  const abs = path.resolve(p);
  try {
    const real = await fs.realpath(abs);
    return { real, stat: await fs.stat(real) };
  } catch {
    const rest: string[] = [];
    let cur = abs;
    for (;;) {
      rest.unshift(path.basename(cur));
      const parent = path.dirname(cur);
      if (parent === cur) return { real: abs, stat: null };
      cur = parent;
      try {
        const real = await fs.realpath(cur);
        return { real: path.join(real, ...rest), stat: null };
      } catch { /* keep climbing */ }
    }
  }
}

/** Why `jp` may not be used (null when it may). `mustExist`: at run time an input has to be there. */
export async function refusal(jp: JobPath, roots: Roots, opts: { mustExist?: boolean } = {}): Promise<{ reason: string | null; real: string }> {
  const { real, stat } = await resolveReal(jp.path);
  const read = jp.kind === 'input' || jp.kind === 'input_tree';
  const list = read ? roots.input : roots.output;
  const root = list.find((r) => inside(real, r));
  const via = real !== path.resolve(jp.path) ? ` (resolves to ${real})` : '';
  const name = read ? 'FERRY_INPUT_ROOTS' : 'FERRY_OUTPUT_ROOTS';
  if (!root) return { real, reason: `${jp.path}${via} is outside every ${read ? 'input' : 'output'} root (${name}: ${list.join(':')})` };
  const device = !!stat && (stat.isBlockDevice() || stat.isCharacterDevice());
  if ((isSystem(real) || device) && !isSystem(root)) return { real,
    reason: `${jp.path}${via} is a device or system path (/dev, /proc, /sys); refused unless a root names it` };
  if (opts.mustExist && read && !stat) return { real, reason: `${jp.path} does not exist or cannot be read` };
  if (stat) {
    const reason = wrongKind(jp, stat, device, root, via);
    if (reason) return { real, reason };
  }
  return { real, reason: null };
}

/** Why an existing path is not of the kind `jp` needs (null when it is); a device counts as a file under a system root. */
function wrongKind(jp: JobPath, stat: Stats, device: boolean, root: string, via: string): string | null {
  const want = jp.kind === 'output_dir' ? stat.isDirectory() : jp.kind === 'input_tree' ? stat.isDirectory() || stat.isFile() : stat.isFile() ||
    (device && isSystem(root));
  if (!want) {
    return `${jp.path}${via} is not a ${jp.kind === 'output_dir' ? 'directory' : jp.kind === 'input_tree' ? 'directory or regular file' : 'regular file'}`;
  }
  return null;
}

/** At submission: 400 naming every field whose path is outside the roots this process knows. */
export async function checkSubmittedPaths(paths: JobPath[], given?: Roots) {
  if (!paths.length) return; // most operations name no path: nothing to resolve (the roots cost syscalls)
  const roots = given ?? configuredRoots();
  const bad: { field: string; message: string }[] = [];
  for (const jp of paths) {
    const r = await refusal(jp, roots);
    if (r.reason) bad.push({ field: jp.field, message: r.reason });
  }
  if (bad.length) throw new ApiError(400, bad.map((b) => `${b.field}: ${b.message}`).join('; '), { fields: bad });
}

/** On the worker, right before opening: the resolved path to use, or a failure that is not retried. */
export async function checkRunPath(jp: JobPath, roots: Roots = configuredRoots()): Promise<string> {
  const r = await refusal(jp, roots, { mustExist: true });
  if (r.reason) throw new OperationError(`${jp.field}: ${r.reason}`, false);
  return r.real;
}

/** Which output files a job wrote itself, so a retry is not refused by its own earlier output. The worker keeps
 *  their identities (outputId) with the job record. */
export interface OutputClaims {
  record(st: Stats): Promise<void>;
  owns(st: Stats): Promise<boolean>;
}

/** A file's identity: device and inode, plus size and modification time because a deleted file's inode number
 *  is soon reused by the next file created. */
export function outputId(st: Stats): string {
  return `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}`;
}

/** Refuses an existing output unless `overwrite` or it is this job's own from an earlier attempt. */
export async function checkOutputFree(out: string, field: string, overwrite: boolean, claims?: OutputClaims) {
  if (overwrite) return;
  const st = await fs.lstat(out).catch(() => null);
  if (st && !(claims && await claims.owns(st))) throw new OperationError(`${field}: output ${out} already exists (set overwrite: true to replace it)`, false);
}

/**
 * Puts a finished temporary file in place. Without `overwrite` a hard link (which never replaces an existing
 * name) makes the move atomic and refuses a file that appeared meanwhile, unless it is this job's own.
 */
export async function placeOutput(tmp: string, out: string, opts: { field: string; overwrite: boolean; claims?: OutputClaims }) {
  await opts.claims?.record(await fs.stat(tmp));
  if (opts.overwrite) return fs.rename(tmp, out);
  try {
    await fs.link(tmp, out);
    await fs.unlink(tmp);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    const cur = await fs.lstat(out);
    if (!(opts.claims && await opts.claims.owns(cur))) throw new OperationError(
      `${opts.field}: output ${out} already exists (set overwrite: true to replace it)`, false);
    await fs.rename(tmp, out);
  }
}
