// Which test files a run takes, and in what order (scripts/test.ts; docs/testing.md, "Tiers and order").
// Tiers: the whole suite (`npm test`), or the fast tier (`npm run test:fast`): every test that starts no virtual
// machine. A VM here is any qemu-system process: an emulated guest (running or paused, booted by qemu or by
// libvirtd) or libguestfs's appliance. The files of test/guest/ all boot real guests (and their describes carry
// `@vm` as well); elsewhere the describe or it that starts one carries `@vm` in its title, and the fast tier runs
// mocha with `--grep @vm --invert`. The tag is checked, not trusted: in the fast tier test/helpers/tier.hooks.ts
// fails any file that starts a qemu-system.
// Order: mocha --parallel takes the files in the order given, so the longest start first, by each file's time in
// the last runs (written by the reporter, test/helpers/file-times.cjs); a file with no time yet starts before them.
import { readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';

export type Tier = 'full' | 'fast';
/** Seconds per file (relative path), per tier: what test/helpers/file-times.cjs writes. */
export type FileTimes = Partial<Record<Tier, Record<string, number>>>;

/** The guest files: real Debian guests booted under TCG, minutes each; the whole folder is outside the fast tier. */
export const GUEST_DIR = 'test/guest/';
/** The tag a describe or it title carries when it starts a VM (mocha's grep matches the full title). */
export const VM_TAG = '@vm';
export const VM_GREP = `${VM_TAG}\\b`;

/** Every test file under test/ (`test/<folder>/**\/*.test.ts`), the guest files first, each part sorted: the order
 *  of the two patterns `npm test` gave mocha before, and the order of a run with no times. */
export function testFiles(root: string): string[] {
  const all = readdirSync(path.join(root, 'test'), { recursive: true, encoding: 'utf8' })
    .map((f) => path.posix.join('test', f.split(path.sep).join('/')))
    .filter((f) => f.endsWith('.test.ts') && f.split('/').length > 2)
    .sort();
  return [...all.filter((f) => f.startsWith(GUEST_DIR)), ...all.filter((f) => !f.startsWith(GUEST_DIR))];
}

/** Whether every top-level describe of a file's text is tagged (on its first line): none of its tests is in the
 *  fast tier, so the fast tier does not load it. A file this misjudges is still filtered by mocha's grep; only its
 *  load would be spent. */
export function allTagged(text: string): boolean {
  // The least indented describes are the top-level ones (one made in a loop is indented: test/guest/releases.test.ts).
  const all = text.split('\n').map((l) => /^(\s*)describe(\.\w+)?\(/.exec(l) && { l, depth: l.search(/\S/) }).filter((x) => !!x);
  const top = Math.min(...all.map((x) => x.depth));
  const tops = all.filter((x) => x.depth === top);
  return tops.length > 0 && tops.every((x) => x.l.includes(VM_TAG));
}

/** The files of a tier, in the default order. */
export function tierFiles(root: string, tier: Tier): string[] {
  const files = testFiles(root);
  if (tier === 'full') return files;
  return files.filter((f) => !f.startsWith(GUEST_DIR) && !allTagged(readFileSync(path.join(root, f), 'utf8')));
}

/** The files longest first by their recorded time (this tier's, else the whole suite's); files with no time keep
 *  their default order and start first (a new file may be a long one). With no times at all: the default order. */
export function orderFiles(files: string[], times: FileTimes, tier: Tier): string[] {
  const timeOf = (f: string) => times[tier]?.[f] ?? times.full?.[f];
  const unknown = files.filter((f) => timeOf(f) === undefined);
  const known = files.filter((f) => timeOf(f) !== undefined).sort((a, b) => timeOf(b)! - timeOf(a)!);
  return [...unknown, ...known];
}

/** The times file, or none when it is missing (a clean clone, an empty cache) or unreadable (then said why). */
export function readTimes(file: string): FileTimes {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as FileTimes;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') console.error(`[test] ${file}: ${(e as Error).message}; the default order is used`);
    return {};
  }
}
