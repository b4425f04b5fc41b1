// The artifact manifest of a warm migration's copy (issue 37): the same manifest an export writes (export-manifest.ts),
// each disk already in its raw target volume (one pass's data path), filled by rounds of changed areas rather than
// one download. No sha256 of the whole disk is taken: it would read every byte again while the VM is down; the
// comparison against the source is the tests' (qemu-img compare) and the block check is one pass's alone.
import { osHint, writeManifest } from './export-manifest';
import type { VmDetail } from './inventory';
import type { ExportResult } from './export';
import { config } from '../../platform/config';

export async function buildWarmManifest(
  o: { d: VmDetail; targets: string[]; dir: string; exportId: string; actions: string[]; seconds: number; bytes: number },
): Promise<ExportResult> {
  const { d } = o;
  const now = new Date().toISOString();
  const notes = [`warm migration of ${d.path}: ${o.bytes} bytes copied in rounds of changed areas into ${o.targets.length} raw volume(s)`, ...o.actions];
  const manifest = {
    manifest_version: '1.0',
    source: {
      provider: 'vsphere', vm_id: d.instance_uuid || d.uuid, vm_name: d.name, datacenter: d.datacenter,
      export_timestamp: now, export_method: 'warm-cbt-rounds',
    },
    vm: {
      cpu: Math.max(1, d.hardware.num_cpu),
      mem_gb: Math.max(1, Math.round(d.hardware.memory_mb / 1024)),
      firmware: d.firmware === 'efi' ? 'uefi' : d.firmware === 'bios' ? 'bios' : 'unknown',
      os_hint: osHint(d.guest_id),
      ...(d.guest_os ? { os_version: d.guest_os } : {}),
    },
    disks: d.disks.map((disk, i) => ({
      id: `disk-${i}`, source_format: 'raw', bytes: disk.capacity_bytes, local_path: o.targets[i], boot_order_hint: i, label: disk.label,
      disk_type: i === 0 ? 'boot' : 'data',
      source_path: disk.file_path, chain_length: disk.chain.length,
      data_path: { mode: 'one_pass', volume: o.targets[i], format: 'raw', source: disk.file_path, warm: true },
    })),
    nics: d.nics.map((n) => ({ id: n.label, mac: n.mac, network: n.network, adapter: n.adapter })),
    notes, warnings: [],
    metadata: { sdk_version: `ferry ${config.version}`, job_id: o.exportId, created_at: now },
  };
  const mp = await writeManifest(o.dir, manifest);
  return {
    manifest_path: mp, manifest, vm_path: d.path, files: [], total_bytes: o.bytes, streams: 0, resumes: 0, bytes_refetched: 0, bytes_rehashed: 0,
    bytes_reused: 0, bytes_sparse: 0, actions: o.actions, warnings: [], seconds: o.seconds,
  };
}
