// The stages of a migration job (daemon API shape B) after its export, on the same worker and the same progress
// stream: the exported disks go through the `migrate` pipeline (inspect, every guest repair, convert to qcow2,
// validate; the source files are never changed), are imported into the destination's storage pool as a domain
// (virtio disk and NIC, the manifest's firmware, networks mapped through options.network_mapping), and the domain
// is started with its console watched from the first instruction. The job completes only when that console
// shows the boot milestone (options.virt_test.expect, else Linux's); a failed boot fails the job, with the domain
// left defined and shut off for a look.
import path from 'node:path';
import { OperationError } from '../../../platform/errors';
import { promises as fs } from 'node:fs';
import { defaultPool, importForMigration, Virsh, watchFromStart } from '../../../domain/libvirt';
import { writeManifest } from '../../../domain/vsphere/export-manifest';
import { mergeIntoPool, pipelineManifest, type BlockCheck } from './one-pass';
import { finishBesideCopy, type BesideCopy } from './repair-beside-copy';
import type { BlockHashes } from '../../../domain/vsphere/block-hash';
import { jobUri } from '../../../domain/libvirt/uri';
import { jobPattern } from '../../../platform/linear-regex';
import { validateManifest } from '../../../domain/schemas/manifest';
import type { ExportResult } from '../../../domain/vsphere/export';
import { testBootLibvirt } from '../../../domain/converter/testboot';
import { migrateManifest, repairParameters } from './migrate';
import { clearEarlierAttempts, finalRefusal } from './import';
import { mergeIntoRemotePool } from './remote-one-pass';
import type { OpContext } from './types';
import { dropped } from '../../../platform/log';

export interface AfterExportInput {
  /** the export stage's result: manifest_path, manifest, files with sha256 */
  exported: ExportResult;
  /** the job's destination: type (kvm), virt_uri */
  destination: { type: string; virt_uri?: string };
  network_mapping: Record<string, string>;
  /** the target storage pool (a plan's storage_map); default FERRY_LIBVIRT_POOL */
  pool?: string;
  /** the domain's name (a plan's options.target_name); default the VM's */
  domain_name?: string;
  conversion_method?: string;
  virt_test?: { expect?: string; timeout_seconds?: number };
  /** The repair started beside the copy (repair-beside-copy.ts); without it the repair runs here, after the copy. */
  beside?: BesideCopy;
}

/** How each exported disk's bytes travelled (the manifest's data_path, domain/vsphere/export-manifest.ts). */
type DataPath =
  | { mode: 'one_pass'; volume: string; format: 'raw'; blocks?: BlockHashes; source: string; verified?: string; block_check?: BlockCheck; virt_uri?: string }
  | { mode: 'export_folder'; reason: string };
type ExportedDisk = { id: string; label?: string; data_path?: DataPath };

/** The repair (and, without one pass, the conversion) of the exported disks, then each disk as the import takes
 *  it: converted in the export folder (today's path), or already in the pool (one pass: mergeIntoPool). */
async function repairDisks(ctx: OpContext, input: AfterExportInput, dir: string, v: Virsh) {
  const disks = (input.exported.manifest as { disks: ExportedDisk[] }).disks;
  const volumes = disks.map((d) => (d.data_path?.mode === 'one_pass' ? d.data_path.volume : undefined));
  const manifest = pipelineManifest(input.exported.manifest, dir, volumes);
  // migrate's result is the pipeline's report (runPipeline); one pass's volumes are Ferry's own, not job input.
  const report = input.beside
    ? await finishBesideCopy(ctx, input.beside)
    : await migrateManifest({ ...ctx, spec: { ...ctx.spec, parameters: repairParameters(ctx, manifest) } }, new Set(volumes.filter((x): x is string => !!x)));
  const artifacts = [...(report.artifacts as { disk_id: string; path: string; format: string; boot_order: number; modified_by_fix?: boolean }[])]
    .sort((a, b) => a.boot_order - b.boot_order);
  // What an earlier attempt made goes, except the volumes this attempt resumed into and has just repaired.
  await clearEarlierAttempts(ctx, 'import', new Set(volumes.filter((x): x is string => !!x)));
  if (!volumes.some(Boolean)) return { report, importDisks: artifacts.map((a) => ({ path: a.path, format: a.format })), dataPath: disks };
  const index = new Map(disks.map((d, i) => [d.id, i]));
  const merging = artifacts.map((a) => {
    const dp = disks[index.get(a.disk_id)!].data_path;
    return { overlay: a.path, volume: volumes[index.get(a.disk_id)!], modified: !!a.modified_by_fix, blocks: dp?.mode === 'one_pass' ? dp.blocks : undefined };
  });
  const merged = await mergeDisks(ctx, input, dir, v, disks, merging);
  const checks = new Map(merged.map((m) => [m.path, m.check]));
  const verified = disks.map((d) => (d.data_path?.mode === 'one_pass'
    ? { ...d, data_path: { ...d.data_path, ...verifiedBy(checks.get(d.data_path.volume)) } }
    : d));
  await recordDataPath(input.exported.manifest_path, report.report_path, verified);
  return { report, importDisks: merged.map((m) => ({ path: m.path, format: m.format, inPool: m.inPool })), dataPath: verified };
}

