// The virtualization-host API (/virt/*, both path forms), POST /import/kvm and POST /convert/vm: thin wiring of
// domain/libvirt to HTTP. Every success is the seed's envelope {status: 'success', message, data, timestamp};
// errors are the daemon's {error, status, timestamp} (404 unknown object, 400 bad input, 409 state conflict,
// 503 libvirtd not answering at the configured URI, 500 a failed libvirt operation with its message).
// Host objects and statistics here; batches, clones, templates, import and conversion in virt-actions.ts; the
// adder both use (envelope, error responses, role) in virt-route.ts.
import * as S from '../../domain/schemas/virt';
import * as L from '../../domain/libvirt';
import { addVirtActions } from './virt-actions';
import { virtAdder, type AddVirt, type VirtDeps } from './virt-route';
import { allowedUris } from '../../domain/libvirt/uri';
import { targetInventory } from '../../domain/plans/target';
import { JobVirsh } from '../../orchestration/virsh-jobs';

/** How long an upload waits for its worker job (FERRY_LIBVIRT_VIA=worker): vol-upload's own bound. */
const UPLOAD_MS = 6 * 3_600_000;

function addHostRoutes(add: AddVirt, v: L.Virsh) {
  // Domains and snapshots
  add('get', 'read', '/virt/domains', 'All domains (virsh domstats): name, state, memory in KiB, vCPUs', {}, async () => {
    const d = await L.listDomains(v);
    return [`${d.length} domains`, { domains: d, total: d.length }];
  });
  add('post', 'admin', '/virt/domain/start', 'Start a defined domain (paused: start it paused)', { body: S.domainStartBody }, async ({ body }) =>
    [`domain ${body.name} started`, await L.startDomain(v, body.name, body.paused)]);
  add('post', 'admin', '/virt/snapshot/create', 'Snapshot of a domain (virsh snapshot-create)', { body: S.snapshotBody, created: true }, async ({ body }) => [
    `snapshot ${body.snapshot_name} of ${body.domain_name} created`,
    await L.createSnapshot(v, body.domain_name, body.snapshot_name, { description: body.description }),
  ]);

  // The hosts a plan may name (FERRY_LIBVIRT_URI, FERRY_LIBVIRT_URIS) with what its maps may point at.
  add('get', 'read', '/virt/targets', 'Every libvirt URI this deployment may migrate to (FERRY_LIBVIRT_URI first, then FERRY_LIBVIRT_URIS) '
    + "with its networks and storage pools (free bytes): the right side of a plan's network_map and storage_map; an unreachable one says why", {}, async () => {
    const t = await Promise.all(allowedUris().map((u, i) => targetInventory(u, i === 0)));
    return [`${t.length} targets, ${t.filter((x) => x.reachable).length} reachable`, { targets: t, total: t.length }];
  });

  // Networks
  add('get', 'read', '/virt/networks', 'Networks with status (active, persistent, autostart), bridge, forward mode, addresses', {}, async () => {
    const n = await L.listNetworks(v);
    return [`${n.length} networks`, { networks: n, total: n.length }];
  });
  add('get', 'read', '/virt/network', 'One network: UUID, active, bridge, forward mode, addresses, DHCP ranges and its XML', { query: S.nameQuery },
    async ({ query }) => [`network ${query.name}`, await L.networkDetail(v, query.name)]);
  add('post', 'admin', '/virt/network/create', 'Define a persistent network (not started; forward nat, route or none)',
    { body: S.networkCreateBody, created: true }, async ({ body }) => [`network ${body.name} defined`, await L.createNetwork(v, body)]);
  add('post', 'admin', '/virt/network/delete', 'Stop (when active) and undefine a network', { body: S.nameBody }, async ({ body }) =>
    [`network ${body.name} deleted`, await L.deleteNetwork(v, body.name)]);
  add('post', 'admin', '/virt/network/start', 'Start a network (inactive -> active)', { body: S.nameBody }, async ({ body }) =>
    [`network ${body.name} started`, await L.startNetwork(v, body.name)]);
  add('post', 'admin', '/virt/network/stop', 'Stop a network (active -> inactive)', { body: S.nameBody }, async ({ body }) =>
    [`network ${body.name} stopped`, await L.stopNetwork(v, body.name)]);

  // Interfaces
  add('post', 'admin', '/virt/interface/attach', 'Attach a NIC (new MAC) on a network to a domain: persistent, and live when it runs',
    { body: S.interfaceAttachBody, created: true }, async ({ body }) =>
    [`interface attached to ${body.vm_name}`, await L.attachInterface(v, body.vm_name, body.network, body.model)]);
  add('post', 'admin', '/virt/interface/detach', 'Detach the NIC with this MAC from a domain', { body: S.interfaceDetachBody }, async ({ body }) =>
    [`interface ${body.mac} detached from ${body.vm_name}`, await L.detachInterface(v, body.vm_name, body.mac)]);
}

