// Images an attacker would hand Ferry, made with qemu-img where it can make them (-u: the backing name is written
// as given, never opened) and by hand where it cannot (a differencing VHD; qemu-img makes none).
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import fc from 'fast-check';

const qemuImg = (args: string[], cwd?: string) => execFileSync('qemu-img', args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });

/** A qcow2 at `file` whose header names `backing` (any string: a path, json:, nbd://) with format `fmt`. */
export function qcow2Backed(file: string, backing: string, fmt = 'raw', mib = 1): string {
  qemuImg(['create', '-q', '-f', 'qcow2', '-u', '-b', backing, '-F', fmt, path.basename(file), `${mib}M`], path.dirname(file));
  return file;
}

/** A qcow2 whose external data file is `dataFile` (qemu-img creates it there: give a path that may be written). */
export function qcow2WithDataFile(file: string, dataFile: string, mib = 1): string {
  qemuImg(['create', '-q', '-f', 'qcow2', '-o', `data_file=${dataFile},data_file_raw=on`, file, `${mib}M`]);
  return file;
}

/** A VMDK descriptor file (monolithicFlat) whose one extent line names `extent`. */
export function vmdkDescriptor(file: string, extent: string, sectors = 2048, extra = ''): string {
  writeFileSync(file, ['# Disk DescriptorFile', 'version=1', 'CID=fffffffe', 'parentCID=ffffffff', 'createType="monolithicFlat"', extra, '',
    '# Extent description', `RW ${sectors} FLAT "${extent}" 0`, '', '# The Disk Data Base', '#DDB', 'ddb.adapterType = "ide"', ''].join('\n'));
  return file;
}

/** A dynamic VHD turned into a differencing one whose parent is `parent`: disk type 4 in both footer copies, the
 *  parent's Unicode name in the dynamic header and one W2ru locator whose data lies in the header's reserved bytes. */
export function differencingVhd(file: string, parent: string): string {
  qemuImg(['create', '-q', '-f', 'vpc', '-o', 'subformat=dynamic', file, '1M']);
  const b = readFileSync(file);
  b.writeUInt32BE(4, 60);
  b.writeUInt32BE(4, b.length - 512 + 60);
  const dyn = Number(b.readBigUInt64BE(16));
  Buffer.from(parent, 'utf16le').swap16().copy(b, dyn + 64);
  const le = Buffer.from(parent, 'utf16le');
  const data = dyn + 768; // reserved bytes of the dynamic header
  le.copy(b, data);
  b.write('W2ru', dyn + 576, 'latin1');
  b.writeUInt32BE(512, dyn + 576 + 4);
  b.writeUInt32BE(le.length, dyn + 576 + 8);
  b.writeBigUInt64BE(BigInt(data), dyn + 576 + 16);
  writeFileSync(file, b);
  return file;
}

// Random image headers for the fuzz test: each format's magic with fields and names chosen to reach every
// branch of domain/image-format.ts (offsets past the file, lengths past any bound, hostile names).
const NAMES = ['/etc/shadow', '../../../etc/passwd', 'base.raw', './base.raw', 'json:{"driver":"raw","file":{"filename":"/etc/shadow"}}', 'nbd://127.0.0.1:1/x',
  'http://169.254.169.254/', 'file:/etc/passwd', '', 'a\0b', 'x'.repeat(2000), 'C:\\Windows\\disk.vhd', 'img-0.qcow2', '\ud800', '..', '/'];
const arbName = fc.oneof(fc.constantFrom(...NAMES), fc.string({ maxLength: 64 }));
const u64 = fc.oneof(fc.constantFrom(0n, 1n, 512n, 4096n, 65536n, 2n ** 63n, 2n ** 64n - 1n), fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }));
const u32 = fc.oneof(fc.constantFrom(0, 1, 9, 16, 21, 72, 104, 1023, 1024, 0xffffffff), fc.nat());

