// Preloaded into every node process of the test suite (NODE_OPTIONS=--require, set by programs.hooks.ts): appends
// each program a process spawns to $FERRY_PROGRAM_LOG, so the suite can prove scripts/programs.txt lists them all.
'use strict';
const cp = require('node:child_process');
const fs = require('node:fs');
const { syncBuiltinESMExports } = require('node:module');
const { promisify } = require('node:util');

const log = process.env.FERRY_PROGRAM_LOG;
if (log && !cp.__ferryRecording) {
  const seen = new Set();
  const note = (file) => {
    if (typeof file !== 'string' || !file || seen.has(file)) return;
    seen.add(file);
    try { fs.appendFileSync(log, `${file}\n`); } catch (e) {
      // The record is a check of the list, not part of what the process does: say so once and carry on.
      process.emitWarning(`could not record the program ${file} in ${log}: ${e.message}`);
    }
  };
  const firstWord = (command) => String(command).trim().split(/\s+/)[0];
  const wrap = (name, pick) => {
    const original = cp[name];
    cp[name] = function recorded(...args) { note(pick(args)); return original.apply(this, args); };
    // exec and execFile promisify to {stdout, stderr} through this symbol: keep it, or promisify(execFile)
    // would resolve to stdout alone and reject without stdout and stderr.
    const custom = original[promisify.custom];
    if (custom) cp[name][promisify.custom] = (...args) => { note(pick(args)); return custom(...args); };
  };
  const fileOrShell = ([file, a, b]) => {
    const opts = [a, b].find((x) => x && typeof x === 'object' && !Array.isArray(x));
    return opts && opts.shell ? firstWord(file) : file;
  };
  for (const name of ['spawn', 'spawnSync', 'execFile', 'execFileSync']) wrap(name, fileOrShell);
  for (const name of ['exec', 'execSync']) wrap(name, ([command]) => firstWord(command));
  cp.__ferryRecording = true;
  syncBuiltinESMExports();
}
