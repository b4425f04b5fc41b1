// Functions that read in one screen (issue 35, item 5): ESLint bounds the line length and the complexity of every
// TypeScript file in services/, orchestration/, queue/, domain/ and platform/ (eslint.config.mjs turns BOUNDS on there, as errors).
//  - `max-len` 160: a line fits one screen beside another file. URLs and regular expression literals may run
//    longer (they cannot be broken honestly); strings, template literals and comments count: a long message is
//    split with `+`, a long comment wraps.
//  - `complexity` 20 (ESLint's default): measured on the tree at 412b81e, half of the 1,537 functions with a branch
//    have 3 or fewer, 95% have 14 or fewer, 99% 25 or fewer; 32 had more than 20, and those are the ones that read
//    as a maze (openapi's convert 49, readUserSpecs 47, the network rewrite 42, verifyLinux 36). A bound near the
//    95th percentile (15) would flag flat tables of cases that read fine (a switch of 16 answers).
// The files that broke a bound when the rules came are listed in scripts/lint-baseline.json with their count of
// errors per rule. The normal lint (`npx eslint .`) turns a rule off for a file listed with errors of that rule, so
// it stays green; test/deploy/lint-bounds.test.ts runs both rules on the three folders and fails when a file has more
// errors than its baseline, or any error and no entry, and when a file has fewer (so the baseline only shrinks:
// `node scripts/eslint-bounds.mjs --write` lowers it, and refuses to raise it).
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export const FOLDERS = ['services', 'orchestration', 'queue', 'domain', 'platform'];
export const MAX_LEN = 160;
export const MAX_COMPLEXITY = 20;
export const BOUNDS = {
  'max-len': ['error', { code: MAX_LEN, ignoreUrls: true, ignoreRegExpLiterals: true }],
  complexity: ['error', MAX_COMPLEXITY],
};
export const RULES = Object.keys(BOUNDS);
const ROOT = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
export const BASELINE_FILE = path.join(ROOT, 'scripts/lint-baseline.json');

/** {file (relative, /): {rule: count}} */
export function readBaseline(file = BASELINE_FILE) {
  return JSON.parse(fs.readFileSync(file, 'utf8'));
}

/** The flat-config entries: the bounds on for the three folders, then off, rule by rule, for the files the baseline
 *  lists with errors of that rule (the test holds those to their counts). */
export function boundsConfig(baseline = readBaseline()) {
  const files = FOLDERS.map((d) => `${d}/**/*.ts`);
  const entries = [{ files, rules: BOUNDS }];
  for (const rule of RULES) {
    const listed = Object.keys(baseline).filter((f) => (baseline[f][rule] ?? 0) > 0);
    if (listed.length) entries.push({ files: listed, rules: { [rule]: 'off' } });
  }
  return entries;
}

/** An ESLint with only the two bounds, on an untyped parser (neither rule needs types: the tree lints in seconds). */
export async function boundsEslint(root = ROOT) {
  const { ESLint } = await import('eslint');
  const tsParser = (await import('@typescript-eslint/parser')).default;
  return new ESLint({
    cwd: root, overrideConfigFile: true,
    overrideConfig: [{ files: ['**/*.ts'], languageOptions: { parser: tsParser }, rules: BOUNDS }],
  });
}

/** ESLint results -> {file: {rule: count}}, files without errors left out. A fatal (parse) error is thrown. */
export function countErrors(results, root = ROOT) {
  const counts = {};
  for (const r of results) {
    for (const m of r.messages) {
      if (m.fatal) throw new Error(`${r.filePath}: ${m.message}`);
      if (!RULES.includes(m.ruleId)) continue;
      const file = path.relative(root, r.filePath).split(path.sep).join('/');
      counts[file] ??= Object.fromEntries(RULES.map((x) => [x, 0]));
      counts[file][m.ruleId]++;
    }
  }
  return counts;
}

/** The tree's counts, from the three folders. */
export async function countTree(root = ROOT) {
  const eslint = await boundsEslint(root);
  return countErrors(await eslint.lintFiles(FOLDERS), root);
}

/** What breaks the rule "the baseline only shrinks": `grown` (more errors than the baseline, or errors in a file not
 *  in it) and `shrunk` (fewer: the baseline must follow), each a list of sentences naming file, rule and counts. */
export function compareToBaseline(baseline, counts) {
  const grown = [], shrunk = [];
  for (const file of [...new Set([...Object.keys(baseline), ...Object.keys(counts)])].sort()) {
    for (const rule of RULES) {
      const was = baseline[file]?.[rule] ?? 0, now = counts[file]?.[rule] ?? 0;
      if (now > was) {
        grown.push(`${file}: ${now} ${rule} error(s), baseline ${was}: shorten the lines or split the function into named steps` +
          ` (bounds in scripts/eslint-bounds.mjs)`);
      } else if (now < was) {
        shrunk.push(`${file}: ${now} ${rule} error(s), baseline ${was}: shrink the baseline (node scripts/eslint-bounds.mjs --write)`);
      }
    }
  }
  return { grown, shrunk };
}

/** The baseline lowered to the tree's counts (files at zero dropped); refuses when any count grew. */
export function shrunkBaseline(baseline, counts) {
  const { grown } = compareToBaseline(baseline, counts);
  if (grown.length) throw new Error(`the baseline only shrinks; fix these first:\n${grown.join('\n')}`);
  const next = {};
  for (const file of Object.keys(counts).sort()) next[file] = counts[file];
  return next;
}

// `node scripts/eslint-bounds.mjs [--write]`: prints the counts against the baseline; --write lowers the baseline.
// `--init` writes it from the tree whatever it held (used once, when the bounds came).
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const counts = await countTree();
  const arg = process.argv[2];
  if (arg === '--init' || arg === '--write') {
    const next = arg === '--init' ? counts : shrunkBaseline(readBaseline(), counts);
    const sorted = Object.fromEntries(Object.keys(next).sort().map((f) => [f, next[f]]));
    fs.writeFileSync(BASELINE_FILE, `${JSON.stringify(sorted, null, 2)}\n`);
  }
  const total = (c) => RULES.map((r) => `${r} ${Object.values(c).reduce((s, x) => s + x[r], 0)}`).join(', ');
  console.log(`tree: ${Object.keys(counts).length} files, ${total(counts)}`);
  const { grown, shrunk } = compareToBaseline(readBaseline(), counts);
  for (const line of [...grown, ...shrunk]) console.log(line);
  process.exitCode = grown.length || shrunk.length ? 1 : 0;
}