const arbQcow2 = fc.record({
  version: fc.constantFrom(1, 2, 3, 0xffffffff), backingOff: u64, backingLen: u32, clusterBits: u32, incompatible: u64, hdrLen: u32,
  exts: fc.array(fc.record({ type: fc.constantFrom(0xe2792aca, 0x44415441, 0x6803f857, 0, 0xdeadbeef), len: fc.option(u32, { nil: undefined }), name: arbName }), { maxLength: 4 }),
  backing: arbName,
}).map((h) => {
  const b = Buffer.alloc(8192);
  b.write('QFI\xfb', 0, 'latin1');
  b.writeUInt32BE(h.version, 4); b.writeBigUInt64BE(h.backingOff, 8); b.writeUInt32BE(h.backingLen, 16); b.writeUInt32BE(h.clusterBits, 20);
  b.writeBigUInt64BE(1n << 20n, 24); b.writeBigUInt64BE(h.incompatible, 72); b.writeUInt32BE(h.hdrLen, 100);
  let off = 104;
  for (const e of h.exts) {
    const data = Buffer.from(e.name, 'latin1');
    if (off + 8 + data.length > 4096) break;
    b.writeUInt32BE(e.type, off); b.writeUInt32BE(e.len ?? data.length, off + 4); data.copy(b, off + 8);
    off += 8 + Math.ceil(data.length / 8) * 8;
  }
  if (h.backingOff < 8000n) b.write(h.backing, Number(h.backingOff), 'latin1');
  return b;
});

const arbDescriptor = fc.array(fc.oneof(
  fc.constantFrom('# Disk DescriptorFile', 'version=1', 'version=3', 'CID=fffffffe', ''),
  fc.constantFrom('monolithicFlat', 'monolithicSparse', 'twoGbMaxExtentSparse', 'twoGbMaxExtentFlat', 'vmfs', 'vmfsSparse', 'vmfsThin', 'streamOptimized', 'seSparse', 'custom').map((t) => `createType="${t}"`),
  arbName.map((n) => `parentFileNameHint="${n}"`),
  arbName.map((n) => `# parentFileNameHint="${n}"`),
  fc.tuple(fc.constantFrom('RW', 'RDONLY', 'NOACCESS', 'RWX'), u32, fc.constantFrom('FLAT', 'SPARSE', 'ZERO', 'VMFS', 'VMFSSPARSE', 'VMFSRDM', 'SESPARSE'), arbName)
    .map(([a, s, t, n]) => `${a} ${s} ${t} "${n}"${t === 'FLAT' ? ' 0' : ''}`),
  fc.string({ maxLength: 80 }),
), { maxLength: 12 }).map((lines) => ['version=1', ...lines].join('\n'));

const arbVmdk = fc.oneof(
  arbDescriptor.map((t) => Buffer.from(t, 'latin1')),
  fc.tuple(u64, arbDescriptor).map(([descOff, t]) => {
    const b = Buffer.alloc(8192);
    b.write('KDMV', 0, 'latin1'); b.writeUInt32LE(1, 4); b.writeBigUInt64LE(2048n, 12); b.writeBigUInt64LE(128n, 20);
    b.writeBigUInt64LE(descOff, 28); b.writeBigUInt64LE(20n, 36);
    if (descOff > 0n && descOff < 15n) b.write(t, Number(descOff) * 512, 'latin1');
    return b;
  }),
);

const arbVhd = fc.record({ type: fc.constantFrom(2, 3, 4, 0xffffffff), dataOff: u64, parent: arbName, locators: fc.array(fc.record({ code: fc.constantFrom('W2ru', 'W2ku', 'Mac ', 'MacX', 'xxxx'), len: u32, off: u64, name: arbName }), { maxLength: 8 }), atEnd: fc.boolean() })
  .map((h) => {
    const b = Buffer.alloc(4096);
    const foot = Buffer.alloc(512);
    foot.write('conectix', 0, 'latin1'); foot.writeBigUInt64BE(h.dataOff, 16); foot.writeUInt32BE(h.type, 60);
    foot.copy(b, h.atEnd ? b.length - 512 : 0);
    b.write('cxsparse', 512, 'latin1');
    Buffer.from(h.parent, 'utf16le').swap16().copy(b, 512 + 64, 0, 512); // UTF-16BE
    h.locators.forEach((l, i) => {
      const e = 512 + 576 + i * 24;
      b.write(l.code, e, 'latin1'); b.writeUInt32BE(l.len, e + 8); b.writeBigUInt64BE(l.off, e + 16);
      if (l.off < 3500n) Buffer.from(l.name, 'utf16le').copy(b, Number(l.off));
    });
    return b;
  });

