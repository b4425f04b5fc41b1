// fstab rewriting as pure functions: which specs are unstable on KVM, which device they mean inside the
// appliance, and the new text with the original spacing kept. The guest repair (guest.ts) only supplies the
// device identifiers and writes the result back.

import type { FstabMode } from '../schemas/fstab-modes';
export type { FstabMode };

export interface DeviceIds { uuid?: string; partuuid?: string; label?: string }

export interface FstabContext {
  /** Whole-disk devices in the appliance in the guest's disk order: ["/dev/sda", "/dev/sdb"]. */
  disks: string[];
  /** Identifiers of each block device that has a filesystem or swap ("/dev/sda1" -> {uuid, ...}). */
  ids: Record<string, DeviceIds>;
  /** Device of "/" as guest inspection found it; a last resort for an unresolvable root entry. */
  rootDevice?: string;
}

export interface FstabChange { line: number; mountpoint: string; from: string; to: string; device: string }
export interface FstabResult { text: string; changes: FstabChange[]; warnings: string[] }

const PSEUDO_FS = new Set(['proc', 'sysfs', 'tmpfs', 'devpts', 'devtmpfs', 'cgroup', 'cgroup2', 'securityfs', 'debugfs',
  'tracefs', 'configfs', 'fusectl', 'hugetlbfs', 'mqueue', 'pstore', 'bpf', 'efivarfs', 'binfmt_misc', 'autofs',
  'rpc_pipefs', 'nfsd', 'ramfs', 'overlay', 'none', 'nfs', 'nfs4', 'cifs', 'smbfs', 'sshfs', 'fuse', 'fuse.sshfs', 'glusterfs', 'ceph']);

export type SpecKind = 'stable' | 'kernel-name' | 'by-path' | 'by-id' | 'pseudo' | 'other';

