// Mocha's spec reporter, plus the closing line CI reads: "N passed, N failed", and each file's time for the order
// of the next run (test/helpers/file-times.cjs).
'use strict';
const Mocha = require('mocha');
const { FileTimes } = require('./helpers/file-times.cjs');
const { Spec } = Mocha.reporters;
const { EVENT_RUN_END, EVENT_TEST_END, EVENT_HOOK_END, EVENT_TEST_FAIL } = Mocha.Runner.constants;

class FerryReporter extends Spec {
  constructor(runner, options) {
    super(runner, options);
    const times = new FileTimes();
    runner.on(EVENT_TEST_END, (test) => times.add(test));
    runner.on(EVENT_HOOK_END, (hook) => times.add(hook));
    // A hook that fails or times out ends with a failure, not a hook end.
    runner.on(EVENT_TEST_FAIL, (r) => { if (r.type === 'hook') times.add(r); });
    runner.once(EVENT_RUN_END, () => {
      times.save();
      const s = runner.stats || {};
      process.stdout.write(`\n${s.passes || 0} passed, ${s.failures || 0} failed, ${s.pending || 0} skipped\n`);
    });
  }
}
module.exports = FerryReporter;
