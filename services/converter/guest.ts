// Guest inspection and repair inside one GuestSession. Steps that need guest binaries (grub-mkconfig, dracut,
// package managers) check the binary is there and, when it is not, say so as a warning instead of pretending.
import type { FixStage } from '../../shared/schemas/manifest';
import { GuestSession } from './guestfs';
import { DeviceIds, FstabContext, FstabMode, rewriteFstab, rewriteKernelArgs } from './fstab';
import { applyConfiguration } from './configuration';
import { injectVirtioDrivers } from './windows';

export interface GuestInfo {
  os: string; distro?: string; version?: string; product_name?: string; hostname?: string;
  root_device: string; mountpoints: Record<string, string>; filesystems: Record<string, string>;
  lvm: boolean; kernels: string[]; hypervisor_tools: string[]; initramfs_tool?: string; grub_config?: string;
  /** deb, rpm, apk, pacman... (inspect-get-package-format), for removing packages with the guest's own tool. */
  package_format?: string;
}

export interface FixAction { action: string; status: 'done' | 'would_do' | 'skipped' | 'warning' | 'failed'; detail: string; [k: string]: unknown }
export interface FixResult { modified: boolean; actions: FixAction[]; warnings: string[]; fstab_before?: string; fstab_after?: string; fstab_changes: unknown[] }

// Source hypervisors' guest tools, under their Debian, RHEL/SUSE and Alpine names.
const HV_TOOL_PACKAGES = ['open-vm-tools', 'open-vm-tools-desktop', 'open-vm-tools-sdmp', 'vmware-tools', 'xe-guest-utilities', 'xe-guest-utilities-latest',
  'hyperv-daemons', 'hypervkvpd', 'hypervvssd', 'hypervfcopyd', 'walinuxagent', 'WALinuxAgent'];
/** How to remove packages with the guest's own package tool, by package format. */
const PURGE: Record<string, { bin: string[]; cmd: string }> = {
  deb: { bin: ['/usr/bin/dpkg'], cmd: 'dpkg --purge' },
  rpm: { bin: ['/usr/bin/rpm', '/bin/rpm'], cmd: 'rpm -e' },
  apk: { bin: ['/sbin/apk'], cmd: 'apk del' },
  pacman: { bin: ['/usr/bin/pacman'], cmd: 'pacman -Rns --noconfirm' },
};
const HV_TOOL_UNITS = ['vmtoolsd.service', 'open-vm-tools.service', 'vmware-tools.service', 'vgauth.service', 'xe-linux-distribution.service'];
const INITRAMFS_TOOLS: { tool: string; paths: string[]; args: (kver: string) => string[]; conf?: { path: string; text: string } }[] = [
  { tool: 'dracut', paths: ['/usr/bin/dracut', '/sbin/dracut', '/usr/sbin/dracut'], args: (k) => ['dracut', '-f', '--kver', k],
    conf: { path: '/etc/dracut.conf.d/ferry-virtio.conf', text: 'add_drivers+=" virtio_blk virtio_scsi virtio_net virtio_pci virtio_console "\n' } },
  { tool: 'update-initramfs', paths: ['/usr/sbin/update-initramfs', '/sbin/update-initramfs'], args: (k) => ['update-initramfs', '-u', '-k', k],
    conf: { path: '/etc/initramfs-tools/modules', text: 'virtio_blk\nvirtio_scsi\nvirtio_net\nvirtio_pci\n' } },
  { tool: 'mkinitcpio', paths: ['/usr/bin/mkinitcpio'], args: () => ['mkinitcpio', '-P'] },
];
const GRUB_TOOLS = [
  { bin: ['/usr/sbin/grub-mkconfig', '/sbin/grub-mkconfig'], cfg: '/boot/grub/grub.cfg' },
  { bin: ['/usr/sbin/grub2-mkconfig', '/sbin/grub2-mkconfig'], cfg: '/boot/grub2/grub.cfg' },
];

