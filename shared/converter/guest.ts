// Guest inspection and repair inside one GuestSession. Steps that need guest binaries (grub-mkconfig, dracut,
// package managers) check the binary is there and, when it is not, say so as a warning instead of pretending.
import { GuestSession } from './guestfs';
import { DeviceIds, FstabContext, FstabMode, rewriteFstab } from './fstab';
import { injectVirtioDrivers } from './windows';
import { fixLinux } from './linux';
import { INITRAMFS_TOOLS, installedHvPackages } from './linux/tools';
import { detectBoot } from './firmware';
import type { FixAction, FixOptions, FixResult, GuestInfo } from './types';
import { ignoreError } from '../log';

/** Which guest an appliance shared by several guests inspects: its root and its disks, and whether a device
 *  (a partition, an LV) lies on them. */
export interface GuestScope { root: string; devices: string[]; owns: (dev: string) => Promise<boolean> }

/** Inspects the guest and mounts its filesystems (read-write unless the session is read-only). */
export async function inspectAndMount(g: GuestSession, readonly: boolean, scope?: GuestScope): Promise<GuestInfo> {
  const roots = scope ? [scope.root] : g.lines(await g.cmd('inspect-os'));
  if (!roots.length) throw new Error('guest inspection found no operating system');
  const root = roots[0];
  const get = async (c: string) => (await g.tryCmd(c, root))?.trim() || undefined;
  const os = (await get('inspect-get-type')) || 'unknown';
  const info: GuestInfo = {
    os, distro: await get('inspect-get-distro'), product_name: await get('inspect-get-product-name'),
    hostname: await get('inspect-get-hostname'), root_device: root, mountpoints: {}, filesystems: {}, lvm: false, kernels: [], hypervisor_tools: [],
  };
  const maj = await get('inspect-get-major-version');
  const min = await get('inspect-get-minor-version');
  if (maj) info.version = `${maj}.${min || 0}`;
  for (const l of g.lines(await g.cmd('inspect-get-mountpoints', root))) { const [mp, dev] = l.split(': '); info.mountpoints[mp] = dev; }
  for (const l of g.lines(await g.cmd('list-filesystems'))) { const [dev, type] = l.split(': '); if (!scope || await scope.owns(dev)) info.filesystems[dev] = type; }
  if (scope) info.devices = scope.devices;
  info.lvm = Object.keys(info.filesystems).some((d) => d.startsWith('/dev/mapper/') || /^\/dev\/[^/]+\/[^/]+$/.test(d) && !/^\/dev\/(sd|vd|hd)/.test(d));
  // Shortest mount point first, so / is mounted before /boot.
  for (const mp of Object.keys(info.mountpoints).sort((a, b) => a.length - b.length)) {
    // A mount point the appliance cannot mount (a swap or foreign filesystem listed there) is left out; the
    // repairs read what they need and report what they could not find.
    await g.cmd(readonly ? 'mount-ro' : 'mount', info.mountpoints[mp], mp).catch(ignoreError('could not mount a guest mount point in the appliance; inspection and repair go on without what it holds', { mountpoint: mp }));
  }
  if (os === 'linux') {
    if (await g.isDir('/lib/modules')) info.kernels = g.lines(await g.tryCmd('ls', '/lib/modules'));
    info.package_format = await get('inspect-get-package-format');
    // libguestfs reads the guest's package database (dpkg, rpm, apk, pacman) for the installed applications.
    info.hypervisor_tools.push(...(await installedHvPackages(g, root)));
    for (const f of ['/usr/bin/vmtoolsd', '/etc/vmware-tools']) if (await g.exists(f)) info.hypervisor_tools.push(f);
    for (const t of INITRAMFS_TOOLS) if (await g.firstFile(t.paths)) { info.initramfs_tool = t.tool; break; }
    for (const c of ['/boot/grub/grub.cfg', '/boot/grub2/grub.cfg']) if (await g.isFile(c)) { info.grub_config = c; break; }
    info.boot = await detectBoot(g, info.mountpoints, scope?.devices);
  }
  return info;
}

/** Identifiers of every filesystem and swap device, for the fstab rewrite. */
export async function deviceContext(g: GuestSession, info: GuestInfo): Promise<FstabContext> {
  const disks = info.devices ?? g.lines(await g.cmd('list-devices'));
  const ids: Record<string, DeviceIds> = {};
  for (const dev of Object.keys(info.filesystems)) {
    const b = await g.blkid(dev);
    ids[dev] = { uuid: b.UUID || undefined, partuuid: b.PART_ENTRY_UUID || undefined, label: b.LABEL || undefined };
  }
  return { disks, ids, rootDevice: info.mountpoints['/'] };
}

/** The repairs a migration job (daemon shape B) asks for; the plans' preflight runs the same as a dry run to say
 *  which files the repair would change. */
