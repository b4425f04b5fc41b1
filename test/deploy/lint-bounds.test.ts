// Issue 35, item 5: functions that read in one screen for real. ESLint bounds line length (160) and complexity (20)
// in services/, queue/, domain/ and platform/ (scripts/eslint-bounds.mjs, turned on in eslint.config.mjs); the files that broke
// a bound when the rules came are in scripts/lint-baseline.json with their counts, and that baseline only shrinks.
// These tests plant an offender (no file written in the tree), then hold the tree to the baseline.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { expect } from 'chai';
import type { ESLint, Linter } from 'eslint';

const ROOT = path.resolve(__dirname, '../..');

type Counts = Record<string, Record<string, number>>;
interface Bounds {
  MAX_LEN: number; MAX_COMPLEXITY: number; RULES: string[];
  readBaseline(): Counts;
  boundsEslint(root?: string): Promise<ESLint>;
  countErrors(results: ESLint.LintResult[], root?: string): Counts;
  countTree(root?: string): Promise<Counts>;
  compareToBaseline(baseline: Counts, counts: Counts): { grown: string[]; shrunk: string[] };
  shrunkBaseline(baseline: Counts, counts: Counts): Counts;
}
const load = async () => (await import(path.join(ROOT, 'scripts/eslint-bounds.mjs'))) as Bounds;

/** A function whose complexity is `n` (one for the function, one per `if`). */
const complexFunction = (n: number) =>
  `export function maze(x: number): number {\n${Array.from({ length: n - 1 }, (_, i) => `  if (x === ${i}) return ${i};`).join('\n')}\n  return -1;\n}\n`;

describe('line length and complexity bounds (scripts/eslint-bounds.mjs, scripts/lint-baseline.json)', function () {
  this.timeout(300_000);

  it('a planted file under services/ with a 200-character line and a function of complexity 30 fails, naming both rules', async () => {
    const b = await load();
    const eslint = await b.boundsEslint();
    const text = `export const long = '${'x'.repeat(200 - 23)}';\n${complexFunction(30)}`;
    expect(text.split('\n')[0]).to.have.length(200);
    const filePath = path.join(ROOT, 'services/planted-offender.ts');
    const results = await eslint.lintText(text, { filePath });
    expect(results[0].messages.map((m) => [m.ruleId, m.line])).to.deep.equal([['max-len', 1], ['complexity', 2]]);
    expect(results[0].messages[1].message).to.include('complexity of 30. Maximum allowed is 20');
    const { grown, shrunk } = b.compareToBaseline(b.readBaseline(), { ...b.readBaseline(), ...b.countErrors(results) });
    expect(grown).to.deep.equal([
      'services/planted-offender.ts: 1 max-len error(s), baseline 0: shorten the lines or split the function into named steps (bounds in scripts/eslint-bounds.mjs)',
      'services/planted-offender.ts: 1 complexity error(s), baseline 0: shorten the lines or split the function into named steps (bounds in scripts/eslint-bounds.mjs)',
    ]);
    expect(shrunk).to.deep.equal([]);
  });

  it('at the bounds passes: a 160-character line, a function of complexity 20, a long URL', async () => {
    const b = await load();
    const eslint = await b.boundsEslint();
    const text = `export const fits = '${'x'.repeat(160 - 23)}';\n// https://example.com/${'a'.repeat(200)}\n${complexFunction(20)}`;
    expect(text.split('\n')[0]).to.have.length(160);
    const results = await eslint.lintText(text, { filePath: path.join(ROOT, 'domain/planted-fits.ts') });
    expect(results[0].messages).to.deep.equal([]);
  });

  it('a baselined file with one more maze fails; one with fewer errors fails asking to shrink the baseline', async () => {
    // The tree's baseline is empty (every function within both bounds since stop 51), so the rule is checked on a
    // baseline given here: a real file listed with one maze, linted with two planted.
    const b = await load();
    expect(b.readBaseline(), 'the tree\'s baseline (scripts/lint-baseline.json)').to.deep.equal({});
    const file = 'domain/converter/network.ts';
    const rule = 'complexity';
    const baseline: Counts = { [file]: { 'max-len': 0, [rule]: 1 } };
    const eslint = await b.boundsEslint();
    const mazes = `${complexFunction(30).replace('maze', 'plantedMaze')}\n${complexFunction(25).replace('maze', 'secondMaze')}`;
    const text = `${readFileSync(path.join(ROOT, file), 'utf8')}\n${mazes}`;
    const counts = b.countErrors(await eslint.lintText(text, { filePath: path.join(ROOT, file) }));
    expect(counts).to.deep.equal({ [file]: { 'max-len': 0, [rule]: 2 } });
    expect(b.compareToBaseline(baseline, counts).grown).to.deep.equal([
      `${file}: 2 ${rule} error(s), baseline 1: shorten the lines or split the function into named steps (bounds in scripts/eslint-bounds.mjs)`,
    ]);
    const fewer: Counts = {};
    expect(b.compareToBaseline(baseline, fewer)).to.deep.equal({ grown: [], shrunk: [
      `${file}: 0 ${rule} error(s), baseline 1: shrink the baseline (node scripts/eslint-bounds.mjs --write)`,
    ] });
    expect(b.shrunkBaseline(baseline, fewer)).to.deep.equal({});
    expect(() => b.shrunkBaseline(baseline, counts)).to.throw('the baseline only shrinks');
  });

  it('eslint.config.mjs bounds every file of the three folders, and turns a rule off only where the baseline holds its errors', async () => {
    const b = await load();
    const { ESLint: Eslint } = await import('eslint');
    const eslint = new Eslint({ cwd: ROOT });
    const baseline = b.readBaseline();
    const rule = async (file: string, name: string) =>
      ((await eslint.calculateConfigForFile(path.join(ROOT, file))) as Linter.Config).rules?.[name];
    for (const file of ['services/planted.ts', 'queue/planted.ts', 'domain/x/planted.ts', 'platform/planted.ts']) {
      expect(await rule(file, 'max-len'), file).to.deep.equal([2, { code: 160, ignoreUrls: true, ignoreRegExpLiterals: true }]);
      expect(await rule(file, 'complexity'), file).to.deep.equal([2, 20]);
    }
    expect(await rule('scripts/planted.ts', 'max-len')).to.equal(undefined);
    for (const [file, counts] of Object.entries(baseline)) {
      for (const name of b.RULES) {
        const severity = ((await rule(file, name)) as unknown[])[0];
        expect(severity, `${file} ${name}`).to.equal(counts[name] > 0 ? 0 : 2);
      }
    }
  });

  it('the tree holds to the baseline: no file with more errors of either rule, none new, and none fewer than listed', async () => {
    const b = await load();
    const { grown, shrunk } = b.compareToBaseline(b.readBaseline(), await b.countTree());
    expect(grown, 'files over the bounds').to.deep.equal([]);
    expect(shrunk, 'the baseline is to shrink').to.deep.equal([]);
  });
});