/** Inspects the guest and mounts its filesystems (read-write unless the session is read-only). */
export async function inspectAndMount(g: GuestSession, readonly: boolean): Promise<GuestInfo> {
  const roots = g.lines(await g.cmd('inspect-os'));
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
  for (const l of g.lines(await g.cmd('list-filesystems'))) { const [dev, type] = l.split(': '); info.filesystems[dev] = type; }
  info.lvm = Object.keys(info.filesystems).some((d) => d.startsWith('/dev/mapper/') || /^\/dev\/[^/]+\/[^/]+$/.test(d) && !/^\/dev\/(sd|vd|hd)/.test(d));
  // Shortest mount point first, so / is mounted before /boot.
  for (const mp of Object.keys(info.mountpoints).sort((a, b) => a.length - b.length)) {
    await g.cmd(readonly ? 'mount-ro' : 'mount', info.mountpoints[mp], mp).catch(() => undefined);
  }
  if (os === 'linux') {
    if (await g.isDir('/lib/modules')) info.kernels = g.lines(await g.tryCmd('ls', '/lib/modules'));
    info.package_format = await get('inspect-get-package-format');
    // libguestfs reads the guest's package database (dpkg, rpm, apk, pacman) for the installed applications.
    const apps = new Set((await g.tryCmd('inspect-list-applications2', root) || '').split('\n').map((l) => /^\s*app2_name: (.+)$/.exec(l)?.[1]).filter((x): x is string => !!x));
    for (const p of HV_TOOL_PACKAGES) if (apps.has(p)) info.hypervisor_tools.push(p);
    for (const f of ['/usr/bin/vmtoolsd', '/etc/vmware-tools']) if (await g.exists(f)) info.hypervisor_tools.push(f);
    for (const t of INITRAMFS_TOOLS) if (await g.firstFile(t.paths)) { info.initramfs_tool = t.tool; break; }
    for (const c of ['/boot/grub/grub.cfg', '/boot/grub2/grub.cfg']) if (await g.isFile(c)) { info.grub_config = c; break; }
  }
  return info;
}

/** Identifiers of every filesystem and swap device, for the fstab rewrite. */
export async function deviceContext(g: GuestSession, info: GuestInfo): Promise<FstabContext> {
  const disks = g.lines(await g.cmd('list-devices'));
  const ids: Record<string, DeviceIds> = {};
  for (const dev of Object.keys(info.filesystems)) {
    const b = await g.blkid(dev);
    ids[dev] = { uuid: b.UUID || undefined, partuuid: b.PART_ENTRY_UUID || undefined, label: b.LABEL || undefined };
  }
  return { disks, ids, rootDevice: info.mountpoints['/'] };
}

export interface FixOptions extends FixStage { fstab_mode: FstabMode | string; dry_run: boolean; configuration?: Record<string, any> }