export const MIGRATION_REPAIR = { enabled: true, remove_source_hv_tools: true, fstab_mode: 'stabilize-all', update_grub: true, regen_initramfs: true } as const;

/** Every repair the fix stage asked for, on the mounted guest. Nothing is written when dry_run is set. */
export async function fixGuest(g: GuestSession, info: GuestInfo, o: FixOptions, log: (m: string) => void): Promise<FixResult> {
  const r: FixResult = { modified: false, actions: [], warnings: [], failures: [], fstab_changes: [] };
  const act = (a: FixAction) => {
    r.actions.push(a);
    if (a.status === 'warning') r.warnings.push(`${a.action}: ${a.detail}`);
    if (a.status === 'failed') r.failures.push(`${a.action}: ${a.detail}`);
  };
  const write = async (path: string, text: string) => { if (!o.dry_run) { await g.writeFile(path, text); r.modified = true; } };
  const backup = async (path: string) => (o.backup && !o.dry_run ? g.backup(path) : undefined);

  if (info.os === 'windows') {
    if (o.inject_virtio_drivers) r.modified = await injectVirtioDrivers(g, info.root_device, o, act);
    act({ action: 'linux_fixes', status: 'skipped', detail: 'the guest is Windows: fstab, grub and initramfs repairs do not apply' });
    if (r.modified) await g.cmd('sync');
    return r;
  }
  if (info.os !== 'linux') { act({ action: 'fix', status: 'skipped', detail: `guest OS "${info.os}" is not supported by the fix stage` }); return r; }
  if (o.inject_virtio_drivers) act({ action: 'inject_virtio_drivers', status: 'skipped', detail: 'Linux guests use the virtio drivers of their kernel (see regen_initramfs)' });

  const ctx = await deviceContext(g, info);

  // xfs_regenerate_uuid runs before the fstab rewrite so the new UUIDs are the ones written.
  if (o.xfs_regenerate_uuid) {
    const xfs = Object.entries(info.filesystems).filter(([, t]) => t === 'xfs').map(([d]) => d);
    if (!xfs.length) act({ action: 'xfs_regenerate_uuid', status: 'skipped', detail: 'the guest has no XFS filesystem' });
    else if (o.dry_run) act({ action: 'xfs_regenerate_uuid', status: 'would_do', detail: `would give new UUIDs to ${xfs.join(', ')}` });
    else {
      await g.cmd('umount-all');
      for (const d of xfs) {
        const old = ctx.ids[d]?.uuid;
        await g.cmd('xfs-admin', d, 'uuid:generate');
        const neu = (await g.blkid(d)).UUID;
        ctx.ids[d] = { ...ctx.ids[d], uuid: neu };
        act({ action: 'xfs_regenerate_uuid', status: 'done', detail: `${d}: ${old} -> ${neu}`, device: d, old_uuid: old, new_uuid: neu });
      }
      for (const mp of Object.keys(info.mountpoints).sort((a, b) => a.length - b.length)) await g.cmd('mount', info.mountpoints[mp], mp).catch(ignoreError('could not remount after the xfs UUID change: a mount point that was not mounted before stays unmounted', { mountpoint: mp }));
      r.modified = true;
    }
  }

  // fstab
  const mode = (o.fstab_mode === 'preserve' ? 'noop' : o.fstab_mode) as FstabMode;
  if (!(await g.isFile('/etc/fstab'))) act({ action: 'fstab', status: 'warning', detail: '/etc/fstab not found in the guest' });
  else {
    const before = await g.read('/etc/fstab');
    const res = rewriteFstab(before, mode, ctx);
    for (const w of res.warnings) act({ action: 'fstab', status: 'warning', detail: w });
    r.fstab_changes = res.changes;
    if (o.print_fstab) { r.fstab_before = before; r.fstab_after = res.text; log(`fstab before:\n${before}\nfstab after:\n${res.text}`); }
    if (mode === 'noop') act({ action: 'fstab', status: 'skipped', detail: `fstab_mode ${o.fstab_mode}: fstab left as it is` });
    else if (!res.changes.length) act({ action: 'fstab', status: 'skipped', detail: 'every fstab entry is already stable' });
    else {
      const bak = await backup('/etc/fstab');
      await write('/etc/fstab', res.text);
      act({ action: 'fstab', status: o.dry_run ? 'would_do' : 'done', detail: `${res.changes.length} entr${res.changes.length === 1 ? 'y' : 'ies'} rewritten${bak ? `, backup ${bak}` : ''}`, backup: bak, changes: res.changes });
    }
  }

  await fixLinux({ g, info, o, ctx, mode, r, act, write, backup });
  if (!o.dry_run && r.modified) await g.cmd('sync');
  return r;
}
