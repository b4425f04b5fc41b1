// Builds every cached test fixture before the suite starts (`npm test`'s pretest; alone: `npx tsx scripts/fixtures.ts`):
// the nine Debian guests (test/fixtures/debian-guest.ts), the tiny guest and the vSphere simulator, two builds at a
// time. On a machine that has them it only looks (about a second). On a new one it builds them while nothing else
// runs: a first boot under TCG that shares the two cores with the guest test files took up to three times as long
// (docs/testing.md), and the test files then wait on nobody's build.
// FERRY_FIXTURE_JOBS sets how many builds run at once (default 2, the cores these machines have). A build that fails
// is named with its error and the others go on; the script still exits 0, so the suite runs and the files that need
// the fixture fail with the builder's log (a set-up that stopped here would print no test result at all). With
// FERRY_SETUP_GUESTFS=0 (no libguestfs installed) only the simulator is built.
import { errorText } from '../platform/errors';
import { DEBIAN_VARIANTS, ensureDebianGuest, DebianVariant } from '../test/fixtures/debian-guest';
import { ensureTinyGuest } from '../test/fixtures/tiny-guest';
import { vcsimBinary } from '../test/helpers/vcsim';

/** In an order that keeps both lanes busy: the three releases' trees early (each needs its own debootstrap), the
 *  layers on the Debian 12 plain disk after it. Every build is under its own lock (debian-guest.ts once), so a
 *  build that needs another one waits for it instead of building it twice. */
const ORDER: DebianVariant[] = ['plain', 'debian11', 'lvm', 'debian13', 'uefi', 'netplan', 'btrfs', 'rhel-shaped', 'cloud-init'];

interface Build { name: string; run: () => Promise<unknown> }

function builds(): Build[] {
  const missing = DEBIAN_VARIANTS.filter((v) => !ORDER.includes(v));
  if (missing.length) throw new Error(`scripts/fixtures.ts: ORDER lacks ${missing.join(', ')}`);
  const guests = process.env.FERRY_SETUP_GUESTFS === '0' ? [] : [
    ...ORDER.map((v) => ({ name: `debian guest ${v}`, run: () => ensureDebianGuest(v) })),
    { name: 'tiny guest', run: () => ensureTinyGuest() },
  ];
  return [
    ...guests,
    { name: 'vcsim', run: vcsimBinary },
  ];
}

async function main() {
  const jobs = Math.max(1, Number(process.env.FERRY_FIXTURE_JOBS) || 2);
  const queue = builds();
  const t0 = Date.now();
  const failed: string[] = [];
  const lane = async () => {
    for (let b = queue.shift(); b; b = queue.shift()) {
      const started = Date.now();
      try {
        await b.run();
        const s = (Date.now() - started) / 1000;
        if (s > 5) console.error(`fixtures: ${b.name} built in ${s.toFixed(0)} s`);
      } catch (e) {
        // The other builds go on; the suite's files that need this one build it again and fail with its log.
        console.error(`fixtures: ${b.name} failed: ${errorText(e)}`);
        failed.push(b.name);
      }
    }
  };
  await Promise.all(Array.from({ length: jobs }, lane));
  const s = (Date.now() - t0) / 1000;
  console.error(`fixtures: ${failed.length ? `${failed.join(', ')} failed; the suite runs without them` : 'all in the cache'} (${s.toFixed(0)} s)`);
}

main().catch((e: unknown) => { console.error(`fixtures: ${errorText(e)}; the suite runs without the prebuilt fixtures`); });
