// Each test file's time in a run, for the order of the next one (scripts/test-order.ts): test/reporter.js hands
// every test and hook that ended here, and at the run's end the sums go into $FERRY_TEST_TIMES (set by
// scripts/test.ts; runs of single files through `npx mocha` record nothing) under the tier $FERRY_TEST_TIER.
// A file's time is the sum of its tests' and hooks' durations as mocha measured them in the worker that ran it
// (its load is not in it): in a parallel run the main process gets a file's events only when the file has ended,
// so their arrival times say nothing of when it started.
'use strict';
const fs = require('node:fs');
const path = require('node:path');

const ROOT = path.resolve(__dirname, '..', '..');

/** A spec outside the repository (a test's own temporary one, run by a mocha it starts) orders nothing: a name
 *  that never comes back would only pile up in the file. */
const outside = (f) => f.startsWith('../') || path.isAbsolute(f);

class FileTimes {
  constructor() { this.ms = new Map(); }

  /** A test or hook that ended (passed, failed or timed out); root hooks belong to no file. */
  add(runnable) {
    if (!runnable || !runnable.file || typeof runnable.duration !== 'number') return;
    const f = path.relative(ROOT, runnable.file).split(path.sep).join('/');
    if (outside(f)) return;
    this.ms.set(f, (this.ms.get(f) || 0) + runnable.duration);
  }

  /** Merges this run's times into the file: other files' times stay. A failure to write is said, not thrown: the
   *  times only order the next run. */
  save(file = process.env.FERRY_TEST_TIMES, tier = process.env.FERRY_TEST_TIER || 'full') {
    if (!file || this.ms.size === 0) return;
    try {
      let all = {};
      try { all = JSON.parse(fs.readFileSync(file, 'utf8')); } catch (e) { if (e.code !== 'ENOENT') throw e; }
      all[tier] = { ...(all[tier] || {}) };
      for (const f of Object.keys(all[tier])) if (outside(f)) delete all[tier][f];
      for (const [f, ms] of this.ms) all[tier][f] = Math.round(ms / 100) / 10;
      fs.mkdirSync(path.dirname(file), { recursive: true });
      const tmp = `${file}.${process.pid}.tmp`;
      fs.writeFileSync(tmp, JSON.stringify(all, null, 1) + '\n');
      fs.renameSync(tmp, file); // whole or not at all: two checkouts may end a run at once
    } catch (e) {
      process.stderr.write(`file times not saved in ${file}: ${e.message}; the next run keeps its order\n`);
    }
  }
}
module.exports = { FileTimes };
