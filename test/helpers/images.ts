// Small real disk images made with qemu-img, with recognisable data in them.
import { execFileSync } from 'node:child_process';
import { writeFileSync, openSync, writeSync, closeSync } from 'node:fs';
import path from 'node:path';

/** A raw image of `mib` MiB with a pattern written at a few offsets, converted to `format`. */
export function makeImage(dir: string, name: string, format: 'vmdk' | 'vhdx' | 'qcow2' | 'raw', mib = 8): string {
  const raw = path.join(dir, `${name}.src.raw`);
  writeFileSync(raw, Buffer.alloc(0));
  execFileSync('qemu-img', ['create', '-f', 'raw', raw, `${mib}M`]);
  const fd = openSync(raw, 'r+');
  for (let off = 0; off < mib; off += 3) {
    const buf = Buffer.alloc(65536, `${name}-${off}-ferry-`);
    writeSync(fd, buf, 0, buf.length, off * 1024 * 1024);
  }
  closeSync(fd);
  if (format === 'raw') return raw;
  const out = path.join(dir, `${name}.${format}`);
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', format, raw, out]);
  return out;
}
