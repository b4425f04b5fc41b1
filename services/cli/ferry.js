#!/usr/bin/env node
// The `ferry` command (package.json "bin"): the daemon's inventory and plans from a terminal or a script.
// Built (dist/, `npm run build`) it runs the compiled code; in a source checkout it loads TypeScript through tsx.
const { existsSync } = require('node:fs');
const path = require('node:path');

const compiled = path.join(__dirname, 'main.js');
if (!existsSync(compiled)) require('tsx/cjs');
// Its own settings (FERRY_URL, FERRY_API_KEY; platform/settings.ts) are checked first: a bad one is one line naming it.
const settings = require(existsSync(compiled) ? '../../platform/settings.js' : '../../platform/settings.ts');
settings.exitOnBadSettings('ferry', settings.cliSettings());
const { main } = require(existsSync(compiled) ? compiled : './main.ts');
main(process.argv.slice(2)).then((code) => process.exit(code), (e) => { process.stderr.write(`ferry: ${(e && e.message) || e}\n`); process.exit(1); });
