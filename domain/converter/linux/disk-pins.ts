// Step 3 (virt-v2v's remap_block_devices and its cache removal): everything besides fstab (guest.ts) that pins
// the disk as VMware presented it. Device names the initramfs and GRUB read become UUID= forms (crypttab, the
// resume device of initramfs-tools and dracut, GRUB's defaults and BLS entries); caches of the old devices are
// removed (blkid's, LVM's metadata cache); LVM's devices file is removed, since it names the PVs by the SATA
// disk's WWID or name, and with it LVM ignores the same PV on a virtio disk (LVs the initramfs does not activate,
// /home say, never appear). Unlike virt-v2v this runs before the initramfs is rebuilt: newer dracut copies the
// devices file into the image. Multipath aliases the guest mounts by are reported: no WWID follows the disk.
// Returns the files the initramfs carries that changed.
import type { LinuxFix } from './context';
import { blsFiles, CRYPTTAB, edit, filesIn, RESUME_FILES } from './context';
import { rewriteKernelArgs } from '../fstab';
import { multipathAliasesUsed, rewriteCrypttab, rewriteDracutDevices, rewriteGrubDefaults, rewriteResume } from '../bootchain';

/** Caches of the old devices: rebuilt on demand by blkid and LVM (virt-v2v removes the same). */
export const STALE_CACHES = ['/etc/blkid/blkid.tab', '/etc/blkid.tab', '/etc/lvm/cache/.cache'];
/** LVM's devices file (lvm.conf `devicesfile`, default system.devices under /etc/lvm/devices). */
export const LVM_DEVICES_DIR = '/etc/lvm/devices';
const MULTIPATH_BINDINGS = '/etc/multipath/bindings';

/** The devices file LVM reads: lvm.conf's `devicesfile` setting, else system.devices. */
async function lvmDevicesFile(x: LinuxFix): Promise<string> {
  const conf = (await x.g.isFile('/etc/lvm/lvm.conf')) ? await x.g.read('/etc/lvm/lvm.conf') : '';
  const name = /^\s*devicesfile\s*=\s*"([^"/]+)"/m.exec(conf)?.[1] || 'system.devices';
  return `${LVM_DEVICES_DIR}/${name}`;
}

/** Removes `file` (backup first) and says why. */
async function removePin(x: LinuxFix, file: string, why: string): Promise<boolean> {
  if (!(await x.g.isFile(file))) return false;
  const bak = await x.backup(file);
  if (!x.o.dry_run) { await x.g.cmd('rm', file); x.r.modified = true; }
  x.act({ action: 'disk_pins', status: x.o.dry_run ? 'would_do' : 'done', detail: `removed ${file}: ${why}`, file, backup: bak, removed: true });
  return true;
}

export async function unpinOldDisk(x: LinuxFix): Promise<string[]> {
  const { g, o, ctx } = x;
  const baked: string[] = [];
  if (x.mode !== 'noop') {
    // Device names the initramfs reads: crypttab (cryptroot and dracut copy it), the resume device.
    if (await edit(x, CRYPTTAB, 'crypttab', (t) => rewriteCrypttab(t, ctx))) baked.push(CRYPTTAB);
    for (const f of RESUME_FILES) if (await edit(x, f, 'resume', (t) => rewriteResume(t, ctx))) baked.push(f);
    for (const f of await filesIn(g, '/etc/dracut.conf.d', '.conf')) if (await edit(x, f, 'resume', (t) => rewriteDracutDevices(t, ctx))) baked.push(f);
  }
  // GRUB's defaults, before grub-mkconfig reads them; BLS entries are read by GRUB directly.
  if (o.update_grub) {
    await edit(x, '/etc/default/grub', 'update_grub', (t) => rewriteGrubDefaults(t, ctx));
    for (const f of await blsFiles(g)) await edit(x, f, 'update_grub', (t) => rewriteKernelArgs(t, 'stabilize-all', ctx));
  }
  for (const f of STALE_CACHES) await removePin(x, f, 'a cache of the devices as VMware presented them, rebuilt on demand');
  const devices = await lvmDevicesFile(x);
  const devicesWhy = 'LVM\'s devices file names the PVs by the old disk\'s WWID or name and would hide them on virtio; '
    + 'without it LVM scans every disk (run `vgimportdevices -a` on KVM to make a new one)';
  if (await removePin(x, devices, devicesWhy)) baked.push(devices);
  if (await g.isFile(MULTIPATH_BINDINGS)) {
    const used = multipathAliasesUsed(await g.read(MULTIPATH_BINDINGS), (await g.isFile('/etc/fstab')) ? await g.read('/etc/fstab') : '');
    for (const a of used) {
      x.act({
        action: 'disk_pins',
        status: 'warning',
        detail: `/etc/fstab mounts the multipath alias ${a}, bound to a WWID of the VMware disk in ${MULTIPATH_BINDINGS}: `
          + 'a virtio disk has no WWID, so the alias will not appear; mount it by UUID=',
      });
    }
  }
  return baked;
}
