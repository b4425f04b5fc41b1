#!/usr/bin/env node
// The `ferry-convert` command (package.json "bin"). Built (dist/, `npm run build`) it runs the compiled CLI;
// in a source checkout it loads the TypeScript through tsx, a development dependency.
const { existsSync } = require('node:fs');
const path = require('node:path');

const compiled = path.join(__dirname, 'cli.js');
if (!existsSync(compiled)) require('tsx/cjs');
// Every setting is checked before the converter's modules load (platform/settings.ts): a bad one stops the command
// with one line naming it (exit 2, as for a bad configuration file).
require(existsSync(compiled) ? '../../platform/settings.js' : '../../platform/settings.ts').exitOnBadSettings('ferry-convert');
const { main } = require(existsSync(compiled) ? compiled : './cli.ts');
main(process.argv.slice(2)).then((code) => process.exit(code), (e) => { process.stderr.write(`ferry-convert: ${(e && e.message) || e}\n`); process.exit(1); });
