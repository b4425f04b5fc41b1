// `npm test` (the whole suite) and `npm run test:fast` (`--fast`: every test that starts no virtual machine):
// the fixture builds (scripts/fixtures.ts; not for the fast tier), the type check, the linter, the one build of
// dist/ for the run, then mocha on the tier's files, the longest first (scripts/test-order.ts). Each check runs
// only when the one before passed, and the command exits with the status of the first that failed, mocha's
// otherwise, as the `tsc && eslint && mocha` chain it replaces did.
// A machine without the Debian guests (a new one) builds them beside the checks and the fast tier, then runs the
// VM tests in a second mocha run (`--grep @vm`), and closes with both runs' counts added up: on two cores the
// fast tier's tests mostly wait (Redis, HTTP, processes), so they fill the builds' idle time instead of adding
// minutes of their own at the end (docs/testing.md, "A new machine").
// The caches live beside the fixtures (${FERRY_CACHE_DIR:-~/.cache/ferry}/suite/), one set per checkout:
//  - tsc --incremental's build info: only what a change affects is checked again;
//  - ESLint's cache (--cache), kept only while no TypeScript file, lint setting or package changed: the typed rules
//    read other files' types, which ESLint's cache does not follow, so a changed .ts lints everything again;
//  - test-times.json: each file's time per tier, written by the reporter, read here for the order.
// Test files named on the command line run instead of the tier's files
// (`npm test -- test/spine/api.test.ts test/queue/writes.test.ts`); other arguments go to mocha (then no times are
// recorded: a filtered run's times are not the file's).
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { GUEST_CACHE, missingDebianGuests } from '../test/fixtures/debian-guest';
import { build } from './build';
import { buildFixturesSaid } from './fixtures';
import { orderFiles, readTimes, tierFiles, vmFiles, VM_GREP, type Tier } from './test-order';

const ROOT = path.resolve(__dirname, '..');
const CACHE = path.join(GUEST_CACHE, 'suite');
/** One set of caches per checkout: tsc's build info and ESLint's cache name files by their paths. */
const CHECKOUT = createHash('sha256').update(ROOT).digest('hex').slice(0, 12);
export const TIMES_FILE = path.join(CACHE, 'test-times.json');
const bin = (pkg: string, file: string) => path.join(path.dirname(require.resolve(`${pkg}/package.json`)), file);

/** Runs one step with the terminal; answers its exit status (a signal counts as 1). Without blocking: the fixture
 *  builds beside it keep starting their next build. */
