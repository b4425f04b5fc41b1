// A mocha root hook (loaded by .mocharc.json): every node process of the suite (this one and every child, through
// NODE_OPTIONS) and every bash script (through BASH_ENV) records the programs it runs; after the last test the
// record is checked against scripts/programs.txt, so a program the set-up would not install on a fresh machine
// fails the run by name (issue 17: dnsmasq was missing and only a hand-installed machine passed).
import { mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { unlisted } from './programs';

const RECORDER = path.join(__dirname, 'record-programs.cjs');
const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-programs-'));
export const PROGRAM_LOG = process.env.FERRY_PROGRAM_LOG ||= path.join(dir, 'programs.log');
process.env.NODE_OPTIONS = [process.env.NODE_OPTIONS, `--require ${JSON.stringify(RECORDER)}`].filter(Boolean).join(' ');
process.env.BASH_ENV ||= path.join(__dirname, 'record-programs.bash');
// This process records too: the recorder patches child_process in place (a CommonJS preload, loaded as such).
// eslint-disable-next-line @typescript-eslint/no-require-imports -- a path computed at run time, loaded for its side effect
require(RECORDER);

export function recordedPrograms(): string[] {
  try { return readFileSync(PROGRAM_LOG, 'utf8').split('\n').filter(Boolean); } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return []; // nothing was spawned
    throw e;
  }
}

export const mochaHooks = {
  afterAll() {
    const missing = unlisted(recordedPrograms());
    if (missing.length) {
      throw new Error(`the suite ran programs that scripts/programs.txt does not list, so scripts/setup.sh would not install them on a fresh machine: ${missing.join(', ')}`);
    }
  },
};
