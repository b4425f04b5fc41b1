// The plan preflight's inspection, reused by the repair (issue 34 item 4; domain/converter/inspection-hint.ts). The
// preflight reads the real Debian guest as the second disk of a shared appliance (as a plan's round does); the
// job's appliance, on a copy-on-write overlay of the same disk, takes that reading without running inspect-os, and
// what it concludes is what inspection concludes. A changed /etc/fstab, or a device holding another file system,
// and it inspects again, saying why.
// A reused proof (test/helpers/proof-tests.ts): the three appliances' answers are the evidence, each test its check on
// them; with every input unchanged (the fixture's disk among them) the same checks re-assert the last passing run's.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { GuestSession } from '../../domain/converter/guestfs';
import { inspectAndMount } from '../../domain/converter/guest';
import { diskName, inspectionHint, jobDevice, type InspectionHint } from '../../domain/converter/inspection-hint';
import { inspectionHintSchema } from '../../domain/schemas/inspection';
import type { GuestInfo } from '../../domain/converter/types';
import { ensureDebianGuest } from '../fixtures/debian-guest';
import { fixtureInputs } from '../helpers/proofs';
import { proofTests } from '../helpers/proof-tests';

describe('inspection reuse: device names as the job sees the VM\'s disks', () => {
  it('names disks as libguestfs does, and renames a VM\'s disks from a shared appliance to its own', () => {
    expect([0, 1, 25, 26, 27, 701, 702].map(diskName)).to.deep.equal(['/dev/sda', '/dev/sdb', '/dev/sdz', '/dev/sdaa', '/dev/sdab', '/dev/sdzz', '/dev/sdaaa']);
    const disks = ['/dev/sdc', '/dev/sdd'];
    expect(jobDevice('/dev/sdc1', disks)).to.equal('/dev/sda1');
    expect(jobDevice('/dev/sdd', disks)).to.equal('/dev/sdb');
    expect(jobDevice('btrfsvol:/dev/sdd2/@home', disks)).to.equal('btrfsvol:/dev/sdb2/@home');
    expect(jobDevice('/dev/debian-vg/root', disks)).to.equal('/dev/debian-vg/root');
    expect(jobDevice('/dev/sda1', disks), 'another VM\'s disk').to.equal(undefined);
  });
});

/** The preflight's reading, and what the job's appliance concluded with it, without it, and with it gone stale. */
interface Evidence {
  roots: string[]; hint: InspectionHint;
  reused: GuestInfo; timings: string[]; mounted: boolean; inspected: GuestInfo;
  changed: { info: GuestInfo; mounted: boolean }; wrong: GuestInfo;
}

/** The fixture's fstab names the root /dev/sda1, as VMware templates often do: a VM not first in a shared round then
 *  resolves onto another's disk and the preflight reads it alone (guest-preflight.ts). By UUID, as most guests name
 *  it, it is read in the shared round: the case where the names must be translated. */
async function byUuid(vmdk: string, base: string) {
  execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-b', vmdk, '-F', 'vmdk', base]);
  const edit = await GuestSession.open([{ path: base, format: 'qcow2' }]);
  try {
    await edit.cmd('mount', '/dev/sda1', '/');
    const uuid = (await edit.blkid('/dev/sda1')).UUID;
    await edit.writeFile('/etc/fstab', (await edit.read('/etc/fstab')).replace(/^\/dev\/sda1(?=\s)/gm, `UUID=${uuid}`) + '\n');
  } finally { await edit.close(); }
}

/** The preflight: another VM's disk first, so the guest is /dev/sdb in its appliance, as in a plan's shared round. */
async function preflight(dir: string): Promise<Pick<Evidence, 'roots' | 'hint'>> {
  execFileSync('qemu-img', ['create', '-q', '-f', 'raw', path.join(dir, 'other.raw'), '16M']);
  const pre = await GuestSession.open([{ path: path.join(dir, 'other.raw'), format: 'raw' }, { path: path.join(dir, 'preflight.qcow2'), format: 'qcow2' }], { readonly: true });
  try {
    const roots = pre.lines(await pre.cmd('inspect-os'));
    const scope = { root: roots[0], devices: ['/dev/sdb'], owns: (d: string) => Promise.resolve(d.startsWith('/dev/sdb')) };
    const info = await inspectAndMount(pre, true, scope);
    return { roots, hint: (await inspectionHint(pre, info, scope.devices))! };
  } finally { await pre.close(); }
}

