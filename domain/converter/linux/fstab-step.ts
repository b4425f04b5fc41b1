// The Linux steps between the pre-checks and the package and boot repairs: every filesystem's identifiers read,
// XFS UUIDs regenerated when asked (before the fstab rewrite, so the new UUIDs are the ones written), fstab
// rewritten to stable names (virt-v2v's remap_block_devices begins here; disk-pins.ts does the rest).
import type { GuestSession } from '../guestfs';
import { DeviceIds, FstabContext, rewriteFstab } from '../fstab';
import type { GuestInfo } from '../types';
import type { FixRun } from '../steps';
import { mountGuest } from '../mounts';

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

/** New UUIDs for the guest's XFS filesystems (xfs_regenerate_uuid), unmounted for the change and mounted again. */
export async function regenerateXfsUuids({ g, info, o, r, act, ctx }: FixRun): Promise<void> {
  const xfs = Object.entries(info.filesystems).filter(([, t]) => t === 'xfs').map(([d]) => d);
  if (!xfs.length) act({ action: 'xfs_regenerate_uuid', status: 'skipped', detail: 'the guest has no XFS filesystem' });
  else if (o.dry_run) act({ action: 'xfs_regenerate_uuid', status: 'would_do', detail: `would give new UUIDs to ${xfs.join(', ')}` });
  else {
    await g.cmd('umount-all');
    for (const d of xfs) {
      const old = ctx!.ids[d]?.uuid;
      await g.cmd('xfs-admin', d, 'uuid:generate');
      const neu = (await g.blkid(d)).UUID;
      ctx!.ids[d] = { ...ctx!.ids[d], uuid: neu };
      act({ action: 'xfs_regenerate_uuid', status: 'done', detail: `${d}: ${old} -> ${neu}`, device: d, old_uuid: old, new_uuid: neu });
    }
    await mountGuest(g, info.mountpoints, false);
    r.modified = true;
  }
}

/** /etc/fstab rewritten by fstab_mode (fstab.ts), with a backup. */
export async function fixFstab({ g, o, r, act, write, backup, log, ctx, mode }: FixRun): Promise<void> {
  if (!(await g.isFile('/etc/fstab'))) { act({ action: 'fstab', status: 'warning', detail: '/etc/fstab not found in the guest' }); return; }
  const before = await g.read('/etc/fstab');
  const res = rewriteFstab(before, mode, ctx!);
  for (const w of res.warnings) act({ action: 'fstab', status: 'warning', detail: w });
  r.fstab_changes = res.changes;
  if (o.print_fstab) { r.fstab_before = before; r.fstab_after = res.text; log(`fstab before:\n${before}\nfstab after:\n${res.text}`); }
  if (mode === 'noop') act({ action: 'fstab', status: 'skipped', detail: `fstab_mode ${o.fstab_mode}: fstab left as it is` });
  else if (!res.changes.length) act({ action: 'fstab', status: 'skipped', detail: 'every fstab entry is already stable' });
  else {
    const bak = await backup('/etc/fstab');
    await write('/etc/fstab', res.text);
    act(
      { action: 'fstab', status: o.dry_run ? 'would_do' : 'done',
      detail: `${res.changes.length} entr${res.changes.length === 1 ? 'y' : 'ies'} rewritten${bak ? `, backup ${bak}` : ''}`, backup: bak,
      changes: res.changes });
  }
}
