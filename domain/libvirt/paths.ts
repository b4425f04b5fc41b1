// Paths the /virt API reads (a source image) or writes (clones' disks, exports): confined to the storage roots
// of platform/roots.ts (FERRY_INPUT_ROOTS / FERRY_OUTPUT_ROOTS), checked on the resolved real path.
import { fieldError } from '../../platform/errors';
import { configuredRoots, PathKind, refusal } from '../../platform/roots';

/** The real path of `p`, or a 400 naming `field` when it is outside the roots (or an input that is missing). */
export async function confinePath(p: string, kind: PathKind, field: string): Promise<string> {
  const r = await refusal({ field, path: p, kind }, configuredRoots(), { mustExist: kind === 'input' });
  if (r.reason) throw fieldError(400, field, r.reason, `${field}: ${r.reason}`);
  return r.real;
}
