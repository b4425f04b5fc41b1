// Builds (or finds in the cache) the Debian guest fixture: `npx tsx scripts/guest-image/build.ts [variant ...]`
// (DEBIAN_VARIANTS in test/fixtures/debian-guest.ts; plain and lvm when none is named).
// Prints each variant's cached VMDK. See docs/testing.md.
import { errorText } from '../../platform/errors';
import { DEBIAN_VARIANTS, ensureDebianGuest, DebianVariant } from '../../test/fixtures/debian-guest';

async function main() {
  const variants = (process.argv.slice(2).length ? process.argv.slice(2) : ['plain', 'lvm']) as DebianVariant[];
  for (const v of variants) {
    if (!DEBIAN_VARIANTS.includes(v)) throw new Error(`variant must be one of ${DEBIAN_VARIANTS.join(', ')}, not '${v}'`);
    const t0 = Date.now();
    const g = await ensureDebianGuest(v);
    console.log(`${v}: ${g.vmdk} (${((Date.now() - t0) / 1000).toFixed(0)} s)`);
  }
}
main().catch((e: unknown) => { console.error(errorText(e)); process.exit(1); });
