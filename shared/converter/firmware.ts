// The firmware a KVM domain boots with.

export type Firmware = 'bios' | 'uefi';
/** OVMF without Secure Boot (the secure-boot builds need SMM, which TCG guests here do not get), and the template
 *  every fresh NVRAM is copied from. */
export const OVMF_CODE = process.env.FERRY_OVMF_CODE || '/usr/share/OVMF/OVMF_CODE_4M.fd';
export const OVMF_VARS = process.env.FERRY_OVMF_VARS || '/usr/share/OVMF/OVMF_VARS_4M.fd';
