#!/usr/bin/env node
// The `ferry-convert` command (package.json "bin"): loads TypeScript through tsx, then runs the CLI.
require('tsx/cjs');
const { main } = require('./cli.ts');
main(process.argv.slice(2)).then((code) => process.exit(code), (e) => { process.stderr.write(`ferry-convert: ${(e && e.message) || e}\n`); process.exit(1); });
