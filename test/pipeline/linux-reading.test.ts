// Ferry's own reading of a Debian guest (domain/converter/linux-reading.ts, issue 34 item 4) against libguestfs's
// inspect-os on the same real disk, and the root chosen when the disk holds two systems (root-choice.ts, issue 35
// item 4): the rule, the option naming one, and the refusal when told to refuse.
// The disk's part is a reused proof (test/helpers/proof-tests.ts): one appliance makes the disk and reads it every
// way the tests compare, and with every input unchanged the same checks re-assert the last passing run's readings.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { GuestSession } from '../../domain/converter/guestfs';
import { inspectAndMount } from '../../domain/converter/guest';
import { installedDebs, keyValues, mapperToLv } from '../../domain/converter/linux-reading';
import { chooseRoot } from '../../domain/converter/root-choice';
import { installedHvPackages } from '../../domain/converter/linux/tools';
import { ManifestError, validateManifest } from '../../domain/schemas/manifest';
import { proofTests } from '../helpers/proof-tests';

describe('Ferry\'s reading of a guest: the parts that need no disk', () => {
  it('reads os-release values with and without quotes, and dpkg\'s installed packages only', () => {
    expect(keyValues('ID=debian\nVERSION_ID="12"\nPRETTY_NAME=\'Debian GNU/Linux 12\'\n# ID=x\n')).to.deep.equal({ ID: 'debian', VERSION_ID: '12', PRETTY_NAME: 'Debian GNU/Linux 12' });
    const status = ['Package: open-vm-tools', 'Status: install ok installed', 'Package: walinuxagent', 'Status: deinstall ok config-files', 'Package: hyperv-daemons', 'Status: install ok installed'];
    expect(installedDebs(status, ['open-vm-tools', 'walinuxagent', 'xe-guest-utilities'])).to.deep.equal(['open-vm-tools']);
  });
  it('names an LVM device-mapper device as the appliance does ("--" is a dash in the name)', () => {
    expect(mapperToLv('/dev/mapper/rhel-root')).to.equal('/dev/rhel/root');
    expect(mapperToLv('/dev/mapper/my--vg-lv--1')).to.equal('/dev/my-vg/lv-1');
    expect(mapperToLv('/dev/mapper/nodash')).to.equal(undefined);
  });
  it('chooses the root by the rule, by name, or refuses, naming every system found', () => {
    const roots = ['/dev/rhel/root', '/dev/sda2', '/dev/sda3'];
    expect(chooseRoot(['/dev/sda1'])).to.deep.equal({ root: '/dev/sda1', why: 'the only system found' });
    expect(chooseRoot(roots).root).to.equal('/dev/sda2');
    expect(chooseRoot(roots, 'first').root).to.equal('/dev/rhel/root');
    expect(chooseRoot(roots, '/dev/sda3')).to.deep.include({ root: '/dev/sda3' });
    expect(chooseRoot(['/dev/sdb1', '/dev/sdc1']).root).to.equal('/dev/sdb1');
    expect(() => chooseRoot(roots, 'single')).to.throw('the disks hold 3 systems (/dev/rhel/root, /dev/sda2, /dev/sda3)');
    expect(() => chooseRoot(roots, '/dev/sdb1')).to.throw('root names /dev/sdb1, which is not a system on these disks');
  });
  it('the manifest takes root as auto, first, single or a device, and names the field otherwise', () => {
    const m = (root: unknown) => validateManifest({ manifest_version: '1.0', disks: [{ id: 'd', source_format: 'raw', bytes: 1, local_path: '/x' }],
      pipeline: { fix: { enabled: true, root } } });
    for (const ok of ['auto', 'first', 'single', '/dev/sda2', 'btrfsvol:/dev/sda1/@', '/dev/rhel/root']) expect(m(ok).pipeline?.fix?.root, ok).to.equal(ok);
    let problems: unknown;
    try { m('sda2'); } catch (e) { problems = (e as ManifestError).problems; }
    expect(problems).to.deep.equal([{ path: '$.pipeline.fix.root', message: 'must be auto, first, single, or a device such as /dev/sda2', type: 'string.pattern.base' }]);
  });
});

