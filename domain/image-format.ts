// Ferry's own image-header inspector (after OpenStack's format_inspector, written for qemu-img's backing-file
// CVEs): the real format of a file and every file its header makes qemu open, read by Ferry and never by a tool
// that probes. Each parser mimics what qemu itself reads (block/qcow2.c, vmdk.c, vpc.c, vhdx.c), including its
// looseness (a VMDK's parentFileNameHint is found by strstr, comments too), so that nothing qemu follows is missed.
// domain/image-confine.ts walks the references against the storage roots.
import { constants, promises as fs } from 'node:fs';

/** A file a header references: a qcow2 backing file (its recorded format) or data-file, a VMDK extent or
 *  parent, a VHD/VHDX parent. `image`: opened as an image in turn (so inspected too); else read as raw bytes. */
export interface ImageRef { kind: 'backing file' | 'data-file' | 'extent' | 'parent'; name: string; format?: string; image: boolean }
export interface Inspected { format: string; refs: ImageRef[]; problem?: string }

/** Formats Ferry opens; others are recognised (so a mismatch is seen) and refused. */
export const OPENED_FORMATS = ['raw', 'qcow2', 'vmdk', 'vpc', 'vhdx', 'vdi'];
/** The name qemu gives a format a request may name ('vhd' is qemu's 'vpc'). */
export const qemuFormat = (f: string) => (f === 'vhd' ? 'vpc' : f);

const MAX_NAME = 1023; // qemu refuses longer backing names; more is never needed
const DESC_SIZE = 20 * 512; // what qemu's vmdk_parent_open reads of a descriptor
const TEXT_DESC_MAX = 1 << 20; // what qemu's vmdk_read_desc reads of a descriptor file

async function readAt(fh: fs.FileHandle, pos: number, len: number): Promise<Buffer> {
  // A header's offset can be anything: past what a file can hold there is nothing to read.
  if (!Number.isSafeInteger(pos) || pos < 0) return Buffer.alloc(0);
  const buf = Buffer.alloc(Math.max(0, len));
  const { bytesRead } = await fh.read(buf, 0, buf.length, pos);
  return buf.subarray(0, bytesRead);
}
/** A C string as qemu uses it: cut at the first NUL. */
const cstr = (b: Buffer, enc: BufferEncoding = 'latin1') => { const s = b.toString(enc); const z = s.indexOf('\0'); return z < 0 ? s : s.slice(0, z); };

/** qemu's vmdk_probe for a text descriptor: blank or comment lines, then `version=1|2|3`. */
function isVmdkText(head: Buffer): boolean {
  const t = head.subarray(0, 2048).toString('latin1');
  for (const line of t.split('\n')) {
    if (line.startsWith('#')) continue;
    if (/^ *\r?$/.test(line)) continue;
    return /^version=[123]\r?$/.test(line);
  }
  return false;
}

/** The format of a file from its first bytes (and size, for a fixed VHD's footer), as qemu names it. */
export function detectFormat(head: Buffer, tail: Buffer): string {
  const at = (s: string, off = 0) => head.length >= off + s.length && head.subarray(off, off + s.length).toString('latin1') === s;
  if (at('QFI\xfb')) return head.length >= 8 && head.readUInt32BE(4) >= 2 ? 'qcow2' : 'qcow';
  if (at('KDMV') || at('COWD') || isVmdkText(head)) return 'vmdk';
  if (at('vhdxfile')) return 'vhdx';
  if (at('conectix') || (tail.length >= 8 && tail.subarray(0, 8).toString('latin1') === 'conectix')) return 'vpc';
  if (head.length >= 0x44 && head.readUInt32LE(0x40) === 0xbeda107f) return 'vdi';
  if (at('QED\0')) return 'qed';
  if (at('LUKS\xba\xbe')) return 'luks';
  if (at('WithoutFreeSpace') || at('WithouFreSpacExt')) return 'parallels';
  if (at('Bochs Virtual HD Image')) return 'bochs';
  if (at('#!/bin/sh\n#V2.0 Format\n')) return 'cloop';
  return 'raw';
}

/** qcow2: the backing file (offset/size at 8/16), and the header extensions after the header (72 bytes in
 *  version 2, header_length in 3): backing format (0xe2792aca) and external data file (0x44415441). */
