// The Linux repairs, in the order that lets each hold: files first (fstab, crypttab, resume, GRUB's defaults,
// hypervisor tools, the configuration block, NIC names), then the guest's own generators, whose output depends
// on those files (the initramfs carries the modules list, resume, crypttab and .link files; grub-mkconfig reads
// /etc/default/grub and probes the appliance's /dev/sda), then grub.cfg is read back and mended if the
// generator still wrote device names, and last everything is read back (`verifyLinux`): what the report calls
// done is what the guest holds at the end, and a repair that did not hold fails the stage.
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { run } from '../qemu';
import type { GuestSession } from './guestfs';
import type { FixAction, FixOptions, FixResult, GuestInfo } from './guest';
import { FstabContext, FstabMode, rewriteFstab, rewriteKernelArgs } from './fstab';
import { crypttabLeftovers, grubDefaultsLeftovers, kernelArgLeftovers, resumeLeftovers, rewriteCrypttab, rewriteGrubDefaults, rewriteResume } from './bootchain';
import { configuredInterfaces, LINK_DIR, namesInterface, persistentNetNames, planNicFileEdits, planNicRenames } from './nic-names';
import { GRUB_TOOLS, HV_TOOL_PACKAGES, HV_TOOL_UNITS, INITRAMFS_TOOLS, installedHvPackages, PURGE, VIRTIO_BOOT_MODULES, withEnv } from './linux-tools';
import { applyConfiguration } from './configuration';
import { fallbackLeftovers, installFallbackLoader } from './firmware';
import { expectedError } from '../log';

export interface LinuxFix {
  g: GuestSession; info: GuestInfo; o: FixOptions; ctx: FstabContext; mode: FstabMode; r: FixResult;
  act: (a: FixAction) => void; write: (p: string, t: string) => Promise<void>; backup: (p: string) => Promise<string | undefined>;
  /** Packages the guest's package tool was run to remove (verified to be gone at the end). */
  purged?: string[];
  /** Whether the guest has /usr/bin/env (asked once). */
  hasEnv?: boolean;
}

const CRYPTTAB = '/etc/crypttab';
const RESUME_FILES = ['/etc/initramfs-tools/conf.d/resume', '/etc/initramfs-tools/initramfs.conf'];
const WANTS = ['/etc/systemd/system/multi-user.target.wants', '/etc/systemd/system/default.target.wants'];
const NET_DIRS = ['/etc/network/interfaces.d', '/etc/netplan', '/etc/systemd/network', '/etc/NetworkManager/system-connections', '/etc/sysconfig/network-scripts'];
const PERSISTENT_NET_RULES = '/etc/udev/rules.d/70-persistent-net.rules';
const INITRD_NAMES = (k: string) => [`/boot/initrd.img-${k}`, `/boot/initramfs-${k}.img`, `/boot/initrd-${k}`, `/boot/initramfs-linux.img`];

/** Every file under `dir` (one level) that is a regular file, or none when the directory is absent. */
async function filesIn(g: GuestSession, dir: string, suffix = ''): Promise<string[]> {
  if (!(await g.isDir(dir))) return [];
  const out: string[] = [];
  for (const n of g.lines(await g.tryCmd('ls', dir))) if (n.endsWith(suffix) && (await g.isFile(`${dir}/${n}`))) out.push(`${dir}/${n}`);
  return out;
}

/** Boot Loader Spec entries and /etc/kernel/cmdline (RHEL 8+, Fedora): their `options` carry root= too. */
async function blsFiles(g: GuestSession): Promise<string[]> {
  return [...(await filesIn(g, '/boot/loader/entries', '.conf')), ...((await g.isFile('/etc/kernel/cmdline')) ? ['/etc/kernel/cmdline'] : [])];
}

