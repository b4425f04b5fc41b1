// `npm test` (the whole suite) and `npm run test:fast` (`--fast`: every test that starts no virtual machine):
// the type check, the linter, the one build of dist/ for the run, then mocha on the tier's files, the longest
// first (scripts/test-order.ts). Each step runs only when the one before passed, and the command exits with the
// status of the first that failed, mocha's otherwise, as the `tsc && eslint && mocha` chain it replaces did.
// The caches live beside the fixtures (${FERRY_CACHE_DIR:-~/.cache/ferry}/suite/), one set per checkout:
//  - tsc --incremental's build info: only what a change affects is checked again;
//  - ESLint's cache (--cache), kept only while no TypeScript file, lint setting or package changed: the typed rules
//    read other files' types, which ESLint's cache does not follow, so a changed .ts lints everything again;
//  - test-times.json: each file's time per tier, written by the reporter, read here for the order.
// Test files named on the command line run instead of the tier's files
// (`npm test -- test/spine/api.test.ts test/queue/writes.test.ts`); other arguments go to mocha (then no times are
// recorded: a filtered run's times are not the file's).
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { GUEST_CACHE } from '../test/fixtures/debian-guest';
import { build } from './build';
import { orderFiles, proofTimes, readTimes, tierFiles, VM_GREP, type Tier } from './test-order';
import { proofDir } from '../test/helpers/proofs';

const ROOT = path.resolve(__dirname, '..');
const CACHE = path.join(GUEST_CACHE, 'suite');
/** One set of caches per checkout: tsc's build info and ESLint's cache name files by their paths. */
const CHECKOUT = createHash('sha256').update(ROOT).digest('hex').slice(0, 12);
export const TIMES_FILE = path.join(CACHE, 'test-times.json');
const bin = (pkg: string, file: string) => path.join(path.dirname(require.resolve(`${pkg}/package.json`)), file);

/** Runs one step with the terminal; answers its exit status (a signal counts as 1). */
function step(name: string, cmd: string, args: string[], env: NodeJS.ProcessEnv = process.env): number {
  const t0 = Date.now();
  const r = spawnSync(cmd, args, { cwd: ROOT, stdio: 'inherit', env });
  if (r.error) { console.error(`[test] ${name}: ${r.error.message}`); return 1; }
  if (name !== 'mocha') console.error(`[test] ${name}: ${r.status === 0 ? 'passed' : 'failed'} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  return r.status ?? 1;
}

function walkTs(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return e.name === 'node_modules' || e.name === 'artifacts' ? [] : walkTs(p);
    return e.name.endsWith('.ts') ? [p] : [];
  }).sort();
}

/** What the typed lint of any file may depend on: every TypeScript file tsconfig.json includes, the settings (the
 *  layer rules' own file among them: they read other files' imports too) and the lock file. */
function typedLintKey(): string {
  const h = createHash('sha256');
  const files = [...['platform', 'domain', 'queue', 'orchestration', 'services', 'scripts', 'test'].flatMap((d) => walkTs(path.join(ROOT, d))),
    ...['tsconfig.json', 'eslint.config.mjs', 'scripts/eslint-layers.mjs', 'scripts/eslint-bounds.mjs',
      'scripts/lint-baseline.json', 'package-lock.json'].map((f) => path.join(ROOT, f))];
  for (const f of files) h.update(path.relative(ROOT, f)).update('\0').update(readFileSync(f)).update('\0');
  return h.digest('hex');
}

function lint(): number {
  const cache = path.join(CACHE, `eslint-${CHECKOUT}.cache`);
  const keyFile = `${cache}.key`;
  const key = typedLintKey();
  const kept = existsSync(keyFile) && readFileSync(keyFile, 'utf8') === key;
  if (!kept) { rmSync(cache, { force: true }); rmSync(keyFile, { force: true }); }
  const status = step(`eslint (${kept ? 'cache kept: no TypeScript changed' : 'every file'})`, process.execPath,
    [bin('eslint', 'bin/eslint.js'), '--max-warnings', '0', '--cache', '--cache-strategy', 'content', '--cache-location', cache, '.']);
  if (status === 0) writeFileSync(keyFile, key); // a failed lint keeps no key: the next one lints everything
  return status;
}

/** `named`: test files named on the command line, run instead of the tier's (still in the order of their times). */
function mocha(tier: Tier, named: string[], extra: string[]): number {
  const files = orderFiles(named.length ? named : tierFiles(ROOT, tier), readTimes(TIMES_FILE), tier, proofTimes(proofDir()));
  const grep = tier === 'fast' ? ['--grep', VM_GREP, '--invert'] : [];
  const env = { ...process.env, FERRY_TEST_TIER: tier, ...(extra.length ? {} : { FERRY_TEST_TIMES: TIMES_FILE }) };
  const what = named.length ? 'named' : tier === 'fast' ? `the fast tier: no test/guest/, no test titled ${VM_GREP}` : 'the whole suite';
  console.error(`[test] mocha: ${files.length} files (${what}), longest first: ${files.slice(0, 3).join(', ')}${files.length > 3 ? ', ...' : ''}`);
  return step('mocha', process.execPath, [bin('mocha', 'bin/mocha.js'), '--parallel', '--jobs', '2', ...grep, ...extra, ...files], env);
}

function main(argv: string[]): number {
  const tier: Tier = argv.includes('--fast') ? 'fast' : 'full';
  const named = argv.filter((a) => a.endsWith('.test.ts'));
  const extra = argv.filter((a) => a !== '--fast' && !named.includes(a));
  mkdirSync(CACHE, { recursive: true });
  const tsc = step('tsc', process.execPath, [bin('typescript', 'bin/tsc'), '--noEmit', '-p', '.', '--incremental', '--tsBuildInfoFile', path.join(CACHE, `tsc-${CHECKOUT}.tsbuildinfo`)]);
  if (tsc !== 0) return tsc;
  const eslint = lint();
  if (eslint !== 0) return eslint;
  const t0 = Date.now();
  try {
    build(path.join(ROOT, 'dist'));
  } catch (e) {
    console.error(`[test] build: ${(e as Error).message}`);
    return 1;
  }
  console.error(`[test] build: passed in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  return mocha(tier, named, extra);
}

if (require.main === module) process.exit(main(process.argv.slice(2)));
