// The guest-level preflight rules (docs/plans.md lists them): pure functions of what the appliance read from the
// VM's disk in place (guest-preflight.ts) and of the repair's dry run, so a finding says before the copy what
// would stop the repair after it.
import type { FixResult, GuestInfo } from '../converter/types';
import type { InspectionHint } from '../converter/inspection-hint';
import { inspectionHintSchema } from '../schemas/inspection';
import type { Finding } from './rules';
import { osOf, spaceShortfalls, unsupportedReason } from '../converter/prechecks';

export { osOf } from '../converter/prechecks';

export interface GuestRead {
  info: GuestInfo;
  /** What the repair of this VM's job may take instead of inspecting again (inspection-hint.ts). */
  inspection?: InspectionHint;
  /** Devices of the VM holding LUKS (crypto_LUKS). */
  luks: string[];
  /** Free bytes for unprivileged writers (statvfs bavail) of the file systems mounted at / and /boot. */
  free: Record<string, number>;
  /** Size of the largest initramfs in /boot (the generator writes a new one beside it before replacing it). */
  largestInitrd: number;
  /** The repair's dry run on the same mounted guest. */
  repair: FixResult;
  /** Files the dry run says it would change, and packages it would remove. */
  files: string[]; packages: string[];
  notes: string[];
}

const f = (rule: string, severity: Finding['severity'], message: string, fix: string): Finding => ({ rule, severity, message, fix });

export function bootLoaderOf(i: GuestInfo): string {
  const b = i.boot;
  const parts: string[] = [];
  if (b?.bios_loader) parts.push(`GRUB for BIOS (${b.partition_table ?? 'unknown'} partition table)`);
  for (const [vendor, files] of Object.entries(b?.efi_loaders ?? {})) parts.push(`UEFI \\EFI\\${vendor}\\{${files.join(',')}} on ${b!.esp}`);
  if (i.grub_config) parts.push(`configuration ${i.grub_config}`);
  return parts.join('; ') || 'none found';
}

const fsOf = (i: GuestInfo, mp: string) => (i.mountpoints[mp] ? `${i.mountpoints[mp]} (${i.filesystems[i.mountpoints[mp]] ?? 'unknown'})` : undefined);

/** The informational finding: what the guest is and what the repair would do to it. */
function inspected(r: GuestRead): Finding {
  const i = r.info;
  const net = r.repair.actions.filter((a) => a.action === 'nic_names' && a.status === 'would_do').map((a) => a.detail);
  const msg = [
    `the disk, read in place, holds ${osOf(i)}`, `boot loader: ${bootLoaderOf(i)}`,
    `root ${fsOf(i, '/') ?? i.root_device}, /boot ${fsOf(i, '/boot') ?? 'on the root file system'}`,
    ...(i.os === 'linux' ? [`initramfs tool: ${i.initramfs_tool ?? 'none'}`, `kernels: ${i.kernels.join(', ') || 'none'}`] : []),
    `the repair would change: ${r.files.join(', ') || 'nothing'}`,
    ...(r.packages.length ? [`and remove packages ${r.packages.join(', ')}`] : []),
    `network configuration it would rewrite: ${net.join('; ') || 'none'}`,
    ...r.notes,
  ];
  return { ...f('guest_inspected', 'info', msg.join('; '), 'none needed'), guest: {
    os: i.os, distro: i.distro, version: i.version, product_name: i.product_name, boot_loader: bootLoaderOf(i), boot: i.boot,
    root: i.mountpoints['/'] ?? i.root_device, boot_fs: i.mountpoints['/boot'] ?? null, filesystems: i.filesystems, initramfs_tool: i.initramfs_tool ?? null,
    kernels: i.kernels, free_bytes: r.free, files_changed: r.files, packages_removed: r.packages, network: net,
    ...(r.inspection ? { inspection: r.inspection } : {}),
  } };
}

/** The converter's own free-space rule (its check_free_space step), as findings before the copy. */
function spaceRule(r: GuestRead): Finding[] {
  return spaceShortfalls(r.info, r).map((x) => f('guest_low_space', 'blocker', x.message,
    `free space in the guest's ${x.mountpoint} (old kernels, logs, caches) before the migration`));
}

