// How libguestfs and qemu are told whether KVM works here; shared by the converter and the libvirt layer's
// virt-sysprep and virt-customize runs.
import { setting } from '../platform/settings';
/** Whether qemu may use KVM here (the appliance and virt_test's boot): only when FERRY_GUESTFS_KVM=1 says so. */
export function kvmUsable(env: NodeJS.ProcessEnv = process.env): boolean { return setting('FERRY_GUESTFS_KVM', env); }

/**
 * Environment for libguestfs. On these machines /dev/kvm opens but qemu aborts when it uses it, so opening the
 * device is no proof: TCG is forced unless FERRY_GUESTFS_KVM=1 says KVM really works, or the caller already set
 * LIBGUESTFS_BACKEND_SETTINGS.
 */
export function guestfsEnv(base: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const env = { ...base };
  if (!setting('LIBGUESTFS_BACKEND_SETTINGS', env) && !kvmUsable(base)) env.LIBGUESTFS_BACKEND_SETTINGS = 'force_tcg';
  if (!setting('LIBGUESTFS_BACKEND', env)) env.LIBGUESTFS_BACKEND = 'direct';
  return env;
}