const OS_RELEASE = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n';
const STATUS = 'Package: open-vm-tools\nStatus: install ok installed\nVersion: 2\n\nPackage: walinuxagent\nStatus: deinstall ok config-files\n\n';

/** A minimal Debian root on the mounted file system: what inspection reads, a kernel's module folder. */
async function debianRoot(g: GuestSession, hostname: string, fstab: string) {
  for (const d of ['/etc', '/bin', '/usr/lib', '/var/lib/dpkg', '/lib/modules/6.1.0-9-amd64', '/srv']) await g.cmd('mkdir-p', d);
  await g.writeFile('/usr/lib/os-release', OS_RELEASE);
  await g.cmd('ln-s', '../usr/lib/os-release', '/etc/os-release');
  await g.writeFile('/etc/debian_version', '12.7\n');
  await g.writeFile('/etc/hostname', `${hostname}\n`);
  await g.writeFile('/etc/fstab', fstab);
  await g.writeFile('/var/lib/dpkg/status', STATUS);
}

type Reading = Awaited<ReturnType<typeof inspectAndMount>>;
/** What an attempt to repair answered: the reading, or the refusal's message. */
type Outcome = { info?: Reading; hostname?: string; refused?: string };

/** One disk, read by Ferry and by libguestfs with one system on it, then every way with a second system added. */
interface Evidence {
  one: { mine: Reading; timings: string[]; theirs: Record<string, unknown> & { mountpoints: Record<string, string> }; named: Outcome };
  two: { auto: Outcome; named: Outcome; single: Outcome; missing: Outcome };
}

/** inspectAndMount with a root option; what it answered and the hostname of what it mounted (umounted after). */
async function attempt(s: GuestSession, root?: string): Promise<Outcome> {
  try {
    const info = await inspectAndMount(s, false, undefined, undefined, root);
    return { info, hostname: (await s.read('/etc/hostname')).trim() };
  } catch (e) { return { refused: (e as Error).message }; } finally { await s.cmd('umount-all'); }
}

/** libguestfs's own inspection of the one system on the disk, mounted as it says. */
async function theirReading(s: GuestSession): Promise<Evidence['one']['theirs']> {
  const root = s.lines(await s.cmd('inspect-os'))[0];
  const get = async (c: string) => (await s.cmd(c, root)).trim();
  const mps: Record<string, string> = {};
  for (const l of s.lines(await s.cmd('inspect-get-mountpoints', root))) { const [mp, dev] = l.split(': '); mps[mp] = dev; }
  for (const mp of Object.keys(mps).sort((a, b) => a.length - b.length)) await s.cmd('mount-ro', mps[mp], mp);
  const theirs = { root_device: root, distro: await get('inspect-get-distro'), product_name: await get('inspect-get-product-name'), hostname: await get('inspect-get-hostname'),
    version: `${await get('inspect-get-major-version')}.${await get('inspect-get-minor-version')}`, package_format: await get('inspect-get-package-format'), mountpoints: mps,
    hypervisor_tools: await installedHvPackages(s, root) };
  await s.cmd('umount-all');
  return theirs;
}

