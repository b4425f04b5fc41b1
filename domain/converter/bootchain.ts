// The other places the boot chain reads device names, besides fstab and the kernel line (fstab.ts): GRUB's
// defaults that make grub-mkconfig write `root=/dev/sdX` (GRUB_DISABLE_LINUX_UUID=true, GRUB_DEVICE=...),
// crypttab's source devices and the initramfs resume setting. Pure functions, like fstab.ts; guest.ts reads and
// writes the files, and reads them back after the last step that could undo the change (`leftovers`).
import { classifySpec, FstabContext, resolveSpec, rewriteKernelArgs, stableSpec } from './fstab';

export interface Change { from: string; to: string }

const unstable = (spec: string) => ['kernel-name', 'by-path', 'by-id'].includes(classifySpec(spec));

/** The stable form (UUID=, else PARTUUID=) of an unstable device spec, when the device can be told. */
function stable(spec: string, ctx: FstabContext): string | undefined {
  const dev = resolveSpec(spec, ctx);
  return dev ? stableSpec(ctx.ids[dev], 'stabilize-all') : undefined;
}

const GRUB_ASSIGN = /^(\s*)(GRUB_DISABLE_LINUX_UUID|GRUB_DEVICE|GRUB_DEVICE_UUID|GRUB_DEVICE_PARTUUID|GRUB_DEVICE_BOOT)=(.*)$/;
const truthy = (v: string) => /^["']?true["']?\s*(#.*)?$/.test(v.trim());

/**
 * /etc/default/grub: the settings that make grub-mkconfig write kernel device names are commented out
 * (GRUB_DISABLE_LINUX_UUID=true; GRUB_DEVICE* overrides naming /dev/sdX and the like), and root=/resume= device
 * names in GRUB_CMDLINE_LINUX* become UUID=. grub-mkconfig then writes `root=UUID=...` whatever the appliance
 * calls the disk (it probes /dev/sda there).
 */
export function rewriteGrubDefaults(text: string, ctx: FstabContext): { text: string; changes: Change[] } {
  const changes: Change[] = [];
  const lines = text.split('\n').map((line) => {
    const m = GRUB_ASSIGN.exec(line);
    if (!m) return line;
    const [, , key, value] = m;
    const v = value.trim().replace(/^["']|["']$/g, '');
    const drop = key === 'GRUB_DISABLE_LINUX_UUID' ? truthy(value) : key.startsWith('GRUB_DEVICE') && v.startsWith('/dev/') && unstable(v);
    if (!drop) return line;
    changes.push({ from: line.trim(), to: `#${line.trim()}` });
    return `# ferry: makes grub-mkconfig write kernel device names, which change on virtio: ${line}`;
  });
  const k = rewriteKernelArgs(lines.join('\n'), 'stabilize-all', ctx);
  return { text: k.text, changes: [...changes, ...k.changes] };
}

/** Why /etc/default/grub would still make grub-mkconfig write device names (empty when it would not). */
export function grubDefaultsLeftovers(text: string): string[] {
  const out: string[] = [];
  for (const line of text.split('\n')) {
    const m = GRUB_ASSIGN.exec(line);
    if (!m) continue;
    const v = m[3].trim().replace(/^["']|["']$/g, '');
    if (m[2] === 'GRUB_DISABLE_LINUX_UUID' && truthy(m[3])) out.push(line.trim());
    else if (m[2].startsWith('GRUB_DEVICE') && v.startsWith('/dev/') && unstable(v)) out.push(line.trim());
  }
  return out.concat(kernelArgLeftovers(text));
}

/** root=/resume= arguments that still name an unstable device (grub.cfg, GRUB_CMDLINE_LINUX, a BLS entry). */
export function kernelArgLeftovers(text: string): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(/\b(root|resume)=(\/dev\/[^\s"']+)/g)) if (unstable(m[2])) out.push(m[0]);
  return [...new Set(out)];
}

/** /etc/crypttab: the second field (the encrypted device) becomes UUID= when it is a kernel name or path. */
export function rewriteCrypttab(text: string, ctx: FstabContext): { text: string; changes: Change[]; unresolved: string[] } {
  const changes: Change[] = [];
  const unresolved: string[] = [];
  const out = text.split('\n').map((line) => {
    const m = /^(\s*)(\S+)(\s+)(\S+)(.*)$/s.exec(line);
    if (!m || m[2].startsWith('#') || !m[4].startsWith('/dev/') || !unstable(m[4])) return line;
    const to = stable(m[4], ctx);
    if (!to) { unresolved.push(m[4]); return line; }
    changes.push({ from: m[4], to });
    return m[1] + m[2] + m[3] + to + m[5];
  });
  return { text: out.join('\n'), changes, unresolved };
}

export function crypttabLeftovers(text: string): string[] {
  return text.split('\n').map((l) => /^\s*[^#\s]\S*\s+(\/dev\/\S+)/.exec(l)?.[1]).filter((s): s is string => !!s && unstable(s));
}

/** initramfs-tools' resume setting (RESUME=/dev/sda2 in conf.d/resume or initramfs.conf). */
export function rewriteResume(text: string, ctx: FstabContext): { text: string; changes: Change[]; unresolved: string[] } {
  const changes: Change[] = [];
  const unresolved: string[] = [];
  const out = text.replace(/^(\s*RESUME=)(["']?)(\/dev\/[^\s"']+)\2/gm, (all, key: string, q: string, spec: string) => {
    if (!unstable(spec)) return all;
    const to = stable(spec, ctx);
    if (!to) { unresolved.push(spec); return all; }
    changes.push({ from: spec, to });
    return `${key}${q}${to}${q}`;
  });
  return { text: out, changes, unresolved };
}

export function resumeLeftovers(text: string): string[] {
  return [...text.matchAll(/^\s*RESUME=["']?(\/dev\/[^\s"']+)/gm)].map((m) => m[1]).filter(unstable);
}

/** dracut's configuration (/etc/dracut.conf.d/*.conf): device names in `add_device` (the resume or another early
 *  device, e.g. `add_device+=" /dev/sda2 "`) and root=/resume= in `kernel_cmdline` become UUID= forms. */
export function rewriteDracutDevices(text: string, ctx: FstabContext): { text: string; changes: Change[]; unresolved: string[] } {
  const changes: Change[] = [];
  const unresolved: string[] = [];
  const out = text.replace(/^(\s*add_device\+?=\s*["']?)([^"'\n]*)/gm, (all, key: string, list: string) => key + list.replace(/\/dev\/\S+/g, (spec) => {
    if (!unstable(spec)) return spec;
    const to = stable(spec, ctx);
    if (!to) { unresolved.push(spec); return spec; }
    changes.push({ from: spec, to });
    return to;
  }));
  const k = rewriteKernelArgs(out, 'stabilize-all', ctx);
  return { text: k.text, changes: [...changes, ...k.changes], unresolved };
}

/** dracut configuration device names that are still unstable (add_device, kernel_cmdline's root=/resume=). */
export function dracutDeviceLeftovers(text: string): string[] {
  const adds = [...text.matchAll(/^\s*add_device\+?=\s*["']?([^"'\n]*)/gm)].flatMap((m) => m[1].match(/\/dev\/\S+/g) || []).filter(unstable);
  return [...adds, ...kernelArgLeftovers(text)];
}

/** Multipath aliases (/etc/multipath/bindings: `mpatha <wwid>`) that fstab mounts by (`/dev/mapper/mpatha`,
 *  `/dev/mapper/mpatha1`, `-part1`, `p1`). */
export function multipathAliasesUsed(bindings: string, fstab: string): string[] {
  const aliases = bindings.split('\n').map((l) => /^\s*([^#\s]\S*)\s+\S+/.exec(l)?.[1]).filter((a): a is string => !!a);
  const specs = fstab.split('\n').map((l) => /^\s*(\/dev\/mapper\/\S+)/.exec(l)?.[1]).filter((s): s is string => !!s);
  return aliases.filter((a) => specs.some((s) => new RegExp(`^/dev/mapper/${a.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}(?:-part\\d+|p?\\d+)?$`).test(s)));
}
