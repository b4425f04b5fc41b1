// A mocha root hook (loaded by .mocharc.json): every node process of the suite (this one and every child, through
// NODE_OPTIONS) and every bash script (through BASH_ENV) records the programs it runs; after the last test the
// record is checked against scripts/programs.txt, so a program the set-up would not install on a fresh machine
// fails the run by name (issue 17: dnsmasq was missing and only a hand-installed machine passed).
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { unlisted } from './programs';

const RECORDER = path.join(__dirname, 'record-programs.cjs');
/** The record's folder, made by the first process that loads this file (mocha's own); the processes below it inherit
 *  FERRY_PROGRAM_LOG, and the folder goes when that first process exits (each run used to leave one per worker). */
function newLog(): string {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-programs-'));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  return path.join(dir, 'programs.log');
}
export const PROGRAM_LOG = process.env.FERRY_PROGRAM_LOG ||= newLog();
const preload = `--require ${JSON.stringify(RECORDER)}`;
// mocha's parallel workers load this file again with NODE_OPTIONS inherited: add the preload once.
if (!process.env.NODE_OPTIONS?.includes(preload)) process.env.NODE_OPTIONS = [process.env.NODE_OPTIONS, preload].filter(Boolean).join(' ');
process.env.BASH_ENV ||= path.join(__dirname, 'record-programs.bash');
// Debian's bash reads the user's ~/.bashrc when its stdin is a socket (node's stdio pipes are) and SHLVL is below
// 2, as if run by sshd: a suite started with SHLVL=0 (npx from a non-shell parent) then records whatever that
// .bashrc runs (pyenv's init on a developer's machine). The record is of what Ferry runs, so not the user's shell.
if (Number(process.env.SHLVL || 0) < 1) process.env.SHLVL = '1';
// This process records too: the recorder patches child_process in place (a CommonJS preload, loaded as such).
// eslint-disable-next-line @typescript-eslint/no-require-imports -- a path computed at run time, loaded for its side effect
require(RECORDER);

export function recordedPrograms(): string[] {
  try { return readFileSync(PROGRAM_LOG, 'utf8').split('\n').filter(Boolean); } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return []; // nothing was spawned
    throw e;
  }
}

// In a parallel run (npm test) root hooks run once per file, in the worker that ran it: every file checks the
// record so far, and the last file to finish sees what every other file recorded.
export const mochaHooks = {
  afterAll() {
    const missing = unlisted(recordedPrograms());
    if (missing.length) {
      throw new Error(`the suite ran programs that scripts/programs.txt does not list, so scripts/setup.sh would not install them on a fresh machine: ${missing.join(', ')}`);
    }
  },
};