async function qcow2Refs(fh: fs.FileHandle, head: Buffer): Promise<Inspected> {
  const refs: ImageRef[] = [];
  if (head.length < 72) return { format: 'qcow2', refs, problem: 'truncated qcow2 header' };
  const version = head.readUInt32BE(4);
  const backingOff = Number(head.readBigUInt64BE(8));
  const backingLen = head.readUInt32BE(16);
  const clusterBits = head.readUInt32BE(20);
  const incompatible = version >= 3 && head.length >= 80 ? head.readBigUInt64BE(72) : 0n;
  const hdrLen = version >= 3 && head.length >= 104 ? head.readUInt32BE(100) : 72;
  const clusterSize = clusterBits >= 9 && clusterBits <= 21 ? 2 ** clusterBits : 65536;
  let backingFormat: string | undefined;
  let dataFile: string | undefined;
  // Extensions end at the first cluster's end or at the backing name, whichever comes first (as qemu reads them).
  const end = Math.min(clusterSize, backingOff > 0 ? backingOff : clusterSize);
  const ext = await readAt(fh, 0, end);
  for (let off = hdrLen; off + 8 <= ext.length;) {
    const type = ext.readUInt32BE(off); const len = ext.readUInt32BE(off + 4);
    if (type === 0) break;
    if (off + 8 + len > ext.length) return { format: 'qcow2', refs, problem: 'a qcow2 header extension runs past its cluster' };
    const data = ext.subarray(off + 8, off + 8 + len);
    if (type === 0xe2792aca) backingFormat = cstr(data);
    if (type === 0x44415441) dataFile = cstr(data);
    off += 8 + Math.ceil(len / 8) * 8;
  }
  if (backingOff > 0 && backingLen > 0) {
    if (backingLen > MAX_NAME) return { format: 'qcow2', refs, problem: `the backing file name is ${backingLen} bytes long` };
    refs.push({ kind: 'backing file', name: cstr(await readAt(fh, backingOff, backingLen)), format: backingFormat, image: true });
  }
  if (dataFile !== undefined) refs.push({ kind: 'data-file', name: dataFile, image: false });
  else if (incompatible & 4n) return { format: 'qcow2', refs, problem: 'an external data file is flagged but not named' };
  return { format: 'qcow2', refs };
}

/** A VMDK descriptor's references as qemu finds them: extent lines (`RW|RDONLY|NOACCESS <sectors> <type>
 *  "<file>"`) and parentFileNameHint (strstr, skipping `="`, up to the next quote). */
export function descriptorRefs(text: string, withExtents: boolean): ImageRef[] {
  const refs: ImageRef[] = [];
  const desc = text.slice(0, withExtents ? TEXT_DESC_MAX : DESC_SIZE);
  const hint = desc.indexOf('parentFileNameHint');
  if (hint >= 0) {
    const from = hint + 'parentFileNameHint'.length + 2;
    const q = desc.indexOf('"', from);
    const name = cstr(Buffer.from(desc.slice(from, q < 0 ? undefined : q), 'latin1'));
    if (name) refs.push({ kind: 'parent', name, format: 'vmdk', image: true });
  }
  if (!withExtents) return refs;
  for (const raw of desc.split('\n')) {
    const line = raw.replace(/\r$/, '');
    if (!/^(RW|RDONLY|NOACCESS)/.test(line)) continue;
    const q = line.indexOf('"');
    if (q < 0) continue; // a ZERO extent names no file
    const rest = line.slice(q + 1);
    const name = cstr(Buffer.from(rest.slice(0, rest.includes('"') ? rest.indexOf('"') : undefined), 'latin1'));
    refs.push({ kind: 'extent', name, image: false });
  }
  return refs;
}

/** VMDK: a hosted sparse file (KDMV) embeds a descriptor whose parent hint qemu follows (its extents are the
 *  file itself); a descriptor file names extents and a parent; a COWD (vmfsSparse) extent opened alone, none. */
async function vmdkRefs(fh: fs.FileHandle, head: Buffer): Promise<Inspected> {
  const magic = head.subarray(0, 4).toString('latin1');
  if (magic === 'COWD') return { format: 'vmdk', refs: [] };
  if (magic === 'KDMV') {
    if (head.length < 44) return { format: 'vmdk', refs: [], problem: 'truncated VMDK header' };
    const off = Number(head.readBigUInt64LE(28)) * 512;
    if (!off) return { format: 'vmdk', refs: [] };
    return { format: 'vmdk', refs: descriptorRefs((await readAt(fh, off, DESC_SIZE)).toString('latin1'), false) };
  }
  return { format: 'vmdk', refs: descriptorRefs((await readAt(fh, 0, TEXT_DESC_MAX)).toString('latin1'), true) };
}

/** VHD: a differencing disk (type 4) names its parent in the dynamic header: the Unicode name and up to eight
 *  locators (W2ru/W2ku in UTF-16LE, Mac/MacX as UTF-8 URLs). */