/** Rewrites one file with `fn` (backup first); true when it changed. */
async function edit(x: LinuxFix, file: string, action: string, fn: (t: string) => { text: string; changes: { from: string; to: string }[]; unresolved?: string[] }): Promise<boolean> {
  if (!(await x.g.isFile(file))) return false;
  const before = await x.g.read(file);
  const res = fn(before);
  for (const u of res.unresolved || []) x.act({ action, status: 'warning', detail: `${file}: cannot tell which device ${u} is; left unchanged` });
  if (!res.changes.length) return false;
  const bak = await x.backup(file);
  await x.write(file, res.text);
  x.act({ action, status: x.o.dry_run ? 'would_do' : 'done', detail: `${file}: ${res.changes.map((c) => `${c.from} -> ${c.to}`).join(', ')}`, file, backup: bak });
  return true;
}

/** The whole Linux repair, in order, then the read-back. */
export async function fixLinux(x: LinuxFix): Promise<void> {
  const { g, o, ctx, act } = x;
  const baked: string[] = [];

  // Device names the initramfs reads: crypttab (cryptroot copies it) and the resume device.
  if (x.mode !== 'noop') {
    if (await edit(x, CRYPTTAB, 'crypttab', (t) => rewriteCrypttab(t, ctx))) baked.push(CRYPTTAB);
    for (const f of RESUME_FILES) if (await edit(x, f, 'resume', (t) => rewriteResume(t, ctx))) baked.push(f);
  }

  // GRUB's defaults, before grub-mkconfig reads them; BLS entries are read by GRUB directly.
  if (o.update_grub) {
    await edit(x, '/etc/default/grub', 'update_grub', (t) => rewriteGrubDefaults(t, ctx));
    for (const f of await blsFiles(g)) await edit(x, f, 'update_grub', (t) => rewriteKernelArgs(t, 'stabilize-all', ctx));
  }

  if (o.remove_source_hv_tools) await removeHvTools(x);
  if (await applyConfiguration(g, o, act, x.write)) x.r.modified = true;
  if (o.nic_names !== false) baked.push(...(await renameNics(x)));
  if (o.regen_initramfs) await regenInitramfs(x, baked);
  if (o.update_grub) await regenGrub(x);
  // After GRUB: the fallback loader is a copy of the loader the guest boots, whose configuration is now final.
  if (o.firmware === 'uefi' && x.info.boot && (await installFallbackLoader(g, x.info.boot, x.info.distro, o.dry_run, act)).length) x.r.modified = true;
  if (!o.dry_run) await verifyLinux(x);
}

async function removeHvTools(x: LinuxFix): Promise<void> {
  const { g, info, o, act } = x;
  const st = o.dry_run ? 'would_do' : 'done';
  let did = 0;
  const pkgs = info.hypervisor_tools.filter((p) => HV_TOOL_PACKAGES.includes(p));
  if (pkgs.length) {
    const tool = PURGE[info.package_format || ''];
    const bin = tool && await g.firstFile(tool.bin);
    if (!tool || !bin) act({ action: 'remove_source_hv_tools', status: 'warning', detail: `packages ${pkgs.join(', ')} are installed but ${tool ? `${tool.bin[0]} is not in the guest` : `the package format "${info.package_format || 'unknown'}" has no removal tool here`}; services disabled only` });
    else if (o.dry_run) act({ action: 'remove_source_hv_tools', status: 'would_do', detail: `would run ${tool.cmd} ${pkgs.join(' ')}` });
    else {
      try { x.purged = pkgs; await g.cmd('command', withEnv([tool.cmd, ...pkgs], await runEnv(x, tool.env))); x.r.modified = true; did++; act({ action: 'remove_source_hv_tools', status: 'done', detail: `ran ${tool.cmd} ${pkgs.join(' ')}` }); }
      catch (e) { act({ action: 'remove_source_hv_tools', status: 'warning', detail: `${tool.cmd} failed: ${(e as Error).message}` }); }
    }
  }
  // Whatever the package tool left (or a tools install without a package): the units' enablement links.
  for (const unit of HV_TOOL_UNITS) {
    for (const dir of WANTS) {
      const p = `${dir}/${unit}`;
      if ((await g.tryCmd('is-symlink', p))?.trim() !== 'true') continue;
      if (!o.dry_run) { await g.cmd('rm', p); x.r.modified = true; }
      did++;
      act({ action: 'remove_source_hv_tools', status: st, detail: `disabled ${unit} (removed ${p})` });
    }
  }
  if (!did && !pkgs.length) act({ action: 'remove_source_hv_tools', status: 'skipped', detail: 'no source hypervisor tools found' });
}

