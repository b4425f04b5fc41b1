// The contracts' references stay true: every Lua header or comment, and every TypeScript comment, in queue/,
// orchestration/, services/, domain/, platform/, scripts/ and test/ that names a file of this repository (queue/bus.ts, docs/queue.md,
// test/queue/commands.test.ts) or a Lua command (transitionJob-13.lua, createJob-14) names one that exists.
import { expect } from 'chai';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

const ROOT = path.resolve(__dirname, '..', '..');
const DIRS = ['queue', 'orchestration', 'services', 'domain', 'platform', 'scripts', 'test'];
const FILE = /(?<![\w./-])((?:queue|orchestration|domain|platform|services|test|docs|scripts|deploy)\/[\w./-]*\w\.(?:ts|lua|md|js|ya?ml|json|sh))\b/g;
const COMMAND = /(?<![\w/.-])([a-z][A-Za-z]*(?:Job|Event|Lease|Output)-\d+)(?:\.lua)?\b/g;

function walk(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) return e.name === 'node_modules' || e.name === 'vendor' ? [] : walk(p);
    return /\.(ts|lua)$/.test(e.name) ? [p] : [];
  });
}

/** The comment text of each line: Lua `--` comments and `--[[ ]]` headers; TypeScript `//` and block comments. */
function comments(file: string): [number, string][] {
  const lua = file.endsWith('.lua');
  const out: [number, string][] = [];
  let inBlock = false;
  readFileSync(file, 'utf8').split('\n').forEach((line, i) => {
    if (inBlock) {
      out.push([i + 1, line]);
      if (lua ? line.includes(']]') : line.includes('*/')) inBlock = false;
      return;
    }
    const open = lua ? line.indexOf('--[[') : line.search(/(^|\s)\/\*/);
    if (open >= 0) {
      out.push([i + 1, line.slice(open)]);
      inBlock = lua ? !line.includes(']]', open) : !line.includes('*/', open);
      return;
    }
    const m = lua ? /--(.*)$/.exec(line) : /(?:^|\s)\/\/(.*)$/.exec(line);
    if (m) out.push([i + 1, m[1]]);
  });
  return out;
}

describe('references in comments and Lua headers', () => {
  const commands = new Set(readdirSync(path.join(ROOT, 'queue', 'commands')).filter((f) => f.endsWith('.lua')).map((f) => f.slice(0, -4)));
  const files = DIRS.flatMap((d) => walk(path.join(ROOT, d)));

  it('name only files and Lua commands that exist', () => {
    const stale: string[] = [];
    for (const f of files) {
      for (const [n, text] of comments(f)) {
        for (const m of text.matchAll(FILE)) if (!existsSync(path.join(ROOT, m[1]))) stale.push(`${path.relative(ROOT, f)}:${n}: ${m[1]}`);
        for (const m of text.matchAll(COMMAND)) if (!commands.has(m[1])) stale.push(`${path.relative(ROOT, f)}:${n}: command ${m[1]}`);
      }
    }
    expect(stale).to.deep.equal([]);
  });

  it('would see a stale one (the scan reads headers and comments)', () => {
    const header = comments(path.join(ROOT, 'queue', 'commands', 'transitionJob-13.lua')).map(([, t]) => t).join('\n');
    expect([...header.matchAll(FILE)].map((m) => m[1])).to.include('queue/store.ts');
    expect([...'// see transitionJob-14.lua and queue/bus-messages.ts'.matchAll(COMMAND)].map((m) => m[1])).to.deep.equal(['transitionJob-14']);
    expect([...'// see queue/bus-messages.ts'.matchAll(FILE)].map((m) => m[1])).to.deep.equal(['queue/bus-messages.ts']);
  });
});
