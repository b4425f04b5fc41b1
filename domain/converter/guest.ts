// Guest inspection and repair inside one GuestSession. Steps that need guest binaries (grub-mkconfig, dracut,
// package managers) check the binary is there and, when it is not, say so as a warning instead of pretending.
import { GuestSession } from './guestfs';
import type { FstabMode } from './fstab';
import { familyFor } from './families';
import { runSteps } from './steps';
import { INITRAMFS_TOOLS, installedHvPackages } from './linux/tools';
import { detectBoot } from './firmware';
import type { FixAction, FixOptions, FixResult, GuestInfo } from './types';
import { ConverterError } from './errors';
import { evidenceDiffers, hintedInfo, type InspectionHint } from './inspection-hint';
import { readLinuxGuest } from './linux-reading';
import { chooseRoot } from './root-choice';
import { mountGuest } from './mounts';

/** Which guest an appliance shared by several guests inspects: its root and its disks, and whether a device
 *  (a partition, an LV) lies on them. */
export interface GuestScope { root: string; devices: string[]; owns: (dev: string) => Promise<boolean> }

/** Inspects the guest and mounts its filesystems (read-write unless the session is read-only). With `hint` (a plan
 *  preflight's inspection of the same disks, inspection-hint.ts) inspection is skipped when the disks still hold
 *  what the preflight read; `info.inspection` says which happened. Otherwise Ferry's own reading (linux-reading.ts)
 *  serves where it can, libguestfs's `inspect-os` where it declines; `info.reading` says which, and why. With
 *  several systems on the disks, `root` (the fix stage's option) chooses one (root-choice.ts). */
export async function inspectAndMount(g: GuestSession, readonly: boolean, scope?: GuestScope, hint?: InspectionHint, root?: string): Promise<GuestInfo> {
  const reused = hint ? await fromPreflight(g, hint, readonly) : {};
  // The appliance's file systems, listed once: Ferry's reading starts from them and the repairs need them.
  const listed = await listFilesystems(g);
  let info = reused.info;
  if (info) info.reading = { by: 'preflight' };
  else {
    const own = scope ? { why: 'the plan preflight\'s shared appliance names the root' } : await readLinuxGuest(g, listed);
    // The one system Ferry's reading found must still be the one `root` names, if it names one.
    if ('info' in own) chooseRoot([own.info.root_device], root);
    info = 'info' in own ? { ...own.info, reading: { by: 'ferry' } } : await inspectedInfo(g, own.why, scope, root);
    await mountGuest(g, info.mountpoints, readonly);
  }
  if (hint) info.inspection = reused.info ? { from: 'preflight' } : { from: 'appliance', why: `the preflight's was not taken: ${reused.why}` };
  info.filesystems = await owned(listed, scope);
  if (scope) info.devices = scope.devices;
  info.lvm = Object.keys(info.filesystems).some((d) => d.startsWith('/dev/mapper/') || /^\/dev\/[^/]+\/[^/]+$/.test(d) && !/^\/dev\/(sd|vd|hd)/.test(d));
  if (info.os === 'linux') await linuxFacts(g, info, scope, info.reading?.by !== 'libguestfs');
  return info;
}

/** The preflight's facts, the guest mounted, when its devices and files are as the preflight read them. */
async function fromPreflight(g: GuestSession, hint: InspectionHint, readonly: boolean): Promise<{ info?: GuestInfo; why?: string }> {
  const r = await hintedInfo(g, hint);
  if (!r.info) return r;
  await mountGuest(g, r.info.mountpoints, readonly);
  const why = await evidenceDiffers(g, hint);
  if (!why) return r;
  await g.cmd('umount-all');
  return { why };
}

/** libguestfs's inspection (`declined`: why Ferry's reading did not serve): the root (the scope's, or the one
 *  `root` chooses among those found) and what it says of the OS. */
