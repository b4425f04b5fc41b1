// Images an attacker would hand Ferry, made with qemu-img where it can make them (-u: the backing name is written
// as given, never opened) and by hand where it cannot (a differencing VHD; qemu-img makes none).
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

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
