// The tiny guest as a monolithicFlat vmdk pair (descriptor + extent): the simulator tracks changed blocks of flat
// disks only, so the warm tests upload this shape. Its own file, not ./fixture.ts: that one is in heavy proofs' keys.
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { ensureTinyGuest } from '../fixtures/tiny-guest';

/** Writes the pair under `dir`/boot, the disk grown to `bytes`; answers the descriptor and the extent. */
export async function tinyFlatGuest(dir: string, bytes: number): Promise<{ desc: string; extent: string }> {
  const raw = path.join(dir, 'boot.raw');
  execFileSync('qemu-img', ['convert', '-f', 'vmdk', '-O', 'raw', await ensureTinyGuest(), raw]);
  execFileSync('qemu-img', ['resize', '-q', '-f', 'raw', raw, String(bytes)]);
  mkdirSync(path.join(dir, 'boot'));
  const desc = path.join(dir, 'boot', 'boot.vmdk');
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=monolithicFlat', raw, desc]);
  return { desc, extent: path.join(dir, 'boot', 'boot-flat.vmdk') };
}
