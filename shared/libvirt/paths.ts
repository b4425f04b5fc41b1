// Where the /virt API may read source files and write exports: inside the configured storage roots
// (FERRY_INPUT_ROOTS / FERRY_OUTPUT_ROOTS, ":"-separated absolute folders), checked on the resolved real path.
// Without roots configured any absolute path without ".." segments is taken (docs/virt.md).
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { ApiError } from '../errors';

function roots(kind: 'input' | 'output'): string[] {
  const raw = process.env[kind === 'input' ? 'FERRY_INPUT_ROOTS' : 'FERRY_OUTPUT_ROOTS'] || '';
  return raw.split(':').filter(Boolean).map((r) => path.resolve(r));
}

/** The real path of `p` (of its parent when it does not exist yet), refused with 400 naming `field` when it
 *  leaves the roots. */
export async function confinePath(p: string, kind: 'input' | 'output', field: string): Promise<string> {
  if (!path.isAbsolute(p) || p.split('/').includes('..')) throw new ApiError(400, `${field} must be an absolute path without ".."`, { fields: [{ field, message: 'invalid path' }] });
  let real: string;
  try { real = await fs.realpath(p); } catch {
    try { real = path.join(await fs.realpath(path.dirname(p)), path.basename(p)); } catch {
      if (kind === 'input') throw new ApiError(400, `${field}: ${p} does not exist`, { fields: [{ field, message: 'not found' }] });
      real = path.resolve(p);
    }
  }
  const allowed = roots(kind);
  if (allowed.length && !allowed.some((r) => real === r || real.startsWith(r + path.sep))) {
    throw new ApiError(400, `${field}: ${p} is outside the configured ${kind} roots`, { fields: [{ field, message: `outside ${kind} roots` }] });
  }
  return real;
}