/** Every guest-level finding of one VM whose disk was read. */
export function guestFindings(r: GuestRead): Finding[] {
  const i = r.info;
  const out: Finding[] = [inspected(r)];
  const unsupported = unsupportedReason(i); // the converter's check_supported step, the same rule
  if (unsupported) out.push(f('guest_os_unsupported', 'blocker', `the disk holds ${osOf(i)}: ${unsupported}`, 'migrate it by another means'));
  if (r.luks.length) {
    out.push(f('guest_luks', 'warning',
      `LUKS-encrypted volume(s) ${r.luks.join(', ')}: the guest still asks for their key at boot, and the repair cannot read inside them`,
      'have the passphrase or key file ready for the first boot on KVM'));
  }
  if (i.os === 'linux') {
    if (!i.boot?.bios_loader && !Object.keys(i.boot?.efi_loaders ?? {}).length) {
      out.push(f('guest_no_bootloader', 'blocker',
        'no boot loader found: neither GRUB for BIOS (/boot/grub/i386-pc on a disk it can boot from) '
          + 'nor an EFI loader on an EFI system partition',
        'install GRUB in the guest (grub-install) before the migration, or override if it boots another way'));
    }
    if (!i.initramfs_tool && i.kernels.length) {
      out.push(f('guest_no_initramfs_tool', 'warning',
        'no initramfs generator (dracut, update-initramfs, mkinitcpio) in the guest: the initramfs cannot be rebuilt with the virtio drivers, '
          + `and the migration works only if it already carries ${['virtio_pci', 'virtio_blk'].join(', ')} (the repair's read-back checks)`,
        'install the distribution\'s initramfs tool in the guest before the migration'));
    }
  }
  out.push(...spaceRule(r));
  for (const x of r.repair.failures) {
    out.push(f('guest_repair_failure', 'blocker', `the repair's dry run says it would fail: ${x}`, 'correct this in the guest before the migration'));
  }
  // The dry run's free-space warning is spaceRule's blocker above, said once.
  for (const x of r.repair.warnings.filter((w) => !w.startsWith('check_free_space: '))) {
    out.push(f('guest_repair_warning', 'warning', `the repair's dry run: ${x}`, 'check this in the guest, or accept it'));
  }
  return out;
}

/** A disk with no operating system Ferry can see: encrypted (LUKS) or empty. */
export function noOsFindings(luks: string[]): Finding[] {
  if (luks.length) {
    return [f('guest_luks', 'blocker',
      `no operating system is readable: ${luks.join(', ')} ${luks.length > 1 ? 'are' : 'is'} LUKS-encrypted, so the root file system is inside; `
        + 'the repair (fstab, initramfs, boot loader) cannot open it',
      'decrypt the root volume before the migration (cryptsetup reencrypt --decrypt), or migrate it by another means')];
  }
  return [f('guest_no_os', 'blocker',
    'no operating system found on the VM\'s disks: the repair would find nothing to repair and the VM would not boot',
    'check that this is the VM you mean, and that its first disk holds the operating system')];
}

/** The read failed or did not finish: the vSphere checks stand, the guest was not seen. */
export const unreadable = (why: string): Finding => f('guest_unreadable', 'warning',
  `the guest could not be read in place before the copy: ${why}`,
  'nothing blocks the migration; the repair finds the same during the job. Fix the cause (credentials, a locked disk of a running VM, '
    + 'the time bound FERRY_GUEST_PREFLIGHT_SECONDS) to see the guest findings');

/** No active worker could run the guest read (the guest_preflight job, domain/operations.ts): said as such, so an
 *  operator starts one rather than looking for a fault in the guest. */
export const noGuestWorker = (why: string): Finding => f('guest_preflight_no_worker', 'warning',
  `the guest was not read before the copy: ${why}; the guest read runs as a worker job`,
  'start a worker with those capabilities (docs/deploy.md: worker-migrate), or set options.guest_preflight to false for this plan; '
    + 'nothing blocks the migration, the repair finds the same during the job');

/** The inspection a VM's guest_inspected finding carries for its job's repair, if it is one the job schema takes
 *  (a plan stored by an older Ferry may hold none, or another shape: then the repair inspects as always). */
export function preflightInspection(findings: Finding[] | undefined): InspectionHint | undefined {
  const hint = findings?.find((x) => x.rule === 'guest_inspected')?.guest?.inspection;
  return hint && !inspectionHintSchema.validate(hint).error ? hint as InspectionHint : undefined;
}