/** Every repair the fix stage asked for, on the mounted guest. Nothing is written when dry_run is set. */
export async function fixGuest(g: GuestSession, info: GuestInfo, o: FixOptions, log: (m: string) => void): Promise<FixResult> {
  const r: FixResult = { modified: false, actions: [], warnings: [], fstab_changes: [] };
  const act = (a: FixAction) => { r.actions.push(a); if (a.status === 'warning' || a.status === 'failed') r.warnings.push(`${a.action}: ${a.detail}`); };
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
      for (const mp of Object.keys(info.mountpoints).sort((a, b) => a.length - b.length)) await g.cmd('mount', info.mountpoints[mp], mp).catch(() => undefined);
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

  // Boot loader: root= arguments made stable (a real edit), then grub-mkconfig when the guest has it.
  if (o.update_grub) {
    const files = [info.grub_config, '/etc/default/grub'].filter((f): f is string => !!f);
    let edited = 0;
    for (const f of files) {
      if (!(await g.isFile(f))) continue;
      const text = await g.read(f);
      const res = rewriteKernelArgs(text, mode === 'noop' ? 'stabilize-all' : mode, ctx);
      if (!res.changes.length) continue;
      const bak = await backup(f);
      await write(f, res.text);
      edited++;
      act({ action: 'update_grub', status: o.dry_run ? 'would_do' : 'done', detail: `${f}: ${res.changes.map((c) => `${c.from} -> ${c.to}`).join(', ')}`, file: f, backup: bak });
    }
    if (!files.length) act({ action: 'update_grub', status: 'warning', detail: 'no GRUB configuration found (/boot/grub/grub.cfg, /boot/grub2/grub.cfg)' });
    else if (!edited) act({ action: 'update_grub', status: 'skipped', detail: 'boot-loader root= arguments are already stable' });
    const tool = GRUB_TOOLS.find((t) => t.cfg === info.grub_config) || GRUB_TOOLS[0];
    const bin = await g.firstFile(tool.bin);
    if (!bin) act({ action: 'update_grub', status: 'warning', detail: `grub-mkconfig is not installed in the guest (looked for ${tool.bin.join(', ')}); configuration not regenerated` });
    else if (o.dry_run) act({ action: 'update_grub', status: 'would_do', detail: `would run ${bin} -o ${tool.cfg}` });
    else {
      try { await g.cmd('command', `${bin} -o ${tool.cfg}`); r.modified = true; act({ action: 'update_grub', status: 'done', detail: `ran ${bin}` }); }
      catch (e) { act({ action: 'update_grub', status: 'warning', detail: `${bin} failed in the guest: ${(e as Error).message}` }); }
    }
  }

  if (o.regen_initramfs) {
    const t = INITRAMFS_TOOLS.find((x) => x.tool === info.initramfs_tool);
    if (!t) act({ action: 'regen_initramfs', status: 'warning', detail: 'no initramfs tool in the guest (dracut, update-initramfs, mkinitcpio); initramfs not regenerated' });
    else if (!info.kernels.length) act({ action: 'regen_initramfs', status: 'warning', detail: `${t.tool} is installed but /lib/modules has no kernel; nothing to regenerate` });
    else if (o.dry_run) act({ action: 'regen_initramfs', status: 'would_do', detail: `would add virtio drivers and run ${t.tool} for ${info.kernels.join(', ')}` });
    else {
      if (t.conf) { const cur = (await g.isFile(t.conf.path)) ? await g.read(t.conf.path) : ''; if (!cur.includes('virtio_blk')) await write(t.conf.path, cur + t.conf.text); }
      for (const k of info.kernels) {
        try { await g.cmd('command', t.args(k).join(' ')); r.modified = true; act({ action: 'regen_initramfs', status: 'done', detail: `${t.tool} for ${k}` }); }
        catch (e) { act({ action: 'regen_initramfs', status: 'warning', detail: `${t.tool} failed for ${k}: ${(e as Error).message}` }); }
      }
    }
  }

  if (o.remove_source_hv_tools) {
    let did = 0;
    for (const unit of HV_TOOL_UNITS) {
      for (const dir of ['/etc/systemd/system/multi-user.target.wants', '/etc/systemd/system/default.target.wants']) {
        const p = `${dir}/${unit}`;
        if ((await g.tryCmd('is-symlink', p))?.trim() !== 'true') continue;
        if (!o.dry_run) { await g.cmd('rm', p); r.modified = true; }
        did++;
        act({ action: 'remove_source_hv_tools', status: o.dry_run ? 'would_do' : 'done', detail: `disabled ${unit} (removed ${p})` });
      }
    }
    const pkgs = info.hypervisor_tools.filter((p) => HV_TOOL_PACKAGES.includes(p));
    if (pkgs.length) {
      const tool = PURGE[info.package_format || ''];
      const bin = tool && await g.firstFile(tool.bin);
      if (!tool || !bin) act({ action: 'remove_source_hv_tools', status: 'warning', detail: `packages ${pkgs.join(', ')} are installed but ${tool ? `${tool.bin[0]} is not in the guest` : `the package format "${info.package_format || 'unknown'}" has no removal tool here`}; services disabled only` });
      else if (o.dry_run) act({ action: 'remove_source_hv_tools', status: 'would_do', detail: `would run ${tool.cmd} ${pkgs.join(' ')}` });
      else {
        try { await g.cmd('command', `${tool.cmd} ${pkgs.join(' ')}`); r.modified = true; act({ action: 'remove_source_hv_tools', status: 'done', detail: `removed ${pkgs.join(', ')} (${tool.cmd})` }); }
        catch (e) { act({ action: 'remove_source_hv_tools', status: 'warning', detail: `${tool.cmd} failed: ${(e as Error).message}` }); }
      }
    } else if (!did) act({ action: 'remove_source_hv_tools', status: 'skipped', detail: 'no source hypervisor tools found' });
  }

  if (await applyConfiguration(g, o, act, write)) r.modified = true;
  if (!o.dry_run && r.modified) await g.cmd('sync');
  return r;
}