/** The run-only environment for a guest tool, when the guest has `env` to set it with (a minimal guest may not:
 *  the tool then runs with its defaults). */
async function runEnv(x: LinuxFix, env?: string[]): Promise<string[] | undefined> {
  if (!env?.length) return undefined;
  x.hasEnv ??= await x.g.isFile('/usr/bin/env');
  return x.hasEnv ? env : undefined;
}

/** Renames the configured NICs to their KVM names (nic-names.ts): the configuration files and the old MAC-to-name
 *  rules rewritten, RHEL's ifcfg-<name> files renamed, a .link file per NIC. Returns the .link files written. */
async function renameNics(x: LinuxFix): Promise<string[]> {
  const { g, o, act } = x;
  if (o.configuration?.network !== undefined) { act({ action: 'nic_names', status: 'skipped', detail: 'configuration.network gives the network configuration' }); return []; }
  const files: { path: string; text: string }[] = [];
  for (const f of ['/etc/network/interfaces', ...(await Promise.all(NET_DIRS.map((d) => filesIn(g, d)))).flat()]) {
    if (await g.isFile(f)) files.push({ path: f, text: await g.read(f) });
  }
  const names = configuredInterfaces(files);
  if (!names.length) { act({ action: 'nic_names', status: 'skipped', detail: 'the guest\'s network configuration names no NIC (DHCP on any, or no configuration)' }); return []; }
  const rules = (await g.isFile(PERSISTENT_NET_RULES)) ? await g.read(PERSISTENT_NET_RULES) : undefined;
  const plan = planNicRenames(names, rules ? persistentNetNames(rules) : [], (o.nic_macs || []).filter(Boolean));
  if (plan.problem) { act({ action: 'nic_names', status: 'warning', detail: plan.problem }); return []; }
  const st = o.dry_run ? 'would_do' : 'done';
  const map = new Map(plan.renames.filter((r) => r.from !== r.to).map((r) => [r.from, r.to]));
  const summary = [...map].map(([f, t]) => `${f} -> ${t}`).join(', ');
  const written: string[] = [];
  // The configuration, and the old rules (they would give the NIC its old name back after the .link file).
  for (const e of planNicFileEdits([...files, ...(rules !== undefined ? [{ path: PERSISTENT_NET_RULES, text: rules }] : [])], map)) {
    const backup = await x.backup(e.path);
    await x.write(e.path, e.text);
    if (e.dest !== e.path && !o.dry_run) await g.cmd('mv', e.path, e.dest);
    x.r.modified ||= !o.dry_run;
    // udev in the initramfs names the NIC first, from the .link files and rules it carries, and a NIC it named
    // keeps that name: the guest's own .link files and the old rules count as baked in, as Ferry's do.
    if (e.dest.endsWith('.link') || e.dest === PERSISTENT_NET_RULES) written.push(e.dest);
    const moved = e.dest !== e.path ? ` (renamed to ${e.dest})` : '';
    act({ action: 'nic_names', status: st, detail: `${e.path}: ${summary}${moved}`, file: e.dest, renamed: e.renamed, backup });
  }
  for (const r of plan.renames) {
    const { path: p, text } = r.link;
    if ((await g.isFile(p)) && (await g.read(p)) === text) continue;
    if (!o.dry_run) { await g.cmd('mkdir-p', LINK_DIR); await x.write(p, text); await g.cmd('chmod', '0644', p); x.r.modified = true; }
    written.push(p);
    act({ action: 'nic_names', status: st, detail: `${p}: the NIC ${'mac' in r.match ? `with MAC ${r.match.mac}` : 'of the virtio driver'} is named ${r.to} (it was ${r.from})`, file: p, name: r.to });
  }
  return written;
}

