// Which test files a run takes, and in what order (scripts/test.ts; docs/testing.md, "Tiers and order").
// Tiers: the whole suite (`npm test`), or the fast tier (`npm run test:fast`): every test that starts no virtual
// machine. A VM here is any qemu-system process: an emulated guest (running or paused, booted by qemu or by
// libvirtd) or libguestfs's appliance. The files of test/guest/ all boot real guests (and their describes carry
// `@vm` as well); elsewhere the describe or it that starts one carries `@vm` in its title, and the fast tier runs
// mocha with `--grep @vm --invert`. The tag is checked, not trusted: in the fast tier test/helpers/tier.hooks.ts
// fails any file that starts a qemu-system.
// Order: mocha --parallel takes the files in the order given, so the longest start first, by each file's time in
// the last runs (written by the reporter, test/helpers/file-times.cjs); a file with no time yet starts before them.
// A file that holds reused proofs is timed by the larger of its last time and its proofs' fresh time (their records):
// after a run that reused them its last time is seconds, and the next run may run them fresh (a converter change).
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

/** The files longest first by their recorded time (this tier's, else the whole suite's; for a file with proofs, the
 *  larger of that and `fresh`, their time when they run fresh); files with no time keep their default order and
 *  start first (a new file may be a long one). With no times at all: the default order. */
export function orderFiles(files: string[], times: FileTimes, tier: Tier, fresh: Record<string, number> = {}): string[] {
  const timeOf = (f: string) => {
    const t = times[tier]?.[f] ?? times.full?.[f];
    return t === undefined ? undefined : Math.max(t, fresh[f] ?? 0);
  };
  const unknown = files.filter((f) => timeOf(f) === undefined);
  const known = files.filter((f) => timeOf(f) !== undefined).sort((a, b) => timeOf(b)! - timeOf(a)!);
  return [...unknown, ...known];
}

/** Each test file's time when its proofs run fresh (test/helpers/proofs.ts): the `seconds` of each proof's latest
 *  record, summed over the proofs whose inputs hold the file. A file with proofs takes seconds when they are reused
 *  and is among the longest when they run fresh; timed by this, it starts early either way (a reused one ends at
 *  once), so a run after a reuse does not leave its longest fresh proofs to the end. */
export function proofTimes(dir: string): Record<string, number> {
  let names: string[];
  try { names = readdirSync(dir).filter((f) => f.endsWith('.json')); } catch (e) {
    // No records yet (a clean cache): the order is the times file's alone.
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') console.error(`[test] ${dir}: ${(e as Error).message}; the proofs' times are left out of the order`);
    return {};
  }
  const latest = new Map<string, { at: string; seconds: number; files: string[] }>();
  for (const n of names) {
    try {
      const r = JSON.parse(readFileSync(path.join(dir, n), 'utf8')) as { name: string; at: string; seconds: number; inputs: { files: Record<string, string> } };
      const prev = latest.get(r.name);
      if (!prev || prev.at < r.at) latest.set(r.name, { at: r.at, seconds: r.seconds, files: Object.keys(r.inputs.files).filter((f) => f.endsWith('.test.ts')) });
    } catch (e) {
      console.error(`[test] proof record ${n}: ${(e as Error).message}; its time is left out of the order`);
    }
  }
  const out: Record<string, number> = {};
  for (const r of latest.values()) for (const f of r.files) out[f] = (out[f] ?? 0) + r.seconds;
  return out;
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
