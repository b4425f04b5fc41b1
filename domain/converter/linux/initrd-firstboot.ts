// The guest's own generator, where it is cheap: after an appended archive gave the images virtio (initrd-append.ts),
// a first-boot unit (firstboot-unit.ts) rebuilds them with the guest's generator at the first boot on KVM (seconds
// there, against a minute or more under TCG in the appliance), with the configuration Ferry wrote (virtio in its
// module list), and then removes itself: from the second boot on the image is the generator's own. A failed rebuild
// leaves everything in place (the appended images still boot) and tries again at the next boot.
import type { LinuxFix } from './context';
import type { InitramfsTool } from './tools';
import { firstBootScript, runsSystemd, shq, unitFiles, unitProblems, writeFirstBootUnit, type FirstBootUnit } from './firstboot-unit';

export const REBUILD: FirstBootUnit = {
  name: 'ferry-initramfs-rebuild.service', script: '/usr/local/sbin/ferry-initramfs-rebuild',
  description: 'rebuild the initramfs with the guest\'s own generator (once, after the migration)',
};
/** The unit, its script and its link, while it has not run. */
export const REBUILD_FILES = unitFiles(REBUILD);
/** What the script prints when it is done (the guest tests wait for it before the second boot). */
export const REBUILD_DONE = 'ferry-initramfs-rebuild: done';

/** The script: the generator for each image that got an appended archive, then the unit's removal. */
export function rebuildScript(t: InitramfsTool, images: { k: string; img: string }[]): string {
  return firstBootScript(REBUILD, {
    header: `Written by Ferry at the migration to KVM: the initramfs images below got the virtio drivers by an archive appended
to them, not from ${t.tool}. This rebuilds them once with ${t.tool} and the guest's configuration (which lists the
virtio drivers), then removes itself and ${REBUILD.name}. If ${t.tool} fails, nothing is removed: the
images still boot, and this runs again at the next boot.`,
    body: images.map(({ k, img }) => `if [ -d /lib/modules/${shq(k)} ]; then ${t.args(k, img).map(shq).join(' ')} || failed=1; fi`).join('\n'),
    failed: `ferry-initramfs-rebuild: ${t.tool} failed; the images stay as Ferry left them, tried again at the next boot`,
    done: REBUILD_DONE, what: `${images.map((i) => i.img).join(' ')} rebuilt by ${t.tool}; the unit removed itself`,
  });
}

/** Writes and enables the unit (a systemd guest only; otherwise a warning: the generator runs at the next kernel
 *  update, with virtio in its configuration). */
export async function installRebuildUnit(x: LinuxFix, t: InitramfsTool, images: { k: string; img: string }[]): Promise<void> {
  if (!(await runsSystemd(x.g))) {
    x.act({
      action: 'initramfs_rebuild_unit', status: 'warning',
      detail: `the guest does not run systemd: the appended images stay until ${t.tool} runs next (a kernel update), `
        + 'with virtio in its configuration',
    });
    return;
  }
  const files = await writeFirstBootUnit(x, REBUILD, rebuildScript(t, images));
  x.act({
    action: 'initramfs_rebuild_unit', status: 'done',
    detail: `${files[0]} (enabled) runs ${t.tool} for ${images.map((i) => i.k).join(', ')} at the first boot on KVM, then removes itself`,
    files,
  });
}

/** verify.ts's part: the unit, its script and its link are in place when it was installed. */
export async function verifyRebuildUnit(x: LinuxFix, check: (what: string, bad: string[], ok: string) => void): Promise<void> {
  if (!x.r.actions.some((a) => a.action === 'initramfs_rebuild_unit' && a.status === 'done')) return;
  check(REBUILD.name, await unitProblems(x.g, REBUILD), 'in place and enabled: the guest\'s generator rebuilds the images at the first boot');
}
