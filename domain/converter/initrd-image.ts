// An initramfs as the kernel unpacks it: concatenated cpio archives (newc), each uncompressed or compressed, an
// early (microcode) archive first, a later file replacing an earlier one. Read here by Ferry itself, not by a
// distribution's lister (lsinitramfs and lsinitrd stop at the first compressed archive or at an appended one), so
// the verification sees every archive the kernel will unpack and fails where the kernel would. The boundaries of
// a compressed archive are found from its own framing (gzip's trailer, zstd's block headers, xz's stream footer,
// bzip2's end-of-stream marker); lz4's legacy format has no end marker: the kernel reads it to the end of the file,
// and so does this reader. Decompression is the host's own tools (zlib for gzip). Also the newc writer for the
// archive the repair appends (linux/initrd-append.ts).
import { spawn } from 'node:child_process';
import zlib from 'node:zlib';
import { OperationError } from '../../platform/errors';

export type Compression = 'none' | 'gzip' | 'xz' | 'zstd' | 'lz4-legacy' | 'bzip2';
export interface CpioEntry { name: string; mode: number; data: Buffer }
/** One archive of the image: where it lies in the file, how it is compressed, its members in order. */
export interface InitrdArchive { offset: number; end: number; compression: Compression; entries: CpioEntry[] }

/** The image does not unpack: where and why (the kernel would stop there too). */
export class InitrdParseError extends OperationError {
  /** `unknownFormat`: the file does not start as any initramfs this reader knows (lzma, lzo, or no initramfs). */
  constructor(readonly offset: number, readonly reason: string, readonly unknownFormat = false) { super(`byte ${offset}: ${reason}`, false); }
}

export const S_IFMT = 0o170000;
export const S_IFDIR = 0o040000;
export const S_IFREG = 0o100000;
const TRAILER = 'TRAILER!!!';
/** No image member is larger: a header claiming more is corruption, not a file. */
const MAX_OUT = 1 << 30;

const startsWith = (b: Buffer, at: number, magic: number[]) => magic.every((m, i) => b[at + i] === m);
const isCpioMagic = (b: Buffer, at: number) => b.toString('latin1', at, at + 6) === '070701' || b.toString('latin1', at, at + 6) === '070702';

/** The compression whose magic starts at `at`, as the kernel's decompress_method() tells them. */
function detect(b: Buffer, at: number): Compression | undefined {
  if (startsWith(b, at, [0x1f, 0x8b])) return 'gzip';
  if (startsWith(b, at, [0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00])) return 'xz';
  if (startsWith(b, at, [0x28, 0xb5, 0x2f, 0xfd])) return 'zstd';
  if (startsWith(b, at, [0x02, 0x21, 0x4c, 0x18])) return 'lz4-legacy';
  if (startsWith(b, at, [0x42, 0x5a, 0x68])) return 'bzip2';
  return undefined;
}

/** Every archive of the image, in order. Throws InitrdParseError where the kernel's unpacker would fail. */
export async function readInitrd(image: Buffer): Promise<InitrdArchive[]> {
  const out: InitrdArchive[] = [];
  let at = 0;
  while (at < image.length) {
    // Zeros between archives are padding (the kernel skips them; GRUB pads each initrd file to 4 bytes).
    if (image[at] === 0) { at++; continue; }
    if (at % 4 === 0 && isCpioMagic(image, at)) {
      const r = parseCpio(image, at);
      out.push({ offset: at, end: r.end, compression: 'none', entries: r.entries });
      at = r.end;
      continue;
    }
    const c = detect(image, at);
    if (!c) {
      throw new InitrdParseError(at, `invalid magic ${image.subarray(at, at + 6).toString('hex')}: `
        + 'neither a cpio archive on a 4-byte boundary nor a compression this reader unpacks', at === 0);
    }
    const { data, end } = await decompressAt(c, image, at);
    out.push({ offset: at, end, compression: c, entries: parseCpioStream(data, at, c) });
    at = end;
  }
  if (!out.length) throw new InitrdParseError(0, 'the image holds no archive');
  return out;
}

/** The files as the kernel leaves them after unpacking every archive: a later member replaces an earlier one. */
export function effectiveTree(archives: InitrdArchive[]): Map<string, CpioEntry> {
  const tree = new Map<string, CpioEntry>();
  for (const a of archives) for (const e of a.entries) tree.set(e.name, e);
  return tree;
}

/** Several cpio archives back to back in one decompressed stream, each on a 4-byte boundary after zeros. */
function parseCpioStream(data: Buffer, offset: number, c: Compression): CpioEntry[] {
  const entries: CpioEntry[] = [];
  let at = 0;
  while (at < data.length) {
    if (data[at] === 0) { at++; continue; }
    if (at % 4 !== 0 || !isCpioMagic(data, at)) {
      throw new InitrdParseError(offset, `the ${c} archive decompresses to something that is not a cpio archive at its byte ${at}`);
    }
    const r = parseCpio(data, at, offset);
    entries.push(...r.entries);
    at = r.end;
  }
  return entries;
}

