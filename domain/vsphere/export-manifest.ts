// The artifact manifest of an export (manifest seed, validated by domain/schemas/manifest.ts): what the VM is
// (CPU, memory, firmware, OS hint, NICs) and each disk with every file of its chain and their checksums.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { config } from '../../platform/config';
import { validateManifest } from '../schemas/manifest';
import type { VmDetail } from './inventory';
import type { RemoteFile } from './download';
import type { BlockHashes } from './block-hash';

export const MANIFEST_FILE = 'manifest.json';

export interface PlannedDisk {
  disk: VmDetail['disks'][number]; top: RemoteFile; files: RemoteFile[]; chainLength: number;
  /** The one flat extent that holds the disk's bytes as they are (byte i of the disk is byte i of the file): what
   *  one pass can write straight into a raw target volume (extent.target, set by ExportRequest.place). */
  extent?: RemoteFile;
  /** Why this disk goes through the export folder instead (docs/pipeline.md, one pass). */
  fallback?: string;
}

/** By local path: a file's sha256, or a one-pass extent's block hash list (its only record: block-hash.ts). */
type Sums = Map<string, { sha256?: string; blocks?: BlockHashes }>;
/** A record's sha256 as a field, or nothing (a one-pass extent has none). */
export const sha256Of = (s: { sha256?: string }) => (s.sha256 ? { sha256: s.sha256 } : {});

/** The manifest's account of how a disk's bytes travel (docs/pipeline.md, one pass): straight into `volume`
 *  (raw), its block hash list (`blocks`, block-hash.ts) taken over the bytes as they were served, in disk order;
 *  or through the export folder. */
export function dataPath(x: PlannedDisk, sums: Sums) {
  if (x.extent?.target) {
    const sum = sums.get(x.extent.local)!;
    return { mode: 'one_pass', volume: x.extent.target, format: 'raw', blocks: sum.blocks,
      source: `[${x.extent.datastore}] ${x.extent.path}`, ...(x.extent.remote ? { virt_uri: x.extent.remote.uri } : {}) };
  }
  return { mode: 'export_folder', reason: x.fallback ?? 'one pass was not asked for' };
}

export function osHint(guestId: string): string {
  if (/^win/i.test(guestId)) return 'windows';
  if (/linux|ubuntu|debian|rhel|centos|sles|fedora|oracle|photon|coreos|mandr|suse|asianux|turbo|amazon|rocky|alma/i.test(guestId)) return 'linux';
  return 'unknown';
}

export interface ManifestInput {
  d: VmDetail; disks: PlannedDisk[]; sums: Sums; notes: string[]; warnings: string[]; exportId: string;
}

export function buildManifest({ d, disks, sums, notes, warnings, exportId }: ManifestInput) {
  const fw = d.firmware === 'efi' ? 'uefi' : d.firmware === 'bios' ? 'bios' : 'unknown';
  const now = new Date().toISOString();
  return {
    manifest_version: '1.0',
    source: { provider: 'vsphere', vm_id: d.instance_uuid || d.uuid, vm_name: d.name, datacenter: d.datacenter, export_timestamp: now,
      export_method: 'datastore-http' },
    vm: { cpu: Math.max(1, d.hardware.num_cpu), mem_gb: Math.max(1, Math.round(d.hardware.memory_mb / 1024)), firmware: fw, os_hint: osHint(d.guest_id),
      ...(d.guest_os ? { os_version: d.guest_os } : {}) },
    disks: disks.map((x, i) => ({
      id: `disk-${i}`, source_format: 'vmdk', bytes: x.disk.capacity_bytes, local_path: x.top.local,
      ...(sums.get(x.top.local)?.sha256 ? { checksum: `sha256:${sums.get(x.top.local)!.sha256}` } : {}),
      boot_order_hint: i, label: x.disk.label, disk_type: i === 0 ? 'boot' : 'data',
      // Beyond the seed (unknown keys are allowed): every file of the disk with its checksum, and its datastore path.
      source_path: x.disk.file_path, chain_length: x.chainLength, data_path: dataPath(x, sums),
      files: x.files.map((f) => ({ path: f.local, datastore_path: `[${f.datastore}] ${f.path}`, bytes: f.size, ...sha256Of(sums.get(f.local)!) })),
    })),
    nics: d.nics.map((n) => ({ id: n.label, mac: n.mac, network: n.network, adapter: n.adapter })),
    notes,
    warnings: warnings.map((message) => ({ stage: 'export', message, timestamp: now })),
    metadata: { sdk_version: `ferry ${config.version}`, job_id: exportId, created_at: now },
  };
}

/** Validated against Ferry's own schema (what a migrate job will check again), then written under a temporary
 *  name and renamed, so a reader never sees half of it. Returns its path. */
export async function writeManifest(outputDir: string, manifest: Record<string, unknown>): Promise<string> {
  validateManifest(manifest);
  const mp = path.join(outputDir, MANIFEST_FILE);
  await fs.writeFile(`${mp}.tmp`, JSON.stringify(manifest, null, 2));
  await fs.rename(`${mp}.tmp`, mp);
  return mp;
}

/** The manifest the repair beside the copy starts from (services/worker/operations/repair-beside-copy.ts), before
 *  any byte is copied: the VM as the manifest describes it, each disk's local_path its target volume, and no
 *  checksums (the copy computes them; the block check after the merge holds the repair to them). */
export function repairManifest(d: VmDetail, disks: PlannedDisk[], exportId: string) {
  const none = '0'.repeat(64); // placeholders for buildManifest's checksums, removed below
  const sums: Sums = new Map(disks.flatMap((x) => x.files.map((f) => [f.local, { sha256: none }] as const)));
  const m = buildManifest({ d, disks, sums, notes: ['the repair beside the copy: read from the source through nbdkit while the copy writes the volumes'],
    warnings: [], exportId });
  return { ...m, disks: m.disks.map((x, i) => ({ ...x, local_path: disks[i].extent?.target ?? x.local_path, source_format: 'raw', checksum: undefined,
    files: undefined, data_path: undefined })) };
}