/** The repaired disks into the pool: on this host (mergeIntoPool), or uploaded onto another one (the volumes' data
 *  path names its URI: remote-one-pass.ts), whose readers of the source stop once the repair is uploaded. */
async function mergeDisks(ctx: OpContext, input: AfterExportInput, dir: string, v: Virsh, disks: ExportedDisk[],
  merging: Parameters<typeof mergeIntoPool>[2]) {
  const pool = input.pool || defaultPool();
  if (!disks.some((d) => d.data_path?.mode === 'one_pass' && d.data_path.virt_uri)) {
    return mergeIntoPool(ctx, { virtUri: v.uri, pool, poolDir: path.dirname(merging.find((m) => m.volume)!.volume!) }, merging);
  }
  try {
    return await mergeIntoRemotePool(ctx, { v, pool, dir }, merging);
  } finally {
    await input.beside?.stop();
  }
}

/** What a one-pass disk's block check showed, in words and figures (docs/pipeline.md, "Shape B: one pass (issue 36)", its Integrity item). */
function verifiedBy(c: BlockCheck | undefined): { verified: string; block_check?: BlockCheck } {
  if (!c) return { verified: 'not checked: this export recorded no block hash list' };
  const wrote = c.repair_written.length;
  return {
    verified: `every block (${c.blocks} of ${c.block_bytes} bytes) re-hashed from the volume matches the bytes as served: `
      + `the ${wrote} the repair wrote before its merge, the other ${c.checked_after_merge} after it`,
    block_check: c,
  };
}

/** A data path without its block hash list (thousands of entries on a large disk; the manifest keeps it). */
const withoutList = (p: DataPath | undefined) => (p?.mode === 'one_pass' ? { ...p, blocks: undefined } : p);

/** The data path and its integrity check into the manifest and report.json, for a user who reads them later (the
 *  block hash list itself stays in the manifest, where the export put it; the job result and the report carry the
 *  check). */
async function recordDataPath(manifestPath: string, reportPath: string | undefined, disks: ExportedDisk[]) {
  const m = JSON.parse(await fs.readFile(manifestPath, 'utf8')) as { disks: ExportedDisk[] };
  m.disks = m.disks.map((d, i) => ({ ...d, data_path: disks[i].data_path }));
  await writeManifest(path.dirname(manifestPath), m);
  if (!reportPath) return;
  const r = JSON.parse(await fs.readFile(reportPath, 'utf8')) as Record<string, unknown>;
  r.data_path = disks.map((d) => ({ disk_id: d.id, label: d.label, ...withoutList(d.data_path) }));
  await fs.writeFile(`${reportPath}.tmp`, JSON.stringify(r, null, 2));
  await fs.rename(`${reportPath}.tmp`, reportPath);
}

type Repaired = Awaited<ReturnType<typeof repairDisks>>;
type Imported = Awaited<ReturnType<typeof importForMigration>>;
type Exported = ReturnType<typeof validateManifest>;

