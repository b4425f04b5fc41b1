// Operation "virt_files" (internal: the daemon's POST /import/kvm, /virt/template/export and /virt/volume/upload when
// FERRY_LIBVIRT_VIA=worker, orchestration/virsh-jobs.ts): routes that read or write host files and run qemu-img, run whole
// here against one of the operator's URIs. The body is validated again with the route's own schema and its paths
// confined to this worker's roots (the daemon checked its own before queueing). A refusal keeps its status, text
// and field (routeWork), so the daemon answers what it answers running the route itself. What an import makes goes
// into the job's ledger: a job the daemon cancels at its bound leaves nothing (cleanupImport).
import { jobUri } from '../../../domain/libvirt/uri';
import { Virsh } from '../../../domain/libvirt/virsh';
import { importRequest } from '../../../domain/libvirt/import';
import { exportTemplate } from '../../../domain/libvirt/templates';
import { importKvmBody, templateExportBody, volumeUploadBody, type ImportKvmInput } from '../../../domain/schemas/virt';
import { uploadVolume } from '../../../domain/libvirt/volumes';
import { validate } from '../../../platform/http';
import { routeWork } from './virt-clone';
import type { Operation } from './types';

/** The parameters as domain/operations.ts's virt_files schema gives them. */
type VirtFilesParameters = { uri: string; action: 'import_kvm' | 'template_export' | 'volume_upload'; body: Record<string, unknown> };

export const virtFiles: Operation = async (ctx) => {
  const p = ctx.spec.parameters as VirtFilesParameters;
  const v = new Virsh(jobUri(p.uri, 'parameters.uri')); // again here: the worker's own FERRY_LIBVIRT_URIS decide
  if (p.action === 'volume_upload') {
    return routeWork(ctx, () => uploadVolume(v, validate<Parameters<typeof uploadVolume>[1]>(volumeUploadBody, p.body, 'body')));
  }
  if (p.action === 'template_export') {
    return routeWork(ctx, () => exportTemplate(v, validate<Parameters<typeof exportTemplate>[1]>(templateExportBody, p.body, 'body')));
  }
  return { ...await routeWork(ctx, () => importRequest(v, validate<ImportKvmInput>(importKvmBody, p.body, 'body'), ctx.ledger)) };
};
