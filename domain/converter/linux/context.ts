// What every Linux repair step shares: the fix in progress (LinuxFix), where the guest keeps what the steps
// read, and the small helpers for reading and editing guest files. The steps are the other files of linux/;
// index.ts runs them in order.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { GuestSession } from '../guestfs';
import type { FstabContext } from '../fstab';
import type { FixRun } from '../steps';

/** A Linux step's view of the repair (steps.ts FixRun) once the device_ids step has read the identifiers. */
export interface LinuxFix extends FixRun {
  ctx: FstabContext;
  /** Packages the guest's package tool was run to remove (verified to be gone at the end). */
  purged?: string[];
  /** Packages a first-boot unit removes on KVM (hv-tools.ts): its unit is verified to be in place instead. */
  purgeAtBoot?: string[];
  /** Whether the guest has /usr/bin/env (asked once). */
  hasEnv?: boolean;
  /** Per initramfs image that got Ferry's appended archive: the files placed in it (image path, guest path), read
   *  back by verify.ts against the guest's files as they are at the end. */
  initrdPlaced?: Record<string, { image: string; guest: string }[]>;
  /** A kernel had no image and its generator made one: grub.cfg must list it (grub.ts). */
  initrdCreated?: boolean;
}
export const CRYPTTAB = '/etc/crypttab';
export const RESUME_FILES = ['/etc/initramfs-tools/conf.d/resume', '/etc/initramfs-tools/initramfs.conf'];
export const WANTS = ['/etc/systemd/system/multi-user.target.wants', '/etc/systemd/system/default.target.wants'];
export const NET_DIRS = ['/etc/network/interfaces.d', '/etc/netplan', '/etc/systemd/network', '/etc/NetworkManager/system-connections',
  '/etc/sysconfig/network-scripts'];
export const PERSISTENT_NET_RULES = '/etc/udev/rules.d/70-persistent-net.rules';
export const INITRD_NAMES = (k: string) => [`/boot/initrd.img-${k}`, `/boot/initramfs-${k}.img`, `/boot/initrd-${k}`, `/boot/initramfs-linux.img`];

/** Every file under `dir` (one level) that is a regular file, or none when the directory is absent. */
export async function filesIn(g: GuestSession, dir: string, suffix = ''): Promise<string[]> {
  if (!(await g.isDir(dir))) return [];
  const out: string[] = [];
  for (const n of g.lines(await g.tryCmd('ls', dir))) if (n.endsWith(suffix) && (await g.isFile(`${dir}/${n}`))) out.push(`${dir}/${n}`);
  return out;
}

/** Boot Loader Spec entries and /etc/kernel/cmdline (RHEL 8+, Fedora): their `options` carry root= too. */
export async function blsFiles(g: GuestSession): Promise<string[]> {
  return [...(await filesIn(g, '/boot/loader/entries', '.conf')), ...((await g.isFile('/etc/kernel/cmdline')) ? ['/etc/kernel/cmdline'] : [])];
}

/** Rewrites one file with `fn` (backup first); true when it changed. */
export async function edit(
  x: LinuxFix, file: string, action: string,
  fn: (t: string) => { text: string; changes: { from: string; to: string }[]; unresolved?: string[] },
): Promise<boolean> {
  if (!(await x.g.isFile(file))) return false;
  const before = await x.g.read(file);
  const res = fn(before);
  for (const u of res.unresolved || []) x.act({ action, status: 'warning', detail: `${file}: cannot tell which device ${u} is; left unchanged` });
  if (!res.changes.length) return false;
  const bak = await x.backup(file);
  await x.write(file, res.text);
  const detail = `${file}: ${res.changes.map((c) => `${c.from} -> ${c.to}`).join(', ')}`;
  x.act({ action, status: x.o.dry_run ? 'would_do' : 'done', detail, file, backup: bak });
  return true;
}

/** The run-only environment for a guest tool, when the guest has `env` to set it with (a minimal guest may not:
 *  the tool then runs with its defaults). */
export async function runEnv(x: LinuxFix, env?: string[]): Promise<string[] | undefined> {
  if (!env?.length) return undefined;
  x.hasEnv ??= await x.g.isFile('/usr/bin/env');
  return x.hasEnv ? env : undefined;
}

/** A guest file's bytes (downloaded through a private temp file), or undefined when it is not a file. */
export async function guestBytes(g: GuestSession, p: string): Promise<Buffer | undefined> {
  if (!(await g.isFile(p))) return undefined;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-initrd-'));
  try {
    await g.cmd('download', p, path.join(dir, 'f'));
    return readFileSync(path.join(dir, 'f'));
  } finally { rmSync(dir, { recursive: true, force: true }); }
}

/** Several guest files' bytes at once: one `copy-out` (one client call: each call costs 0.3-1 s under TCG and load)
 *  when their names differ and all exist, else one by one. Only the files that exist are in the answer. */
export async function guestFiles(g: GuestSession, paths: string[]): Promise<Map<string, Buffer>> {
  const out = new Map<string, Buffer>();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-initrd-'));
  try {
    const names = paths.map((p) => path.posix.basename(p));
    if (paths.length && new Set(names).size === paths.length && (await g.tryCmd('copy-out', ...paths, dir)) !== undefined) {
      paths.forEach((p, i) => out.set(p, readFileSync(path.join(dir, names[i]))));
      return out;
    }
  } finally { rmSync(dir, { recursive: true, force: true }); }
  for (const p of paths) { const b = await guestBytes(g, p); if (b) out.set(p, b); }
  return out;
}

/** Each kernel in /lib/modules with its initramfs, and whether /boot has the kernel itself (a modules directory
 *  left behind by a removed kernel boots nothing and is not checked). */
export async function kernelsWithInitrd(x: LinuxFix): Promise<{ k: string; img?: string; installed: boolean }[]> {
  return Promise.all(x.info.kernels.map(async (k) => ({
    k,
    img: await x.g.firstFile(INITRD_NAMES(k)),
    installed: !!(await x.g.firstFile([`/boot/vmlinuz-${k}`, `/boot/vmlinuz-linux`, `/lib/modules/${k}/vmlinuz`])),
  })));
}
