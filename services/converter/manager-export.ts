// ferry-convert `command: manager_export`: the VM named by vm_name is exported from manager_host with the same
// code as the workers' export jobs (domain/vsphere/export.ts), into conversion_dir (default
// <output_dir>/.ferry-export/<vm_name>); its manifest's disks and VM facts then go through the local pipeline.
import path from 'node:path';
import { ConfigError, type MigrationSettings } from '../../domain/schemas/converter-config';
import type { Manifest } from '../../domain/schemas/manifest';
import { managerFor } from '../../domain/vsphere/client';
import { resolveCredentials } from '../../domain/vsphere/credentials';
import { VsphereError } from '../../domain/vsphere/errors';
import { exportVm, ExportResult } from '../../domain/vsphere/export';
import { pathByName } from '../../domain/vsphere/inventory';

export async function exportForConvert(
  s: MigrationSettings, baseDir: string, progress: (pct: number, msg: string) => void, log: (msg: string) => void,
): Promise<ExportResult> {
  if (!s.output_dir) throw new ConfigError('output_dir is required in mode manager_export', [{ path: 'output_dir', message: 'is required' }]);
  // manager_user / manager_password fall back to GOVC_USERNAME / GOVC_PASSWORD (with ${ENV} in the file too).
  const creds = resolveCredentials(
    { manager_url: s.manager_host, username: s.manager_user, password: s.manager_password, insecure: s.manager_insecure },
    process.env,
    true,
  );
  const m = managerFor(creds);
  const vmPath = s.vm_path ?? await pathByName(m, s.vm_name!); // the schema requires vm_name in this mode
  const dir = path.resolve(baseDir, s.conversion_dir || path.join(s.output_dir, '.ferry-export', String(s.vm_name)));
  log(`exporting ${vmPath} from ${m.name} into ${dir} with ${s.parallel_streams ?? 4} stream(s)`);
  try {
    return await exportVm({
      creds, vmPath, outputDir: dir, exportId: `ferry-convert:${vmPath}`, parallel: s.parallel_streams ?? 4,
      removeCdrom: s.remove_cdrom, powerOff: s.power_off, signal: new AbortController().signal,
      onAction: (msg) => log(msg),
      onProgress: (p) => {
        if (p.phase === 'exporting') {
          progress(Math.floor(p.percent_complete), `export: ${p.files_downloaded}/${p.total_files} files, `
            + `${(p.bytes_downloaded / 1048576).toFixed(1)} of ${(p.total_bytes / 1048576).toFixed(1)} MiB`);
        }
      },
    });
  } catch (e) {
    if (e instanceof VsphereError) throw new Error(e.message, { cause: e });
    throw e;
  }
}

/** The local pipeline's manifest (from the config's settings) with the export's disks and VM facts. */
export function withExport(m: Manifest, exported: ExportResult): Manifest {
  const e = exported.manifest as Manifest; // the manifest seed, built by domain/vsphere/export-manifest.ts
  return {
    ...m, source: e.source, vm: e.vm, nics: e.nics, notes: e.notes, warnings: [...(m.warnings || []), ...(e.warnings || [])],
    disks: e.disks, metadata: e.metadata,
  };
}
