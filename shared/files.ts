// File-system questions the rest of the code asks often.
import { promises as fs, Stats } from 'node:fs';

/** fs.stat, or undefined when nothing is there (ENOENT, ENOTDIR); any other error (EACCES, EIO) is thrown,
 *  never taken for "missing". */
export async function statIfExists(p: string): Promise<Stats | undefined> {
  try { return await fs.stat(p); } catch (e: any) {
    if (e?.code === 'ENOENT' || e?.code === 'ENOTDIR') return undefined;
    throw e;
  }
}
