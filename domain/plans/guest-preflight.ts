// Guest-level preflight: each VM's disks read in place over the datastore's HTTPS (guest-source.ts), inspected in
// a read-only libguestfs appliance with the converter's own inspection (inspectAndMount) and the migration
// repair run dry (fixGuest with MIGRATION_REPAIR), then judged by guest-rules.ts. Nothing is downloaded.
//
// One appliance serves a round of VMs (a launch costs ~25 s under TCG). Sharing is checked, not assumed: VMs
// cloned from one template carry the same file system and LVM UUIDs, and libguestfs resolves a guest's fstab
// (UUID=, /dev/sdX) against every disk of the appliance. So after the launch the VMs whose UUIDs clash, or whose
// mount points resolve to a disk that is not theirs, are left for a later round that holds no clash (alone if
// need be). The whole preflight is bounded in time (FERRY_GUEST_PREFLIGHT_SECONDS). It runs on a worker with
// the tools (the guest_preflight job), never in the daemon, whose image is Node only.
import { pipelineSchema } from '../schemas/manifest';
import { GuestSession } from '../converter/guestfs';
import { fixGuest, inspectAndMount, MIGRATION_REPAIR, type GuestScope } from '../converter/guest';
import type { FixAction, FixOptions, FixResult, GuestInfo } from '../converter/types';
import { chooseFirmware } from '../converter/firmware';
import { fsDevice, inspectionHint } from '../converter/inspection-hint';
import { readGuestSpace, unsupportedReason } from '../converter/prechecks';
import type { Manager } from '../vsphere/client';
import { datacenterOf } from '../vsphere/inventory';
import type { Logger } from '../../platform/log';
import type { VmFacts } from './facts';
import type { Finding } from './rules';
import { diskData, serveDisk, type DiskData, type NbdSource } from './guest-source';
import { guestFindings, noOsFindings, unreadable, type GuestRead } from './guest-rules';
import { setting } from '../../platform/settings';

/** Disks of one appliance round (the daemon counts the nbdkit processes of a read by it, orchestration/guest-read.ts). */
export const MAX_DRIVES = 64;
export const guestPreflightSeconds = () => setting('FERRY_GUEST_PREFLIGHT_SECONDS');
/** Whether validate and start read the guests (FERRY_GUEST_PREFLIGHT=0 turns it off for the daemon; a plan's or
 *  VM's options.guest_preflight decides over it). */
export const guestPreflightDefault = () => setting('FERRY_GUEST_PREFLIGHT');

interface Vm { facts: VmFacts; disks: DiskData[]; uuids: Set<string> }

/** Each device of a VM (its disks and their partitions) with blkid's TYPE and UUID. */
async function deviceIds(g: GuestSession, disks: string[]) {
  const parts = [];
  for (const p of g.lines(await g.cmd('list-partitions'))) if (disks.includes((await g.cmd('part-to-dev', p)).trim())) parts.push(p);
  const out: { dev: string; type?: string; uuid?: string }[] = [];
  for (const dev of [...disks, ...parts]) { const b = await g.blkid(dev); out.push({ dev, type: b.TYPE, uuid: b.UUID }); }
  return out;
}

const plainId = (u: string) => u.replace(/-/g, '').toLowerCase();

/** Whether a device (partition, LV, btrfs subvolume) lies on `disks`: LVs through their VG's PVs. */
function ownsFn(g: GuestSession, disks: string[], pvs: Set<string>) {
  return async (dev: string): Promise<boolean> => {
    const d = fsDevice(dev);
    if (/^\/dev\/(sd|vd|hd)[a-z]+\d*$/.test(d)) return disks.includes(/\d$/.test(d) ? (await g.cmd('part-to-dev', d)).trim() : d);
    const lv = (await g.tryCmd('lvm-canonical-lv-name', d))?.trim();
    const vg = lv && /^\/dev\/([^/]+)\//.exec(lv)?.[1];
    if (!vg) return false;
    const ids = g.lines(await g.tryCmd('vgpvuuids', vg)).map(plainId);
    return ids.length > 0 && ids.every((x) => pvs.has(x));
  };
}