async function produce(dir: string): Promise<Evidence> {
  const disk = path.join(dir, 'disk.raw');
  execFileSync('qemu-img', ['create', '-q', '-f', 'raw', disk, '96M']);
  const s = await GuestSession.open([{ path: disk, format: 'raw' }]);
  try {
    await s.cmd('part-init', '/dev/sda', 'mbr');
    await s.cmd('part-add', '/dev/sda', 'p', '2048', '98303');
    await s.cmd('part-add', '/dev/sda', 'p', '98304', '-2048');
    for (const p of ['/dev/sda1', '/dev/sda2']) await s.cmd('mkfs', 'ext4', p);
    const data = (await s.blkid('/dev/sda2')).UUID;
    await s.cmd('mount', '/dev/sda1', '/');
    // The second file system by UUID, proc and a swap that the reading leaves out.
    await debianRoot(s, 'alpha', `/dev/sda1 / ext4 errors=remount-ro 0 1\nUUID=${data} /srv ext4 defaults 0 2\nproc /proc proc defaults 0 0\n/dev/sdb1 none swap sw 0 0\n`);
    await s.cmd('umount-all');
    const mine = await inspectAndMount(s, false);
    const timings = Object.keys(s.timings);
    await s.cmd('umount-all');
    const one = { mine, timings, theirs: await theirReading(s), named: await attempt(s, '/dev/sda2') };
    // A second system on the second file system.
    await s.cmd('mount', '/dev/sda2', '/');
    await debianRoot(s, 'beta', '/dev/sda2 / ext4 defaults 0 1\n');
    await s.cmd('umount-all');
    const two = { auto: await attempt(s), named: await attempt(s, '/dev/sda2'), single: await attempt(s, 'single'), missing: await attempt(s, '/dev/sda3') };
    return JSON.parse(JSON.stringify({ one, two })) as Evidence;
  } finally { await s.close(); }
}

describe('Ferry\'s reading of a guest against libguestfs\'s inspection, on one real disk @vm', function () {
  this.timeout(20 * 60 * 1000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-linux-reading-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  proofTests<Evidence>({
    spec: () => ({ name: 'pipeline-linux-reading', entries: [__filename] }),
    produce: () => produce(dir),
    runTitle: 'makes the disk and reads it every way (or reuses the record of the same inputs)',
    checks: [
      ['reads one Debian system as libguestfs does, without inspect-os', ({ one }) => {
        expect(one.timings).to.not.include('inspect-os');
        expect(one.mine.reading).to.deep.equal({ by: 'ferry' });
        expect(one.theirs).to.deep.include({ root_device: '/dev/sda1', distro: 'debian', version: '12.7', hostname: 'alpha', package_format: 'deb', hypervisor_tools: ['open-vm-tools'] });
        expect(one.theirs.mountpoints).to.deep.equal({ '/': '/dev/sda1', '/srv': '/dev/sda2' });
        expect({ ...one.mine, hypervisor_tools: one.mine.hypervisor_tools.filter((t) => !t.startsWith('/')) }).to.deep.include(one.theirs);
        expect(one.named.refused, 'a root option naming another device than the one system found').to.include('root names /dev/sda2, which is not a system on these disks (found: /dev/sda1)');
      }],
    ],
    groups: [{ title: 'a disk with two systems', checks: [
      ['declines to read it itself; inspect-os finds both, and the rule repairs the first on the boot disk, saying so', ({ two: { auto } }) => {
        expect(auto.refused, 'refused').to.equal(undefined);
        expect(auto.info!.reading).to.deep.include({ by: 'libguestfs', why: 'the disks hold 2 systems (/dev/sda1, /dev/sda2)', roots: ['/dev/sda1', '/dev/sda2'] });
        expect(auto.info!.reading?.root_choice).to.match(/^root "auto": the first system on the first disk/);
        expect([auto.info!.root_device, auto.info!.hostname]).to.deep.equal(['/dev/sda1', 'alpha']);
        expect(auto.hostname, 'that root is what is mounted').to.equal('alpha');
      }],
      ['repairs the one the fix stage\'s root names', ({ two: { named } }) => {
        expect(named.refused, 'refused').to.equal(undefined);
        expect([named.info!.root_device, named.info!.hostname, named.info!.reading?.root_choice]).to.deep.equal(['/dev/sda2', 'beta', 'root "/dev/sda2", as the fix stage named it, of /dev/sda1, /dev/sda2']);
        expect(named.hostname).to.equal('beta');
      }],
      ['refuses with root "single", and a root that is not there, naming what was found', ({ two: { single, missing } }) => {
        expect(single.refused).to.include('the disks hold 2 systems (/dev/sda1, /dev/sda2) and the fix stage\'s root is "single"');
        expect(missing.refused).to.include('root names /dev/sda3, which is not a system on these disks (found: /dev/sda1, /dev/sda2)');
      }],
    ] }],
  });
});
