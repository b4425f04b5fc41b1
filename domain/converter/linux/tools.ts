// What the Linux repairs know about guest tools: hypervisor tools' packages and units, each initramfs
// generator and where its module list lives, GRUB's generator, and how to ask the package database.
import type { GuestSession } from '../guestfs';

// Source hypervisors' guest tools, under their Debian, RHEL/SUSE and Alpine names.
export const HV_TOOL_PACKAGES = ['open-vm-tools', 'open-vm-tools-desktop', 'open-vm-tools-sdmp', 'vmware-tools', 'xe-guest-utilities',
  'xe-guest-utilities-latest',
  'hyperv-daemons', 'hypervkvpd', 'hypervvssd', 'hypervfcopyd', 'walinuxagent', 'WALinuxAgent'];
export const HV_TOOL_UNITS = ['vmtoolsd.service', 'open-vm-tools.service', 'vmware-tools.service', 'vgauth.service', 'xe-linux-distribution.service'];
/** How to remove packages with the guest's own package tool, by package format (`env`: set for that run only). */
export const PURGE: Record<string, { bin: string[]; cmd: string; env?: string[] }> = {
  // No debconf question can be answered in the appliance.
  deb: { bin: ['/usr/bin/dpkg'], cmd: 'dpkg --purge', env: ['DEBIAN_FRONTEND=noninteractive'] },
  rpm: { bin: ['/usr/bin/rpm', '/bin/rpm'], cmd: 'rpm -e' },
  apk: { bin: ['/sbin/apk'], cmd: 'apk del' },
  pacman: { bin: ['/usr/bin/pacman'], cmd: 'pacman -Rns --noconfirm' },
};

/** The modules a guest needs in its initramfs to find its root on a virtio disk (virtio_pci brings the bus). */
export const VIRTIO_BOOT_MODULES = ['virtio_pci', 'virtio_blk'];
/** Added to the generator's module list: the boot modules, SCSI (virtio-scsi targets) and the NIC. */
export const VIRTIO_MODULES = ['virtio_pci', 'virtio_blk', 'virtio_scsi', 'virtio_net'];

export interface InitramfsTool {
  /** `img`: the kernel's image as the guest has it, rebuilt in place (the file the boot loader loads). */
  tool: string; paths: string[]; args: (kver: string, img?: string) => string[];
  /** Environment for that run only (`env K=V tool ...` in the appliance), never written to the guest. */
  env?: string[];
  conf?: { path: string; modules: string[]; text: (add: string[]) => string };
}
export const INITRAMFS_TOOLS: InitramfsTool[] = [
  // The image named: Debian's dracut writes initrd.img-<k>, RHEL's initramfs-<k>.img; a host-only guest stays
  // host-only (dracut.conf.d's own settings) and gets the drivers from add_drivers.
  {
    tool: 'dracut', paths: ['/usr/bin/dracut', '/sbin/dracut', '/usr/sbin/dracut'],
    args: (k, img) => (img ? ['dracut', '-f', img, k] : ['dracut', '-f', '--kver', k]),
    conf: {
      path: '/etc/dracut.conf.d/ferry-virtio.conf', modules: VIRTIO_MODULES,
      text: (add) => `# Ferry: the virtio drivers KVM's disks and NICs need\nadd_drivers+=" ${add.join(' ')} "\n`,
    },
  },
  // COMPRESSLEVEL from the environment counts only when the guest's initramfs.conf sets none (mkinitramfs reads
  // the file after): zstd's own default level 3 instead of initramfs-tools' -9, which under TCG took 13-40 s of
  // the run for ~9% less size (9.5 MB against 10.4 MB on the Debian 12 guest). Only this build; nothing persisted.
  {
    tool: 'update-initramfs', paths: ['/usr/sbin/update-initramfs', '/sbin/update-initramfs'],
    args: (k) => ['update-initramfs', '-u', '-k', k], env: ['COMPRESSLEVEL=3'],
    conf: {
      path: '/etc/initramfs-tools/modules', modules: VIRTIO_MODULES,
      text: (add) => `# Ferry: the virtio drivers KVM's disks and NICs need\n${add.join('\n')}\n`,
    },
  },
  // mkinitcpio 36+ reads /etc/mkinitcpio.conf.d/*.conf after mkinitcpio.conf.
  {
    tool: 'mkinitcpio', paths: ['/usr/bin/mkinitcpio'], args: () => ['mkinitcpio', '-P'],
    conf: {
      path: '/etc/mkinitcpio.conf.d/ferry-virtio.conf', modules: VIRTIO_MODULES,
      text: (add) => `# Ferry: the virtio drivers KVM's disks and NICs need\nMODULES+=(${add.join(' ')})\n`,
    },
  },
];
/** Initramfs generators Ferry does not drive: found without a known one, the repair fails naming it. */
export const UNSUPPORTED_INITRAMFS_TOOLS = [
  { tool: 'mkinitrd (SUSE or RHEL 5)', paths: ['/sbin/mkinitrd', '/usr/sbin/mkinitrd'] },
  { tool: 'booster', paths: ['/usr/bin/booster'] },
  { tool: 'genkernel', paths: ['/usr/bin/genkernel'] },
  { tool: 'mkinitfs (Alpine)', paths: ['/sbin/mkinitfs'] },
];
/** The guest command line for `command`: `env K=V ... prog args` when an environment is given. */
export const withEnv = (cmd: string[], env?: string[]): string => [...(env?.length ? ['env', ...env] : []), ...cmd].join(' ');

export const GRUB_TOOLS = [
  { bin: ['/usr/sbin/grub-mkconfig', '/sbin/grub-mkconfig'], cfg: '/boot/grub/grub.cfg' },
  { bin: ['/usr/sbin/grub2-mkconfig', '/sbin/grub2-mkconfig'], cfg: '/boot/grub2/grub.cfg' },
];

/** Installed packages of the guest that are source-hypervisor tools, from its package database (libguestfs reads
 *  dpkg, rpm, apk and pacman databases). */
export async function installedHvPackages(g: GuestSession, root: string): Promise<string[]> {
  const apps = new Set((await g.tryCmd('inspect-list-applications2', root) || '').split('\n').map((l) => /^\s*app2_name: (.+)$/.exec(l)?.[1]).filter((x): x is string => !!x));
  return HV_TOOL_PACKAGES.filter((p) => apps.has(p));
}