/** The dry run's files and packages, from its actions. */
function planned(actions: FixAction[], info: GuestInfo, initrds: string[]) {
  const files = new Set<string>();
  const packages: string[] = [];
  for (const a of actions.filter((x) => x.status === 'would_do')) {
    if (typeof a.file === 'string') files.add(a.file);
    for (const x of Array.isArray(a.files) ? a.files : []) files.add(String(x));
    if (a.action === 'fstab') files.add('/etc/fstab');
    if (a.action === 'regen_initramfs' && /^would (run|append)/.test(a.detail)) initrds.forEach((x) => files.add(x));
    const cfg = /^would run \S+ -o (\S+)/.exec(a.detail);
    if (a.action === 'update_grub' && cfg) files.add(cfg[1]);
    if (a.action === 'uefi_fallback' && info.boot?.esp_mount) files.add(`${info.boot.esp_mount}/EFI/BOOT/BOOTX64.EFI`);
    const removed = /\(removed (\S+)\)$/.exec(a.detail);
    if (a.action === 'remove_source_hv_tools' && removed) files.add(removed[1]);
    const pk = /^would run \S+ --?\S+ (.+)$|^would run (?:rpm -e|apk del|pacman -Rns --noconfirm) (.+)$/.exec(a.detail);
    if (a.action === 'remove_source_hv_tools' && pk) packages.push(...(pk[1] ?? pk[2]).split(' '));
  }
  return { files: [...files], packages };
}

/** The dry run's answer for a guest the converter refuses: nothing it would do. */
function unsupportedResult(info: GuestInfo): FixResult {
  return { modified: false, actions: [{ action: 'check_supported', status: 'skipped', detail: unsupportedReason(info)! }], warnings: [], failures: [],
    fstab_changes: [], steps: ['check_supported'] };
}

/** What one mounted guest tells: free space, the initramfs sizes, the dry-run repair. */
async function readGuest(g: GuestSession, vm: Vm, info: GuestInfo, scope: { disks: string[]; luks: string[] }): Promise<GuestRead> {
  const { disks, luks } = scope;
  const { free, initrds, largestInitrd } = await readGuestSpace(g, info);
  const fix = pipelineSchema.extract('fix').validate(MIGRATION_REPAIR).value as FixOptions;
  const firmware = chooseFirmware(/efi/i.test(vm.facts.firmware) ? 'uefi' : 'bios', info.boot).firmware;
  // An unsupported guest is refused by the dry run as by the repair; guest-rules.ts says so (guest_os_unsupported).
  const repair = unsupportedReason(info) ? unsupportedResult(info)
    : await fixGuest(g, info, { ...fix, dry_run: true, nic_macs: vm.facts.nics.map((n) => n.mac), firmware },
      () => undefined); // the dry run's log lines: its findings are the result
  const notes = [...new Set(vm.disks.flatMap((d) => d.notes))];
  // Read last: the dry run above writes nothing, so the digests are of the guest as it is.
  const inspection = await inspectionHint(g, info, disks);
  return { info, inspection, luks, free, largestInitrd, repair, ...planned(repair.actions, info, initrds), notes };
}

