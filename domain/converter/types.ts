// The types the converter's steps share: what inspection found (GuestInfo), what the fix stage was asked
// (FixOptions) and what each repair did (FixAction, FixResult). They live apart from the steps and from the
// orchestrator (guest.ts) so every step imports them without importing the others: no import cycle. How the guest
// boots (GuestBoot) and the firmware its domain gets are here too: firmware.ts reads and repairs them.
import type { FixStage } from '../schemas/manifest';

/** The firmware a KVM domain boots with (firmware.ts chooseFirmware). */
export type Firmware = 'bios' | 'uefi';

/** How a guest boots, read from its disk (firmware.ts detectBoot). */
export interface GuestBoot {
  /** gpt or msdos, of the first disk. */
  partition_table?: string;
  /** The EFI system partition (appliance name) and where the guest mounts it (fstab), if it has one. */
  esp?: string; esp_mount?: string;
  /** EFI loaders on the ESP, by vendor directory: `debian: [shimx64.efi, grubx64.efi]`. */
  efi_loaders: Record<string, string[]>;
  /** The guest path of \EFI\BOOT\BOOTX64.EFI when present. */
  fallback?: string;
  /** GRUB for BIOS is installed (/boot/grub/i386-pc or /boot/grub2/i386-pc) where it can boot: an MBR disk, or
   *  a GPT disk with a BIOS boot partition (a UEFI guest that once had grub-pc keeps the directory). */
  bios_loader: boolean;
}

export interface GuestInfo {
  os: string; distro?: string; version?: string; product_name?: string; hostname?: string;
  root_device: string; mountpoints: Record<string, string>; filesystems: Record<string, string>;
  lvm: boolean; kernels: string[]; hypervisor_tools: string[]; initramfs_tool?: string; grub_config?: string;
  /** deb, rpm, apk, pacman... (inspect-get-package-format), for removing packages with the guest's own tool. */
  package_format?: string;
  /** How the guest boots (firmware.ts): the ESP and its EFI loaders, GRUB for BIOS. Linux guests only. */
  boot?: GuestBoot;
  /** The appliance's disks that are this guest's (an appliance shared by several guests, the plans' preflight);
   *  unset: every disk of the appliance. */
  devices?: string[];
  /** Who read the facts above: Ferry's own reading (linux-reading.ts), libguestfs's inspect-os (`why`: why Ferry's
   *  declined) or the plan preflight's. With several systems on the disks, all of them and why the root was chosen. */
  reading?: { by: 'ferry' | 'libguestfs' | 'preflight'; why?: string; roots?: string[]; root_choice?: string };
  /** Set when a plan preflight's inspection was offered (inspection-hint.ts): taken, or inspected again and why. */
  inspection?: { from: 'preflight' | 'appliance'; why?: string };
}

export interface FixAction { action: string; status: 'done' | 'would_do' | 'skipped' | 'warning' | 'failed'; detail: string; [k: string]: unknown }
/** `failures`: repairs that did not hold when the guest was read back at the end (they fail the fix stage). */
export interface FixResult {
  modified: boolean; actions: FixAction[]; warnings: string[]; failures: string[]; fstab_before?: string; fstab_after?: string; fstab_changes: unknown[];
  /** The family's steps that ran, in order (families.ts; `ferry-convert --explain` lists them all). */
  steps: string[];
}

export interface FixOptions extends FixStage {
  fstab_mode: string; /* a FstabMode, or 'preserve' (noop) */ dry_run: boolean; configuration?: Record<string, unknown>;
  /** Rename the NICs the guest's network configuration uses to their names on KVM (nic-names.ts; default on). */
  nic_names?: boolean;
  /** The VM's NIC MAC addresses (manifest `nics`, in order), for matching NICs by MAC. */
  nic_macs?: string[];
  /** The firmware the KVM domain gets (firmware.ts chooseFirmware): with `uefi` the fallback loader is installed. */
  firmware?: Firmware;
}