function addVolumeRoutes(add: AddVirt, v: L.Virsh) {
  // Volumes (bytes)
  add('get', 'read', '/virt/volume/info', 'A volume: path, format, capacity, allocation (bytes)', { query: S.volumeQuery }, async ({ query }) =>
    [`volume ${query.volume}`, await L.volumeInfo(v, query.pool, query.volume)]);
  add('post', 'admin', '/virt/volume/create', 'Create a volume; capacity in bytes', { body: S.volumeCreateBody, created: true }, async ({ body }) =>
    [`volume ${body.name} created`, await L.createVolume(v, body)]);
  add('post', 'admin', '/virt/volume/clone', 'Clone a volume (into target_pool when given)', { body: S.volumeCloneBody, created: true }, async ({ body }) =>
    [`volume ${body.source_volume} cloned to ${body.target_volume}`, await L.cloneVolume(v, body)]);
  add('post', 'admin', '/virt/volume/resize', 'Set a volume\'s capacity in bytes; a smaller one needs shrink: true', { body: S.volumeResizeBody },
    async ({ body }) => [`volume ${body.volume} resized`, await L.resizeVolume(v, body)]);
  add('post', 'admin', '/virt/volume/delete', 'Delete a volume', { body: S.volumeBody }, async ({ body }) =>
    [`volume ${body.volume} deleted`, await L.deleteVolume(v, body.pool, body.volume)]);
  add('post', 'admin', '/virt/volume/upload', 'Fill a volume from a local image (converted when format differs; created when missing)',
    { body: S.volumeUploadBody }, async ({ body }) => {
      // Through workers (v a JobVirsh) the whole upload runs on one with libvirt_access and qemu-img (virt_files).
      return [
        `volume ${body.volume} uploaded`,
        v instanceof JobVirsh ? await v.onWorker('volume_upload', body, UPLOAD_MS) : await L.uploadVolume(v, body),
      ];
    });
  add('post', 'admin', '/virt/volume/wipe', 'Wipe a volume with an algorithm of virsh vol-wipe', { body: S.volumeWipeBody }, async ({ body }) =>
    [`volume ${body.volume} wiped (${body.algorithm})`, await L.wipeVolume(v, body.pool, body.volume, body.algorithm)]);
}

function addStatsRoutes(add: AddVirt, v: L.Virsh) {
  // Statistics
  const one = async (name: string) => L.domainStats(v, name);
  add('get', 'read', '/virt/stats', 'CPU, memory, disk I/O and network I/O of one domain', { query: S.nameQuery }, async ({ query }) =>
    [`statistics of ${query.name}`, await one(query.name)]);
  add('get', 'read', '/virt/stats/all', 'Statistics of every running domain', {}, async () => {
    const a = await L.allStats(v);
    return [`${a.length} running domains`, { domains: a, total: a.length }];
  });
  add('get', 'read', '/virt/stats/cpu', 'vCPUs, CPU time (ns: user, system, total) and usage percent', { query: S.nameQuery }, async ({ query }) => {
    const s = await one(query.name);
    return [`cpu of ${query.name}`, { name: s.name, ...s.cpu }];
  });
  add('get', 'read', '/virt/stats/memory', 'Memory (KiB): total, used, available, usage percent, swap in and out', { query: S.nameQuery },
    async ({ query }) => {
      const s = await one(query.name);
      return [`memory of ${query.name}`, { name: s.name, ...s.memory }];
    });
  add('get', 'read', '/virt/stats/disk', 'Per disk: read and write bytes and requests, errors', { query: S.nameQuery }, async ({ query }) => {
    const s = await one(query.name);
    return [`disks of ${query.name}`, { name: s.name, disks: s.disks }];
  });
  add('get', 'read', '/virt/stats/network', 'Per interface: RX and TX bytes, packets, errors, dropped', { query: S.nameQuery }, async ({ query }) => {
    const s = await one(query.name);
    return [`interfaces of ${query.name}`, { name: s.name, interfaces: s.interfaces }];
  });
}

export function registerVirt({ api, virsh: v, submitConvert }: VirtDeps) {
  const add = virtAdder(api);
  addHostRoutes(add, v);
  addVolumeRoutes(add, v);
  addStatsRoutes(add, v);
  addVirtActions(add, v, submitConvert);
}