/** One round: an appliance on every disk of `vms`; the findings of those it could judge, and the ones to retry. */
async function round(m: Manager, vms: Vm[], signal: AbortSignal, log: Pick<Logger, 'warn'>): Promise<{ done: Map<string, Finding[]>; again: Vm[];
  alone: Vm[] }> {
  const sources: NbdSource[] = [];
  const done = new Map<string, Finding[]>();
  let g: GuestSession | undefined;
  try {
    for (const vm of vms) for (const d of vm.disks) sources.push(await serveDisk(m, d, signal));
    g = await GuestSession.open(sources.map((s) => ({ path: s.uri, format: s.format })), {
      readonly: true, signal, log: (line) => log.warn(`guest preflight: ${line}`, { vms: vms.map((v) => v.facts.vm_path) }),
    });
    const devices = g.lines(await g.cmd('list-devices'));
    const byIndex = new Map<number, string>();
    for (const d of devices) byIndex.set(Number((await g.cmd('device-index', d)).trim()), d);
    let next = 0;
    const scoped = vms.map((vm) => ({ vm, disks: vm.disks.map(() => byIndex.get(next++)!) }));
    const ids = new Map<Vm, Awaited<ReturnType<typeof deviceIds>>>();
    for (const s of scoped) { const x = await deviceIds(g, s.disks); ids.set(s.vm, x); x.forEach((y) => y.uuid && s.vm.uuids.add(plainId(y.uuid))); }
    const clash = (vm: Vm) => vms.length > 1 && vms.some((o) => o !== vm && [...vm.uuids].some((u) => o.uuids.has(u)));
    const roots = g.lines(await g.cmd('inspect-os'));
    const again: Vm[] = [], alone: Vm[] = [];
    for (const { vm, disks } of scoped) {
      if (clash(vm)) { again.push(vm); continue; }
      const pvs = new Set(ids.get(vm)!.filter((x) => x.type === 'LVM2_member' && x.uuid).map((x) => plainId(x.uuid!)));
      const owns = vms.length === 1 ? () => Promise.resolve(true) : ownsFn(g, disks, pvs);
      const luks = ids.get(vm)!.filter((x) => x.type === 'crypto_LUKS').map((x) => x.dev);
      let root: string | undefined;
      for (const r of roots) if (!root && await owns(r)) root = r;
      if (!root) { done.set(vm.facts.vm_path, noOsFindings(luks)); continue; }
      await g.cmd('umount-all');
      const scope: GuestScope = { root, devices: disks, owns };
      const info = await inspectAndMount(g, true, scope);
      const mine = await Promise.all(Object.values(info.mountpoints).map(owns));
      if (mine.includes(false)) { alone.push(vm); continue; } // its fstab resolved onto another VM's disk
      done.set(vm.facts.vm_path, guestFindings(await readGuest(g, vm, info, { disks, luks })));
    }
    return { done, again, alone };
  } finally {
    if (g) await g.close();
    for (const s of sources) await s.stop();
  }
}

/** Rounds for the VMs left over: greedily, VMs whose UUIDs (learned in the first round) do not meet. */
function regroup(vms: Vm[]): Vm[][] {
  const groups: Vm[][] = [];
  for (const vm of vms) {
    const g = groups.find((x) => x.every((o) => ![...vm.uuids].some((u) => o.uuids.has(u))) &&
      x.reduce((n, o) => n + o.disks.length, 0) + vm.disks.length <= MAX_DRIVES);
    if (g) g.push(vm); else groups.push([vm]);
  }
  return groups;
}

/** Guest findings per VM path for `facts`; every VM gets an answer (a guest_unreadable warning when the read
 *  failed or `signal` ended it: the time bound, `seconds`, is named then). Runs on a worker, as the job of the
 *  internal operation guest_preflight (services/worker/operations/guest-preflight.ts); the daemon submits it and
 *  applies the per-caller and total caps at submission (orchestration/guest-read.ts). */
export async function readGuests(m: Manager, facts: VmFacts[], log: Pick<Logger, 'warn'>,
  bound: { signal: AbortSignal; seconds: number }): Promise<Map<string, Finding[]>> {
  const { signal, seconds } = bound;
  const out = new Map<string, Finding[]>();
  const vms: Vm[] = [];
  for (const x of facts) {
    try {
      if (!x.disks.length) { out.set(x.vm_path, [unreadable('the VM has no virtual disk')]); continue; }
      vms.push({ facts: x, uuids: new Set(), disks: await Promise.all(x.disks.map((d) => diskData(m, d.file, datacenterOf(x.vm_path), signal))) });
    } catch (e) { out.set(x.vm_path, [unreadable(signal.aborted ? timedOut(seconds) : (e as Error).message)]); }
  }
  let todo: Vm[][] = regroup(vms);
  while (todo.length) {
    const group = todo.shift()!;
    try {
      const r = await round(m, group, signal, log);
      for (const [k, v] of r.done) out.set(k, v);
      // A round of one VM neither clashes nor resolves onto another's disk, and a clash is regrouped with the
      // UUIDs now known, so the rounds end.
      todo = [...regroup(r.again), ...r.alone.map((v) => [v]), ...todo];
    } catch (e) {
      const why = signal.aborted ? timedOut(seconds) : (e as Error).message;
      log.warn('guest preflight could not read VMs; they get a guest_unreadable warning', { vms: group.map((v) => v.facts.vm_path), error: why });
      for (const v of group) out.set(v.facts.vm_path, [unreadable(why)]);
    }
  }
  return out;
}

export const timedOut = (seconds: number) => `the guest preflight did not finish within ${seconds} s (FERRY_GUEST_PREFLIGHT_SECONDS)`;
