// The Linux family: one ordered list of named steps, in the order virt-v2v's convert_linux `do_convert` keeps them,
// each step able to hold because the ones before it are done. Pre-checks first (they read only); a step the fix
// stage was not asked for returns at once. ../families.ts runs the list; `ferry-convert --explain` prints it.
import type { ConverterFamily, ConverterStep, FixRun } from '../steps';
import type { LinuxFix } from './context';
import { CHECK_FREE_SPACE, CHECK_SUPPORTED } from '../prechecks';
import { CHECK_FILESYSTEMS, RECHECK_FILESYSTEMS } from '../fs-check';
import { deviceContext, fixFstab, regenerateXfsUuids } from './fstab-step';
import { removeHvTools } from './hv-tools';
import { applyConfiguration } from '../configuration';
import { unpinOldDisk } from './disk-pins';
import { renameNics } from './nics';
import { regenInitramfs } from './initramfs';
import { regenGrub } from './grub';
import { installFallbackLoader } from '../firmware';
import { verifyLinux } from './verify';

export type { LinuxFix } from './context';

/** The step's view once device_ids has run (every step after it). */
const lx = (x: FixRun): LinuxFix => {
  if (!x.ctx) throw new Error('a Linux step ran before device_ids: the step list is out of order');
  return x as LinuxFix;
};

const LINUX_STEPS: ConverterStep[] = [
  CHECK_SUPPORTED,
  CHECK_FILESYSTEMS,
  CHECK_FREE_SPACE,
  { name: 'inject_virtio_drivers', does: 'nothing to inject: a Linux kernel brings its own virtio drivers (regen_initramfs puts them in the initramfs)',
    run: ({ o, act }) => { if (o.inject_virtio_drivers) act({ action: 'inject_virtio_drivers', status: 'skipped',
      detail: 'Linux guests use the virtio drivers of their kernel (see regen_initramfs)' }); } },
  { name: 'device_ids', does: 'reads the UUID, PARTUUID and label of every filesystem and swap device',
    run: async (x) => { x.ctx = await deviceContext(x.g, x.info); } },
  { name: 'xfs_regenerate_uuid', does: 'gives XFS filesystems new UUIDs (when asked), before fstab is rewritten with them',
    run: async (x) => { if (x.o.xfs_regenerate_uuid) await regenerateXfsUuids(x); } },
  { name: 'fstab', does: 'rewrites /etc/fstab to stable names (UUID=, by fstab_mode), the original backed up',
    run: (x) => fixFstab(x) },
  { name: 'remove_source_hv_tools', does: 'disables the source hypervisor\'s tools (open-vm-tools, ...) and removes them with the guest\'s package tool'
      + ' (at the first boot on KVM on a systemd guest)',
    run: async (x) => { if (x.o.remove_source_hv_tools) await removeHvTools(lx(x)); } },
  { name: 'configuration', does: 'applies the manifest\'s configuration: users, network, files',
    run: async (x) => { if (await applyConfiguration(x.g, x.o, x.act, x.write)) x.r.modified = true; } },
  { name: 'unpin_old_disk', does: 'rewrites what pins the old disk: crypttab, resume, GRUB\'s defaults, caches, LVM\'s devices file',
    run: async (x) => { x.baked.push(...(await unpinOldDisk(lx(x)))); } },
  { name: 'nic_names', does: 'renames the NICs in every network stack to their names on KVM, cloud-init held',
    run: async (x) => { if (x.o.nic_names !== false) x.baked.push(...(await renameNics(lx(x)))); } },
  { name: 'regen_initramfs',
    does: 'puts the virtio drivers in each kernel\'s initramfs: an archive appended to the image, the guest\'s generator on its first boot '
      + '(rebuilt in the appliance only where an append cannot serve); the image carries the files above',
    run: async (x) => { if (x.o.regen_initramfs) await regenInitramfs(lx(x), x.baked); } },
  { name: 'update_grub', does: 'runs grub-mkconfig with the mended defaults, reads grub.cfg back and mends it',
    run: async (x) => { if (x.o.update_grub) await regenGrub(lx(x)); } },
  { name: 'uefi_fallback', does: 'UEFI outputs: copies the loader the guest boots to \\EFI\\BOOT\\BOOTX64.EFI',
    run: async ({ g, o, info, r, act }) => { if (o.firmware === 'uefi' && info.boot &&
      (await installFallbackLoader(g, info.boot, info.distro, o.dry_run, act)).length) r.modified = true; } },
  { name: 'verify', does: 'reads every repair back: one that did not hold fails the fix stage (not in a dry run)',
    run: async (x) => { if (!x.o.dry_run) await verifyLinux(lx(x)); } },
  { name: 'sync', does: 'flushes the guest\'s writes to the disk',
    run: async ({ g, o, r }) => { if (!o.dry_run && r.modified) await g.cmd('sync'); } },
  RECHECK_FILESYSTEMS,
];

export const LINUX: ConverterFamily = { os: 'linux', title: 'Linux', steps: LINUX_STEPS };
