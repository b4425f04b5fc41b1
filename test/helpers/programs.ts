// scripts/programs.txt read as data, and the check that every program the suite ran is in it.
import { execFileSync } from 'node:child_process';
import { accessSync, constants, statSync } from 'node:fs';
import path from 'node:path';
import { programList } from '../../scripts/programs';

const SEARCH = [...(process.env.PATH || '').split(':'), '/usr/sbin', '/sbin'].filter(Boolean);
const SYSTEM = /^\/(usr\/(local\/)?)?s?bin\//;

/** Where a bare name resolves on PATH (plus /usr/sbin and /sbin), or undefined. */
export function which(name: string): string | undefined {
  for (const dir of SEARCH) {
    const p = path.join(dir, name);
    try { accessSync(p, constants.X_OK); if (statSync(p).isFile()) return p; } catch { /* not in this directory: try the next */ }
  }
  return undefined;
}

let shellWords: Set<string> | undefined;
/** bash's builtins and keywords: a recorded `echo` or `[` ran inside bash, not as /usr/bin/echo. */
function bashWords(): Set<string> {
  shellWords ??= new Set(execFileSync('bash', ['-c', 'compgen -b; compgen -k'], { encoding: 'utf8' }).split('\n').filter(Boolean));
  return shellWords;
}

/** The recorded programs (names or paths) that are system programs not named by the list. A bare word that is
 *  a bash builtin or keyword, or resolves to nothing (a shell function, a variable), is not a program; a path
 *  outside the system's bin directories (the repository's own scripts, a test's stand-in tool, the cached
 *  simulator) is not installed by set-up. */
export function unlisted(recorded: Iterable<string>, list = programList()): string[] {
  const listed = new Set(list.flatMap((e) => e.names));
  const out = new Set<string>();
  for (const r of recorded) {
    if (!r) continue;
    let name: string;
    if (r.includes('/')) {
      if (!SYSTEM.test(r)) continue;
      name = path.basename(r);
    } else {
      if (bashWords().has(r) || !which(r)) continue;
      name = r;
    }
    if (!listed.has(name)) out.add(name);
  }
  return [...out].sort();
}
