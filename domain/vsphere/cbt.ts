// Changed-block tracking (CBT) for warm migration (issue 37): enable it on a VM, take a snapshot (no memory, no
// quiesce) and read each disk's changeId and frozen backing from the snapshot's config, ask
// VirtualMachine.QueryChangedDiskAreas what changed since a change id (paging by startOffset), copy those ranges
// of the frozen disk into a raw target with the datastore downloader, and remove a snapshot by the managed object
// reference Ferry recorded when it made it (never by name). What the simulator proves of this and what needs a
// real vCenter: docs/plans.md, "Warm migration: what the simulator proves".
import type { Manager } from './client';
import { VsphereError } from './errors';
import { waitForTask } from './actions';
import { virtualDevices } from './inventory';
import { retrieve } from './properties';
import { downloadFiles, remoteHead } from './download';
import { parseDatastorePath, resolveSibling, SNIFF_BYTES, sniffVmdk } from './vmdk';
import { arr, bool, child, el, moref, MoRef, num, ref, text } from './xml';

export interface SnapshotDisk {
  key: number;
  label: string;
  capacity_bytes: number;
  /** "[ds] path" of the disk as frozen at the snapshot (the snapshot config's backing). */
  file: string;
  /** The disk's change id at the snapshot; absent when CBT was not active for it. */
  change_id?: string;
}

export interface Snapshot { ref: MoRef; disks: SnapshotDisk[] }

export interface ChangedArea { start: number; length: number }

/** Whether config.changeTrackingEnabled is true on the VM. */
export async function cbtEnabled(m: Manager, vm: MoRef): Promise<boolean> {
  const [o] = await retrieve(m, [vm], [{ type: 'VirtualMachine', paths: ['config.changeTrackingEnabled'] }]);
  return bool(o?.props['config.changeTrackingEnabled']) === true;
}

/** Turns CBT on (ReconfigVM_Task, changeTrackingEnabled) and reads it back from the VM's config. */
export async function enableCbt(m: Manager, vm: MoRef, signal?: AbortSignal): Promise<void> {
  const task = moref(await m.call('ReconfigVM_Task', vm, `<spec>${el('changeTrackingEnabled', true)}</spec>`))!;
  await waitForTask(m, task, `enabling changed-block tracking on ${vm.value}`, signal);
  if (!(await cbtEnabled(m, vm))) {
    throw new VsphereError('state', `vSphere manager ${m.name} accepted enabling changed-block tracking on ${vm.value} but its config still says it is off`);
  }
}

/** The disks of a snapshot, from its config: frozen backing file, change id, size. */
export async function snapshotDisks(m: Manager, snapshot: MoRef): Promise<SnapshotDisk[]> {
  const [o] = await retrieve(m, [snapshot], [{ type: 'VirtualMachineSnapshot', paths: ['config.hardware.device'] }]);
  if (!o) throw new VsphereError('not_found', `snapshot ${snapshot.value} does not exist on vSphere manager ${m.name}`);
  return virtualDevices(o.props['config.hardware.device']).filter((d) => d['@_type'] === 'VirtualDisk').map((d) => {
    const kb = num(d.capacityInKB) ?? 0;
    const changeId = text(d.backing?.changeId);
    return {
      key: num(d.key) ?? 0, label: text(d.deviceInfo?.label) ?? '', capacity_bytes: num(d.capacityInBytes) ?? kb * 1024,
      file: text(d.backing?.fileName) ?? '', ...(changeId ? { change_id: changeId } : {}),
    };
  });
}

/** Takes a snapshot without memory and without quiescing; returns its reference (the caller records it at once)
 *  and its disks. `onCreated` runs as soon as the reference is known, before the disks are read. */
export async function createSnapshot(
  m: Manager, vm: MoRef, name: string, opts: { signal?: AbortSignal; onCreated?: (ref: MoRef) => Promise<void> | void } = {},
): Promise<Snapshot> {
  const inner = el('name', name) + el('description', 'Ferry warm migration round (removed by Ferry)') + el('memory', false) + el('quiesce', false);
  const task = moref(await m.call('CreateSnapshot_Task', vm, inner))!;
  const snap = moref(await waitForTask(m, task, `snapshot ${name} of ${vm.value}`, opts.signal));
  if (!snap || snap.type !== 'VirtualMachineSnapshot') {
    throw new VsphereError('task', `vSphere manager ${m.name} finished the snapshot ${name} of ${vm.value} without naming it`);
  }
  await opts.onCreated?.(snap);
  return { ref: snap, disks: await snapshotDisks(m, snap) };
}

