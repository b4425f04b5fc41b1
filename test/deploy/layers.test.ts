// Issue 35, item 1: layers are rules. ESLint (scripts/eslint-layers.mjs, turned on in eslint.config.mjs) fails on an
// upward import (each layer of platform -> domain -> queue -> orchestration -> services into one above it; product
// -> scripts or test) and on an import cycle
// among product files. These tests plant each in a temporary tree and run the rules through ESLint, then hold the
// repository's own tree to them.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { ESLint, type Linter } from 'eslint';

const ROOT = path.resolve(__dirname, '../..');
const PLUGIN = path.join(ROOT, 'scripts/eslint-layers.mjs');

/** ESLint with only the layer rules. The rules read a file's text with the TypeScript scanner, never ESLint's
 *  syntax tree, so ESLint is handed a parser that answers an empty program: the tree lints in seconds, not the
 *  minute the TypeScript parser takes on a busy machine. */
async function layerLint(root: string, files: string[]): Promise<{ file: string; line: number; rule: string | null; message: string }[]> {
  const layers = ((await import(PLUGIN)) as { default: ESLint.Plugin }).default;
  const textOnly: Linter.Parser = {
    parse: (text: string) => ({ type: 'Program', body: [], sourceType: 'module', range: [0, text.length], loc: { start: { line: 1, column: 0 }, end: { line: 1, column: 0 } }, tokens: [], comments: [] }),
  };
  const eslint = new ESLint({
    cwd: root, overrideConfigFile: true,
    overrideConfig: [{ files: ['**/*.ts'], languageOptions: { parser: textOnly }, plugins: { layers },
      rules: { 'layers/downward': ['error', { root }], 'layers/no-cycle': ['error', { root }] } }],
  });
  const results = await eslint.lintFiles(files);
  return results.flatMap((r) => r.messages.map((m) => ({ file: path.relative(root, r.filePath), line: m.line, rule: m.ruleId, message: m.message })));
}

/** A temporary tree of files ({relative path: text}); answers its root. */
function plant(files: Record<string, string>): string {
  const root = mkdtempSync(path.join(os.tmpdir(), 'ferry-layers-'));
  for (const [rel, text] of Object.entries(files)) {
    mkdirSync(path.dirname(path.join(root, rel)), { recursive: true });
    writeFileSync(path.join(root, rel), text);
  }
  return root;
}

describe('layers as rules (scripts/eslint-layers.mjs)', function () {
  this.timeout(120_000);
  const roots: string[] = [];
  const planted = (files: Record<string, string>) => { const r = plant(files); roots.push(r); return r; };
  after(() => { for (const r of roots) rmSync(r, { recursive: true, force: true }); });

  it('fails on an upward import, in each form an import is written, and passes the downward ones', async () => {
    const root = planted({
      'platform/low.ts': "export const low = 1;\n",
      'domain/rule.ts': "import { low } from '../platform/low';\nexport const rule = low;\n",
      'queue/mid.ts': "import { low } from '../platform/low';\nimport { rule } from '../domain/rule';\nexport const mid = low + rule;\n",
      'orchestration/runner.ts': "import { mid } from '../queue/mid';\nexport const runner = mid;\n",
      'queue/up-orchestration.ts': "import { runner } from '../orchestration/runner';\nexport const r = runner;\n",
      'services/top.ts': "import { mid } from '../queue/mid';\nimport { low } from '../platform/low';\nexport const top = mid + low;\n",
      'platform/up-domain.ts': "import { rule } from '../domain/rule';\nexport const r = rule;\n",
      'domain/up-type.ts': "import type { mid } from '../queue/mid';\nexport type M = typeof mid;\n",
      'platform/up-reexport.ts': "export * from '../services/top';\n",
      'queue/up-dynamic.ts': "export const load = () => import('../services/top');\n",
      'domain/up-test.ts': "import { helper } from '../test/helper';\nexport const h = helper;\n",
      'test/helper.ts': "import { top } from '../services/top';\nexport const helper = top;\n",
    });
    const found = await layerLint(root, ['.']);
    expect(found.map((f) => [f.file, f.line, f.rule])).to.have.deep.members([
      ['platform/up-domain.ts', 1, 'layers/downward'],
      ['queue/up-orchestration.ts', 1, 'layers/downward'],
      ['domain/up-type.ts', 1, 'layers/downward'],
      ['platform/up-reexport.ts', 1, 'layers/downward'],
      ['queue/up-dynamic.ts', 1, 'layers/downward'],
      ['domain/up-test.ts', 1, 'layers/downward'],
    ]);
    expect(found.find((f) => f.file === 'domain/up-type.ts')?.message).to.equal(
      "domain/ may not import queue/ (../queue/mid): layers point downward, services -> orchestration -> queue -> domain -> platform. Move what both need down.");
    expect(found.find((f) => f.file === 'platform/up-domain.ts')?.message).to.include('platform/ may not import domain/ (../domain/rule)');
    expect(found.find((f) => f.file === 'queue/up-dynamic.ts')?.message).to.include('queue/ may not import services/ (../services/top)');
  });

  it('fails on an import cycle (type-only imports too) on every file in it, naming the cycle, and not on a file that only imports into it', async () => {
    const root = planted({
      'queue/a.ts': "import { b } from './b';\nexport const a = () => b();\n",
      'queue/b.ts': "import { c } from '../queue/c';\nexport const b = () => c;\n",
      'queue/c.ts': "// a comment first\nimport type { a } from './a';\nexport const c: typeof a | null = null;\n",
      'services/user.ts': "import { a } from '../queue/a';\nexport const user = a;\n",
      'scripts/self.ts': "export const self = 1;\nexport * from './self';\n",
    });
    const found = await layerLint(root, ['.']);
    expect(found.map((f) => [f.file, f.line, f.rule])).to.have.deep.members([
      ['queue/a.ts', 1, 'layers/no-cycle'],
      ['queue/b.ts', 1, 'layers/no-cycle'],
      ['queue/c.ts', 2, 'layers/no-cycle'],
      ['scripts/self.ts', 2, 'layers/no-cycle'],
    ]);
    expect(found.find((f) => f.file === 'queue/a.ts')?.message).to.equal(
      'import cycle: queue/a.ts -> queue/b.ts -> queue/c.ts -> queue/a.ts. Move what the files share into a module both import.');
  });

  it('eslint.config.mjs turns both rules on, as errors, for every TypeScript file', async () => {
    const eslint = new ESLint({ cwd: ROOT });
    for (const file of ['platform/config.ts', 'orchestration/plans.ts', 'services/daemon/app.ts', 'scripts/test.ts']) {
      const config = (await eslint.calculateConfigForFile(path.join(ROOT, file))) as Linter.Config;
      expect(config.rules?.['layers/downward'], file).to.deep.equal([2, { root: ROOT }]);
      expect(config.rules?.['layers/no-cycle'], file).to.deep.equal([2, { root: ROOT }]);
    }
  });

  it('the tree passes: no upward import and no import cycle among services/, orchestration/, queue/, domain/, platform/ and scripts/', async () => {
    expect(await layerLint(ROOT, ['services', 'orchestration', 'queue', 'domain', 'platform', 'scripts'])).to.deep.equal([]);
  });
});
