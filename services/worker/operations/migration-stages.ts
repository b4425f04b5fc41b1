// The stages of a migration job (daemon API shape B) after its export, on the same worker and the same progress
// stream: the exported disks go through the `migrate` pipeline (inspect, every guest repair, convert to qcow2,
// validate; the source files are never changed), are imported into the destination's storage pool as a domain
// (virtio disk and NIC, the manifest's firmware, networks mapped through options.network_mapping), and the domain
// is started with its console watched from the first instruction. The job completes only when that console
// shows the boot milestone (options.virt_test.expect, else Linux's); a failed boot fails the job, with the domain
// left defined and shut off for a look.
import path from 'node:path';
import { OperationError } from '../../../shared/errors';
import { importForMigration, Virsh, watchFromStart } from '../../../shared/libvirt';
import { jobUri } from '../../../shared/libvirt/uri';
import { jobPattern } from '../../../shared/linear-regex';
import { validateManifest } from '../../../shared/schemas/manifest';
import type { ExportResult } from '../../../shared/vsphere/export';
import { testBootLibvirt } from '../../../shared/converter/testboot';
import { MIGRATION_REPAIR } from '../../../shared/converter/guest';
import { migrate } from './migrate';
import { clearEarlierAttempts, finalRefusal } from './import';
import type { PipelineReport } from '../../../shared/converter/stages/report';
import type { OpContext } from './types';
import { dropped } from '../../../shared/log';

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
}

export async function afterExport(ctx: OpContext, input: AfterExportInput): Promise<Record<string, unknown>> {
  const exported = validateManifest(input.exported.manifest);
  const dir = path.dirname(input.exported.manifest_path);
  // Every repair a VMware guest needs on KVM; the outputs beside the export, in qcow2.
  const manifest = validateManifest({
    ...input.exported.manifest,
    pipeline: {
      inspect: { enabled: true }, convert: { enabled: true }, validate: { enabled: true },
      fix: MIGRATION_REPAIR,
    },
    output: { directory: path.join(dir, 'converted'), format: 'qcow2' },
  });
  // migrate's result is the pipeline's report (runPipeline).
  const report = await migrate({ ...ctx, spec: { ...ctx.spec, parameters: { manifest, overwrite: false } } }) as PipelineReport;
  const artifacts = [...(report.artifacts as { path: string; format: string; boot_order: number }[])].sort((a, b) => a.boot_order - b.boot_order);

  const v = new Virsh(jobUri(input.destination.virt_uri, 'destination.virt_uri'));
  const vmName: unknown = exported.source?.vm_name;
  const name = input.domain_name || (typeof vmName === 'string' && vmName ? vmName : path.basename(dir));
  const nics = (exported.nics || []).filter((n) => n.network); // a NIC on no network gets none on KVM either
  await clearEarlierAttempts(ctx, 'import');
  await ctx.progress('import', 0, `importing ${name} into ${v.uri}`);
  const imported = await importForMigration({
    virtUri: v.uri, name, disks: artifacts.map((a) => ({ path: a.path, format: a.format })),
    memoryMiB: (exported.vm?.mem_gb || 1) * 1024, cpus: exported.vm?.cpu || 1,
    sourceNetworks: nics.map((n) => n.network!), sourceMacs: nics.map((n) => n.mac),
    // The firmware the conversion found the guest needs (report.firmware), else the VM's own.
    networkMapping: input.network_mapping, pool: input.pool, firmware: report.firmware?.firmware ?? (exported.vm?.firmware === 'uefi' ? 'uefi' : 'bios'),
    onProgress: (stage, pct) => void ctx.progress('import', Math.min(99, pct), stage), ledger: ctx.ledger,
  }).catch(finalRefusal);
  await ctx.progress('import', 100, `domain ${imported.domain} (${imported.uuid}) defined on ${v.uri}`);

  // The first start of the imported domain is the test boot: paused, console attached, resumed, judged.
  const vt = input.virt_test || {};
  await ctx.progress('boot', 0, `starting ${imported.domain} and watching its serial console`);
  // By its UUID from here on: the one identity of this domain virsh cannot resolve to another.
  await v.run(['start', '--paused', imported.uuid]);
  const boot = await testBootLibvirt(
    { disks: [], firmware: imported.firmware, expect: vt.expect ? jobPattern(vt.expect, 'options.virt_test.expect') : undefined, timeoutSeconds: vt.timeout_seconds ?? 600, signal: ctx.signal, consoleLog: path.join(dir, `${imported.domain}.console.log`) },
    v,
    async function* (signal) { yield* watchFromStart(v, imported.uuid, signal); return { domain_type: imported.domain_type }; },
  );
  if (boot.status !== 'passed') {
    await v.run(['destroy', imported.uuid]).catch(dropped(ctx.log, 'the domain is already off when it stopped by itself', { domain: imported.domain }));
    throw new OperationError(`the imported domain ${imported.domain} on ${v.uri} did not boot (${boot.status}): ${boot.detail}; it is left defined and shut off, its console in ${path.join(dir, `${imported.domain}.console.log`)}`, false);
  }
  await ctx.progress('boot', 100, `${imported.domain} is running: ${boot.detail}`);
  return {
    success: true, domain: imported.domain, uuid: imported.uuid, virt_uri: v.uri, pool: imported.pool, volumes: imported.volumes,
    firmware: imported.firmware, firmware_reason: report.firmware?.reason ?? `the VM's firmware (manifest vm.firmware ${exported.vm?.firmware ?? 'not given'})`, domain_type: imported.domain_type, boot,
    export: { manifest_path: input.exported.manifest_path, files: input.exported.files, total_bytes: input.exported.total_bytes, resumes: input.exported.resumes, bytes_refetched: input.exported.bytes_refetched },
    conversion: { report_path: report.report_path, artifacts: report.artifacts, summary: report.summary, warnings: report.warnings },
  };
}
