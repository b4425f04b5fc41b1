// What the converter checks before it changes anything, shared with the plans' preflight (domain/plans/
// guest-preflight.ts and guest-rules.ts) so one rule gives one answer in both places: which guests the steps handle,
// and how much room the repair needs on / and /boot.
import type { GuestSession } from './guestfs';
import type { GuestInfo } from './types';
import type { ConverterStep } from './steps';
import { GuestLowSpace, UnsupportedGuest } from './errors';

/** "Debian 12.15 (linux)": libguestfs's product name for Debian is only the version, so the distribution leads. */
export function osOf(i: GuestInfo): string {
  const distro = i.distro && i.distro !== 'unknown' ? i.distro[0].toUpperCase() + i.distro.slice(1) : i.os;
  const product = i.product_name && i.product_name !== i.version && !i.version?.startsWith(i.product_name) ? `, ${i.product_name}` : '';
  return `${[distro, i.version].filter(Boolean).join(' ')} (${i.os}${product})`;
}

/** Package formats libguestfs names whose tools and layouts the Linux steps do not know (they remove packages and
 *  read databases with dpkg, rpm, apk and pacman; linux/tools.ts PURGE). A guest without a package database
 *  (package format unknown) is not refused: the steps report what they could not find. */
const FOREIGN_PACKAGE_FORMATS: Record<string, string> = {
  xbps: 'Void Linux\'s xbps', ebuild: 'Gentoo\'s portage (ebuild)', pisi: 'Pardus\'s pisi', pkgsrc: 'pkgsrc', pkg: 'FreeBSD\'s pkg',
};

/** Why the converter's steps do not handle this guest, or undefined when they do. */
export function unsupportedReason(i: GuestInfo): string | undefined {
  if (i.os !== 'linux' && i.os !== 'windows') return `the converter's steps handle Linux and Windows guests, and this is "${i.os}"`;
  const pf = i.os === 'linux' && i.package_format ? FOREIGN_PACKAGE_FORMATS[i.package_format] : undefined;
  if (pf) return `the Linux steps know the deb, rpm, apk and pacman families, and this distribution uses ${pf}`;
  return undefined;
}

const MiB = 2 ** 20;
export const mib = (n: number) => `${(n / MiB).toFixed(0)} MiB`;
/** Room the repair needs: on /boot a new initramfs beside the old plus slack, on / the backups and the generator's
 *  work files (/var/tmp). A guest with no kernel has no initramfs to rebuild: the backups only. */
const BOOT_SLACK = 16 * MiB, ROOT_NEED = 32 * MiB, BACKUP_NEED = MiB;

export interface GuestSpace {
  /** Free bytes for unprivileged writers (statvfs bavail) of the file systems mounted at / and /boot. */
  free: Record<string, number>;
  /** The initramfs images in /boot, and the size of the largest (the generator writes a new one beside it). */
  initrds: string[]; largestInitrd: number;
}

/** Reads the room on the mounted guest's / and /boot, and its initramfs images. */
export async function readGuestSpace(g: GuestSession, info: GuestInfo): Promise<GuestSpace> {
  const free: Record<string, number> = {};
  for (const mp of ['/', '/boot']) {
    if (mp === '/boot' && !info.mountpoints['/boot']) continue;
    const st: Record<string, number> = {};
    for (const l of g.lines(await g.tryCmd('statvfs', mp))) { const [k, v] = l.split(': '); st[k] = Number(v); }
    if (st.bavail !== undefined) free[mp] = st.bavail * (st.frsize || st.bsize);
  }
  const initrds = g.lines(await g.tryCmd('ls', '/boot')).filter((n) => /^(initrd\.img-|initramfs-|initrd-)/.test(n)).map((n) => `/boot/${n}`);
  let largestInitrd = 0;
  for (const x of initrds) largestInitrd = Math.max(largestInitrd, Number((await g.tryCmd('filesize', x))?.trim() || 0));
  return { free, initrds, largestInitrd };
}

/** The rule: each mount point (/ and /boot) with less room than the repair needs, said for people. Linux only. */
export function spaceShortfalls(i: GuestInfo, s: Pick<GuestSpace, 'free' | 'largestInitrd'>): { mountpoint: string; message: string }[] {
  if (i.os !== 'linux') return [];
  if (!i.kernels.length) {
    const f = s.free['/'];
    return f !== undefined &&
      f < BACKUP_NEED ? [{ mountpoint: '/', message: `/ has ${mib(f)} free; the repair needs about ${mib(BACKUP_NEED)} there for its backups` }] : [];
  }
  const bootApart = !!i.mountpoints['/boot'] && i.mountpoints['/boot'] !== i.mountpoints['/'];
  const bootNeed = s.largestInitrd + BOOT_SLACK;
  const needs: [string, number][] = bootApart ? [['/boot', bootNeed], ['/', ROOT_NEED]] : [['/', bootNeed + ROOT_NEED]];
  return needs.filter(([mp, need]) => s.free[mp] !== undefined && s.free[mp] < need).map(([mp, need]) => ({ mountpoint: mp,
    message: `${mp} has ${mib(s.free[mp])} free; the repair needs about ${mib(need)} there (a new initramfs of up to ${mib(s.largestInitrd)} beside the old, ` +
             `backups, the generator's work files)` }));
}

export const CHECK_SUPPORTED: ConverterStep = {
  name: 'check_supported', precheck: true,
  does: 'refuses, by name and before any change, a guest the steps do not handle (not Linux or Windows, a Linux family they do not know)',
  run: ({ info }) => { const why = unsupportedReason(info); if (why) throw new UnsupportedGuest(osOf(info), why); },
};

/** The free-space rule above on the guest being repaired; a dry run reports it as a warning and goes on, to say
 *  everything else it would do. */
export const CHECK_FREE_SPACE: ConverterStep = {
  name: 'check_free_space', precheck: true,
  does: 'reads the free space on / and /boot and refuses a guest with less than the repair needs (the plans\' preflight rule)',
  run: async ({ g, info, o, act }) => {
    const short = spaceShortfalls(info, await readGuestSpace(g, info)).map((x) => x.message).join('; ');
    if (!short) return;
    if (!o.dry_run) throw new GuestLowSpace(short);
    act({ action: 'check_free_space', status: 'warning', detail: short });
  },
};
