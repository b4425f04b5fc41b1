// What files make up a VMDK on a datastore, read from its descriptor: a text descriptor names its extents
// (monolithicFlat's -flat file, twoGbMaxExtent's -s001.. files, VMFS -flat, delta and sesparse extents) and
// its parent (parentFileNameHint) for a snapshot chain; a binary sparse file (KDMV magic) is self-contained
// and may embed a descriptor with a parent hint. Only the first bytes of a file are needed to know.
export interface DescriptorInfo {
  /** 'text': a descriptor file; 'sparse': a hosted sparse file with an embedded descriptor; 'other': neither. */
  kind: 'text' | 'sparse' | 'other';
  createType?: string;
  extents: { access: string; sectors: number; type: string; file: string; offset?: number }[];
  parentHint?: string;
}

export const SNIFF_BYTES = 64 * 1024;

function parseDescriptorText(t: string): Omit<DescriptorInfo, 'kind'> {
  const extents: DescriptorInfo['extents'] = [];
  let createType: string | undefined;
  let parentHint: string | undefined;
  for (const raw of t.split(/\r?\n/)) {
    const line = raw.replace(/\0+$/, '').trim();
    if (!line || line.startsWith('#')) continue;
    const kv = /^([A-Za-z.]+)\s*=\s*"?([^"]*)"?\s*$/.exec(line);
    if (kv) {
      if (kv[1] === 'createType') createType = kv[2];
      if (kv[1] === 'parentFileNameHint') parentHint = kv[2];
      continue;
    }
    const ex = /^(RW|RDONLY|NOACCESS)\s+(\d+)\s+(\w+)(?:\s+"([^"]+)")?(?:\s+(\d+))?/.exec(line);
    if (ex && ex[4]) extents.push({ access: ex[1], sectors: Number(ex[2]), type: ex[3], file: ex[4], ...(ex[5] ? { offset: Number(ex[5]) } : {}) });
  }
  return { createType, extents, parentHint };
}

/** Reads the first bytes of a VMDK file (at most SNIFF_BYTES; for a sparse file the embedded descriptor must
 *  lie within them, which is where qemu-img and VMware put it). */
export function sniffVmdk(head: Buffer): DescriptorInfo {
  if (head.length >= 4 && head.subarray(0, 4).toString('latin1') === 'KDMV') {
    // Hosted sparse header: descriptorOffset and descriptorSize in sectors at bytes 28 and 36 (little endian).
    const off = Number(head.readBigUInt64LE(28)) * 512;
    const size = Number(head.readBigUInt64LE(36)) * 512;
    const desc = off > 0 && size > 0 && off < head.length ? head.subarray(off, Math.min(head.length, off + size)).toString('latin1') : '';
    const p = parseDescriptorText(desc);
    // The extent of a monolithic sparse file is the file itself.
    return { kind: 'sparse', createType: p.createType, extents: [], parentHint: p.parentHint };
  }
  const t = head.toString('latin1');
  if (/^\s*# Disk DescriptorFile/m.test(t.slice(0, 200)) || /createType\s*=/.test(t.slice(0, 4096))) {
    return { kind: 'text', ...parseDescriptorText(t) };
  }
  return { kind: 'other', extents: [] };
}

/** "[ds] dir/file.vmdk" -> { datastore: 'ds', path: 'dir/file.vmdk' }. */
export function parseDatastorePath(p: string): { datastore: string; path: string } {
  const m = /^\[([^\]]+)\]\s*(.*)$/.exec(p.trim());
  if (!m) throw new Error(`not a datastore path: ${p}`);
  return { datastore: m[1], path: m[2] };
}

/** A name in a descriptor, relative to the descriptor's directory (absolute /vmfs/volumes/<ds>/... is mapped). */
export function resolveSibling(descriptor: { datastore: string; path: string }, name: string): { datastore: string; path: string } {
  const vmfs = /^\/vmfs\/volumes\/([^/]+)\/(.+)$/.exec(name);
  if (vmfs) return { datastore: vmfs[1], path: vmfs[2] };
  const dir = descriptor.path.includes('/') ? descriptor.path.slice(0, descriptor.path.lastIndexOf('/') + 1) : '';
  return { datastore: descriptor.datastore, path: dir + name };
}
