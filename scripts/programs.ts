// scripts/programs.txt as data (the one list of programs Ferry needs), and its table in docs/testing.md.
// `npx tsx scripts/programs.ts` rewrites that table after the list changed; test/deploy/programs.test.ts checks it.
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

const ROOT = path.resolve(__dirname, '..');
export const PROGRAMS_FILE = path.join(ROOT, 'scripts', 'programs.txt');
export const TESTING_DOC = path.join(ROOT, 'docs', 'testing.md');
const BEGIN = '<!-- programs: generated from scripts/programs.txt by `npx tsx scripts/programs.ts` -->';
const END = '<!-- /programs -->';

export interface ProgramEntry { check: string; names: string[]; package: string; group: string; why: string }

export function programList(file = PROGRAMS_FILE): ProgramEntry[] {
  return readFileSync(file, 'utf8').split('\n').filter((l) => l.trim() && !l.trimStart().startsWith('#')).map((line) => {
    const [check, pkg, group, ...why] = line.trim().split(/\s+/);
    return { check, names: check.startsWith('/') ? [] : check.split(','), package: pkg, group, why: why.join(' ') };
  });
}

export function programsTable(list = programList()): string {
  const rows = list.map((e) => `| ${e.names.length ? e.names.map((n) => `\`${n}\``).join(', ') : `\`${e.check}\``} | ${e.package === '-' ? '(before set-up)' : `\`${e.package}\``} | ${e.group} | ${e.why} |`);
  return [BEGIN, '| program or file | Debian package | group | who needs it |', '|---|---|---|---|', ...rows, END].join('\n');
}

/** docs/testing.md's table as it stands (undefined when the markers are missing). */
export function documentedTable(doc = readFileSync(TESTING_DOC, 'utf8')): string | undefined {
  const a = doc.indexOf(BEGIN), b = doc.indexOf(END);
  return a < 0 || b < a ? undefined : doc.slice(a, b + END.length);
}

if (require.main === module) {
  const doc = readFileSync(TESTING_DOC, 'utf8');
  const old = documentedTable(doc);
  if (!old) throw new Error(`${TESTING_DOC} has no ${BEGIN} ... ${END} block to rewrite`);
  writeFileSync(TESTING_DOC, doc.replace(old, programsTable()));
  console.log(`rewrote the programs table in ${path.relative(ROOT, TESTING_DOC)}`);
}
