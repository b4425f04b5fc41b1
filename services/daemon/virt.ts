// The virtualization-host API (/virt/*, both path forms), POST /import/kvm and POST /convert/vm: thin wiring of
// shared/libvirt to HTTP. Every success is the seed's envelope {status: 'success', message, data, timestamp};
// errors are the daemon's {error, status, timestamp} (404 unknown object, 400 bad input, 409 state conflict,
// 503 libvirtd not answering at the configured URI, 500 a failed libvirt operation with its message).
import Joi from 'joi';
import type Koa from 'koa';
import { Api } from '../../shared/http';
import type { Need } from '../../shared/auth';
import { daemonErrorSchema } from '../../shared/schemas/daemon';
import * as S from '../../shared/schemas/virt';
import * as L from '../../shared/libvirt';
import { confineRequestImage } from '../../shared/image-confine';

const ok = (message: string, data: unknown) => ({ status: 'success', message, data, timestamp: new Date().toISOString() });
const errs = { 400: { description: 'invalid input (names the field)', schema: daemonErrorSchema }, 404: { description: 'unknown domain, network, pool or volume', schema: daemonErrorSchema },
  409: { description: 'the object exists already or its state does not allow this', schema: daemonErrorSchema }, 500: { description: "a failed libvirt operation, with libvirt's message", schema: daemonErrorSchema },
  503: { description: 'libvirtd does not answer at the configured URI', schema: daemonErrorSchema } };

export interface VirtDeps { api: Api; virsh: L.Virsh; submitConvert: (def: unknown) => Promise<{ job_id: string }> }