function step(name: string, cmd: string, args: string[], env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const c = spawn(cmd, args, { cwd: ROOT, stdio: 'inherit', env });
    c.on('error', (e) => { console.error(`[test] ${name}: ${e.message}`); resolve(1); });
    c.on('close', (code) => {
      if (!name.startsWith('mocha')) console.error(`[test] ${name}: ${code === 0 ? 'passed' : 'failed'} in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
      resolve(code ?? 1);
    });
  });
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

async function lint(): Promise<number> {
  const cache = path.join(CACHE, `eslint-${CHECKOUT}.cache`);
  const keyFile = `${cache}.key`;
  const key = typedLintKey();
  const kept = existsSync(keyFile) && readFileSync(keyFile, 'utf8') === key;
  if (!kept) { rmSync(cache, { force: true }); rmSync(keyFile, { force: true }); }
  const status = await step(`eslint (${kept ? 'cache kept: no TypeScript changed' : 'every file'})`, process.execPath,
    [bin('eslint', 'bin/eslint.js'), '--max-warnings', '0', '--cache', '--cache-strategy', 'content', '--cache-location', cache, '.']);
  if (status === 0) writeFileSync(keyFile, key); // a failed lint keeps no key: the next one lints everything
  return status;
}

/** The type check, the linter and the build of dist/, each only when the one before passed. */
async function checks(): Promise<number> {
  const tsc = await step('tsc', process.execPath, [bin('typescript', 'bin/tsc'), '--noEmit', '-p', '.', '--incremental', '--tsBuildInfoFile', path.join(CACHE, `tsc-${CHECKOUT}.tsbuildinfo`)]);
  if (tsc !== 0) return tsc;
  const eslint = await lint();
  if (eslint !== 0) return eslint;
  const t0 = Date.now();
  try {
    build(path.join(ROOT, 'dist'));
  } catch (e) {
    console.error(`[test] build: ${(e as Error).message}`);
    return 1;
  }
  console.error(`[test] build: passed in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  return 0;
}

type Counts = { passed: number; failed: number; skipped: number };
/** What a mocha run selects: its files (in the default order), the grep, the tier its times are kept under. */
type Selection = { files: string[]; grep: string[]; times: Tier | 'vm'; what: string };

const SELECT: Record<Tier | 'vm', (root: string) => Selection> = {
  full: (root) => ({ files: tierFiles(root, 'full'), grep: [], times: 'full', what: 'the whole suite' }),
  fast: (root) => ({ files: tierFiles(root, 'fast'), grep: ['--grep', VM_GREP, '--invert'], times: 'fast', what: `the fast tier: no test/guest/, no test titled ${VM_GREP}` }),
  vm: (root) => ({ files: vmFiles(root), grep: ['--grep', VM_GREP], times: 'vm', what: `the VM tests: every test titled ${VM_GREP}` }),
};

/** One mocha run, the longest files first; with `counts`, the reporter writes its counts there too. */
function mocha(sel: Selection, extra: string[], counts?: string): Promise<number> {
  const files = orderFiles(sel.files, readTimes(TIMES_FILE), sel.times);
  const env = { ...process.env, FERRY_TEST_TIER: sel.times, ...(extra.length ? {} : { FERRY_TEST_TIMES: TIMES_FILE }),
    ...(counts ? { FERRY_TEST_COUNTS: counts } : {}) };
  console.error(`[test] mocha: ${files.length} files (${sel.what}), longest first: ${files.slice(0, 3).join(', ')}${files.length > 3 ? ', ...' : ''}`);
  return step(`mocha (${sel.times})`, process.execPath, [bin('mocha', 'bin/mocha.js'), '--parallel', '--jobs', '2', ...sel.grep, ...extra, ...files], env);
}

/** A new machine's suite: the fixture builds beside the checks and then the fast tier, the VM tests after both,
 *  and one closing line with both runs' counts (a run that wrote none counts as one failure). */
async function besideBuilds(extra: string[]): Promise<number> {
  console.error(`[test] the Debian guests ${missingDebianGuests().join(', ')} are not built: they build beside the checks and the fast tier`);
  const built = buildFixturesSaid();
  const checked = await checks();
  if (checked !== 0) { await built; return checked; }
  const countsOf = (t: string) => path.join(CACHE, `counts-${CHECKOUT}-${t}.json`);
  for (const t of ['fast', 'vm']) rmSync(countsOf(t), { force: true });
  const fast = await mocha(SELECT.fast(ROOT), extra, countsOf('fast'));
  await built;
  const vm = await mocha(SELECT.vm(ROOT), extra, countsOf('vm'));
  const sum: Counts = { passed: 0, failed: 0, skipped: 0 };
  for (const t of ['fast', 'vm']) {
    const c = existsSync(countsOf(t)) ? JSON.parse(readFileSync(countsOf(t), 'utf8')) as Counts : { passed: 0, failed: 1, skipped: 0 };
    for (const k of ['passed', 'failed', 'skipped'] as const) sum[k] += c[k];
  }
  process.stdout.write(`\n${sum.passed} passed, ${sum.failed} failed, ${sum.skipped} skipped\n`);
  return fast || vm;
}

async function main(argv: string[]): Promise<number> {
  const tier: Tier = argv.includes('--fast') ? 'fast' : 'full';
  const named = argv.filter((a) => a.endsWith('.test.ts'));
  const extra = argv.filter((a) => a !== '--fast' && !named.includes(a));
  mkdirSync(CACHE, { recursive: true });
  if (tier === 'full' && !named.length && missingDebianGuests().length) return besideBuilds(extra);
  if (tier === 'full') await buildFixturesSaid();
  const checked = await checks();
  if (checked !== 0) return checked;
  const sel = SELECT[tier](ROOT);
  return mocha(named.length ? { ...sel, files: named, what: 'named' } : sel, extra);
}

if (require.main === module) void main(process.argv.slice(2)).then((status) => process.exit(status));
