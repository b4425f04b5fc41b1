// scripts/programs.txt's table in docs/testing.md (the list read as data: platform/programs.ts).
// `npx tsx scripts/programs.ts` rewrites that table after the list changed; test/deploy/programs.test.ts checks it.
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { programList, PROGRAMS_FILE, type ProgramEntry } from '../platform/programs';

export { programList, PROGRAMS_FILE, type ProgramEntry };
const ROOT = path.resolve(__dirname, '..');
export const TESTING_DOC = path.join(ROOT, 'docs', 'testing.md');
const BEGIN = '<!-- programs: generated from scripts/programs.txt by `npx tsx scripts/programs.ts` -->';
const END = '<!-- /programs -->';

export function programsTable(list = programList()): string {
  const rows = list.map((e) => `| ${e.names.length ? e.names.map((n) => `\`${n}\``).join(', ') : `\`${e.check}\``} | ${e.package === '-' ? '(before set-up)' : `\`${e.package}\``} | ${e.group} | ${e.capabilities.join(', ')} | ${e.why} |`);
  return [BEGIN, '| program or file | Debian package | group | worker capabilities | who needs it |', '|---|---|---|---|---|', ...rows, END].join('\n');
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
