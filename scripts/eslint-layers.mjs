// The layers as ESLint rules (eslint.config.mjs turns them on): imports point downward,
// services -> orchestration -> queue -> domain -> platform.
//  - `layers/downward`: a file imports only from its own layer and those below it (platform/, then domain/, queue/,
//    orchestration/, services/), and no product file imports scripts/ or test/.
//  - `layers/no-cycle`: no import cycle among the product files (services/, orchestration/, queue/, domain/,
//    platform/, scripts/), type-only imports included: a cycle of types is still two modules that cannot be read, moved or tested apart.
// Both read imports with the TypeScript compiler's own scanner (ts.preProcessFile: import, export ... from, import(),
// `typeof import()`, require) and resolve them with its module resolution and tsconfig.json's options, so an import
// resolves here to the file tsc reads. The import graph of the whole tree is built once per lint run (each file read
// again only when its size or time changed; docs/testing.md, "The linter", has what it costs).
// test/deploy/layers.test.ts plants an upward import and a cycle and checks each rule fails, and the tree passes.
import fs from 'node:fs';
import path from 'node:path';
import ts from 'typescript';

/** Lower first: a file may import its own layer and those before it. */
export const LAYERS = ['platform', 'domain', 'queue', 'orchestration', 'services'];
/** Product code, whose import cycles are refused. */
export const PRODUCT = [...LAYERS, 'scripts'];
/** Folders that product layers may never import (scripts/ and test/ may import the layers). */
const TOP = ['scripts', 'test'];

/** Per root: the compiler options the tree is checked with (the test's planted trees have no tsconfig.json: the
 *  defaults) and TypeScript's module resolution cache, dropped when a file appears or goes. */
const resolvers = new Map();
function resolverOf(root) {
  let r = resolvers.get(root);
  if (!r) {
    const file = path.join(root, 'tsconfig.json');
    const read = fs.existsSync(file) ? ts.readConfigFile(file, ts.sys.readFile) : { config: {} };
    const options = ts.parseJsonConfigFileContent(read.config ?? {}, ts.sys, root).options;
    r = { options, cache: ts.createModuleResolutionCache(root, (f) => f, options) };
    resolvers.set(root, r);
  }
  return r;
}

/** file -> { text, imports }: each file's imports are read once per text, by whichever rule asks first. */
const importsByFile = new Map();

/** The relative imports of one file's text: [{ target (absolute path of a .ts file), spec (as written), pos, end }]. */
function importsOf(file, text, root) {
  const known = importsByFile.get(file);
  if (known?.text === text && known.root === root) return known.imports;
  const { options, cache } = resolverOf(root);
  const imports = [];
  for (const ref of ts.preProcessFile(text, true, true).importedFiles) {
    if (!ref.fileName.startsWith('.')) continue; // a package: outside the layers
    const r = ts.resolveModuleName(ref.fileName, file, options, ts.sys, cache).resolvedModule;
    if (r && !r.isExternalLibraryImport) imports.push({ target: path.resolve(r.resolvedFileName), spec: ref.fileName, pos: ref.pos, end: ref.end });
  }
  importsByFile.set(file, { text, root, imports });
  return imports;
}

/** The top folder of `file` under `root` ('' when outside it). */
function areaOf(file, root) {
  const rel = path.relative(root, file);
  return rel.startsWith('..') || path.isAbsolute(rel) ? '' : rel.split(path.sep)[0];
}

function tsFiles(dir) {
  if (!fs.existsSync(dir)) return [];
  return fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return e.name === 'node_modules' ? [] : tsFiles(p);
    return e.name.endsWith('.ts') && !e.name.endsWith('.d.ts') ? [p] : [];
  });
}

/** root -> { files: Map<file, {stamp, imports}>, cycles: Map<file, Set<file>> (a file's cycle), checked } */
const graphs = new Map();
/** A lint run lints hundreds of files within seconds: the tree is looked at again only after this pause. */
const FRESH_MS = 2000;

/** The files of the import cycles among product files: each file in a cycle -> the files of its cycle. */
function cyclesOf(files) {
  // Tarjan's strongly connected components, iterative so a deep chain cannot overflow the stack.
  const index = new Map(), low = new Map(), onStack = new Set(), stack = [], out = new Map();
  let next = 0;
  for (const start of files.keys()) {
    if (index.has(start)) continue;
    const work = [[start, 0]];
    index.set(start, next); low.set(start, next); next++; stack.push(start); onStack.add(start);
    while (work.length) {
      const frame = work[work.length - 1];
      const [v, i] = frame;
      const edges = files.get(v).imports.filter((e) => files.has(e.target));
      if (i < edges.length) {
        frame[1]++;
        const w = edges[i].target;
        if (!index.has(w)) {
          index.set(w, next); low.set(w, next); next++; stack.push(w); onStack.add(w); work.push([w, 0]);
        } else if (onStack.has(w)) low.set(v, Math.min(low.get(v), index.get(w)));
        continue;
      }
      work.pop();
      if (work.length) { const u = work[work.length - 1][0]; low.set(u, Math.min(low.get(u), low.get(v))); }
      if (low.get(v) !== index.get(v)) continue;
      const scc = new Set();
      for (let w; w !== v;) { w = stack.pop(); onStack.delete(w); scc.add(w); }
      const selfImport = files.get(v).imports.some((e) => e.target === v);
      if (scc.size > 1 || selfImport) for (const f of scc) out.set(f, scc);
    }
  }
  return out;
}

