// Imported first by every service's entry point (services/*/main.ts, the bins, scripts/cluster.ts): every
// declared setting (platform/settings.ts) is checked before any other module is loaded, so a bad value stops the
// process with one line on stderr naming the variable and what it must be (exit 2), instead of a stack trace
// from whichever module read it first, or a NaN in a timer.
import path from 'node:path';
import { exitOnBadSettings } from './settings';

/** The process's name as the operator knows it: the service's folder for services/<name>/main, else the script. */
function processName(script = process.argv[1] || 'ferry'): string {
  const base = path.basename(script).replace(/\.[cm]?[jt]s$/, '');
  return base === 'main' ? path.basename(path.dirname(script)) : base;
}

exitOnBadSettings(processName());
