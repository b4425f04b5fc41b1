// The read-back of what boots: for every kernel the boot loader offers (grub.cfg's menu entries, Boot Loader Spec
// entries; the installed kernels when neither lists one), the initramfs files it loads, concatenated as GRUB loads
// them and unpacked archive by archive as the kernel does (../initrd-image.ts), must hold each virtio module (block,
// SCSI, PCI, net) and every module they depend on, indexed, and each file Ferry placed in an appended archive as the
// guest has it now. An image that does not unpack fails, naming where.
import type { LinuxFix } from './context';
import { blsFiles, guestBytes, guestFiles, kernelsWithInitrd } from './context';
import { effectiveTree, InitrdParseError, readInitrd } from '../initrd-image';
import { bootEntries, concatInitrds, initrdProblems, moduleClosure, type BootEntry, type PlacedFile } from './initrd-check';
import { VIRTIO_BOOT_MODULES, VIRTIO_MODULES } from './tools';

/** What the images of kernel `k` (guest paths, in the order the boot loader loads them) lack to boot it on KVM;
 *  undefined when the first does not start as any initramfs the reader knows (lzma, lzo: not verified). */
export async function imageProblems(x: LinuxFix, k: string, imgs: string[]): Promise<string[] | undefined> {
  const { g } = x;
  const parts: Buffer[] = [];
  for (const p of imgs) {
    const b = await guestBytes(g, p);
    if (!b) return [`${p} is missing`];
    parts.push(b);
  }
  let tree;
  try { tree = effectiveTree(await readInitrd(concatInitrds(parts))); } catch (e) {
    if (e instanceof InitrdParseError && e.unknownFormat) return undefined;
    if (e instanceof InitrdParseError) return [`does not unpack as the kernel unpacks it: ${e.message}`];
    throw e;
  }
  const meta = await guestFiles(g, [`/lib/modules/${k}/modules.dep`, `/lib/modules/${k}/modules.builtin`]);
  const dep = meta.get(`/lib/modules/${k}/modules.dep`);
  if (!dep) return [`the guest has no /lib/modules/${k}/modules.dep: the modules kernel ${k} needs cannot be told`];
  const builtin = meta.get(`/lib/modules/${k}/modules.builtin`)?.toString('utf8') ?? '';
  const need = moduleClosure(dep.toString('utf8'), builtin, VIRTIO_MODULES);
  const placed: PlacedFile[] = [];
  for (const p of imgs.flatMap((i) => x.initrdPlaced?.[i] ?? [])) {
    const data = await guestBytes(g, p.guest);
    if (data) placed.push({ image: p.image, data });
  }
  return [...need.unknown.map((m) => `kernel ${k} has no ${m}, neither a module nor built in`), ...initrdProblems(tree, k, need.files, placed)];
}

/** The kernels the boot loader offers, with the /boot files of their initramfs; the installed kernels and their
 *  images when no configuration lists a kernel. */
async function offered(x: LinuxFix): Promise<BootEntry[]> {
  const texts: string[] = [];
  for (const f of [x.info.grub_config, ...(await blsFiles(x.g))].filter((f): f is string => !!f)) if (await x.g.isFile(f)) texts.push(await x.g.read(f));
  // A BLS entry's initrd line may name a variable ($tuned_initrd) GRUB expands from grubenv: not a file.
  const listed: BootEntry[] = [];
  for (const e of bootEntries(texts)) {
    // An entry whose kernel is not in /boot boots nothing: it is not checked (as a modules directory without one).
    if (await x.g.firstFile([`/boot/vmlinuz-${e.kver}`, `/lib/modules/${e.kver}/vmlinuz`])) {
      listed.push({ ...e, initrds: e.initrds.filter((n) => !n.startsWith('$')) });
    }
  }
  if (listed.length) return listed;
  return (await kernelsWithInitrd(x)).filter((e) => e.installed).map((e) => ({ kver: e.k, initrds: e.img ? [e.img.replace(/^\/boot\//, '')] : [] }));
}

/** verify.ts's part for the initramfs: one check per kernel the boot loader offers. */
export async function verifyInitrds(x: LinuxFix, check: (what: string, bad: string[], ok: string) => void): Promise<void> {
  for (const { kver, initrds } of await offered(x)) {
    if (!initrds.length) {
      const builtin = (await guestBytes(x.g, `/lib/modules/${kver}/modules.builtin`))?.toString('utf8') ?? '';
      const missing = VIRTIO_BOOT_MODULES.filter((m) => !new RegExp(`/${m}\\.ko$`, 'm').test(builtin));
      check(`kernel ${kver}`, missing.map((m) => `has no initramfs and ${m} is not built in`),
        `has no initramfs; ${VIRTIO_BOOT_MODULES.join(', ')} are built in`);
      continue;
    }
    const imgs = initrds.map((n) => `/boot/${n}`);
    const placed = imgs.some((i) => x.initrdPlaced?.[i]?.length) ? ' and the files Ferry placed in it' : '';
    const problems = await imageProblems(x, kver, imgs);
    if (!problems) {
      x.act({
        action: 'verify', status: 'warning',
        detail: `${imgs.join(' + ')}: its format is not one Ferry reads (gzip, xz, zstd, lz4 legacy, bzip2 or uncompressed cpio); `
          + 'the virtio modules are not verified',
        check: 'initramfs',
      });
    } else {
      check(imgs.join(' + '), problems, `carries ${VIRTIO_MODULES.join(', ')} with their dependencies, indexed, for kernel ${kver}${placed}`);
    }
  }
}