/** Removes one snapshot by its reference (children kept, disks consolidated). */
export async function removeSnapshot(m: Manager, snapshot: MoRef, signal?: AbortSignal): Promise<void> {
  if (snapshot.type !== 'VirtualMachineSnapshot') throw new VsphereError('config', `${snapshot.type}:${snapshot.value} is not a snapshot reference`);
  const task = moref(await m.call('RemoveSnapshot_Task', snapshot, el('removeChildren', false) + el('consolidate', true)))!;
  await waitForTask(m, task, `removal of snapshot ${snapshot.value}`, signal);
}

/** Every area QueryChangedDiskAreas lists for a disk of a snapshot since `changeId` ("*": every allocated area),
 *  paging by startOffset until the disk's end. `pages` counts the calls. */
export async function changedAreas(
  m: Manager, vm: MoRef, snapshot: MoRef, disk: { key: number; capacity_bytes: number }, changeId: string,
): Promise<{ areas: ChangedArea[]; pages: number }> {
  const areas: ChangedArea[] = [];
  let pages = 0;
  for (let start = 0; start < disk.capacity_bytes;) {
    const inner = ref('snapshot', snapshot) + el('deviceKey', disk.key) + el('startOffset', start) + el('changeId', changeId);
    let ret;
    try {
      ret = await m.call('QueryChangedDiskAreas', vm, inner);
    } catch (e) {
      if (!(e instanceof VsphereError)) throw e;
      throw new VsphereError(e.kind, `changed areas of disk ${disk.key} of ${vm.value} since change id ${changeId}: ${e.message}`, e.fault);
    }
    pages++;
    const length = num(child(ret, 'length')) ?? 0;
    if (num(child(ret, 'startOffset')) !== start || length <= 0) {
      throw new VsphereError('http', `vSphere manager ${m.name} answered QueryChangedDiskAreas at offset ${start} with no progress `
        + `(startOffset ${text(child(ret, 'startOffset'))}, length ${length})`);
    }
    for (const a of arr(child(ret, 'changedArea'))) areas.push({ start: num(child(a, 'start')) ?? 0, length: num(child(a, 'length')) ?? 0 });
    start += length;
  }
  return { areas, pages };
}

/** The flat extent behind a frozen disk's descriptor ("[ds] dir/x.vmdk"): the file whose bytes are the disk.
 *  Only a monolithicFlat disk qualifies; a delta chain needs VDDK/NFC (docs/plans.md). */
export async function frozenExtent(
  m: Manager, dcPath: string, file: string, signal?: AbortSignal,
): Promise<{ datastore: string; path: string; dcPath: string }> {
  const desc = { ...parseDatastorePath(file), dcPath };
  const info = sniffVmdk(await remoteHead(m, desc, SNIFF_BYTES, signal));
  const flat = info.kind === 'text' && info.extents.length === 1 && info.extents[0].type === 'FLAT' && !info.extents[0].offset && !info.parentHint;
  if (!flat) {
    throw new VsphereError('state', `${file} is not a flat disk (${info.kind} ${info.createType ?? ''}); `
      + 'Ferry copies changed areas only from a monolithicFlat disk, a delta chain needs VDDK/NFC');
  }
  return { ...resolveSibling(desc, info.extents[0].file), dcPath };
}

/** Copies the listed areas of a snapshot's frozen disk into `target` (a raw file of the disk's size that holds
 *  the earlier rounds), with the datastore downloader's parallel ranged requests. Returns the bytes fetched. */
export async function copyAreas(
  m: Manager,
  o: { dcPath: string; disk: SnapshotDisk; areas: ChangedArea[]; target: string; streams?: number; chunkBytes?: number; signal: AbortSignal },
): Promise<{ bytes_fetched: number }> {
  if (!o.areas.length) return { bytes_fetched: 0 };
  const extent = await frozenExtent(m, o.dcPath, o.disk.file, o.signal);
  const res = await downloadFiles(m, [{
    ...extent, size: o.disk.capacity_bytes, local: o.target, target: o.target, ranges: o.areas.map((a) => [a.start, a.start + a.length]),
  }], {
    streams: o.streams ?? 4, chunkBytes: o.chunkBytes ?? 64 * 1024, signal: o.signal,
  });
  return { bytes_fetched: res.bytes_fetched };
}