async function inspectedInfo(g: GuestSession, declined: string, scope?: GuestScope, rootOption?: string): Promise<GuestInfo> {
  const roots = scope ? [scope.root] : g.lines(await g.cmd('inspect-os'));
  if (!roots.length) throw new ConverterError('guest inspection found no operating system', 'guest');
  const choice = chooseRoot(roots, rootOption);
  const root = choice.root;
  const get = async (c: string) => (await g.tryCmd(c, root))?.trim() || undefined;
  const os = (await get('inspect-get-type')) || 'unknown';
  const info: GuestInfo = {
    os, distro: await get('inspect-get-distro'), product_name: await get('inspect-get-product-name'),
    hostname: await get('inspect-get-hostname'), root_device: root, mountpoints: {}, filesystems: {}, lvm: false, kernels: [], hypervisor_tools: [],
    reading: { by: 'libguestfs', why: declined, ...(roots.length > 1 ? { roots, root_choice: choice.why } : {}) },
  };
  const maj = await get('inspect-get-major-version');
  const min = await get('inspect-get-minor-version');
  if (maj) info.version = `${maj}.${min || 0}`;
  for (const l of g.lines(await g.cmd('inspect-get-mountpoints', root))) { const [mp, dev] = l.split(': '); info.mountpoints[mp] = dev; }
  return info;
}

/** What the Linux repairs read from the mounted guest: kernels, packages (the hint's, when taken), tools' files,
 *  the boot loader. */
async function linuxFacts(g: GuestSession, info: GuestInfo, scope: GuestScope | undefined, packagesRead: boolean) {
  if (await g.isDir('/lib/modules')) info.kernels = g.lines(await g.tryCmd('ls', '/lib/modules'));
  if (!packagesRead) {
    info.package_format = (await g.tryCmd('inspect-get-package-format', info.root_device))?.trim() || undefined;
    // libguestfs reads the guest's package database (dpkg, rpm, apk, pacman) for the installed applications.
    info.hypervisor_tools.push(...(await installedHvPackages(g, info.root_device)));
  }
  for (const f of ['/usr/bin/vmtoolsd', '/etc/vmware-tools']) if (await g.exists(f)) info.hypervisor_tools.push(f);
  for (const t of INITRAMFS_TOOLS) if (await g.firstFile(t.paths)) { info.initramfs_tool = t.tool; break; }
  for (const c of ['/boot/grub/grub.cfg', '/boot/grub2/grub.cfg']) if (await g.isFile(c)) { info.grub_config = c; break; }
  info.boot = await detectBoot(g, info.mountpoints, scope?.devices);
}

/** Every filesystem and swap device on the appliance's disks with its type. `list-filesystems` (2-4 s under TCG),
 *  not inspection's own list (`inspect-get-filesystems`): inspection leaves out what fstab names in a way it cannot
 *  resolve (a by-path or by-id swap), which is what the fstab rewrite must find (the pipeline test's plain guest). */
async function listFilesystems(g: GuestSession): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const l of g.lines(await g.cmd('list-filesystems'))) { const [dev, type] = l.split(': '); out[dev] = type; }
  return out;
}

/** The listed file systems that are the guest's (the scope's, in an appliance shared by several guests). */
async function owned(listed: Record<string, string>, scope?: GuestScope): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const [dev, type] of Object.entries(listed)) if (!scope || await scope.owns(dev)) out[dev] = type;
  return out;
}

/** The repairs a migration job (daemon shape B) asks for; the plans' preflight runs the same as a dry run to say
 *  which files the repair would change. */
export const MIGRATION_REPAIR = { enabled: true, remove_source_hv_tools: true, fstab_mode: 'stabilize-all', update_grub: true, regen_initramfs: true } as const;

/** Every repair the fix stage asked for, on the mounted guest: the steps of the guest's family (families.ts), in
 *  order, pre-checks first; r.steps names those that ran. Nothing is written when dry_run is set. A guest no family
 *  handles is refused by name (UnsupportedGuest) before any step. */
export async function fixGuest(g: GuestSession, info: GuestInfo, o: FixOptions, log: (m: string) => void): Promise<FixResult> {
  const family = familyFor(info);
  const r: FixResult = { modified: false, actions: [], warnings: [], failures: [], fstab_changes: [], steps: [] };
  const act = (a: FixAction) => {
    r.actions.push(a);
    if (a.status === 'warning') r.warnings.push(`${a.action}: ${a.detail}`);
    if (a.status === 'failed') r.failures.push(`${a.action}: ${a.detail}`);
  };
  const write = async (path: string, text: string) => { if (!o.dry_run) { await g.writeFile(path, text); r.modified = true; } };
  const backup = async (path: string) => (o.backup && !o.dry_run ? g.backup(path) : undefined);
  const mode = (o.fstab_mode === 'preserve' ? 'noop' : o.fstab_mode) as FstabMode;
  await runSteps(family, { g, info, o, r, mode, act, write, backup, log, baked: [] });
  return r;
}
