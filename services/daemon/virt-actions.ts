// The virtualization host's larger actions: batches over many domains, clones and templates, and the
// conversion and import routes (POST /import/kvm, POST /convert/vm). Routes are added with virt-route.ts's adder.
import Joi from 'joi';
import * as S from '../../domain/schemas/virt';
import * as L from '../../domain/libvirt';
import { confineRequestImage } from '../../domain/image-confine';
import type { AddVirt, VirtDeps } from './virt-route';
import { JobVirsh } from '../../orchestration/virsh-jobs';

/** How long a clone route waits for its worker job (FERRY_LIBVIRT_VIA=worker): virt-clone's own bound, per clone. */
const CLONE_MS = 3_600_000;
/** How long an import or a template export waits for its worker job (virt_files): the same hour, as a clone. */
const HOST_WORK_MS = CLONE_MS;

function addBatchRoutes(add: AddVirt, v: L.Virsh) {
  // Batch actions: the seed's batch result object as data.
  const batch = <B extends S.BatchDomains>(op: string, schema: Joi.ObjectSchema<B>, mk: (body: B) => (d: string) => Promise<unknown>) =>
    add('post', 'admin', `/virt/batch/${op}`, `Batch ${op} (result per domain; at most FERRY_VIRT_BATCH_CONCURRENCY at once)`,
      { body: schema }, async ({ body }) => {
        const r = await L.runBatch(op, body.domains, mk(body));
        return [`batch ${op}: ${r.successful} of ${r.total} succeeded`, r];
      });
  batch('start', S.batchStartBody, (b) => L.batchOps.start(v, b));
  batch('stop', S.batchStopBody, (b) => L.batchOps.stop(v, b));
  batch('reboot', S.batchRebootBody, (b) => L.batchOps.reboot(v, b));
  batch('snapshot', S.batchSnapshotBody, (b) => L.batchOps.snapshot(v, b, L.batchStamp()));
  batch('delete', S.batchDeleteBody, (b) => L.batchOps.delete(v, b));
  batch('pause', S.batchDomainsBody, () => L.batchOps.pause(v));
  batch('resume', S.batchDomainsBody, () => L.batchOps.resume(v));
}

function addCloneRoutes(add: AddVirt, v: L.Virsh) {
  // Clones and templates. With FERRY_LIBVIRT_VIA=worker (v a JobVirsh) each runs whole on a worker (virt_clone),
  // where virt-clone is; sealing and customizing on one that also has libguestfs (mount_operations).
  const w = v instanceof JobVirsh ? v : null;
  add('post', 'admin', '/virt/clone', 'Clone a shut-off or paused domain with virt-clone', { body: S.cloneBody, created: true }, async ({ body }) => {
    for (const [i, f] of (body.files || []).entries()) await L.confinePath(f, 'output', `files[${i}]`);
    return [`domain ${body.source} cloned to ${body.target}`, w ? await w.onWorker('clone', body, CLONE_MS) : await L.cloneDomain(v, body)];
  });
  add('post', 'admin', '/virt/clone/multiple', 'count clones named <name_prefix>-<n>, n from start_index (default 1)',
    { body: S.cloneMultipleBody, created: true }, async ({ body }) => {
      const r = w ? (await w.onWorker('clone_multiple', body, CLONE_MS * body.count)) as Awaited<ReturnType<typeof L.cloneMany>> : await L.cloneMany(v, body);
      return [`${r.successful} of ${r.total} clones of ${body.source} created`, r];
    });
  add('post', 'admin', '/virt/template/create', 'Mark a domain (or a clone of it named name) as a template in its <metadata>; seal runs virt-sysprep',
    { body: S.templateCreateBody, created: true }, async ({ body }) => {
      const r = w ? (await w.onWorker('template_create', body, CLONE_MS)) as Awaited<ReturnType<typeof L.createTemplate>> : await L.createTemplate(v, body);
      return [`template ${r.name} created`, r];
    });
  add('post', 'admin', '/virt/template/deploy', 'A new domain from a template: clone, memory (MiB), vCPUs, network, autostart, virt-customize',
    { body: S.templateDeployBody, created: true }, async ({ body }) => {
      return [`domain ${body.name} deployed from ${body.template}`, w ? await w.onWorker('template_deploy', body, CLONE_MS) : await L.deployTemplate(v, body)];
    });
  add('get', 'read', '/virt/template/list', 'Marked templates, plus domains named with the word template or shut off (reason says which)', {}, async () => {
    const t = await L.listTemplates(v);
    return [`${t.length} templates`, { templates: t, total: t.length }];
  });
  // Admin only (it writes host files): VNC/SPICE passwords only when the admin asks with security_info.
  add('post', 'admin', '/virt/template/export',
    'Domain XML and disk images (compress: qcow2 compressed) into export_path/<template>/, files 0600; security_info: with VNC/SPICE passwords',
    { body: S.templateExportBody, created: true }, async ({ body }) => {
      // Through workers (v a JobVirsh) the whole export runs on one with libvirt_access and qemu-img (virt_files).
      return [`template ${body.template} exported`, w ? await w.onWorker('template_export', body, HOST_WORK_MS) : await L.exportTemplate(v, body)];
    });
}

function addConversionRoutes(add: AddVirt, v: L.Virsh, submitConvert: VirtDeps['submitConvert']) {
  // Conversion and import
  add('post', 'admin', '/import/kvm', 'Import a disk image: a volume in the pool and a domain with virtio disk and NIC, serial console, BIOS or UEFI',
    { body: S.importKvmBody, created: true }, async ({ body }) => {
      // Through workers (v a JobVirsh) the whole import runs on one with libvirt_access and qemu-img (virt_files),
      // the image read there; this daemon checks the path against its roots first, nothing queued when it is outside.
      const r = v instanceof JobVirsh ? (await v.onWorker('import_kvm', body, HOST_WORK_MS)) as unknown as L.ImportResult : await L.importRequest(v, body);
      return [`domain ${r.domain} imported`, r];
    });
  add('post', 'submit', '/convert/vm', 'Convert a disk image as a convert job; answers at once with the job id (GET /jobs/{job_id} to follow it)',
    { body: S.convertVmBody }, async ({ body }) => {
      const src = await L.confinePath(body.source_path, 'input', 'source_path');
      const dest = await L.confinePath(body.dest_path, 'output', 'dest_path');
      // The header says the format (a source_format given must match it) and what it references; no tool probes.
      const header = await confineRequestImage({ field: 'source_path', path: src, format: body.source_format });
      const format = body.source_format || (header.format === 'vpc' ? 'vhd' : header.format);
      const job = await submitConvert({
        operation: 'convert', image: { path: src, format },
        parameters: { output_format: body.format, compress: body.compression === 'zlib', output_path: dest, overwrite: body.overwrite },
      });
      return [`convert job ${job.job_id} queued`, {
        job_id: job.job_id, status: 'pending', source_path: src, dest_path: dest, format: body.format, compression: body.compression,
      }];
    });
}

export function addVirtActions(add: AddVirt, v: L.Virsh, submitConvert: VirtDeps['submitConvert']) {
  addBatchRoutes(add, v);
  addCloneRoutes(add, v);
  addConversionRoutes(add, v, submitConvert);
}
