// How the guest boots and which firmware its KVM domain gets. The guest's own disk decides first (an EFI system
// partition holding a loader, GRUB for BIOS), the VM's firmware from the manifest (vSphere's config.firmware) where
// the disk allows both. A UEFI guest gets the fallback loader \EFI\BOOT\BOOTX64.EFI: its boot entry lives in the
// source VM's NVRAM, which stays behind on VMware, and a fresh NVRAM boots only the fallback path.
import type { GuestSession } from './guestfs';
import type { Firmware, FixAction, GuestBoot } from './types';
import { setting } from '../../platform/settings';

/** OVMF without Secure Boot (the secure-boot builds need SMM, which TCG guests here do not get), and the template
 *  every fresh NVRAM is copied from. */
export const OVMF_CODE = setting('FERRY_OVMF_CODE');
export const OVMF_VARS = setting('FERRY_OVMF_VARS');

const ESP_GUID = 'C12A7328-F81F-11D2-BA4B-00A0C93EC93B';
/** GRUB for BIOS on a GPT disk has nowhere to put its core image but this partition. */
const BIOS_BOOT_GUID = '21686148-6449-6E6F-744E-656564454649';
const FALLBACK_DIR = 'EFI/BOOT';
const FALLBACK = 'BOOTX64.EFI';

export interface FirmwareChoice { firmware: Firmware; reason: string }

/** Each partition's type: the GPT type GUID, or the MBR id in decimal (0xef = 239: an ESP). */
async function partitionTypes(
  g: GuestSession, disks: string[], tableOf: (dev: string) => Promise<string | undefined>,
): Promise<[string, string | undefined][]> {
  const out: [string, string | undefined][] = [];
  for (const p of g.lines(await g.cmd('list-partitions'))) {
    const dev = (await g.cmd('part-to-dev', p)).trim();
    if (!disks.includes(dev)) continue;
    const n = (await g.cmd('part-to-partnum', p)).trim();
    const table = await tableOf(dev);
    out.push([p, table === 'gpt' ? (await g.tryCmd('part-get-gpt-type', dev, n))?.trim().toUpperCase() : (await g.tryCmd('part-get-mbr-id', dev, n))?.trim()]);
  }
  return out;
}

/** How the mounted guest boots (read-only: nothing is written); `devices`: the guest's disks when the appliance
 *  holds other guests' too. */
export async function detectBoot(g: GuestSession, mountpoints: Record<string, string>, devices?: string[]): Promise<GuestBoot> {
  const disks = devices ?? g.lines(await g.cmd('list-devices'));
  // Each disk's table read once (parted, about 0.4 s under TCG), not once per partition.
  const tables = new Map<string, Promise<string | undefined>>();
  const tableOf = (dev: string) => tables.get(dev) ?? tables.set(dev, g.tryCmd('part-get-parttype', dev).then((t) => t?.trim())).get(dev)!;
  const boot: GuestBoot = { efi_loaders: {}, bios_loader: false, partition_table: disks[0] ? await tableOf(disks[0]) : undefined };
  const types = await partitionTypes(g, disks, tableOf);
  const biosRoom = boot.partition_table !== 'gpt' || types.some(([, t]) => t === BIOS_BOOT_GUID);
  for (const d of ['/boot/grub/i386-pc', '/boot/grub2/i386-pc']) if (biosRoom && (await g.isDir(d))) boot.bios_loader = true;
  boot.esp = types.find(([, t]) => t === ESP_GUID || t === '239')?.[0];
  boot.esp_mount = Object.entries(mountpoints).find(([, dev]) => dev === boot.esp)?.[0];
  if (!boot.esp_mount || !(await g.isDir(`${boot.esp_mount}/EFI`))) return boot;
  for (const vendor of g.lines(await g.tryCmd('ls', `${boot.esp_mount}/EFI`))) {
    const dir = `${boot.esp_mount}/EFI/${vendor}`;
    if (vendor.toUpperCase() === 'BOOT') { if (await g.isFile(`${dir}/${FALLBACK}`)) boot.fallback = `${dir}/${FALLBACK}`; continue; }
    const files = g.lines(await g.tryCmd('ls', dir)).filter((f) => /^(shim|grub|mm|fb)x64\.efi$/i.test(f));
    if (files.some((f) => /^(shim|grub)x64\.efi$/i.test(f))) boot.efi_loaders[vendor] = files;
  }
  return boot;
}

