// Builds (or finds in the cache) the Debian guest fixture: `npx tsx scripts/guest-image/build.ts [plain] [lvm] [uefi] [netplan] [btrfs]`.
// Prints each variant's cached VMDK. See docs/testing.md.
import { ensureDebianGuest, DebianVariant } from '../../test/fixtures/debian-guest';

async function main() {
  const variants = (process.argv.slice(2).length ? process.argv.slice(2) : ['plain', 'lvm']) as DebianVariant[];
  for (const v of variants) {
    if (!['plain', 'lvm', 'uefi', 'netplan', 'btrfs'].includes(v)) throw new Error(`variant must be plain, lvm, uefi, netplan or btrfs, not '${v}'`);
    const t0 = Date.now();
    const g = await ensureDebianGuest(v);
    console.log(`${v}: ${g.vmdk} (${((Date.now() - t0) / 1000).toFixed(0)} s)`);
  }
}
main().catch((e) => { console.error(e.message || e); process.exit(1); });
