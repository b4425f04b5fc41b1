// File-system questions the rest of the code asks often.
import { promises as fs, Stats } from 'node:fs';

/** fs.stat, or undefined when nothing is there (ENOENT, ENOTDIR); any other error (EACCES, EIO) is thrown,
 *  never taken for "missing". */
export async function statIfExists(p: string): Promise<Stats | undefined> {
  try { return await fs.stat(p); } catch (e) {
    const code = (e as NodeJS.ErrnoException | undefined)?.code; // fs rejects with an ErrnoException
    if (code === 'ENOENT' || code === 'ENOTDIR') return undefined;
    throw e;
  }
}
