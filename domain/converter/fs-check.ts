// The guest's file systems checked before the repair writes to them and again after (issue 35 item 4): a damaged
// file system is refused by name instead of written to, and damage the repair would have done fails the fix stage
// instead of reaching the target. Only the file systems the repair writes on are checked (/, /boot, the ESP, a
// separate /var or /usr): each check costs 0.2-1.2 s under TCG, and the appliance's time is bounded (issue 34).
// The session works on the output or an overlay of the source, never on the source itself.
import type { GuestSession } from './guestfs';
import type { GuestInfo } from './types';
import type { ConverterStep, FixRun } from './steps';
import { ConverterError } from './errors';
import { mountGuest } from './mounts';
import { fsDevice } from './inspection-hint';

/** Where the repair writes: /etc, /boot (initramfs, GRUB), the ESP (the fallback loader), /var/tmp, /usr's units. */
const WRITTEN = ['/', '/boot', '/boot/efi', '/var', '/usr'];

const message = (e: unknown) => (e as Error).message.replace(/^[^:]*: /, '').trim().split('\n').filter(Boolean).slice(0, 4).join(' ');

/** Each type's checker as the appliance runs it: the problem found, or undefined when clean. */
const CHECKERS: Record<string, (g: GuestSession, dev: string) => Promise<string | undefined>> = {
  // Preen mode, as the guest's own boot-time check runs it: what is safe to mend is mended, anything else fails.
  ext4: (g, dev) => g.cmd('e2fsck', dev, 'correct:true').then(() => undefined, message),
  // No preen mode: -n only reads; status 1 is corruption found.
  xfs: async (g, dev) => {
    const status = (await g.cmd('xfs-repair', dev, 'nomodify:true').catch((e: unknown) => message(e))).trim();
    return status === '0' ? undefined : status === '1' ? 'xfs_repair -n found corruption' : status;
  },
  btrfs: (g, dev) => g.cmd('btrfs-fsck', dev).then(() => undefined, message),
  // fsck -a: 1 is "errors corrected"; 2 and up are not.
  vfat: async (g, dev) => { const st = Number((await g.cmd('fsck', 'vfat', dev)).trim()); return st > 1 ? `fsck.vfat -a returned ${st}` : undefined; },
};
CHECKERS.ext2 = CHECKERS.ext3 = CHECKERS.ext4;

/** The devices the repair writes on that have a checker, once each (a btrfs subvolume: its file system). */
export function devicesToCheck(info: GuestInfo): { device: string; type: string }[] {
  const out = new Map<string, string>();
  for (const mp of WRITTEN) {
    const mounted = info.mountpoints[mp];
    const device = mounted && fsDevice(mounted);
    const type = mounted && (info.filesystems[mounted] ?? info.filesystems[device]);
    if (device && type && CHECKERS[type]) out.set(device, type);
  }
  return [...out].map(([device, type]) => ({ device, type }));
}

/** Checks them with the guest unmounted, and mounts it again (read-write). */
export async function checkFilesystems(g: GuestSession, info: GuestInfo): Promise<{ device: string; type: string; problem?: string }[]> {
  const devices = devicesToCheck(info);
  await g.cmd('umount-all');
  try {
    const out = [];
    for (const d of devices) out.push({ ...d, problem: await CHECKERS[d.type](g, d.device) });
    return out;
  } finally { await mountGuest(g, info.mountpoints, false); }
}

const said = (checked: { device: string; type: string }[]) => checked.map((c) => `${c.device} (${c.type})`).join(', ');

/** Before any change: a damaged file system refuses the guest, by name, as a guest fault. */
export const CHECK_FILESYSTEMS: ConverterStep = {
  name: 'check_filesystems', precheck: true,
  does: 'checks the file systems the repair writes on (/, /boot, the ESP) with their own checkers, and refuses a damaged one',
  run: async ({ g, info, o, act }: FixRun) => {
    if (o.dry_run) {
      act({ action: 'check_filesystems', status: 'skipped', detail: 'a dry run opens the disks read-only; the checkers run in the repair' });
      return;
    }
    const checked = await checkFilesystems(g, info);
    const bad = checked.filter((c) => c.problem);
    if (bad.length) {
      throw new ConverterError(`the file system check found damage: ${bad.map((c) => `${c.device} (${c.type}): ${c.problem}`).join('; ')}; ` +
        'repair it in the source VM and export again; nothing in the source was changed', 'guest', 'check_filesystems');
    }
    const detail = checked.length ? `clean: ${said(checked)}` : 'no file system the repair writes on has a checker here';
    act({ action: 'check_filesystems', status: 'done', detail });
  },
};

/** After every change: damage found fails the fix stage (a repair that did not hold), the output not delivered. */
export const RECHECK_FILESYSTEMS: ConverterStep = {
  name: 'recheck_filesystems',
  does: 'checks the same file systems again after the repair wrote to them; damage fails the fix stage',
  run: async ({ g, info, o, r, act }: FixRun) => {
    if (o.dry_run || !r.modified) return;
    const checked = await checkFilesystems(g, info);
    const bad = checked.filter((c) => c.problem);
    for (const c of bad) {
      act({ action: 'recheck_filesystems', status: 'failed', detail: `${c.device} (${c.type}) after the repair: ${c.problem}`, device: c.device });
    }
    if (!bad.length) act({ action: 'recheck_filesystems', status: 'done', detail: `clean after the repair: ${said(checked)}` });
  },
};
