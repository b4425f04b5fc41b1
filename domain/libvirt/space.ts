// Do a VM's disks fit a storage pool (issue 36 item 5)? One rule for both places that ask: a migration job before
// any byte moves (services/worker/operations/one-pass.ts) and a plan's preflight (domain/plans/rules.ts,
// `pool_space`). Each disk ends in the pool at up to its capacity: a one-pass volume is raw (its holes can be
// filled by the guest later), and a converted qcow2 grows to it too, so the capacity is what must fit.

/** A size as both checks print it: GiB for reading, the exact bytes for comparing with `virsh pool-info`. */
export const sizeText = (n: number) => `${(n / 2 ** 30).toFixed(2)} GiB (${n} bytes)`;

export interface SpaceDisk { label: string; capacity_bytes: number }

/** Null when the disks fit `room` (the pool's available bytes, plus what this job already wrote there), else the
 *  reason naming both sizes. `earlier`: bytes the same plan's earlier VMs will take in this pool. */
export function poolShortfall(pool: string, disks: SpaceDisk[], room: number, earlier = 0): string | null {
  const need = disks.reduce((a, x) => a + x.capacity_bytes, 0);
  if (earlier + need <= room) return null;
  const each = disks.map((x) => `${x.label} ${sizeText(x.capacity_bytes)}`).join(', ');
  const after = earlier ? ` after ${sizeText(earlier)} for the plan's earlier VMs` : '';
  return `the disks need ${sizeText(need)} in pool ${pool} (${each})${after}, which has ${sizeText(room)} free`;
}
