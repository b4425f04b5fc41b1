// `npm run build`: the production build. Compiles platform/, domain/, queue/, orchestration/, services/ and scripts/cluster.ts to JavaScript
// under dist/ (tsconfig.build.json), then copies every file in those folders that is not TypeScript (the daemon's
// web/, the ferry-convert bin, and any .lua, .json or .yaml a module reads beside itself), so that dist/ with
// package.json and production dependencies runs as `node dist/services/<name>/main.js`. `--out DIR` builds
// elsewhere.
// A build writes `<out>/.ferry-build.json` last, with the hash of everything it was built from; when that hash is
// the one of the sources now, the build is current and is not done again (a test run builds dist/ once, then
// `npm start` in the cluster test and the build test reuse it: docs/testing.md). `--force` rebuilds anyway.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';

const ROOT = path.resolve(__dirname, '..');
const SOURCES = ['platform', 'domain', 'queue', 'orchestration', 'services'];
/** Data files outside SOURCES that the compiled code reads, copied to the same place under the output: the
 *  programs list (platform/programs.ts: a worker checks its capabilities' programs at start). */
const DATA = ['scripts/programs.txt'];
/** Files outside SOURCES the output depends on: the compiler's settings, the entry point, this script, the types
 *  the installed packages bring (pinned by the lock file). */
const INPUTS = ['scripts/cluster.ts', 'scripts/build.ts', 'tsconfig.json', 'tsconfig.build.json', 'package-lock.json', ...DATA];
export const BUILD_STAMP = '.ferry-build.json';

function walk(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    return e.isDirectory() ? walk(p) : [p];
  }).sort();
}

/** The hash of every file the build reads: each path and its content. */
export function buildKey(root = ROOT): string {
  const h = createHash('sha256');
  const files = [...SOURCES.flatMap((s) => walk(path.join(root, s))), ...INPUTS.map((f) => path.join(root, f))];
  for (const f of files) h.update(path.relative(root, f)).update('\0').update(readFileSync(f)).update('\0');
  return h.digest('hex');
}

/** Whether `out` holds a complete build of the sources as they are now. */
export function buildIsCurrent(out: string, key = buildKey()): boolean {
  try {
    return (JSON.parse(readFileSync(path.join(out, BUILD_STAMP), 'utf8')) as { key?: string }).key === key;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return false; // never built, or a build that did not end
    throw e;
  }
}

/** Builds into `out` unless it is current; answers whether it compiled. */
export function build(out: string, opts: { force?: boolean } = {}): boolean {
  const key = buildKey();
  if (!opts.force && buildIsCurrent(out, key)) {
    console.log(`[build] ${out}: current (built from these sources), not built again`);
    return false;
  }
  rmSync(out, { recursive: true, force: true });
  // tsc's own resolution, with the output folder overridden; errors fail the build.
  execFileSync(process.execPath, [require.resolve('typescript/bin/tsc'), '-p', path.join(ROOT, 'tsconfig.build.json'), '--outDir', out], { cwd: ROOT, stdio: 'inherit' });
  let n = 0;
  for (const src of SOURCES) {
    for (const f of walk(path.join(ROOT, src)).filter((p) => !p.endsWith('.ts'))) {
      const to = path.join(out, path.relative(ROOT, f));
      mkdirSync(path.dirname(to), { recursive: true });
      cpSync(f, to, { preserveTimestamps: true });
      n++;
    }
  }
  for (const f of DATA) {
    mkdirSync(path.dirname(path.join(out, f)), { recursive: true });
    cpSync(path.join(ROOT, f), path.join(out, f), { preserveTimestamps: true });
    n++;
  }
  // Written last: an interrupted build has no stamp, so the next one starts again from nothing.
  writeFileSync(path.join(out, BUILD_STAMP), JSON.stringify({ key, built: new Date().toISOString() }) + '\n');
  console.log(`[build] ${out}: compiled, ${n} non-TypeScript files copied`);
  return true;
}

function main(argv: string[]) {
  const i = argv.indexOf('--out');
  const out = path.resolve(i >= 0 ? argv[i + 1] : path.join(ROOT, 'dist'));
  build(out, { force: argv.includes('--force') });
}

if (require.main === module) main(process.argv.slice(2));