/** Which of the virtio boot modules an initramfs listing (or the kernel itself) lacks; undefined: unreadable. */
async function missingVirtio(x: LinuxFix, k: string, img: string): Promise<string[] | undefined> {
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
async function kernelsWithInitrd(x: LinuxFix): Promise<{ k: string; img?: string; installed: boolean }[]> {
  return Promise.all(x.info.kernels.map(async (k) => ({
    k, img: await x.g.firstFile(INITRD_NAMES(k)), installed: !!(await x.g.firstFile([`/boot/vmlinuz-${k}`, `/boot/vmlinuz-linux`, `/lib/modules/${k}/vmlinuz`])),
  })));
}

async function regenInitramfs(x: LinuxFix, baked: string[]): Promise<void> {
  const { g, info, o, act } = x;
  const t = INITRAMFS_TOOLS.find((y) => y.tool === info.initramfs_tool);
  if (!t) { act({ action: 'regen_initramfs', status: 'warning', detail: 'no initramfs tool in the guest (dracut, update-initramfs, mkinitcpio); initramfs not regenerated' }); return; }
  if (!info.kernels.length) { act({ action: 'regen_initramfs', status: 'warning', detail: `${t.tool} is installed but /lib/modules has no kernel; nothing to regenerate` }); return; }
  if (t.conf) {
    const cur = (await g.isFile(t.conf.path)) ? await g.read(t.conf.path) : '';
    const add = t.conf.modules.filter((m) => !new RegExp(`(^|[\\s"])${m}($|[\\s"])`, 'm').test(cur.replace(/#.*/g, '')));
    if (add.length) {
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
    try { await g.cmd('command', withEnv(t.args(k), await runEnv(x, t.env))); x.r.modified = true; act({ action: 'regen_initramfs', status: 'done', detail: `ran ${t.args(k).join(' ')}${baked.length ? ` (also for ${baked.join(', ')})` : ''}` }); }
    catch (e) { act({ action: 'regen_initramfs', status: 'warning', detail: `${t.tool} failed for ${k}: ${(e as Error).message}` }); }
  }
}

/** grub-mkconfig with the mended defaults; then grub.cfg is read back and, if the generator still wrote device
 *  names (a GRUB_DEVICE it computed, a distribution script), the kernel lines are mended in place. */
async function regenGrub(x: LinuxFix): Promise<void> {
  const { g, info, o, act } = x;
  const cfg = info.grub_config;
  const tool = GRUB_TOOLS.find((t) => t.cfg === cfg) || GRUB_TOOLS[0];
  const bin = await g.firstFile(tool.bin);
  if (!bin) act({ action: 'update_grub', status: 'warning', detail: `grub-mkconfig is not installed in the guest (looked for ${tool.bin.join(', ')}); grub.cfg edited in place only` });
  else if (o.dry_run) act({ action: 'update_grub', status: 'would_do', detail: `would run ${bin} -o ${tool.cfg}` });
  else {
    try { await g.cmd('command', `${bin} -o ${tool.cfg}`); x.r.modified = true; act({ action: 'update_grub', status: 'done', detail: `ran ${bin} -o ${tool.cfg}` }); }
    catch (e) { act({ action: 'update_grub', status: 'warning', detail: `${bin} failed in the guest: ${(e as Error).message}` }); }
  }
  const final = cfg || (bin && (await g.isFile(tool.cfg)) ? tool.cfg : undefined);
  if (!final) { act({ action: 'update_grub', status: 'warning', detail: 'no GRUB configuration found (/boot/grub/grub.cfg, /boot/grub2/grub.cfg)' }); return; }
  const changed = await edit(x, final, 'update_grub', (t) => rewriteKernelArgs(t, 'stabilize-all', x.ctx));
  if (!changed && !bin) act({ action: 'update_grub', status: 'skipped', detail: `${final}: root=/resume= arguments are already stable` });
}

/** Reads the guest back after the last step that could undo a repair; a repair that did not hold is `failed`. */
async function verifyLinux(x: LinuxFix): Promise<void> {
  const { g, info, o, ctx, act } = x;
  const check = (what: string, bad: string[], ok: string) => act(bad.length
    ? { action: 'verify', status: 'failed', detail: `${what}: ${bad.join('; ')}`, check: what }
    : { action: 'verify', status: 'done', detail: `${what}: ${ok}`, check: what });
  const read = async (f: string) => ((await g.isFile(f)) ? g.read(f) : undefined);

  if (x.mode !== 'noop') {
    const fstab = await read('/etc/fstab');
    if (fstab !== undefined) check('/etc/fstab', rewriteFstab(fstab, x.mode, ctx).changes.map((c) => `line ${c.line} still names ${c.from}`), 'no entry names a device that changes on the new bus');
    const crypttab = await read(CRYPTTAB);
    if (crypttab !== undefined) check(CRYPTTAB, crypttabLeftovers(crypttab).map((d) => `still names ${d}`), 'every encrypted device is named stably');
    for (const f of RESUME_FILES) { const t = await read(f); if (t !== undefined && /RESUME=/.test(t)) check(f, resumeLeftovers(t).map((d) => `RESUME still names ${d}`), 'the resume device is named stably'); }
  }
  if (o.update_grub) {
    const defaults = await read('/etc/default/grub');
    if (defaults !== undefined) check('/etc/default/grub', grubDefaultsLeftovers(defaults), 'nothing makes grub-mkconfig write kernel device names');
    for (const f of [info.grub_config, ...(await blsFiles(g))].filter((f): f is string => !!f)) {
      const t = await read(f);
      if (t !== undefined) check(f, kernelArgLeftovers(t).map((a) => `still has ${a}`), 'every root=/resume= names a stable device');
    }
  }
  if (o.regen_initramfs) {
    for (const { k, img, installed } of await kernelsWithInitrd(x)) {
      if (!installed) continue;
      if (!img) {
        const builtin = (await g.isFile(`/lib/modules/${k}/modules.builtin`)) ? await g.read(`/lib/modules/${k}/modules.builtin`) : '';
        const missing = VIRTIO_BOOT_MODULES.filter((m) => !new RegExp(`/${m}\\.ko$`, 'm').test(builtin));
        check(`kernel ${k}`, missing.map((m) => `has no initramfs and ${m} is not built in`), `has no initramfs; ${VIRTIO_BOOT_MODULES.join(', ')} are built in`);
        continue;
      }
      const missing = await missingVirtio(x, k, img);
      if (!missing) act({ action: 'verify', status: 'warning', detail: `${img}: cannot list its contents (no lsinitramfs/lsinitrd in the guest or on this host understands it); the virtio modules are not verified`, check: 'initramfs' });
      else check(img, missing.map((m) => `lacks ${m}`), `carries ${VIRTIO_BOOT_MODULES.join(', ')}`);
    }
  }
  for (const a of x.r.actions.filter((y) => y.action === 'uefi_fallback' && y.status === 'done')) {
    const fallback = (a.files as string[])[0];
    check(fallback, await fallbackLeftovers(g, fallback, String(a.from)), `is ${String(a.from)}: a fresh NVRAM boots it`);
  }
  for (const a of x.r.actions.filter((y) => y.action === 'nic_names' && y.status === 'done')) {
    const t = await read(String(a.file));
    if (typeof a.name === 'string' && a.name) { check(String(a.file), t && t.includes(`Name=${a.name}`) ? [] : ['is missing or does not set the name'], `names the NIC ${a.name}`); continue; }
    const renamed = Object.entries(a.renamed as Record<string, string>);
    check(String(a.file), t === undefined ? ['is missing'] : renamed.flatMap(([from, to]) => [...(namesInterface(t, from) ? [`still names ${from}`] : []), ...(namesInterface(t, to) ? [] : [`does not name ${to}`])]),
      renamed.length ? `names ${renamed.map(([, to]) => to).join(', ')}, not ${renamed.map(([from]) => from).join(', ')}` : 'is in place');
  }
  if (o.remove_source_hv_tools) {
    const installed = x.purged?.length ? await installedHvPackages(g, info.root_device) : [];
    const left = (x.purged || []).filter((p) => installed.includes(p));
    const links: string[] = [];
    for (const unit of HV_TOOL_UNITS) for (const dir of WANTS) if ((await g.tryCmd('is-symlink', `${dir}/${unit}`))?.trim() === 'true') links.push(`${dir}/${unit}`);
    check('source hypervisor tools', [...left.map((p) => `package ${p} is still installed`), ...links.map((l) => `${l} still enables it`)], 'no package installed, no unit enabled');
  }
}
