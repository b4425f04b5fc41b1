// Functions that do not read in one screen: every function, method or arrow function in services/, orchestration/,
// queue/, domain/ and platform/ longer than 80 lines (its whole text, nested functions included). One over the limit must
// say why in a comment above it containing "Long because" (a table that reads best whole, a script's single pass, ...).
// `npx tsx scripts/function-length.ts` prints them all; test/deploy/function-length.test.ts fails on an unexplained
// one. The TypeScript compiler's own parser reads the files, so no function is missed or miscounted.
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import ts from 'typescript';

const ROOT = path.resolve(__dirname, '..');
export const MAX_LINES = 80;
export const AREAS = ['services', 'orchestration', 'queue', 'domain', 'platform'];
const WHY = /long because/i;

export interface LongFunction { file: string; line: number; name: string; lines: number; explained: boolean }

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return e.name === 'node_modules' ? [] : sourceFiles(p);
    return /\.ts$/.test(e.name) && !e.name.endsWith('.d.ts') ? [p] : [];
  });
}

type FunctionNode = ts.FunctionLikeDeclaration;

function isFunction(node: ts.Node): node is FunctionNode {
  return ts.isFunctionDeclaration(node) || ts.isMethodDeclaration(node) || ts.isArrowFunction(node)
    || ts.isFunctionExpression(node) || ts.isConstructorDeclaration(node) || ts.isGetAccessor(node) || ts.isSetAccessor(node);
}

/** A readable name: the declaration's own, or what it is assigned to, or the call it is passed to. */
function nameOf(node: FunctionNode, sf: ts.SourceFile): string {
  if (node.name) return node.name.getText(sf);
  const p = node.parent;
  if (ts.isVariableDeclaration(p) || ts.isPropertyAssignment(p) || ts.isPropertyDeclaration(p)) return p.name.getText(sf);
  if (ts.isCallExpression(p)) {
    const first = p.arguments[0];
    const label = first && ts.isStringLiteralLike(first) ? ` ${first.text}` : '';
    return `(passed to ${p.expression.getText(sf).slice(0, 40)}${label})`;
  }
  return '(anonymous)';
}

/** The comments above the function, or above the statement, property or call that holds it. */
function commentsAbove(node: FunctionNode, sf: ts.SourceFile): string {
  const text = sf.getFullText();
  const out: string[] = [];
  let n: ts.Node = node;
  for (;;) {
    for (const c of ts.getLeadingCommentRanges(text, n.getFullStart()) ?? []) out.push(text.slice(c.pos, c.end));
    if (ts.isStatement(n) || ts.isClassElement(n) || ts.isPropertyAssignment(n) || ts.isSourceFile(n.parent)) break;
    if (ts.isBlock(n.parent) || ts.isSourceFile(n.parent)) break;
    n = n.parent;
  }
  return out.join('\n');
}

export function longFunctionsIn(file: string, max = MAX_LINES): LongFunction[] {
  const sf = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.ES2022, true);
  const found: LongFunction[] = [];
  const visit = (node: ts.Node) => {
    if (isFunction(node) && node.body) {
      const first = sf.getLineAndCharacterOfPosition(node.getStart(sf)).line;
      const last = sf.getLineAndCharacterOfPosition(node.getEnd()).line;
      const lines = last - first + 1;
      if (lines > max) {
        found.push({ file: path.relative(ROOT, file), line: first + 1, name: nameOf(node, sf), lines, explained: WHY.test(commentsAbove(node, sf)) });
      }
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return found;
}

/** Every function over the limit in services/, queue/, domain/ and platform/, longest first. */
export function longFunctions(max = MAX_LINES): LongFunction[] {
  return AREAS.flatMap((a) => sourceFiles(path.join(ROOT, a))).flatMap((f) => longFunctionsIn(f, max)).sort((a, b) => b.lines - a.lines);
}

if (require.main === module) {
  const all = longFunctions();
  for (const f of all) console.log(`${String(f.lines).padStart(4)}  ${f.file}:${f.line}  ${f.name}${f.explained ? '  (explained)' : ''}`);
  const bare = all.filter((f) => !f.explained).length;
  console.log(`${all.length} functions over ${MAX_LINES} lines, ${bare} without a "Long because" comment`);
  process.exitCode = bare ? 1 : 0;
}
