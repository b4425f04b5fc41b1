// The netplan Debian 12 guest (test/fixtures/debian-guest.ts 'netplan': netplan with the systemd-networkd renderer
// holding ens192's static address, and a data disk mounted as `/dev/sdb1 /data` without nofail), issue 20 items
// 1, 4 and 5:
// - the source boots on SATA, its data disk on pvscsi as on VMware, and prints its marker on ens192 with every fstab mount present;
//   (a property of the cached fixture: booted once per fixture build, its record re-checked after,
//   test/fixtures/source-proof.ts)
// - a migrate job with both disks (every repair, virt_test with the same marker) makes two outputs that boot on
//   virtio-blk with a virtio NIC: the NIC renamed in netplan's own file, /data found by its UUID on the second
//   virtio disk;
// - read back: fstab names each file system by the UUID its output disk holds, netplan's file names the KVM NIC
//   (the original in /ferry-backup), and the source VMDKs are byte-identical.
// That this guest's initramfs does not find its root on virtio-blk is the plain variant's (fixture.test.ts): the
// netplan layer keeps the plain disk's boot loader and initramfs. Serial logs of a failed check stay in
// test/artifacts/guest-netplan-*.log.
import { expect } from 'chai';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { sha256File } from '../../shared/qemu';
import { GuestSession } from '../../shared/converter/guestfs';
import { kvmNicName } from '../../shared/converter/nic-names';
import { ensureDebianGuest, GUEST_CACHE, repairManifest } from '../fixtures/debian-guest';
import { asOnVmware, provedSourceBoot } from '../fixtures/source-proof';
import { keepOnFailure } from '../helpers/boot-logs';
import { startStack } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';
import type { PipelineReport } from '../../shared/converter/stages/report';
import type { FixAction } from '../../shared/converter/types';

const BOOT_TIMEOUT = 600;

describe('Ferry on the netplan Debian 12 guest with a data disk: both disks and the static address after the move', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the fixtures first
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guest-netplan-'));
  let stack: Awaited<ReturnType<typeof startStack>> | undefined;
  before(async () => {
    stack = await startStack('netplan-worker', ['img_tool', 'mount_operations'], { FERRY_INPUT_ROOTS: [os.tmpdir(), GUEST_CACHE].join(':') });
  });
  after(async () => {
    await stack?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('the source boots on SATA; a migrate job\'s two outputs boot on virtio with /data mounted and netplan\'s address on the renamed NIC', async () => {
    const g = await ensureDebianGuest('netplan');
    const data = g.dataVmdk!;
    const sums = await Promise.all([sha256File(g.vmdk), sha256File(data)]);
    const ready = new RegExp(`${g.ready.source} mounts=/,/data`);
    const out = path.join(dir, 'out');
    const manifest = await repairManifest(g, out, 'netplan.qcow2', 'test');
    const gw = stack!.gw.url;
    // The source's boot first (recorded: nothing to boot), then Ferry's: one emulated VM at a time.
    await provedSourceBoot(g, 'sata', asOnVmware(g, ready, { disks: [{ path: g.vmdk, format: 'vmdk' }, { path: data, format: 'vmdk', bus: 'pvscsi' }] }), (r) => {
      expect(r, 'the source on SATA').to.include({ status: 'passed' });
      expect(ready.exec(r.matched!)![1]).to.equal(g.vmwareNic);
    });
    const sub = await req(gw, 'POST', '/jobs?queue=true', { job_id: 'guest-netplan', operation: 'migrate', parameters: { manifest, virt_test: { expect: ready.source, timeout_seconds: BOOT_TIMEOUT, memory_mib: 1024 } } });
    expect(sub.status, sub.text).to.equal(201);
    const final = await until(async () => { const j = (await req<JobStatus>(gw, 'GET', '/jobs/guest-netplan')).body; return ['COMPLETED', 'FAILED', 'CANCELLED'].includes(j.state) && j; }, 40 * 60_000, 'the migrate job');

    const report = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as PipelineReport;
    keepOnFailure('guest-netplan-output', report.test_boot?.console_log ?? '', () => {
      expect(final.state, JSON.stringify(final.error || final.result?.errors)).to.equal('COMPLETED');
      expect(report.test_boot, 'the outputs\' test boot').to.include({ status: 'passed' });
      expect(ready.exec(report.test_boot!.matched!)![1]).to.equal(kvmNicName(0));
    });
    const actions = report.stages.fix.result!.actions as FixAction[];
    expect(actions.filter((a) => a.action === 'verify' && a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);
    expect(actions.filter((a) => a.action === 'nic_names' && a.file === '/etc/netplan/01-vmware.yaml').map((a) => a.status)).to.deep.equal(['done']);

    // Read back independently: the system disk's fstab names /data by the UUID the output data disk holds.
    const outs = ['root', 'data'].map((id) => ({ path: path.join(out, `netplan-${id}.qcow2`), format: 'qcow2' }));
    const s = await GuestSession.open(outs, { readonly: true });
    try {
      const [rootUuid, dataUuid] = [await s.cmd('vfs-uuid', '/dev/sda1'), await s.cmd('vfs-uuid', '/dev/sdb1')].map((u) => u.trim());
      await s.cmd('mount-ro', '/dev/sda1', '/');
      const fstab = s.lines(await s.read('/etc/fstab')).filter((l) => !l.startsWith('#')).map((l) => l.split(/\s+/).slice(0, 2));
      expect(fstab).to.deep.equal([[`UUID=${rootUuid}`, '/'], [`UUID=${dataUuid}`, '/data']]);
      const plan = await s.read('/etc/netplan/01-vmware.yaml');
      expect(plan).to.match(new RegExp(`^    ${kvmNicName(0)}:$`, 'm')).and.not.contain(g.vmwareNic);
      expect(await s.read('/ferry-backup/etc/netplan/01-vmware.yaml')).to.match(new RegExp(`^    ${g.vmwareNic}:$`, 'm'));
    } finally { await s.close(); }
    expect(await Promise.all([sha256File(g.vmdk), sha256File(data)]), 'the source VMDKs are byte-identical').to.deep.equal(sums);
  });
});