/** The repaired disks defined as a domain on the destination, named after the VM unless the job names it. */
async function importStage(ctx: OpContext, input: AfterExportInput, exported: Exported, dir: string, v: Virsh, { report, importDisks }: Repaired) {
  const vmName: unknown = exported.source?.vm_name;
  const name = input.domain_name || (typeof vmName === 'string' && vmName ? vmName : path.basename(dir));
  const nics = (exported.nics || []).filter((n) => n.network); // a NIC on no network gets none on KVM either
  await ctx.progress('import', 0, `importing ${name} into ${v.uri}`);
  const imported = await importForMigration({
    virtUri: v.uri, name, disks: importDisks,
    memoryMiB: (exported.vm?.mem_gb || 1) * 1024, cpus: exported.vm?.cpu || 1,
    sourceNetworks: nics.map((n) => n.network!), sourceMacs: nics.map((n) => n.mac),
    // The firmware the conversion found the guest needs (report.firmware), else the VM's own.
    networkMapping: input.network_mapping, pool: input.pool, firmware: report.firmware?.firmware ?? (exported.vm?.firmware === 'uefi' ? 'uefi' : 'bios'),
    onProgress: (stage, pct) => void ctx.progress('import', Math.min(99, pct), stage), ledger: ctx.ledger,
  }).catch(finalRefusal);
  await ctx.progress('import', 100, `domain ${imported.domain} (${imported.uuid}) defined on ${v.uri}`);
  return imported;
}

/** The first start of the imported domain is the test boot: paused, console attached, resumed, judged. A domain
 *  that does not boot fails the job and is left defined and shut off, its console kept. */
async function bootStage(ctx: OpContext, input: AfterExportInput, dir: string, v: Virsh, imported: Imported) {
  const vt = input.virt_test || {};
  const consoleLog = path.join(dir, `${imported.domain}.console.log`);
  await ctx.progress('boot', 0, `starting ${imported.domain} and watching its serial console`);
  // By its UUID from here on: the one identity of this domain virsh cannot resolve to another.
  await v.run(['start', '--paused', imported.uuid]);
  const boot = await testBootLibvirt(
    {
      disks: [], firmware: imported.firmware, expect: vt.expect ? jobPattern(vt.expect, 'options.virt_test.expect') : undefined,
      timeoutSeconds: vt.timeout_seconds ?? 600, signal: ctx.signal, consoleLog,
    },
    v,
    async function* (signal) { yield* watchFromStart(v, imported.uuid, signal); return { domain_type: imported.domain_type }; },
  );
  if (boot.status !== 'passed') {
    await v.run(['destroy', imported.uuid]).catch(dropped(ctx.log, 'the domain is already off when it stopped by itself', { domain: imported.domain }));
    throw new OperationError(`the imported domain ${imported.domain} on ${v.uri} did not boot (${boot.status}): ${boot.detail}; `
      + `it is left defined and shut off, its console in ${consoleLog}`, false);
  }
  await ctx.progress('boot', 100, `${imported.domain} is running: ${boot.detail}`);
  return boot;
}

/** The migrate job's result: the domain, its boot, and what the export, the data path and the repair did. */
function migrationResult(input: AfterExportInput, exported: Exported, v: Virsh, { report, dataPath }: Repaired, imported: Imported,
  boot: Awaited<ReturnType<typeof bootStage>>): Record<string, unknown> {
  const e = input.exported;
  return {
    success: true, domain: imported.domain, uuid: imported.uuid, virt_uri: v.uri, pool: imported.pool, volumes: imported.volumes,
    firmware: imported.firmware,
    firmware_reason: report.firmware?.reason ?? `the VM's firmware (manifest vm.firmware ${exported.vm?.firmware ?? 'not given'})`,
    domain_type: imported.domain_type, boot,
    export: {
      manifest_path: e.manifest_path, files: e.files, total_bytes: e.total_bytes, resumes: e.resumes,
      bytes_refetched: e.bytes_refetched, bytes_rehashed: e.bytes_rehashed, bytes_sparse: e.bytes_sparse,
    },
    data_path: dataPath.map((d) => ({ disk_id: d.id, label: d.label, ...withoutList(d.data_path) })),
    conversion: { report_path: report.report_path, artifacts: report.artifacts, summary: report.summary, warnings: report.warnings },
  };
}

/** After the export: the repair, the import and the test boot, in that order. */
export async function afterExport(ctx: OpContext, input: AfterExportInput): Promise<Record<string, unknown>> {
  const exported = validateManifest(input.exported.manifest);
  const dir = path.dirname(input.exported.manifest_path);
  const v = new Virsh(jobUri(input.destination.virt_uri, 'destination.virt_uri'));
  const repaired = await repairDisks(ctx, input, dir, v);
  const imported = await importStage(ctx, input, exported, dir, v, repaired);
  const boot = await bootStage(ctx, input, dir, v, imported);
  return migrationResult(input, exported, v, repaired, imported, boot);
}
