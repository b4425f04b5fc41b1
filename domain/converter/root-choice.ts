// Which system the repair works on when the disks hold several (issue 35 item 4): the fix stage's `root` option.
// virt-v2v asks (`--root ask`) or takes the first; an operator moving hundreds of VMs cannot answer a prompt, so
// Ferry chooses by a rule it reports, and refuses only when told to (`single`) or when the named root is not there.
import { ConverterError } from './errors';

/** `auto` (the default): the first root on the first disk (sda, where the VM boots from), else the first listed.
 *  `first`: the first libguestfs lists. `single`: refuse a guest with several. A device: that root. */
export const ROOT_CHOICES = ['auto', 'first', 'single'] as const;

/** The root to repair among `roots` (libguestfs's order), and why, said for the report. */
export function chooseRoot(roots: string[], option = 'auto'): { root: string; why: string } {
  const named = !(ROOT_CHOICES as readonly string[]).includes(option);
  if (roots.length === 1 && (!named || option === roots[0])) return { root: roots[0], why: 'the only system found' };
  const listed = roots.join(', ');
  if (option === 'single') {
    throw new ConverterError(`the disks hold ${roots.length} systems (${listed}) and the fix stage's root is "single"; name the one to repair in root`,
      'guest');
  }
  if (option === 'first') return { root: roots[0], why: `root "first": the first of ${listed}` };
  if (named) {
    if (!roots.includes(option)) {
      throw new ConverterError(`the fix stage's root names ${option}, which is not a system on these disks (found: ${listed})`, 'guest');
    }
    return { root: option, why: `root "${option}", as the fix stage named it, of ${listed}` };
  }
  const onBootDisk = roots.find((r) => /^(btrfsvol:)?\/dev\/sda\d/.test(r));
  return onBootDisk
    ? { root: onBootDisk, why: `root "auto": the first system on the first disk (sda, the VM's boot disk), of ${listed}` }
    : { root: roots[0], why: `root "auto": no system on a partition of the first disk, so the first listed, of ${listed}` };
}