/** One newc archive from `start` to its trailer (offsets 4-aligned from the start of `b`, as the kernel's). */
function parseCpio(b: Buffer, start: number, reportAt = start): { entries: CpioEntry[]; end: number } {
  const entries: CpioEntry[] = [];
  const align = (n: number) => (n + 3) & ~3;
  let at = start;
  for (;;) {
    if (at + 110 > b.length) throw new InitrdParseError(reportAt, `cpio archive truncated: a header at ${at} runs past the end`);
    if (!isCpioMagic(b, at)) throw new InitrdParseError(reportAt, `bad cpio magic ${JSON.stringify(b.toString('latin1', at, at + 6))} at ${at} (mid-archive)`);
    const field = (i: number) => {
      const s = b.toString('latin1', at + 6 + i * 8, at + 14 + i * 8);
      if (!/^[0-9a-fA-F]{8}$/.test(s)) throw new InitrdParseError(reportAt, `cpio header at ${at}: field ${i} is not hexadecimal`);
      return parseInt(s, 16);
    };
    const mode = field(1); const size = field(6); const nameSize = field(11);
    const nameEnd = at + 110 + nameSize;
    const dataAt = align(nameEnd);
    if (nameSize < 1 || dataAt + size > b.length || size > MAX_OUT) {
      throw new InitrdParseError(reportAt, `cpio archive truncated: the member at ${at} runs past the end`);
    }
    if (b[nameEnd - 1] !== 0) throw new InitrdParseError(reportAt, `cpio header at ${at}: the name is not terminated`);
    const raw = b.toString('utf8', at + 110, nameEnd - 1);
    at = align(dataAt + size);
    if (raw === TRAILER) return { entries, end: Math.min(at, b.length) };
    const name = raw.replace(/^(\.\/|\/)+/, '');
    if (name && name !== '.') entries.push({ name, mode, data: b.subarray(dataAt, dataAt + size) });
  }
}

async function decompressAt(c: Compression, b: Buffer, at: number): Promise<{ data: Buffer; end: number }> {
  switch (c) {
    case 'gzip': return gunzipMember(b, at);
    case 'zstd': { const end = zstdFrameEnd(b, at); return { data: await pipe('zstd', ['-dcq'], b.subarray(at, end), at), end }; }
    case 'xz': { const end = xzStreamEnd(b, at); return { data: await pipe('xz', ['-dcq'], b.subarray(at, end), at), end }; }
    case 'bzip2': { const end = bzip2StreamEnd(b, at); return { data: await pipe('bzip2', ['-dcq'], b.subarray(at, end), at), end }; }
    case 'lz4-legacy': { lz4LegacyCheck(b, at); return { data: await pipe('lz4', ['-dcq'], b.subarray(at), at), end: b.length }; }
    default: throw new InitrdParseError(at, `compression ${String(c)} is not read`);
  }
}

/** One gzip member: header, deflate data (zlib says how much it consumed), CRC32 and size checked. */
function gunzipMember(b: Buffer, at: number): { data: Buffer; end: number } {
  if (b[at + 2] !== 8) throw new InitrdParseError(at, 'gzip member with a method other than deflate');
  const flags = b[at + 3];
  let p = at + 10;
  if (flags & 4) p += 2 + b.readUInt16LE(p);
  for (const bit of [8, 16]) if (flags & bit) { const z = b.indexOf(0, p); if (z < 0) throw new InitrdParseError(at, 'gzip header truncated'); p = z + 1; }
  if (flags & 2) p += 2;
  let r: { buffer: Buffer; engine: { bytesWritten: number } };
  try { r = zlib.inflateRawSync(b.subarray(p), { info: true, maxOutputLength: MAX_OUT }) as unknown as typeof r; } catch (e) {
    throw new InitrdParseError(at, `gzip member does not decompress: ${(e as Error).message}`);
  }
  const end = p + r.engine.bytesWritten + 8;
  if (end > b.length) throw new InitrdParseError(at, 'gzip member truncated (no trailer)');
  if (b.readUInt32LE(end - 8) !== zlib.crc32(r.buffer) || b.readUInt32LE(end - 4) !== (r.buffer.length >>> 0)) {
    throw new InitrdParseError(at, 'gzip member decompresses wrong (CRC32 or size mismatch)');
  }
  return { data: r.buffer, end };
}

