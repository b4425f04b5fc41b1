// `npx tsx scripts/bench/guest-reading.ts`: Ferry's own reading of a Debian guest (domain/converter/linux-reading.ts)
// against its bare baseline, libguestfs's inspection (`inspect-os`, the `inspect-get-*` calls and its package list,
// with the mounts that list needs), in the same appliance on each guest fixture's disks
// (issue 34 item 4). Prints, per variant: the appliance time of the reading's own calls, of `inspect-os`, and
// whether both gave the same facts (root, mount points, distribution, version, product name, hostname, package
// format, hypervisor packages). BENCH_VARIANTS (default every variant) picks fixtures; a missing one is built first.
import { GuestSession } from '../../domain/converter/guestfs';
import { readLinuxGuest } from '../../domain/converter/linux-reading';
import { installedHvPackages } from '../../domain/converter/linux/tools';
import { DEBIAN_VARIANTS, ensureDebianGuest, type DebianVariant } from '../../test/fixtures/debian-guest';

const canon = (o: object) => JSON.stringify(o, (_k, v: unknown) => (v && typeof v === 'object' && !Array.isArray(v) ? Object.fromEntries(Object.entries(v).sort()) : v));
const seconds = (t0: bigint) => Number(process.hrtime.bigint() - t0) / 1e9;

/** libguestfs's facts for the first root it finds, the guest mounted read-only for its package database. */
async function libguestfsFacts(g: GuestSession) {
  const root = g.lines(await g.cmd('inspect-os'))[0];
  const get = async (c: string) => (await g.tryCmd(c, root))?.trim() || undefined;
  const mountpoints: Record<string, string> = {};
  for (const l of g.lines(await g.cmd('inspect-get-mountpoints', root))) { const [mp, dev] = l.split(': '); mountpoints[mp] = dev; }
  for (const mp of Object.keys(mountpoints).sort((a, b) => a.length - b.length)) await g.cmd('mount-ro', mountpoints[mp], mp);
  const facts = { root_device: root, distro: await get('inspect-get-distro'), product_name: await get('inspect-get-product-name'),
    hostname: await get('inspect-get-hostname'), version: `${await get('inspect-get-major-version')}.${await get('inspect-get-minor-version')}`,
    package_format: await get('inspect-get-package-format'), mountpoints, hypervisor_tools: await installedHvPackages(g, root) };
  await g.cmd('umount-all');
  return facts;
}

async function one(variant: DebianVariant): Promise<{ reading: number; inspect: number; same: boolean; why?: string }> {
  const guest = await ensureDebianGuest(variant);
  const disks = [guest.vmdk, ...(guest.dataVmdk ? [guest.dataVmdk] : [])].map((p) => ({ path: p, format: 'vmdk', readonly: true }));
  const g = await GuestSession.open(disks, { readonly: true });
  try {
    const listed: Record<string, string> = {};
    for (const l of g.lines(await g.cmd('list-filesystems'))) { const [dev, type] = l.split(': '); listed[dev] = type; }
    let t0 = process.hrtime.bigint();
    const mine = await readLinuxGuest(g, listed);
    const reading = seconds(t0);
    t0 = process.hrtime.bigint();
    const theirs = await libguestfsFacts(g);
    const inspect = seconds(t0);
    if (!('info' in mine)) return { reading, inspect, same: false, why: mine.why };
    const i = mine.info;
    const ours = { root_device: i.root_device, distro: i.distro, product_name: i.product_name, hostname: i.hostname, version: i.version,
      package_format: i.package_format, mountpoints: i.mountpoints, hypervisor_tools: i.hypervisor_tools };
    return { reading, inspect, same: canon(ours) === canon(theirs) };
  } finally { await g.close(); }
}

async function main() {
  const variants = (process.env.BENCH_VARIANTS?.split(',') ?? [...DEBIAN_VARIANTS]) as DebianVariant[];
  let all = true;
  for (const v of variants) {
    const r = await one(v);
    all &&= r.same;
    console.log(`${v.padEnd(12)} reading ${r.reading.toFixed(1)} s, libguestfs ${r.inspect.toFixed(1)} s (${(r.reading / r.inspect).toFixed(2)}x), ` +
      `facts ${r.same ? 'equal' : `DIFFER${r.why ? `: ${r.why}` : ''}`}`);
  }
  console.log(`guest-reading: ${variants.length} variants, facts ${all ? 'equal on every one' : 'NOT equal on every one'}`);
  if (!all) process.exitCode = 1;
}

main().catch((e: unknown) => { console.error(e); process.exit(1); });
