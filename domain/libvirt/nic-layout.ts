// Where Ferry's KVM domains put their NICs: q35, NIC n (0-based, the VM's NIC order) alone behind PCIe root port
// n+1, the first root ports, so on bus n+1. The import (import.ts) places them so and the test boot's qemu runner
// puts NIC 0 there (domain/converter/testboot.ts); the guest repair names the interfaces after it
// (domain/converter/nic-names.ts kvmNicName).
export const nicBus = (index: number) => index + 1;
