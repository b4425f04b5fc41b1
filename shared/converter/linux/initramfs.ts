// Step 5 (virt-v2v's configure_kernel_modules and rebuild_initrd): the virtio drivers go into the guest's own
// initramfs generator's configuration (dracut add_drivers in /etc/dracut.conf.d, initramfs-tools' modules,
// mkinitcpio's conf.d), so the next kernel update keeps them, and every installed kernel's image is rebuilt
// into the file the boot loader loads (a host-only image is rebuilt as host-only, now with virtio). A generator
// Ferry does not know is a failure naming it. verify.ts reads each image back.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { run } from '../../qemu';
import type { GuestSession } from '../guestfs';
import type { LinuxFix } from './context';
import { INITRD_NAMES, runEnv } from './context';
import { INITRAMFS_TOOLS, UNSUPPORTED_INITRAMFS_TOOLS, VIRTIO_BOOT_MODULES, withEnv } from './tools';
import { expectedError } from '../../log';

/** Which of the virtio boot modules an initramfs listing (or the kernel itself) lacks; undefined: unreadable. */
export async function missingVirtio(x: LinuxFix, k: string, img: string): Promise<string[] | undefined> {
  const listing = await initramfsListing(x.g, img);
  if (!listing) return undefined;
  const builtin = (await x.g.isFile(`/lib/modules/${k}/modules.builtin`)) ? await x.g.read(`/lib/modules/${k}/modules.builtin`) : '';
  return VIRTIO_BOOT_MODULES.filter((m) => !new RegExp(`/${m}\\.ko(\\.[a-z]+)?$`, 'm').test(listing) && !new RegExp(`/${m}\\.ko$`, 'm').test(builtin));
}

/** The file list of an initramfs: the host's lsinitramfs on a downloaded copy (a second under TCG, against ~6 s
 *  for the guest's own lister run in the appliance), else the guest's own lister (a format the host's does not
 *  read, or no lsinitramfs on this host). */
async function initramfsListing(g: GuestSession, img: string): Promise<string | undefined> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-initrd-'));
  try {
    const local = path.join(dir, 'initrd');
    await g.cmd('download', img, local);
    const r = await run('lsinitramfs', [local]).catch(expectedError('no lsinitramfs on this host, or it failed: the guest\'s own lister is tried next'));
    if (r && r.code === 0 && /\.ko/.test(r.stdout)) return r.stdout;
  } finally { rmSync(dir, { recursive: true, force: true }); }
  for (const [bin, cmd] of [['/usr/bin/lsinitramfs', 'lsinitramfs'], ['/usr/sbin/lsinitramfs', 'lsinitramfs'], ['/usr/bin/lsinitrd', 'lsinitrd']]) {
    if (!(await g.isFile(bin))) continue;
    const out = await g.tryCmd('command', `${cmd} ${img}`);
    if (out && /\.ko/.test(out)) return out;
  }
  return undefined;
}

/** Each kernel in /lib/modules with its initramfs, and whether /boot has the kernel itself (a modules directory
 *  left behind by a removed kernel boots nothing and is not checked). */
export async function kernelsWithInitrd(x: LinuxFix): Promise<{ k: string; img?: string; installed: boolean }[]> {
  return Promise.all(x.info.kernels.map(async (k) => ({
    k, img: await x.g.firstFile(INITRD_NAMES(k)), installed: !!(await x.g.firstFile([`/boot/vmlinuz-${k}`, `/boot/vmlinuz-linux`, `/lib/modules/${k}/vmlinuz`])),
  })));
}

/** No generator Ferry drives: a known other one is a failure naming it (its image would keep lacking virtio);
 *  none at all is a warning (a guest whose kernels need no initramfs; verify.ts checks they have virtio built in). */
async function noKnownTool(x: LinuxFix): Promise<void> {
  for (const u of UNSUPPORTED_INITRAMFS_TOOLS) {
    const bin = await x.g.firstFile(u.paths);
    if (bin) { x.act({ action: 'regen_initramfs', status: 'failed', detail: `the guest's initramfs generator is ${u.tool} (${bin}), which Ferry does not support: its images keep lacking ${VIRTIO_BOOT_MODULES.join(', ')}; add them with that tool, or convert with virt-v2v` }); return; }
  }
  x.act({ action: 'regen_initramfs', status: 'warning', detail: `no initramfs tool in the guest (${INITRAMFS_TOOLS.map((t) => t.tool).join(', ')}); initramfs not regenerated` });
}

export async function regenInitramfs(x: LinuxFix, baked: string[]): Promise<void> {
  const { g, info, o, act } = x;
  const t = INITRAMFS_TOOLS.find((y) => y.tool === info.initramfs_tool);
  if (!t) { await noKnownTool(x); return; }
  if (!info.kernels.length) { act({ action: 'regen_initramfs', status: 'warning', detail: `${t.tool} is installed but /lib/modules has no kernel; nothing to regenerate` }); return; }
  if (t.conf) {
    const cur = (await g.isFile(t.conf.path)) ? await g.read(t.conf.path) : '';
    const add = t.conf.modules.filter((m) => !new RegExp(`(^|[\\s"])${m}($|[\\s"])`, 'm').test(cur.replace(/#.*/g, '')));
    if (add.length) {
      if (!o.dry_run) await g.cmd('mkdir-p', path.posix.dirname(t.conf.path));
      await x.write(t.conf.path, cur.replace(/\n?$/, cur ? '\n' : '') + t.conf.text(add));
      act({ action: 'regen_initramfs', status: o.dry_run ? 'would_do' : 'done', detail: `${t.conf.path}: added ${add.join(', ')}`, file: t.conf.path });
    }
  }
  if (o.dry_run) { act({ action: 'regen_initramfs', status: 'would_do', detail: `would run ${t.tool} for ${info.kernels.join(', ')} unless every initramfs already carries ${VIRTIO_BOOT_MODULES.join(', ')}` }); return; }
  for (const { k, img } of await kernelsWithInitrd(x)) {
    // Skipped only when nothing the initramfs carries changed and it already has the virtio boot modules.
    if (!baked.length && img) {
      const missing = await missingVirtio(x, k, img);
      if (missing && !missing.length) { act({ action: 'regen_initramfs', status: 'skipped', detail: `${img} already carries ${VIRTIO_BOOT_MODULES.join(', ')} and nothing it holds changed` }); continue; }
    }
    const args = t.args(k, img);
    try { await g.cmd('command', withEnv(args, await runEnv(x, t.env))); x.r.modified = true; act({ action: 'regen_initramfs', status: 'done', detail: `ran ${args.join(' ')}${baked.length ? ` (also for ${baked.join(', ')})` : ''}`, kernel: k }); }
    catch (e) { act({ action: 'regen_initramfs', status: 'warning', detail: `${t.tool} failed for ${k}: ${(e as Error).message}` }); }
  }
}