async function produce(vmdk: string, dir: string): Promise<Evidence> {
  const base = path.join(dir, 'base.qcow2');
  await byUuid(vmdk, base);
  for (const name of ['preflight', 'job']) execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-b', base, '-F', 'qcow2', path.join(dir, `${name}.qcow2`)]);
  const { roots, hint } = await preflight(dir);
  const s = await GuestSession.open([{ path: path.join(dir, 'job.qcow2'), format: 'qcow2' }]);
  try {
    const t0 = Date.now();
    const reused = await inspectAndMount(s, false, undefined, hint);
    const t1 = Date.now();
    const timings = Object.keys(s.timings);
    const mounted = await s.isFile('/etc/fstab');
    await s.cmd('umount-all');
    const t2 = Date.now();
    const inspected = await inspectAndMount(s, false);
    console.log(`      the preflight's reading taken in ${((t1 - t0) / 1000).toFixed(1)} s; Ferry's own reading and mounts ${((Date.now() - t2) / 1000).toFixed(1)} s`);
    // A file inspection reads, changed after the preflight.
    await s.cmd('write-append', '/etc/fstab', '# edited after the preflight\n');
    await s.cmd('umount-all');
    const changedInfo = await inspectAndMount(s, false, undefined, hint);
    const changed = { info: changedInfo, mounted: await s.isFile('/etc/fstab') };
    // A device holding another file system than the preflight read.
    await s.cmd('umount-all');
    const wrong = await inspectAndMount(s, false, undefined, { ...hint, uuids: { ...hint.uuids, '/dev/sda1': '00000000-0000-4000-8000-000000000000' } });
    return JSON.parse(JSON.stringify({ roots, hint, reused, timings, mounted, inspected, changed, wrong })) as Evidence;
  } finally { await s.close(); }
}

describe('inspection reuse: the repair takes the preflight\'s reading of the same disks @vm', function () {
  this.timeout(20 * 60 * 1000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-inspection-reuse-'));
  let vmdk = '';
  after(() => rmSync(dir, { recursive: true, force: true }));

  const without = (i: GuestInfo) => { const { inspection, reading, ...rest } = i; void inspection; void reading; return rest; };

  proofTests<Evidence>({
    spec: async () => { vmdk = (await ensureDebianGuest('plain')).vmdk; return { name: 'pipeline-inspection-reuse', entries: [__filename], extra: fixtureInputs(vmdk) }; },
    produce: () => produce(vmdk, dir),
    runTitle: 'reads the guest in the preflight\'s appliance and the job\'s (or reuses the record of the same inputs)',
    checks: [
      ['the preflight records the job\'s device names, the file systems\' UUIDs and the digests of the files inspection reads', ({ roots, hint }) => {
        expect(roots).to.deep.equal(['/dev/sdb1']);
        expect(inspectionHintSchema.validate(hint).error).to.equal(undefined);
        expect(hint).to.deep.include({ os: 'linux', distro: 'debian', package_format: 'deb', root: '/dev/sda1' });
        expect(hint.mountpoints['/']).to.equal('/dev/sda1');
        expect(hint.uuids['/dev/sda1']).to.match(/^[0-9a-f-]{36}$/);
        expect(hint.hypervisor_packages).to.include('open-vm-tools');
        for (const f of ['/etc/fstab', '/etc/os-release', '/etc/hostname', '/etc/debian_version', '/var/lib/dpkg/status']) expect(hint.evidence[f], f).to.match(/^[0-9a-f]{64}$/);
        expect(hint.evidence['/etc/redhat-release']).to.equal(null);
      }],
      ['the job takes it without inspect-os, and concludes what inspection concludes', ({ reused, timings, mounted, inspected }) => {
        expect(reused.inspection).to.deep.equal({ from: 'preflight' });
        expect(timings).to.not.include('inspect-os');
        expect(mounted, 'the guest is mounted').to.equal(true);
        expect(inspected.reading).to.deep.equal({ by: 'ferry' });
        expect(reused.reading).to.deep.equal({ by: 'preflight' });
        expect(without(reused)).to.deep.equal(without(inspected));
      }],
      ['a file inspection reads changed since the preflight: inspected again, saying which', ({ changed }) => {
        expect(changed.info.inspection?.from).to.equal('appliance');
        expect(changed.info.inspection?.why).to.include('/etc/fstab changed since the preflight');
        expect(changed.info.root_device).to.equal('/dev/sda1');
        expect(changed.mounted, 'mounted by the inspection that followed').to.equal(true);
      }],
      ['a device holding another file system than the preflight read: inspected again, naming it', ({ wrong }) => {
        expect(wrong.inspection?.from).to.equal('appliance');
        expect(wrong.inspection?.why).to.match(/\/dev\/sda1 holds the file system [0-9a-f-]{36}, not 00000000-/);
      }],
    ],
  });
});
