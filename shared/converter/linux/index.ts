// The Linux repair, one step per file in the order virt-v2v's convert_linux `do_convert` keeps them, each step
// able to hold because the ones before it are done:
//   1. hv-tools.ts    the source hypervisor's tools removed (unconfigure_vmware)
//   2. configuration  the manifest's users, network, files (../configuration.ts)
//   3. disk-pins.ts   what pins the old disk: crypttab, resume, GRUB's defaults, caches, LVM's devices file
//                     (remap_block_devices; fstab itself is rewritten before, in ../guest.ts)
//   4. nics.ts        the NICs renamed in every network stack, cloud-init held (virt-v2v has no such step)
//   5. initramfs.ts   the virtio drivers in the generator's configuration, every kernel's image rebuilt
//                     (configure_kernel_modules, rebuild_initrd): it carries the files of steps 3 and 4
//   6. grub.ts        grub-mkconfig with the mended defaults, grub.cfg read back and mended
//   7. the UEFI fallback loader, a copy of the loader the guest boots, now configured (../firmware.ts)
//   8. verify.ts      everything read back: a repair that did not hold fails the stage.
import type { LinuxFix } from './context';
import { removeHvTools } from './hv-tools';
import { applyConfiguration } from '../configuration';
import { unpinOldDisk } from './disk-pins';
import { renameNics } from './nics';
import { regenInitramfs } from './initramfs';
import { regenGrub } from './grub';
import { installFallbackLoader } from '../firmware';
import { verifyLinux } from './verify';

export type { LinuxFix } from './context';

/** The whole Linux repair, in order, then the read-back. */
export async function fixLinux(x: LinuxFix): Promise<void> {
  const { g, o, act } = x;
  if (o.remove_source_hv_tools) await removeHvTools(x);
  if (await applyConfiguration(g, o, act, x.write)) x.r.modified = true;
  const baked = await unpinOldDisk(x);
  if (o.nic_names !== false) baked.push(...(await renameNics(x)));
  if (o.regen_initramfs) await regenInitramfs(x, baked);
  if (o.update_grub) await regenGrub(x);
  if (o.firmware === 'uefi' && x.info.boot && (await installFallbackLoader(g, x.info.boot, x.info.distro, o.dry_run, act)).length) x.r.modified = true;
  if (!o.dry_run) await verifyLinux(x);
}
