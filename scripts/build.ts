// `npm run build`: the production build. Compiles shared/, queue/, services/ and scripts/cluster.ts to JavaScript
// under dist/ (tsconfig.build.json), then copies every file in those folders that is not TypeScript (the daemon's
// web/, the ferry-convert bin, and any .lua, .json or .yaml a module reads beside itself), so that dist/ with
// package.json and production dependencies runs as `node dist/services/<name>/main.js`. `--out DIR` builds
// elsewhere (the build test does, so that it never touches a developer's dist/).
import { execFileSync } from 'node:child_process';
import { cpSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';

const ROOT = path.resolve(__dirname, '..');
const SOURCES = ['shared', 'queue', 'services'];

function assets(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return assets(p);
    return e.name.endsWith('.ts') ? [] : [p];
  });
}

function main(argv: string[]) {
  const i = argv.indexOf('--out');
  const out = path.resolve(i >= 0 ? argv[i + 1] : path.join(ROOT, 'dist'));
  rmSync(out, { recursive: true, force: true });
  // tsc's own resolution, with the output folder overridden; errors fail the build.
  execFileSync(process.execPath, [require.resolve('typescript/bin/tsc'), '-p', path.join(ROOT, 'tsconfig.build.json'), '--outDir', out], { cwd: ROOT, stdio: 'inherit' });
  let n = 0;
  for (const src of SOURCES) {
    for (const f of assets(path.join(ROOT, src))) {
      const to = path.join(out, path.relative(ROOT, f));
      mkdirSync(path.dirname(to), { recursive: true });
      cpSync(f, to, { preserveTimestamps: true });
      n++;
    }
  }
  console.log(`[build] ${out}: compiled, ${n} non-TypeScript files copied`);
}

main(process.argv.slice(2));
