// scripts/programs.txt as data: the one list of every program Ferry runs, the Debian package that brings it, and
// the worker capabilities that need it. scripts/setup.sh installs from it, each worker image installs the packages
// of its capabilities (Dockerfile: `node dist/platform/programs.js packages <capabilities>`), and a worker checks the
// programs of its capabilities at start (services/worker/tools.ts). The build copies the file beside this module's
// folder (dist/scripts/programs.txt), so the path below holds in the checkout and in the image alike.
import { readFileSync } from 'node:fs';
import path from 'node:path';

export const PROGRAMS_FILE = path.resolve(__dirname, '..', 'scripts', 'programs.txt');

export interface ProgramEntry { check: string; names: string[]; package: string; group: string; capabilities: string[]; why: string }

export function programList(file = PROGRAMS_FILE): ProgramEntry[] {
  return readFileSync(file, 'utf8').split('\n').filter((l) => l.trim() && !l.trimStart().startsWith('#')).map((line) => {
    const [check, pkg, group, caps, ...why] = line.trim().split(/\s+/);
    return { check, names: check.startsWith('/') ? [] : check.split(','), package: pkg, group, capabilities: caps === '-' ? [] : caps.split(','),
      why: why.join(' ') };
  });
}

/** The entries a worker with `capabilities` needs at run time. */
export function programsFor(capabilities: string[], list = programList()): ProgramEntry[] {
  return list.filter((e) => e.capabilities.some((c) => capabilities.includes(c)));
}

/** The Debian packages an image for `capabilities` installs: each once, in the list's order. */
export function packagesFor(capabilities: string[], list = programList()): string[] {
  return [...new Set(programsFor(capabilities, list).map((e) => e.package).filter((p) => p !== '-'))];
}

// `node dist/platform/programs.js packages img_tool,libvirt_access`: the packages, one a line (the Dockerfile's
// worker stages install these).
if (require.main === module) {
  const [cmd, caps] = process.argv.slice(2);
  if (cmd !== 'packages' || !caps) { process.stderr.write('usage: programs.js packages <capability,...>\n'); process.exit(2); }
  process.stdout.write(packagesFor(caps.split(',').map((c) => c.trim()).filter(Boolean)).join('\n') + '\n');
}