/** The product import graph under `root`, brought up to date when the last look is older than FRESH_MS. */
function graphOf(root) {
  let g = graphs.get(root);
  if (g && Date.now() - g.checked < FRESH_MS) return g;
  if (!g) { g = { files: new Map(), cycles: new Map(), checked: 0 }; graphs.set(root, g); }
  const list = PRODUCT.flatMap((d) => tsFiles(path.join(root, d)));
  let changed = list.length !== g.files.size || list.some((f) => !g.files.has(f));
  if (changed) { // a file appeared or went: what resolved to nothing before may resolve now, so resolve all again
    resolvers.delete(root);
    importsByFile.clear();
    g.files = new Map();
  }
  for (const file of list) {
    const st = fs.statSync(file);
    const stamp = `${st.size}:${st.mtimeMs}`;
    if (g.files.get(file)?.stamp === stamp) continue;
    g.files.set(file, { stamp, imports: importsOf(file, fs.readFileSync(file, 'utf8'), root) });
    changed = true;
  }
  if (changed) g.cycles = cyclesOf(g.files);
  g.checked = Date.now();
  return g;
}

/** The shortest import path from `from` to `to` inside one cycle (both ends included). */
function pathWithin(g, scc, from, to) {
  const prev = new Map([[from, null]]);
  const queue = [from];
  while (queue.length) {
    const v = queue.shift();
    if (v === to) break;
    for (const { target } of g.files.get(v).imports) {
      if (scc.has(target) && !prev.has(target)) { prev.set(target, v); queue.push(target); }
    }
  }
  const out = [];
  for (let v = to; v !== null && v !== undefined; v = prev.get(v)) out.unshift(v);
  return out;
}

const rootOption = {
  type: 'array',
  items: [{ type: 'object', properties: { root: { type: 'string' } }, additionalProperties: false }],
};
/** The tree's root: the rule's `root` option (eslint.config.mjs gives its own folder, so a lint started in a
 *  subfolder checks the same layers), else ESLint's working directory. */
const rootFor = (context) => path.resolve(context.options[0]?.root ?? context.cwd);

const downward = {
  meta: {
    type: 'problem',
    docs: { description: 'imports point downward: services -> orchestration -> queue -> domain -> platform; product code never imports scripts/ or test/' },
    schema: rootOption,
    messages: { upward: '{{from}}/ may not import {{to}}/ ({{spec}}): layers point downward, services -> orchestration -> queue -> domain -> platform. Move what both need down.' },
  },
  create(context) {
    const root = rootFor(context);
    const file = path.resolve(context.filename);
    const from = areaOf(file, root);
    const level = LAYERS.indexOf(from);
    if (level < 0) return {};
    return {
      Program() {
        const text = context.sourceCode.text;
        for (const imp of importsOf(file, text, root)) {
          const to = areaOf(imp.target, root);
          if (LAYERS.indexOf(to) <= level && !TOP.includes(to)) continue;
          const loc = { start: context.sourceCode.getLocFromIndex(imp.pos), end: context.sourceCode.getLocFromIndex(imp.end) };
          context.report({ loc, messageId: 'upward', data: { from, to, spec: imp.spec } });
        }
      },
    };
  },
};

const noCycle = {
  meta: {
    type: 'problem',
    docs: { description: 'no import cycle among product files (services/, orchestration/, queue/, domain/, platform/, scripts/)' },
    schema: rootOption,
    messages: { cycle: 'import cycle: {{cycle}}. Move what the files share into a module both import.' },
  },
  create(context) {
    const root = rootFor(context);
    const file = path.resolve(context.filename);
    if (!PRODUCT.includes(areaOf(file, root))) return {};
    return {
      Program() {
        const g = graphOf(root);
        const scc = g.cycles.get(file);
        if (!scc) return;
        for (const imp of importsOf(file, context.sourceCode.text, root)) {
          if (!scc.has(imp.target)) continue;
          const cycle = [file, ...pathWithin(g, scc, imp.target, file)].map((f) => path.relative(root, f)).join(' -> ');
          const loc = { start: context.sourceCode.getLocFromIndex(imp.pos), end: context.sourceCode.getLocFromIndex(imp.end) };
          context.report({ loc, messageId: 'cycle', data: { cycle } });
        }
      },
    };
  },
};

export default { meta: { name: 'ferry-layers' }, rules: { downward, 'no-cycle': noCycle } };
