// The guest's own generator, where it is cheap: after an appended archive gave the images virtio (initrd-append.ts),
// a systemd unit rebuilds them with the guest's generator at the first boot on KVM (seconds there, against a minute
// or more under TCG in the appliance), with the configuration Ferry wrote (virtio in its module list), and then
// removes itself, its script and its enablement link: from the second boot on the image is the generator's own.
// A failed rebuild leaves everything in place (the appended images still boot) and tries again at the next boot.
// What it did is said in the journal and on the console (opened afresh for each line: a serial getty may have hung
// up the descriptor systemd would hand it), so whoever watches the first boot sees it finish.
import type { LinuxFix } from './context';
import type { InitramfsTool } from './tools';

export const REBUILD_UNIT_NAME = 'ferry-initramfs-rebuild.service';
export const REBUILD_UNIT = `/etc/systemd/system/${REBUILD_UNIT_NAME}`;
export const REBUILD_LINK = `/etc/systemd/system/multi-user.target.wants/${REBUILD_UNIT_NAME}`;
export const REBUILD_SCRIPT = '/usr/local/sbin/ferry-initramfs-rebuild';
/** What the script prints when it is done (the guest tests wait for it before the second boot). */
export const REBUILD_DONE = 'ferry-initramfs-rebuild: done';

const UNIT = `# Written by Ferry: rebuilds the initramfs once with the guest's own generator after the migration, then
# removes itself (${REBUILD_SCRIPT} says what it does).
[Unit]
Description=Ferry: rebuild the initramfs with the guest's own generator (once, after the migration)
After=local-fs.target
ConditionPathExists=${REBUILD_SCRIPT}

[Service]
Type=oneshot
ExecStart=${REBUILD_SCRIPT}
StandardOutput=journal
StandardError=journal
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
`;

const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

/** The script: the generator for each image that got an appended archive, then the unit's removal. */
export function rebuildScript(t: InitramfsTool, images: { k: string; img: string }[]): string {
  const runs = images.map(({ k, img }) => `if [ -d /lib/modules/${q(k)} ]; then ${t.args(k, img).map(q).join(' ')} || failed=1; fi`);
  return `#!/bin/sh
# Written by Ferry at the migration to KVM: the initramfs images below got the virtio drivers by an archive appended
# to them, not from ${t.tool}. This rebuilds them once with ${t.tool} and the guest's configuration (which lists the
# virtio drivers), then removes itself and ${REBUILD_UNIT_NAME}. If ${t.tool} fails, nothing is removed: the
# images still boot, and this runs again at the next boot.
say() { echo "$*"; echo "$*" > /dev/console 2>/dev/null || true; }
failed=0
${runs.join('\n')}
if [ "$failed" != 0 ]; then say "ferry-initramfs-rebuild: ${t.tool} failed; the images stay as Ferry left them, tried again at the next boot"; exit 1; fi
sync
rm -f ${REBUILD_LINK} ${REBUILD_UNIT} ${REBUILD_SCRIPT}
sync
say "${REBUILD_DONE}: ${images.map((i) => i.img).join(' ')} rebuilt by ${t.tool}; the unit removed itself"
`;
}

/** Writes and enables the unit (a systemd guest only; otherwise a warning: the generator runs at the next kernel
 *  update, with virtio in its configuration). */
export async function installRebuildUnit(x: LinuxFix, t: InitramfsTool, images: { k: string; img: string }[]): Promise<void> {
  const { g, act } = x;
  if (!(await g.isDir('/etc/systemd/system')) || !(await g.firstFile(['/lib/systemd/systemd', '/usr/lib/systemd/systemd']))) {
    act({ action: 'initramfs_rebuild_unit', status: 'warning', detail: `the guest does not run systemd: the appended images stay until ${t.tool} runs next (a kernel update), with virtio in its configuration` });
    return;
  }
  await g.cmd('mkdir-p', '/usr/local/sbin');
  await x.write(REBUILD_SCRIPT, rebuildScript(t, images));
  await g.cmd('chmod', '0755', REBUILD_SCRIPT);
  await x.write(REBUILD_UNIT, UNIT);
  await g.cmd('chmod', '0644', REBUILD_UNIT);
  await g.cmd('mkdir-p', '/etc/systemd/system/multi-user.target.wants');
  await g.cmd('ln-sf', REBUILD_UNIT, REBUILD_LINK);
  act({ action: 'initramfs_rebuild_unit', status: 'done', detail: `${REBUILD_UNIT} (enabled) runs ${t.tool} for ${images.map((i) => i.k).join(', ')} at the first boot on KVM, then removes itself`, files: [REBUILD_UNIT, REBUILD_SCRIPT, REBUILD_LINK] });
}

/** verify.ts's part: the unit, its script and its link are in place when it was installed. */
export async function verifyRebuildUnit(x: LinuxFix, check: (what: string, bad: string[], ok: string) => void): Promise<void> {
  if (!x.r.actions.some((a) => a.action === 'initramfs_rebuild_unit' && a.status === 'done')) return;
  const bad: string[] = [];
  for (const f of [REBUILD_UNIT, REBUILD_SCRIPT]) if (!(await x.g.isFile(f))) bad.push(`${f} is missing`);
  if ((await x.g.tryCmd('is-symlink', REBUILD_LINK))?.trim() !== 'true') bad.push(`${REBUILD_LINK} does not enable it`);
  check(REBUILD_UNIT_NAME, bad, 'in place and enabled: the guest\'s generator rebuilds the images at the first boot');
}