async function vpcRefs(fh: fs.FileHandle, footer: Buffer): Promise<Inspected> {
  if (footer.length < 512 || footer.readUInt32BE(60) !== 4) return { format: 'vpc', refs: [] };
  const dyn = await readAt(fh, Number(footer.readBigUInt64BE(16)), 1024);
  const refs: ImageRef[] = [];
  if (dyn.length < 768) return { format: 'vpc', refs, problem: 'a differencing VHD without its dynamic header' };
  const utf16be = Buffer.from(dyn.subarray(64, 576)).swap16();
  const uname = cstr(utf16be, 'utf16le');
  if (uname) refs.push({ kind: 'parent', name: uname, image: true });
  for (let i = 0; i < 8; i++) {
    const e = dyn.subarray(576 + i * 24, 600 + i * 24);
    const code = e.subarray(0, 4).toString('latin1');
    if (!/^(W2ru|W2ku|Mac |MacX)$/.test(code)) continue;
    const data = await readAt(fh, Number(e.readBigUInt64BE(16)), Math.min(e.readUInt32BE(8), 4096));
    const name = cstr(data, code.startsWith('W2') ? 'utf16le' : 'utf8').replace(/^file:\/\//, '');
    if (name) refs.push({ kind: 'parent', name, image: true });
  }
  return { format: 'vpc', refs };
}

/** A GUID as it lies on disk (first three groups little endian). */
function guid(s: string): Buffer {
  const h = s.replace(/-/g, '');
  const b = Buffer.from(h, 'hex');
  b.subarray(0, 4).reverse(); b.subarray(4, 6).reverse(); b.subarray(6, 8).reverse();
  return b;
}
const METADATA_REGION = guid('8B7CA206-4790-4B9A-B8FE-575F050F886E');
const FILE_PARAMETERS = guid('CAA16737-FA36-4D43-B3B6-33F0AA44E76B');
const PARENT_LOCATOR = guid('A8D35F2D-B30B-454D-ABF7-D3D84834AB0C');

/** VHDX: the region table (192 KiB) gives the metadata region; its table gives the file parameters (HasParent)
 *  and the parent locator, whose key/value pairs (UTF-16LE) name the parent by several paths. */
async function vhdxRefs(fh: fs.FileHandle): Promise<Inspected> {
  const rt = await readAt(fh, 192 * 1024, 64 * 1024);
  if (rt.length < 16 || rt.subarray(0, 4).toString('latin1') !== 'regi') return { format: 'vhdx', refs: [], problem: 'no VHDX region table' };
  let meta: number | undefined;
  for (let i = 0, n = Math.min(rt.readUInt32LE(8), 2047); i < n; i++) {
    const e = rt.subarray(16 + i * 32, 48 + i * 32);
    if (e.length === 32 && e.subarray(0, 16).equals(METADATA_REGION)) meta = Number(e.readBigUInt64LE(16));
  }
  if (meta === undefined) return { format: 'vhdx', refs: [], problem: 'no VHDX metadata region' };
  const mt = await readAt(fh, meta, 64 * 1024);
  if (mt.subarray(0, 8).toString('latin1') !== 'metadata') return { format: 'vhdx', refs: [], problem: 'no VHDX metadata table' };
  let hasParent = false;
  const refs: ImageRef[] = [];
  for (let i = 0, n = Math.min(mt.readUInt16LE(10), 2047); i < n; i++) {
    const e = mt.subarray(32 + i * 32, 64 + i * 32);
    if (e.length < 32) break;
    const at = meta + e.readUInt32LE(16);
    if (e.subarray(0, 16).equals(FILE_PARAMETERS)) hasParent = !!((await readAt(fh, at + 4, 4)).readUInt32LE(0) & 2);
    if (e.subarray(0, 16).equals(PARENT_LOCATOR)) {
      const loc = await readAt(fh, at, Math.min(e.readUInt32LE(20), 64 * 1024));
      for (let k = 0, m = loc.length >= 20 ? loc.readUInt16LE(18) : 0; k < m && 20 + k * 12 + 12 <= loc.length; k++) {
        const kv = loc.subarray(20 + k * 12, 32 + k * 12);
        const key = loc.subarray(kv.readUInt32LE(0), kv.readUInt32LE(0) + kv.readUInt16LE(8)).toString('utf16le');
        const value = loc.subarray(kv.readUInt32LE(4), kv.readUInt32LE(4) + kv.readUInt16LE(10)).toString('utf16le');
        if (/path/i.test(key) && value) refs.push({ kind: 'parent', name: value, image: true });
      }
    }
  }
  if (hasParent && !refs.length) return { format: 'vhdx', refs, problem: 'a differencing VHDX whose parent is not named' };
  return { format: 'vhdx', refs };
}

/** The format of `file` and every file its header references. Reads at most a few hundred KiB. */
export async function inspectImage(file: string): Promise<Inspected> {
  // Non-blocking: a FIFO swapped in after the path checks must not hang the reader (regular files are unaffected).
  const fh = await fs.open(file, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const { size } = await fh.stat();
    const head = await readAt(fh, 0, 64 * 1024);
    const tail = size >= 512 ? await readAt(fh, size - 512, 512) : Buffer.alloc(0);
    const format = detectFormat(head, tail);
    if (format === 'qcow2') return await qcow2Refs(fh, head);
    if (format === 'vmdk') return await vmdkRefs(fh, head);
    if (format === 'vpc') return await vpcRefs(fh, head.subarray(0, 8).toString('latin1') === 'conectix' ? head : tail);
    if (format === 'vhdx') return await vhdxRefs(fh);
    return { format, refs: [] };
  } finally { await fh.close(); }
}