export function registerVirt({ api, virsh: v, submitConvert }: VirtDeps) {
  type H = (input: { query: any; body: any }, ctx: Koa.Context) => Promise<[string, unknown]>;
  // Each route names its role: GETs read the host (`read`); whatever changes it is `admin`, because libvirtd
  // runs as root and these routes reach the host's disks, networks and guests (docs/security.md).
  const add = (method: 'get' | 'post', role: Need, path: string, summary: string, schemas: { query?: Joi.ObjectSchema; body?: Joi.ObjectSchema; created?: boolean; data?: Joi.Schema }, h: H) => api.add({
    method, role, path, summary, tags: [path.startsWith('/virt') ? 'virt' : 'conversion'], query: schemas.query, body: schemas.body,
    responses: { [schemas.created ? 201 : 200]: { description: 'success envelope', schema: S.virtSuccessSchema }, ...errs },
    handler: async (ctx, input) => {
      const [message, data] = await h(input, ctx);
      if (schemas.created) ctx.status = 201;
      return ok(message, data);
    },
  });

  // Domains and snapshots
  add('get', 'read', '/virt/domains', 'All domains (virsh domstats): name, state, memory in KiB, vCPUs', {}, async () => {
    const d = await L.listDomains(v);
    return [`${d.length} domains`, { domains: d, total: d.length }];
  });
  add('post', 'admin', '/virt/domain/start', 'Start a defined domain (paused: start it paused)', { body: S.domainStartBody }, async ({ body }) => [`domain ${body.name} started`, await L.startDomain(v, body.name, body.paused)]);
  add('post', 'admin', '/virt/snapshot/create', 'Snapshot of a domain (virsh snapshot-create)', { body: S.snapshotBody, created: true }, async ({ body }) =>
    [`snapshot ${body.snapshot_name} of ${body.domain_name} created`, await L.createSnapshot(v, body.domain_name, body.snapshot_name, { description: body.description })]);

  // Networks
  add('get', 'read', '/virt/networks', 'Networks with status (active, persistent, autostart), bridge, forward mode, addresses', {}, async () => {
    const n = await L.listNetworks(v);
    return [`${n.length} networks`, { networks: n, total: n.length }];
  });
  add('get', 'read', '/virt/network', 'One network: UUID, active, bridge, forward mode, addresses, DHCP ranges and its XML', { query: S.nameQuery }, async ({ query }) => [`network ${query.name}`, await L.networkDetail(v, query.name)]);
  add('post', 'admin', '/virt/network/create', 'Define a persistent network (not started; forward nat, route or none)', { body: S.networkCreateBody, created: true }, async ({ body }) => [`network ${body.name} defined`, await L.createNetwork(v, body)]);
  add('post', 'admin', '/virt/network/delete', 'Stop (when active) and undefine a network', { body: S.nameBody }, async ({ body }) => [`network ${body.name} deleted`, await L.deleteNetwork(v, body.name)]);
  add('post', 'admin', '/virt/network/start', 'Start a network (inactive -> active)', { body: S.nameBody }, async ({ body }) => [`network ${body.name} started`, await L.startNetwork(v, body.name)]);
  add('post', 'admin', '/virt/network/stop', 'Stop a network (active -> inactive)', { body: S.nameBody }, async ({ body }) => [`network ${body.name} stopped`, await L.stopNetwork(v, body.name)]);

  // Interfaces
  add('post', 'admin', '/virt/interface/attach', 'Attach a NIC (new MAC) on a network to a domain: persistent, and live when it runs', { body: S.interfaceAttachBody, created: true }, async ({ body }) =>
    [`interface attached to ${body.vm_name}`, await L.attachInterface(v, body.vm_name, body.network, body.model)]);
  add('post', 'admin', '/virt/interface/detach', 'Detach the NIC with this MAC from a domain', { body: S.interfaceDetachBody }, async ({ body }) => [`interface ${body.mac} detached from ${body.vm_name}`, await L.detachInterface(v, body.vm_name, body.mac)]);

  // Volumes (bytes)
  add('get', 'read', '/virt/volume/info', 'A volume: path, format, capacity, allocation (bytes)', { query: S.volumeQuery }, async ({ query }) => [`volume ${query.volume}`, await L.volumeInfo(v, query.pool, query.volume)]);
  add('post', 'admin', '/virt/volume/create', 'Create a volume; capacity in bytes', { body: S.volumeCreateBody, created: true }, async ({ body }) => [`volume ${body.name} created`, await L.createVolume(v, body)]);
  add('post', 'admin', '/virt/volume/clone', 'Clone a volume (into target_pool when given)', { body: S.volumeCloneBody, created: true }, async ({ body }) => [`volume ${body.source_volume} cloned to ${body.target_volume}`, await L.cloneVolume(v, body)]);
  add('post', 'admin', '/virt/volume/resize', 'Set a volume\'s capacity in bytes; a smaller one needs shrink: true', { body: S.volumeResizeBody }, async ({ body }) => [`volume ${body.volume} resized`, await L.resizeVolume(v, body)]);
  add('post', 'admin', '/virt/volume/delete', 'Delete a volume', { body: S.volumeBody }, async ({ body }) => [`volume ${body.volume} deleted`, await L.deleteVolume(v, body.pool, body.volume)]);
  add('post', 'admin', '/virt/volume/upload', 'Fill a volume from a local image (converted when format differs; created when missing)', { body: S.volumeUploadBody }, async ({ body }) => {
    const source_path = await L.confinePath(body.source_path, 'input', 'source_path');
    return [`volume ${body.volume} uploaded`, await L.uploadVolume(v, { ...body, source_path })];
  });
  add('post', 'admin', '/virt/volume/wipe', 'Wipe a volume with an algorithm of virsh vol-wipe', { body: S.volumeWipeBody }, async ({ body }) => [`volume ${body.volume} wiped (${body.algorithm})`, await L.wipeVolume(v, body.pool, body.volume, body.algorithm)]);

  // Statistics
  const one = async (name: string) => L.domainStats(v, name);
  add('get', 'read', '/virt/stats', 'CPU, memory, disk I/O and network I/O of one domain', { query: S.nameQuery }, async ({ query }) => [`statistics of ${query.name}`, await one(query.name)]);
  add('get', 'read', '/virt/stats/all', 'Statistics of every running domain', {}, async () => { const a = await L.allStats(v); return [`${a.length} running domains`, { domains: a, total: a.length }]; });
  add('get', 'read', '/virt/stats/cpu', 'vCPUs, CPU time (ns: user, system, total) and usage percent', { query: S.nameQuery }, async ({ query }) => { const s = await one(query.name); return [`cpu of ${query.name}`, { name: s.name, ...s.cpu }]; });
  add('get', 'read', '/virt/stats/memory', 'Memory (KiB): total, used, available, usage percent, swap in and out', { query: S.nameQuery }, async ({ query }) => { const s = await one(query.name); return [`memory of ${query.name}`, { name: s.name, ...s.memory }]; });
  add('get', 'read', '/virt/stats/disk', 'Per disk: read and write bytes and requests, errors', { query: S.nameQuery }, async ({ query }) => { const s = await one(query.name); return [`disks of ${query.name}`, { name: s.name, disks: s.disks }]; });
  add('get', 'read', '/virt/stats/network', 'Per interface: RX and TX bytes, packets, errors, dropped', { query: S.nameQuery }, async ({ query }) => { const s = await one(query.name); return [`interfaces of ${query.name}`, { name: s.name, interfaces: s.interfaces }]; });

  // Batch actions: the seed's batch result object as data.
  const batch = (op: string, schema: Joi.ObjectSchema, mk: (body: any) => (d: string) => Promise<unknown>) =>
    add('post', 'admin', `/virt/batch/${op}`, `Batch ${op} (result per domain; at most FERRY_VIRT_BATCH_CONCURRENCY at once)`, { body: schema }, async ({ body }) => {
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

  // Clones and templates
  add('post', 'admin', '/virt/clone', 'Clone a shut-off or paused domain with virt-clone', { body: S.cloneBody, created: true }, async ({ body }) => {
    for (const [i, f] of (body.files || []).entries()) await L.confinePath(f, 'output', `files[${i}]`);
    return [`domain ${body.source} cloned to ${body.target}`, await L.cloneDomain(v, body)];
  });
  add('post', 'admin', '/virt/clone/multiple', 'count clones named <name_prefix>-<n>, n from start_index (default 1)', { body: S.cloneMultipleBody, created: true }, async ({ body }) => {
    const r = await L.cloneMany(v, body);
    return [`${r.successful} of ${r.total} clones of ${body.source} created`, r];
  });
  add('post', 'admin', '/virt/template/create', 'Mark a domain (or a clone of it named name) as a template in its <metadata>; seal runs virt-sysprep', { body: S.templateCreateBody, created: true }, async ({ body }) => {
    const r = await L.createTemplate(v, body);
    return [`template ${r.name} created`, r];
  });
  add('post', 'admin', '/virt/template/deploy', 'A new domain from a template: clone, memory (MiB), vCPUs, network, autostart, virt-customize', { body: S.templateDeployBody, created: true }, async ({ body }) =>
    [`domain ${body.name} deployed from ${body.template}`, await L.deployTemplate(v, body)]);
  add('get', 'read', '/virt/template/list', 'Marked templates, plus domains named with the word template or shut off (reason says which)', {}, async () => {
    const t = await L.listTemplates(v);
    return [`${t.length} templates`, { templates: t, total: t.length }];
  });
  // Admin only (it writes host files): VNC/SPICE passwords only when the admin asks with security_info.
  add('post', 'admin', '/virt/template/export', 'Domain XML and disk images (compress: qcow2 compressed) into export_path/<template>/, files 0600; security_info: with VNC/SPICE passwords', { body: S.templateExportBody, created: true }, async ({ body }) =>
    [`template ${body.template} exported`, await L.exportTemplate(v, body)]);

  // Conversion and import
  add('post', 'admin', '/import/kvm', 'Import a disk image: a volume in the pool and a domain with virtio disk and NIC, serial console, BIOS or UEFI', { body: S.importKvmBody, created: true }, async ({ body }) => {
    const image = await L.confinePath(body.image_path, 'input', 'image_path');
    // Copied into the pool, a reference would resolve against the pool's folder: the disk must reference nothing.
    const { format } = await confineRequestImage({ field: 'image_path', path: image, selfContained: true });
    const r = await L.importDisk(v, { disks: [{ path: image, format }], diskField: () => 'image_path', name: body.vm_name, memoryMiB: body.memory, cpus: body.cpus, networks: body.network ? [body.network] : [], pool: body.pool, firmware: body.firmware });
    return [`domain ${r.domain} imported`, r];
  });
  add('post', 'submit', '/convert/vm', 'Convert a disk image as a convert job; answers at once with the job id (GET /jobs/{job_id} to follow it)', { body: S.convertVmBody }, async ({ body }) => {
    const src = await L.confinePath(body.source_path, 'input', 'source_path');
    const dest = await L.confinePath(body.dest_path, 'output', 'dest_path');
    // The header says the format (a source_format given must match it) and what it references; no tool probes.
    const header = await confineRequestImage({ field: 'source_path', path: src, format: body.source_format });
    const format = body.source_format || (header.format === 'vpc' ? 'vhd' : header.format);
    const job = await submitConvert({
      operation: 'convert', image: { path: src, format },
      parameters: { output_format: body.format, compress: body.compression === 'zlib', output_path: dest, overwrite: body.overwrite },
    });
    return [`convert job ${job.job_id} queued`, { job_id: job.job_id, status: 'pending', source_path: src, dest_path: dest, format: body.format, compression: body.compression }];
  });
}
