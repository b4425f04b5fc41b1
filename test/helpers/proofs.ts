// Reused proofs (issue 32 items 1 and 2): a heavy test (a conversion and an emulated boot of Ferry's output, minutes
// under TCG) whose every input is unchanged re-asserts the evidence its last passing run stored, with the same check
// function, instead of converting and booting again. The key is what the proof depends on:
// - every file the code under test loads: the import closure (the TypeScript compiler's own import scanner,
//   preProcessFile, on relative .ts/.js/.json imports and require() calls) of the test file and of every program it
//   starts, found as the repository paths its code names ('services/converter/ferry-convert.js' in the helpers,
//   './cli.ts' in that stub), and the non-code files it reads at run time (a path literal naming a repository file,
//   or a folder named by path.join/resolve(__dirname, ...): every file in it, e.g. scripts/guest-image, the fixture
//   scripts);
// - package-lock.json (every npm package's exact version), the Node version;
// - the versions of qemu, its firmware (SeaBIOS, OVMF, iPXE), libguestfs and supermin, libvirt, nbdkit, the host
//   kernel (uname -r) and the kernels supermin builds the appliance from (/boot/vmlinuz-*);
// - what the test adds (`extra`): the fixture's own key and its disks as they are.
// A record is written only when the fresh run's check passed; FERRY_FRESH_PROOFS=1 ignores every record (and writes
// new ones). Each outcome is logged to FERRY_PROOF_LOG, which test/helpers/proofs.hooks.ts prints as a summary
// before the run's closing line, so nobody mistakes a reuse for a fresh boot.
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { appendFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import ts from 'typescript';
import { errorText } from '../../platform/errors';

export const ROOT = path.resolve(__dirname, '..', '..');
const CACHE = process.env.FERRY_CACHE_DIR || path.join(os.homedir(), '.cache', 'ferry');
/** Where records live: beside the fixtures, outside the clone (so every checkout of the same inputs shares them). */
export const proofDir = () => process.env.FERRY_PROOF_DIR || path.join(CACHE, 'proofs');

/** Reads a file's bytes; the key's tests pass one that overrides some files' content. */
export type Reader = (file: string) => Buffer;
const realRead: Reader = (f) => readFileSync(f);

/** The .gitignore's outputs (logs, kept serial logs, builds): written by runs, never read as inputs. */
function isOutput(rel: string): boolean {
  return /^(node_modules|dist|\.data|\.git|test\/artifacts)(\/|$)/.test(rel) || rel.endsWith('.log');
}
const inRepo = (abs: string) => {
  const rel = path.relative(ROOT, abs);
  return !rel.startsWith('..') && !path.isAbsolute(rel) && rel !== '' && !isOutput(rel);
};
const isFile = (p: string) => { try { return statSync(p).isFile(); } catch { return false; } };
const isDir = (p: string) => { try { return statSync(p).isDirectory(); } catch { return false; } };
const CODE = /\.(ts|js|cjs|mjs)$/;

/** A relative import resolved as Node and tsx do: the file, or it with .ts/.js/.json, or its index. */
function resolveImport(from: string, spec: string): string | undefined {
  const base = path.resolve(path.dirname(from), spec);
  const tries = [base, ...['.ts', '.js', '.cjs', '.json'].map((e) => base + e), ...['index.ts', 'index.js'].map((i) => path.join(base, i))];
  return tries.find(isFile);
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((d) => {
    const p = path.join(dir, d.name);
    if (!inRepo(p)) return [];
    return d.isDirectory() ? filesUnder(p) : d.isFile() ? [p] : [];
  });
}

const LITERAL = /'([^'\n\\$]{1,200})'|"([^"\n\\$]{1,200})"|`([^`\n\\$]{1,200})`/g;
const JOIN = /path\.(?:join|resolve)\(\s*(\w+)((?:\s*,\s*(?:'[^'\n]*'|"[^"\n]*"))+)\s*\)/g;

/** The repository files a file's code names by path: a literal that is a file (relative to the file or to the
 *  repository), and what path.join/resolve(<base>, '...', ...) names from __dirname (or, for another base such as a
 *  ROOT constant, from the file's folder or the repository's root): that file, or every file in that folder. The
 *  folder holding the file itself (`path.resolve(__dirname, '..', '..')`: the repository's root) is a base, not a
 *  read. */
function namedFiles(file: string, text: string): string[] {
  const found = new Set<string>();
  for (const m of text.matchAll(LITERAL)) {
    const s = m[1] ?? m[2] ?? m[3];
    if (!s.includes('/') && !/\.\w+$/.test(s)) continue;
    for (const p of [path.resolve(path.dirname(file), s), path.resolve(ROOT, s)]) if (inRepo(p) && isFile(p)) found.add(p);
  }
  for (const m of text.matchAll(JOIN)) {
    const parts = [...m[2].matchAll(/'([^'\n]*)'|"([^"\n]*)"/g)].map((a) => a[1] ?? a[2]);
    const bases = m[1] === '__dirname' ? [path.dirname(file)] : [path.dirname(file), ROOT];
    for (const p of bases.map((b) => path.resolve(b, ...parts))) {
      if (!inRepo(p)) continue;
      if (isFile(p)) found.add(p);
      else if (isDir(p) && path.relative(p, file).startsWith('..')) filesUnder(p).forEach((f) => found.add(f));
    }
  }
  return [...found];
}

/** A file's imports and named files, by its path and content (the key's tests compute many keys). */
const depsMemo = new Map<string, string[]>();
function depsOf(file: string, text: string): string[] {
  const memo = `${file}\0${createHash('sha256').update(text).digest('hex')}`;
  let deps = depsMemo.get(memo);
  if (!deps) {
    const imports = ts.preProcessFile(text, true, true).importedFiles.map((i) => i.fileName).filter((s) => s.startsWith('.'));
    deps = [...imports.map((spec) => resolveImport(file, spec)).filter((r): r is string => !!r && inRepo(r)), ...namedFiles(file, text)];
    depsMemo.set(memo, deps);
  }
  return deps;
}

/** Every repository file that `entries` load or read, by the rules above, sorted. */
export function closure(entries: string[], read: Reader = realRead): string[] {
  const seen = new Set<string>();
  const todo = entries.map((e) => path.resolve(ROOT, e));
  while (todo.length) {
    const f = todo.pop()!;
    if (seen.has(f)) continue;
    seen.add(f);
    if (!CODE.test(f)) continue;
    todo.push(...depsOf(f, read(f).toString('utf8')));
  }
  return [...seen].sort();
}

/** The Debian packages a heavy proof's result can depend on (an absent one is keyed as absent): qemu and its
 *  firmware, libguestfs and its tools (virt-sysprep, virt-customize), libvirt, the simulator's source and compiler, Redis. */
const PACKAGES = ['qemu-system-x86', 'qemu-system-data', 'qemu-utils', 'seabios', 'ipxe-qemu', 'ovmf', 'libguestfs0', 'libguestfs-tools',
  'supermin', 'linux-image-amd64', 'libvirt-daemon-system', 'libvirt0', 'nbdkit', 'initramfs-tools-core', 'busybox-static',
  'golang-github-vmware-govmomi-dev', 'golang-go', 'redis-server', 'guestfs-tools', 'openssl',
  // one proof connects through sshd and counts its logins; one drives the dashboard in Chromium
  'openssh-server', 'openssh-client', 'chromium'];
let toolsMemo: Record<string, string> | undefined;

/** qemu, firmware, libguestfs, libvirt and kernel versions on this host (once per process). */
export function toolVersions(): Record<string, string> {
  if (toolsMemo) return toolsMemo;
  const q = spawnSync('dpkg-query', ['-W', '-f', '${Package}=${Version}\n', ...PACKAGES], { encoding: 'utf8' });
  const got = new Map(q.stdout.split('\n').filter(Boolean).map((l) => l.split('=', 2) as [string, string]));
  const t: Record<string, string> = Object.fromEntries(PACKAGES.map((p) => [p, got.get(p) || 'absent']));
  t.kernel = os.release();
  // supermin builds the libguestfs appliance from the newest of these kernels.
  t.appliance_kernels = readdirSync('/boot').filter((f) => f.startsWith('vmlinuz-')).sort()
    .map((f) => `${f}:${statSync(path.join('/boot', f)).size}`).join(',');
  t.node = process.version;
  return (toolsMemo = t);
}

export interface ProofSpec {
  /** The proof's name, unique in the suite (the record's file name). */
  name: string;
  /** The test file (`__filename`) and any program it starts that its code does not name by path. */
  entries: string[];
  /** What the test adds to the key: the fixture's key and its disks as they are. */
  extra?: Record<string, unknown>;
}
export interface ProofInputs { files: Record<string, string>; tools: Record<string, string>; extra: Record<string, unknown> }

/** The proof's key and the inputs it hashes (file contents through `read`, so a test can change one in memory). */
export function proofKey(spec: ProofSpec, read: Reader = realRead, tools = toolVersions()): { key: string; inputs: ProofInputs } {
  const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
  const files = [...closure(spec.entries, read), path.join(ROOT, 'package-lock.json')];
  const inputs: ProofInputs = { files: Object.fromEntries(files.map((f) => [path.relative(ROOT, f), sha(read(f))])), tools, extra: spec.extra ?? {} };
  return { key: sha(Buffer.from(JSON.stringify(inputs))).slice(0, 20), inputs };
}

/** The commit the proof ran at, marked when the work tree had uncommitted changes to tracked files. */
export function currentCommit(): string {
  try {
    const head = execFileSync('git', ['-C', ROOT, 'rev-parse', '--short=12', 'HEAD'], { encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['-C', ROOT, 'status', '--porcelain', '--untracked-files=no'], { encoding: 'utf8' }).trim();
    return dirty ? `${head}+uncommitted` : head;
  } catch (e) { return `unknown (${errorText(e).split('\n')[0]})`; }
}

export interface ProofRecord<E> { name: string; key: string; commit: string; at: string; seconds: number; inputs: ProofInputs; evidence: E }
export type ProofOutcome = 'reused' | 'fresh';
/** One line of FERRY_PROOF_LOG. */
export interface ProofLogLine { name: string; outcome: ProofOutcome | 'fresh (forced)'; commit: string; at: string; seconds: number }

function logOutcome(line: ProofLogLine) {
  const log = process.env.FERRY_PROOF_LOG;
  if (log) appendFileSync(log, `${JSON.stringify(line)}\n`);
}

function readRecord<E>(file: string): ProofRecord<E> | undefined {
  if (!existsSync(file)) return undefined;
  try { return JSON.parse(readFileSync(file, 'utf8')) as ProofRecord<E>; } catch (e) {
    console.error(`      proof ${path.basename(file)} unreadable (${errorText(e)}): running it again`);
    return undefined;
  }
}

/** Checks `check` on the stored evidence of `spec` when a record of the same key exists (and FERRY_FRESH_PROOFS is
 *  not 1), else runs `produce` and checks its evidence, recording it when the check passed. A stored evidence that
 *  fails the check is removed and the proof runs fresh at once. Says which it did. */
export async function reusedProof<E>(spec: ProofSpec, produce: () => Promise<E>, check: (e: E) => void | Promise<void>): Promise<ProofOutcome> {
  const { key, inputs } = proofKey(spec);
  const file = path.join(proofDir(), `${spec.name}-${key}.json`);
  const forced = process.env.FERRY_FRESH_PROOFS === '1';
  const kept = forced ? undefined : readRecord<E>(file);
  if (kept) {
    try {
      await check(kept.evidence);
      console.log(`      proof ${spec.name}: REUSED, the record of ${kept.at} at commit ${kept.commit} (its run took ${kept.seconds.toFixed(0)} s; key ${key}) checked`);
      logOutcome({ name: spec.name, outcome: 'reused', commit: kept.commit, at: kept.at, seconds: kept.seconds });
      return 'reused';
    } catch (e) {
      console.error(`      proof ${spec.name}: the record fails the checks (${errorText(e).split('\n')[0]}): running it again`);
      rmSync(file, { force: true });
    }
  }
  const started = Date.now();
  const evidence = await produce();
  await check(evidence);
  const record: ProofRecord<E> = { name: spec.name, key, commit: currentCommit(), at: new Date().toISOString(), seconds: (Date.now() - started) / 1000, inputs, evidence };
  mkdirSync(proofDir(), { recursive: true });
  writeFileSync(`${file}.tmp`, JSON.stringify(record));
  renameSync(`${file}.tmp`, file);
  console.log(`      proof ${spec.name}: run fresh${forced ? ' (FERRY_FRESH_PROOFS=1)' : ''} in ${record.seconds.toFixed(0)} s, checked, recorded (key ${key})`);
  logOutcome({ name: spec.name, outcome: forced ? 'fresh (forced)' : 'fresh', commit: record.commit, at: record.at, seconds: record.seconds });
  return 'fresh';
}

/** A fixture's part of a key: its own key (the name of its cache folder, which hashes its build scripts) and each of
 *  its disks as it is now (size and modification time: a disk rebuilt or changed after the record is proved again). */
export function fixtureInputs(...disks: (string | undefined)[]): Record<string, unknown> {
  const present = disks.filter((d): d is string => !!d);
  return {
    fixture: path.basename(path.dirname(present[0])),
    disks: present.map((d) => { const st = statSync(d); return [path.basename(d), st.size, st.mtimeMs]; }),
  };
}

/** The whole serial console of a report's test boot (evidence: the boot's temp folder is gone after the run). */
export function consoleOf(report: { test_boot?: { console_log?: string } } | undefined): string {
  const log = report?.test_boot?.console_log;
  return log && existsSync(log) ? readFileSync(log, 'latin1') : '';
}

/** Files of an output read back in an open read-only appliance session: each one's content, or null when it is not
 *  a file (the check then says which is missing, as the read itself would have). */
export async function readBack(s: { isFile(p: string): Promise<boolean>; read(p: string): Promise<string> }, files: string[]): Promise<Record<string, string | null>> {
  const r: Record<string, string | null> = {};
  for (const f of files) r[f] = (await s.isFile(f)) ? await s.read(f) : null;
  return r;
}