/** Classifies the first fstab field (and the type, for pseudo and network filesystems). */
export function classifySpec(spec: string, fstype = ''): SpecKind {
  if (/^(UUID|PARTUUID|LABEL|PARTLABEL)=/i.test(spec)) return 'stable';
  if (PSEUDO_FS.has(fstype) || !spec.startsWith('/dev/')) return 'pseudo';
  if (/^\/dev\/disk\/by-(uuid|label|partuuid|partlabel)\//.test(spec)) return 'stable';
  if (spec.startsWith('/dev/disk/by-path/')) return 'by-path';
  if (spec.startsWith('/dev/disk/by-id/')) return 'by-id';
  if (/^\/dev\/(sd|vd|hd|xvd)[a-z]+\d*$/.test(spec) || /^\/dev\/nvme\d+n\d+(p\d+)?$/.test(spec)) return 'kernel-name';
  return 'other'; // /dev/mapper/*, /dev/<vg>/<lv>, /dev/md0: stable names already
}

/** Disk index from "a", "b" ... "aa" (as the kernel names disks). */
function letterIndex(s: string): number {
  let n = 0;
  for (const c of s) n = n * 26 + (c.charCodeAt(0) - 96);
  return n - 1;
}

const withPart = (disk: string | undefined, part: string | undefined) => disk && (part ? `${disk}${part}` : disk);

/**
 * The appliance device an unstable spec means. Kernel names map by disk order (the source's sdb is the second
 * disk whatever the new bus calls it); by-path uses the SCSI target or ATA/virtio position; by-id falls back to
 * the only disk when there is one.
 */
export function resolveSpec(spec: string, ctx: FstabContext, mountpoint?: string): string | undefined {
  let m = /^\/dev\/(?:sd|vd|hd|xvd)([a-z]+)(\d*)$/.exec(spec);
  const byName = m ? withPart(ctx.disks[letterIndex(m[1])], m[2]) : undefined;
  if (byName) return byName;
  m = /^\/dev\/nvme(\d+)n\d+(?:p(\d+))?$/.exec(spec);
  const byNvme = m ? withPart(ctx.disks[Number(m[1])], m[2]) : undefined;
  if (byNvme) return byNvme;
  if (spec.startsWith('/dev/disk/by-path/')) {
    const part = /-part(\d+)$/.exec(spec)?.[1];
    const scsi = /-scsi-(\d+):(\d+):(\d+):(\d+)/.exec(spec);
    const ata = /-ata-(\d+)/.exec(spec);
    const virtio = /-virtio-pci-[0-9a-f:.]+$|virtio-pci/.test(spec);
    let idx: number | undefined;
    if (scsi) idx = Number(scsi[3]);
    else if (ata) idx = Math.max(0, Number(ata[1]) - 1);
    else if (virtio && ctx.disks.length === 1) idx = 0;
    const dev = idx !== undefined ? withPart(ctx.disks[idx], part) : undefined;
    if (dev) return dev;
  }
  if (spec.startsWith('/dev/disk/by-id/') && ctx.disks.length === 1) {
    return withPart(ctx.disks[0], /-part(\d+)$/.exec(spec)?.[1]);
  }
  if (mountpoint === '/' && ctx.rootDevice) return ctx.rootDevice;
  return undefined;
}

/** Stable replacement for a device: UUID=, else PARTUUID=, else LABEL= (uuid-only: UUID= or nothing). */
export function stableSpec(ids: DeviceIds | undefined, mode: FstabMode): string | undefined {
  if (!ids) return undefined;
  if (ids.uuid) return `UUID=${ids.uuid}`;
  if (mode === 'uuid-only') return undefined;
  if (ids.partuuid) return `PARTUUID=${ids.partuuid}`;
  if (ids.label && !/\s/.test(ids.label)) return `LABEL=${ids.label}`;
  return undefined;
}

function wants(kind: SpecKind, mode: FstabMode): boolean {
  if (mode === 'noop' || mode === 'preserve') return false;
  if (mode === 'bypath-only') return kind === 'by-path';
  return kind === 'kernel-name' || kind === 'by-path' || kind === 'by-id';
}

/** Rewrites `text` for `mode`; comments, blank lines, options and whitespace stay exactly as they were. */
export function rewriteFstab(text: string, mode: FstabMode, ctx: FstabContext): FstabResult {
  const changes: FstabChange[] = [];
  const warnings: string[] = [];
  const lines = text.split('\n');
  const out = lines.map((line, i) => {
    const m = /^(\s*)(\S+)(\s+)(\S+)(?:(\s+)(\S+))?(.*)$/s.exec(line);
    if (!m || m[2].startsWith('#')) return line;
    const [, lead, spec, sp1, mountpoint, , fstype = ''] = m;
    const kind = classifySpec(spec, fstype);
    if (!wants(kind, mode)) return line;
    const device = resolveSpec(spec, ctx, mountpoint);
    if (!device) {
      warnings.push(`fstab line ${i + 1}: cannot tell which device ${spec} (${mountpoint}) is; left unchanged`);
      return line;
    }
    const to = stableSpec(ctx.ids[device], mode);
    if (!to) {
      const wanted = mode === 'uuid-only' ? 'UUID' : 'UUID, PARTUUID or LABEL';
      warnings.push(`fstab line ${i + 1}: ${device} (${spec}, ${mountpoint}) has no ${wanted}; left unchanged`);
      return line;
    }
    changes.push({ line: i + 1, mountpoint, from: spec, to, device });
    return lead + to + sp1 + line.slice(lead.length + spec.length + sp1.length);
  });
  return { text: out.join('\n'), changes, warnings };
}

/**
 * Boot-loader files: kernel-name and by-path `root=` arguments (and `resume=`) become UUID= forms, so the
 * guest finds its root whatever the new bus calls the disk. Returns the new text and what changed.
 */
export function rewriteKernelArgs(text: string, mode: FstabMode, ctx: FstabContext): { text: string; changes: { from: string; to: string }[] } {
  const changes: { from: string; to: string }[] = [];
  const out = text.replace(/\b(root|resume)=(\/dev\/[^\s"']+)/g, (all, key: string, spec: string) => {
    if (!wants(classifySpec(spec), mode === 'noop' || mode === 'preserve' ? mode : 'stabilize-all')) return all;
    const dev = resolveSpec(spec, ctx, key === 'root' ? '/' : undefined);
    const to = dev && stableSpec(ctx.ids[dev], 'uuid-only');
    if (!to) return all;
    changes.push({ from: spec, to });
    return `${key}=${to}`;
  });
  return { text: out, changes };
}