/** The end of the zstd frame at `at`, walked by its block headers (skippable frames too). */
function zstdFrameEnd(b: Buffer, at: number): number {
  const need = (p: number) => { if (p > b.length) throw new InitrdParseError(at, 'zstd frame truncated'); return p; };
  const fhd = b[need(at + 5) - 1];
  const fcs = [0, 2, 4, 8][fhd >> 6] || ((fhd >> 5) & 1 ? 1 : 0);
  let p = at + 5 + ((fhd >> 5) & 1 ? 0 : 1) + [0, 1, 2, 4][fhd & 3] + fcs;
  for (;;) {
    const h = b.readUIntLE(need(p + 3) - 3, 3);
    const type = (h >> 1) & 3;
    if (type === 3) throw new InitrdParseError(at, `zstd frame: reserved block type at ${p}`);
    p = need(p + 3 + (type === 1 ? 1 : h >>> 3));
    if (h & 1) break;
  }
  return need(p + ((fhd >> 2) & 1 ? 4 : 0));
}

/** The end of the xz stream at `at`: the first stream footer whose CRC32 and flags agree with the header. */
function xzStreamEnd(b: Buffer, at: number): number {
  const flags = b.subarray(at + 6, at + 8);
  for (let y = b.indexOf('YZ', at + 22, 'latin1'); y >= 0; y = b.indexOf('YZ', y + 1, 'latin1')) {
    const foot = y + 2 - 12;
    if (b[y - 2] === flags[0] && b[y - 1] === flags[1] && b.readUInt32LE(foot) === zlib.crc32(b.subarray(foot + 4, foot + 10))) return y + 2;
  }
  throw new InitrdParseError(at, 'xz stream truncated (no stream footer)');
}

/** The end of the bzip2 stream at `at`: after the bit-aligned end-of-stream marker 0x177245385090 and its CRC. */
function bzip2StreamEnd(b: Buffer, at: number): number {
  for (let i = at + 4; i + 10 <= b.length; i++) {
    for (let s = 0; s < 8; s++) {
      const hi = (b.readUInt32BE(i) >>> (8 - s)) & 0xffffff;
      if (hi !== 0x177245) continue;
      if (((b.readUInt32BE(i + 3) >>> (8 - s)) & 0xffffff) === 0x385090) return i + Math.ceil((s + 48 + 32) / 8);
    }
  }
  throw new InitrdParseError(at, 'bzip2 stream truncated (no end-of-stream marker)');
}

/** lz4's legacy frames: chunks of a 32-bit size and data up to the end of the file (no end marker). */
function lz4LegacyCheck(b: Buffer, at: number): void {
  let p = at + 4;
  while (p < b.length) {
    if (p + 4 > b.length) throw new InitrdParseError(at, 'lz4 legacy stream truncated in a chunk header');
    const n = b.readUInt32LE(p);
    if (n === 0x184c2102) { p += 4; continue; }
    if (n > (8 << 20) + (8 << 20) / 255 + 16) {
      throw new InitrdParseError(at, `lz4 legacy stream: a chunk of ${n} bytes at ${p} (data after the stream, or corruption)`);
    }
    if (p + 4 + n > b.length) throw new InitrdParseError(at, 'lz4 legacy stream truncated');
    p += 4 + n;
  }
}

/** `input` through a host decompressor; its failure is the image's. */
function pipe(cmd: string, args: string[], input: Buffer, at: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    let size = 0; let err = '';
    child.stdout.on('data', (d: Buffer) => { size += d.length; if (size > MAX_OUT) child.kill(); else out.push(d); });
    child.stderr.setEncoding('utf8').on('data', (s: string) => { err += s; });
    child.on('error', (e: NodeJS.ErrnoException) => reject(e.code === 'ENOENT'
      ? new OperationError(`${cmd} is not installed on this host: an initramfs compressed with it cannot be read`, false)
      : e));
    child.on('close', (code) => (code === 0
      ? resolve(Buffer.concat(out))
      : reject(new InitrdParseError(at, `${cmd} cannot decompress the archive: ${err.trim() || `exit ${code}`}`))));
    // A decompressor that fails early closes its stdin: that is its answer, given on close.
    child.stdin.on('error', () => undefined);
    child.stdin.end(input);
  });
}

/** A newc archive of `entries` (parents before children, as the caller orders them), ending in the trailer. */
export function newcArchive(entries: { name: string; mode: number; data?: Buffer }[]): Buffer {
  const parts: Buffer[] = [];
  let size = 0;
  const push = (b: Buffer) => { parts.push(b); size += b.length; };
  const pad = () => { if (size % 4) push(Buffer.alloc(4 - (size % 4))); };
  const mtime = Math.floor(Date.now() / 1000);
  [...entries, { name: TRAILER, mode: 0, data: undefined }].forEach((e, i) => {
    const data = e.data ?? Buffer.alloc(0);
    const name = Buffer.from(`${e.name}\0`, 'utf8');
    const f = [i + 1, e.mode, 0, 0, (e.mode & S_IFMT) === S_IFDIR ? 2 : 1, e.name === TRAILER ? 0 : mtime, data.length, 0, 0, 0, 0, name.length, 0];
    push(Buffer.from(`070701${f.map((n) => n.toString(16).padStart(8, '0')).join('')}`, 'latin1'));
    push(name); pad(); push(data); pad();
  });
  return Buffer.concat(parts, size);
}
