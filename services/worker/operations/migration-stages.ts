// THE SEAM for the stages of a migration job (daemon API shape B) after its export: convert and repair the
// exported disks (the `migrate` pipeline, from the manifest) and import them into the destination host
// (libvirt). The libvirt work (branch `libvirt`) replaces `afterExport` with the real stages; until then a
// migration job stops after a complete export with a clear, final reason, and the exported disks and their
// manifest stay where the result says, ready for a `migrate` job.
import { OperationError } from '../../../shared/errors';
import type { ExportResult } from '../../../shared/vsphere/export';
import type { OpContext } from './types';

export interface AfterExportInput {
  /** the export stage's result: manifest_path, manifest, files with sha256 */
  exported: ExportResult;
  /** the job's destination: type (kvm), virt_uri */
  destination: { type: string; virt_uri?: string };
  network_mapping: Record<string, string>;
  conversion_method?: string;
}

export async function afterExport(ctx: OpContext, input: AfterExportInput): Promise<Record<string, unknown>> {
  void ctx;
  throw new OperationError(`the export of ${input.exported.vm_path} is complete (manifest ${input.exported.manifest_path}), but the conversion and import stages into ${input.destination.type}${input.destination.virt_uri ? ` at ${input.destination.virt_uri}` : ''} are not part of this build yet; run a migrate job with that manifest`, false);
}
