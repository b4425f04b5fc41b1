// Regular expressions a caller gives (virt_test.expect) run on V8's linear-time engine (the `l` flag, behind
// --enable-experimental-regexp-engine, on since Node 16): its time grows with the text only, so a pattern such
// as `(a|aa)+$` over a long serial console cannot hold a worker's event loop until its leases lapse. The engine
// has no backreferences, lookarounds, or `i`/`u`/`y` flags; such a pattern is refused when the job is submitted.
import v8 from 'node:v8';
import { OperationError } from './errors';

v8.setFlagsFromString('--enable-experimental-regexp-engine');

/** `source` compiled for the linear-time engine; throws (with V8's reason) when it cannot run there. */
export function linearRegExp(source: string): RegExp {
  // eslint-disable-next-line no-invalid-regexp -- 'l' is V8's linear-engine flag, enabled above; ESLint knows only the standard flags
  return new RegExp(source, 'l');
}

/** Why `source` cannot be a caller's pattern, or null. */
export function refusePattern(source: string): string | null {
  try { new RegExp(source); } catch (e) { return `is not a regular expression: ${(e as Error).message}`; }
  try { linearRegExp(source); return null; } catch {
    return 'cannot run in linear time (backreferences such as \\1 and lookarounds such as (?=...) or (?<!...) are not supported in caller patterns)';
  }
}

/** A job's pattern on the worker, checked again (a job in Redis may come from an older submission rule): a
 *  refusal fails the job without retry, naming the field. */
export function jobPattern(source: string, field: string): RegExp {
  const r = refusePattern(source);
  if (r) throw new OperationError(`${field} ${r}`, false);
  return linearRegExp(source);
}