const arbVhdx = fc.tuple(fc.uint8Array({ maxLength: 256 }), fc.nat(0x40000)).map(([junk, at]) => {
  const b = Buffer.alloc(0x40000 + 512);
  b.write('vhdxfile', 0, 'latin1');
  b.write('regi', 192 * 1024, 'latin1');
  Buffer.from(junk).copy(b, Math.min(at, b.length - junk.length));
  return b;
});

/** One random image file's bytes. */
export const arbImageFile: fc.Arbitrary<Buffer> = fc.oneof(arbQcow2, arbVmdk, arbVhd, arbVhdx, fc.uint8Array({ maxLength: 1024 }).map((a) => Buffer.from(a)));

/** A GUID as VHDX stores it (first three groups little endian). */
function guidBytes(s: string): Buffer {
  const b = Buffer.from(s.replace(/-/g, ''), 'hex');
  b.subarray(0, 4).reverse(); b.subarray(4, 6).reverse(); b.subarray(6, 8).reverse();
  return b;
}

/** A VHDX (made by qemu-img) turned differencing: HasParent set in its file parameters and a parent locator
 *  (relative_path = `parent`) added to the metadata table, its data in the metadata region's unused space. */
export function differencingVhdx(file: string, parent: string): string {
  qemuImg(['create', '-q', '-f', 'vhdx', file, '1M']);
  const b = readFileSync(file);
  const rt = 192 * 1024;
  const metaGuid = guidBytes('8B7CA206-4790-4B9A-B8FE-575F050F886E');
  let meta = -1;
  for (let i = 0; i < b.readUInt32LE(rt + 8); i++) if (b.subarray(rt + 16 + i * 32, rt + 32 + i * 32).equals(metaGuid)) meta = Number(b.readBigUInt64LE(rt + 32 + i * 32));
  if (meta < 0) throw new Error('no metadata region in the VHDX qemu-img made');
  const count = b.readUInt16LE(meta + 10);
  const fileParams = guidBytes('CAA16737-FA36-4D43-B3B6-33F0AA44E76B');
  for (let i = 0; i < count; i++) {
    const e = meta + 32 + i * 32;
    if (b.subarray(e, e + 16).equals(fileParams)) { const at = meta + b.readUInt32LE(e + 16); b.writeUInt32LE(b.readUInt32LE(at + 4) | 2, at + 4); }
  }
  const locOff = 0x40000; // relative to the metadata region; qemu-img's items lie below
  const key = Buffer.from('relative_path', 'utf16le');
  const value = Buffer.from(parent, 'utf16le');
  const loc = Buffer.alloc(32 + key.length + value.length);
  guidBytes('B04AEFB7-D19E-4A81-B789-25B8E9445913').copy(loc, 0);
  loc.writeUInt16LE(1, 18);
  loc.writeUInt32LE(32, 20); loc.writeUInt32LE(32 + key.length, 24); loc.writeUInt16LE(key.length, 28); loc.writeUInt16LE(value.length, 30);
  key.copy(loc, 32); value.copy(loc, 32 + key.length);
  loc.copy(b, meta + locOff);
  const e = meta + 32 + count * 32;
  guidBytes('A8D35F2D-B30B-454D-ABF7-D3D84834AB0C').copy(b, e);
  b.writeUInt32LE(locOff, e + 16); b.writeUInt32LE(loc.length, e + 20); b.writeUInt32LE(4, e + 24); // IsRequired
  b.writeUInt16LE(count + 1, meta + 10);
  writeFileSync(file, b);
  return file;
}
