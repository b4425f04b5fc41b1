// What an initramfs must hold to boot a kernel on KVM, judged on the files the kernel leaves after unpacking every
// archive of the image (../initrd-image.ts): each virtio module the guest needs and every module it depends on, by
// the guest's own modules.dep, each listed in the image's modules.dep (else modprobe, and udev loading drivers by
// device alias, cannot find it), and each file the repair placed in the image with the content the guest has now.
// Pure functions: verify.ts and initrd-append.ts read the guest and the image and call them.
import path from 'node:path';
import { type CpioEntry, S_IFMT, S_IFDIR } from '../initrd-image';

/** A module's name from its file (`kernel/drivers/block/virtio_blk.ko.xz` -> `virtio_blk`), `-` read as `_`. */
export const moduleName = (file: string): string => path.posix.basename(file).replace(/\.ko(\.(xz|zst|gz))?$/, '').replace(/-/g, '_');

/** The module files (relative to /lib/modules/<kver>) that `wanted` need by the guest's modules.dep, dependencies
 *  included (modules.dep lists them transitively), less the modules built into the kernel; `unknown`: neither. */
export function moduleClosure(modulesDep: string, builtin: string, wanted: string[]): { files: string[]; builtin: string[]; unknown: string[] } {
  const deps = new Map<string, { file: string; deps: string[] }>();
  for (const line of modulesDep.split('\n')) {
    const m = /^([^:\s]+):\s*(.*)$/.exec(line.trim());
    if (m) deps.set(moduleName(m[1]), { file: m[1], deps: m[2].split(/\s+/).filter(Boolean) });
  }
  const inKernel = new Set(builtin.split('\n').map((l) => l.trim()).filter(Boolean).map(moduleName));
  const files = new Set<string>();
  const r = { builtin: [] as string[], unknown: [] as string[] };
  for (const w of wanted.map((n) => n.replace(/-/g, '_'))) {
    const d = deps.get(w);
    if (d) { files.add(d.file); d.deps.forEach((f) => files.add(f)); } else if (inKernel.has(w)) r.builtin.push(w); else r.unknown.push(w);
  }
  return { files: [...files], ...r };
}

/** Where the image keeps the modules of `kver` (`lib/modules/<kver>/` or, merged /usr, `usr/lib/modules/<kver>/`):
 *  the directory holding its modules.dep. */
export function modulesPrefix(tree: Map<string, CpioEntry>, kver: string): string | undefined {
  return [`usr/lib/modules/${kver}/`, `lib/modules/${kver}/`].find((p) => tree.has(`${p}modules.dep`));
}

/** The image's modules of `kver` by name, with their paths relative to the modules directory. */
export function imageModules(tree: Map<string, CpioEntry>, prefix: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const [name, e] of tree) if (name.startsWith(prefix) && /\.ko(\.(xz|zst|gz))?$/.test(name) && (e.mode & S_IFMT) !== S_IFDIR) out.set(moduleName(name), name.slice(prefix.length));
  return out;
}

/** A file the image must hold as the guest has it now: its path in the image and its content. */
export interface PlacedFile { image: string; data: Buffer }

/**
 * What the unpacked image lacks to boot `kver` on KVM: each module file of `modules` (paths relative to the
 * modules directory, from moduleClosure) absent or missing from the image's modules.dep, and each of `files` absent
 * or different. Empty: it boots as far as the initramfs's part goes.
 */
export function initrdProblems(tree: Map<string, CpioEntry>, kver: string, modules: string[], files: PlacedFile[] = []): string[] {
  const problems: string[] = [];
  if (modules.length) {
    const prefix = modulesPrefix(tree, kver);
    if (!prefix) problems.push(`holds no modules.dep for kernel ${kver}: no module can be loaded`);
    else {
      const have = imageModules(tree, prefix);
      const indexed = new Set(tree.get(`${prefix}modules.dep`)!.data.toString('utf8').split('\n').map((l) => /^([^:\s]+):/.exec(l)?.[1]).filter((f): f is string => !!f).map(moduleName));
      for (const m of modules.map(moduleName)) {
        if (!have.has(m)) problems.push(`lacks ${m} for kernel ${kver}`);
        else if (!indexed.has(m)) problems.push(`holds ${m} but its modules.dep does not list it (modprobe cannot load it)`);
      }
    }
  }
  for (const f of files) {
    const e = tree.get(f.image);
    if (!e) problems.push(`lacks ${f.image}`);
    else if (!e.data.equals(f.data)) problems.push(`holds a ${f.image} that is not the guest's current one`);
  }
  return problems;
}

/** A kernel the boot loader offers and the initramfs files it loads with it (names in /boot, in order). */
export interface BootEntry { kver: string; initrds: string[] }

/**
 * The kernels a GRUB configuration or Boot Loader Spec entries offer: each `linux` line's kernel (vmlinuz-<kver>)
 * with the `initrd` line after it (GRUB concatenates several files on one line: microcode first). Paths are
 * reduced to their names, found in /boot whatever filesystem or subvolume GRUB reads them from. Deduplicated.
 */
export function bootEntries(texts: string[]): BootEntry[] {
  const out = new Map<string, BootEntry>();
  for (const text of texts) {
    let cur: BootEntry | undefined;
    for (const line of text.split('\n')) {
      const k = /^\s*linux(?:16|efi)?\s+(\S+)/.exec(line);
      if (k) { cur = { kver: path.posix.basename(k[1]).replace(/^vmlinuz-/, ''), initrds: [] }; out.set(`${cur.kver}\0`, cur); continue; }
      const i = /^\s*initrd(?:16|efi)?\s+(.+)$/.exec(line);
      if (i && cur) {
        out.delete(`${cur.kver}\0${cur.initrds.join(' ')}`);
        cur.initrds = i[1].trim().split(/\s+/).map((p) => path.posix.basename(p));
        out.set(`${cur.kver}\0${cur.initrds.join(' ')}`, cur);
        cur = undefined;
      }
      if (/^\s*(menuentry|submenu)\b|^\s*\}/.test(line)) cur = undefined;
    }
  }
  // A kernel listed once with and once without an initrd keeps only the entry with one.
  return [...out.values()].filter((e, _, all) => e.initrds.length || !all.some((o) => o.kver === e.kver && o.initrds.length));
}

/** GRUB concatenates the initrd files of one line, each padded to 4 bytes. */
export function concatInitrds(parts: Buffer[]): Buffer {
  return Buffer.concat(parts.flatMap((p) => (p.length % 4 ? [p, Buffer.alloc(4 - (p.length % 4))] : [p])));
}