/** The firmware the domain needs, and why (the report's `firmware`). `vm` is the manifest's vm.firmware. */
export function chooseFirmware(vm: string | undefined, boot: GuestBoot | undefined): FirmwareChoice {
  const stated = vm === 'uefi' || vm === 'bios' ? vm : undefined;
  if (!boot) {
    return stated === 'uefi'
      ? { firmware: 'uefi', reason: 'the VM\'s firmware is UEFI (manifest vm.firmware); the guest was not inspected' }
      : {
        firmware: 'bios',
        reason: `${stated ? 'the VM\'s firmware is BIOS (manifest vm.firmware)' : 'the manifest names no firmware'}; the guest was not inspected`,
      };
  }
  const efi = Object.entries(boot.efi_loaders).map(([v, f]) => `\\EFI\\${v}\\{${f.join(',')}}`).join(' ');
  const esp = `${boot.partition_table || 'a'} disk with an EFI system partition ${boot.esp} on ${boot.esp_mount} holding ${efi}`;
  if (efi && !boot.bios_loader) {
    return {
      firmware: 'uefi',
      reason: `the guest boots only through UEFI: a ${esp}, and no GRUB for BIOS`
        + `${stated === 'bios' ? ' (the manifest says bios, which could not boot it)' : ''}`,
    };
  }
  if (!efi && boot.bios_loader) {
    return {
      firmware: 'bios',
      reason: `the guest boots through GRUB for BIOS and has no EFI loader${stated === 'uefi' ? ' (the manifest says uefi, which could not boot it)' : ''}`,
    };
  }
  if (efi) {
    return {
      firmware: stated || 'uefi',
      reason: `the guest has both a ${esp} and GRUB for BIOS; `
        + `${stated ? `the VM's firmware (manifest vm.firmware) is ${stated}` : 'the manifest names no firmware, so UEFI, as it was installed'}`,
    };
  }
  return {
    firmware: stated || 'bios',
    reason: 'no boot loader found in the guest (no EFI loader on an ESP, no GRUB for BIOS); '
      + `${stated ? `the manifest's vm.firmware ${stated}` : 'BIOS by default'}`,
  };
}

/** The vendor directory whose loader the fallback path gets: one with shim first, the distribution's own first. */
function pickVendor(boot: GuestBoot, distro?: string): string | undefined {
  const vendors = Object.keys(boot.efi_loaders).sort((a, b) => Number(b.toLowerCase() === distro) - Number(a.toLowerCase() === distro));
  return vendors.find((v) => boot.efi_loaders[v].some((f) => /^shimx64\.efi$/i.test(f))) || vendors[0];
}

/** shim's fallback (fbx64.efi) reads EFI/<vendor>/BOOTX64.CSV to recreate the boot entry: UCS-2 with a BOM. */
const bootCsv = (vendor: string) => Buffer.from(`\ufeffshimx64.efi,${vendor},,This is the boot entry for ${vendor}\n`, 'utf16le');

/**
 * Installs \EFI\BOOT\BOOTX64.EFI so a fresh NVRAM boots the guest: through shim when the guest uses it (shimx64.efi
 * as BOOTX64.EFI, with grubx64.efi and mmx64.efi beside it, and BOOTX64.CSV in the vendor directory as the
 * distributions' packages write it), else the GRUB EFI binary the guest boots. fbx64.efi is not put beside it:
 * shim would run it on every boot from the fallback path, and it resets the VM after writing an NVRAM entry. An
 * existing fallback loader is left as it is. Returns the files written (guest paths).
 */
export async function installFallbackLoader(
  g: GuestSession, boot: GuestBoot, distro: string | undefined, dry: boolean, act: (a: FixAction) => void,
): Promise<string[]> {
  const base = { action: 'uefi_fallback' };
  if (boot.fallback) { act({ ...base, status: 'skipped', detail: `${boot.fallback} is already there` }); return []; }
  const vendor = pickVendor(boot, distro);
  if (!vendor || !boot.esp_mount) {
    act({
      ...base,
      status: 'failed',
      detail: `no EFI loader to make the fallback from (ESP ${boot.esp || 'none'}${boot.esp ? `, mounted on ${boot.esp_mount || 'nothing in fstab'}` : ''}): `
        + 'a fresh NVRAM would not boot the guest',
    });
    return [];
  }
  const files = boot.efi_loaders[vendor];
  const has = (n: string) => files.find((f) => f.toLowerCase() === n);
  const src = `${boot.esp_mount}/EFI/${vendor}`;
  const dst = `${boot.esp_mount}/${FALLBACK_DIR}`;
  const shim = has('shimx64.efi');
  const copies: [string, string][] = shim
    ? [[shim, FALLBACK], ...['grubx64.efi', 'mmx64.efi'].map((n) => has(n)).filter((n): n is string => !!n).map((n) => [n, n] as [string, string])]
    : [[has('grubx64.efi')!, FALLBACK]];
  const what = copies.map(([f, t]) => `\\EFI\\${vendor}\\${f} -> \\EFI\\BOOT\\${t}`).join(', ');
  if (dry) { act({ ...base, status: 'would_do', detail: what }); return []; }
  await g.cmd('mkdir-p', dst);
  for (const [f, t] of copies) await g.cmd('cp', `${src}/${f}`, `${dst}/${t}`);
  const written = copies.map(([, t]) => `${dst}/${t}`);
  if (shim && !(await g.isFile(`${src}/BOOTX64.CSV`))) { await g.writeFile(`${src}/BOOTX64.CSV`, bootCsv(vendor)); written.push(`${src}/BOOTX64.CSV`); }
  act({ ...base, status: 'done', detail: `${what}${shim ? ' (through shim)' : ''}`, files: written, from: `${src}/${copies[0][0]}` });
  return written;
}

/** The read-back: the fallback loader is there and is the loader it was copied from (empty when it holds). */
export async function fallbackLeftovers(g: GuestSession, fallback: string, from: string): Promise<string[]> {
  if (!(await g.isFile(fallback))) return [`${fallback} is missing`];
  const a = await g.cmd('checksum', 'sha256', fallback);
  const b = await g.cmd('checksum', 'sha256', from);
  return a.trim() === b.trim() ? [] : [`${fallback} differs from ${from}`];
}
