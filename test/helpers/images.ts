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

/**
 * A 1 MiB disk whose MBR boot code prints `message` (FERRY-BOOT-OK) on the first serial port and halts: the smallest disk
 * that really boots, for the test boot (virt_test). 16-bit code, loaded by the BIOS at 0x7c00:
 *   cld; xor ax,ax; mov ds,ax; mov dx,0x3f8; mov si,0x7c17
 *   next: lodsb; test al,al; jz done; out dx,al; jmp next
 *   done: cli; hlt; jmp done-1          ; the message follows at 0x7c17, then the 0x55aa boot signature
 */
export function makeBootableImage(dir: string, name: string, format: 'vmdk' | 'qcow2' | 'raw', message = 'FERRY-BOOT-OK'): string {
  const disk = Buffer.alloc(1024 * 1024);
  mbrBootCode(message).copy(disk, 0);
  disk.writeUInt16LE(0xaa55, 510);
  const raw = path.join(dir, `${name}.src.raw`);
  writeFileSync(raw, disk);
  if (format === 'raw') return raw;
  const out = path.join(dir, `${name}.${format}`);
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', format, raw, out]);
  return out;
}

/** The boot code above with its message, at most 440 bytes: it fits an MBR's code area before the disk signature
 *  and the partition table, so a partitioned disk can carry it too (test/fixtures/tiny-guest.ts). */
export function mbrBootCode(message = 'FERRY-BOOT-OK'): Buffer {
  const code = Buffer.from([0xfc, 0x31, 0xc0, 0x8e, 0xd8, 0xba, 0xf8, 0x03, 0xbe, 0x17, 0x7c, 0xac, 0x84, 0xc0, 0x74, 0x03, 0xee, 0xeb, 0xf8, 0xfa, 0xf4, 0xeb, 0xfd]);
  const out = Buffer.concat([code, Buffer.from(`${message}\r\n\0`)]);
  if (out.length > 440) throw new Error(`boot message too long for an MBR: ${out.length} bytes`);
  return out;
}
