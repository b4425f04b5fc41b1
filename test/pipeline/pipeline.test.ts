// The pipeline on real guests built with libguestfs: fstab rewritten in the output (read back with libguestfs),
// backups, the grub/initramfs tools reported missing, the source untouched, report.json, dry run, checksums.
// Appliance launches: fixture build (cached across runs), plain + LVM fix (in parallel), dry run, one read-back.
// The runs are one reused proof (test/helpers/proofs.ts, issue 32 item 2): produce() runs every conversion and
// reads back what the tests assert on as plain data (runPipeline's answers, each report.json as written, the
// outputs' and sources' sha256 before and after, the dry run's and the failed runs' folders, the outputs' files,
// modes and UUIDs read back in one read-only appliance); each `it` below is one check on that evidence, and all of
// them together are the proof's check, so a record is written only when every one passed and a reuse re-asserts
// every one. The key holds this file's import closure (the converter runs in this process: domain/converter and
// what it loads), the fixture's recipe (test/fixtures/guests.ts, in the closure) and its three disks as they are,
// the tools and the lock file. Nothing here is timed, so no part stays fresh.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { sha256File } from '../../domain/qemu';
import { validateManifest } from '../../domain/schemas/manifest';
import { reportSchema } from '../../domain/schemas/report';
import { runPipeline } from '../../domain/converter/pipeline';
import { GuestSession } from '../../domain/converter/guestfs';
import { buildGuests, Guests, readFiles, PLAIN_FSTAB, LVM_FSTAB, IFUPDOWN_INTERFACES, NETPLAN_CLOUD, PERSISTENT_NET, TOOL_LOG } from '../fixtures/guests';
import { errorText } from '../../platform/errors';
import { fixtureInputs } from '../helpers/proofs';
import { proofTests, type Check as ProofCheck } from '../helpers/proof-tests';
import type { PipelineReport } from '../../domain/converter/stages/report';
import type { FixResult, GuestInfo } from '../../domain/converter/types';
import type { FstabChange } from '../../domain/converter/fstab';

/** runPipeline's answer (and report.json) with each stage's result (free-form in the report's type) as the
 *  stage writes it: the fields read here. */
type Report = PipelineReport & { stages: {
  inspect: { result: { guest: GuestInfo } };
  convert: { result: { compression: string; files: Array<Record<string, unknown>> } };
  fix: { result: FixResult };
  validate: { result: { checks: Array<Record<string, unknown>> } };
} };

const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFerryTestKeyFerryTestKeyFerryTestKey00 alice@ops';
const PLAIN_CONFIGURATION = {
  hostname: { name: 'kvm-plain' },
  services: { enable: ['ssh.service'] },
  users: { alice: { password: 'S3cret-pass!', groups: ['sudo', 'adm'], ssh_authorized_keys: [KEY], sudo: true }, root: { ssh_authorized_keys: [KEY] } },
  network: { interfaces: [{ name: 'enp1s0', dhcp4: true }] },
};
const LVM_CONFIGURATION = { network: { interfaces: [{ mac: '52:54:00:12:34:56', addresses: ['192.0.2.10/24'], gateway4: '192.0.2.1', dns: ['192.0.2.53'] }] } };

const PLAIN_FILES = ['/etc/fstab', '/ferry-backup/etc/fstab', '/boot/grub/grub.cfg', '/ferry-backup/boot/grub/grub.cfg', '/etc/hostname', '/etc/hosts',
  '/etc/systemd/system/multi-user.target.wants/vmtoolsd.service', '/etc/systemd/system/multi-user.target.wants/ssh.service',
  '/etc/passwd', '/etc/shadow', '/etc/group', '/etc/gshadow', '/ferry-backup/etc/passwd', '/home/alice/.bashrc', '/home/alice/.ssh/authorized_keys', '/root/.ssh/authorized_keys',
  '/etc/sudoers.d/90-ferry-alice', '/etc/network/interfaces', '/etc/network/interfaces.d/90-ferry', '/etc/udev/rules.d/70-persistent-net.rules', '/ferry-backup/etc/udev/rules.d/70-persistent-net.rules', '/etc/fstab.ferry-backup'];
const STAT_OF = ['/ferry-backup', '/etc/shadow', '/etc/gshadow', '/home/alice', '/home/alice/.bashrc', '/home/alice/.ssh', '/home/alice/.ssh/authorized_keys', '/etc/sudoers.d/90-ferry-alice'];

/** The UUID in an XFS superblock on the first MBR partition of a disk image, read with qemu-img and node only. */
async function xfsUuidOf(image: string, dir: string): Promise<string> {
  const raw = path.join(dir, 'xfs-source.raw');
  execFileSync('qemu-img', ['convert', '-f', 'vmdk', '-O', 'raw', image, raw]);
  const fd = await fs.open(raw, 'r');
  try {
    const mbr = Buffer.alloc(512);
    await fd.read(mbr, 0, 512, 0);
    const sb = Buffer.alloc(48);
    await fd.read(sb, 0, 48, mbr.readUInt32LE(446 + 8) * 512);
    expect(sb.subarray(0, 4).toString()).to.equal('XFSB');
    const h = sb.subarray(32, 48).toString('hex');
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  } finally { await fd.close(); await fs.rm(raw, { force: true }); }
}

const manifest = (o: { id: string; src: string; dir: string; fix?: Record<string, unknown>; extra?: Record<string, unknown>; checksum?: string; more?: Record<string, unknown>[] }) => validateManifest({
  manifest_version: '1.0',
  disks: [{ id: o.id, source_format: 'vmdk', bytes: 134217728, local_path: o.src, boot_order_hint: 0, ...(o.checksum ? { checksum: o.checksum } : {}) }, ...(o.more || [])],
  pipeline: { inspect: { enabled: true, collect_guest_info: true }, convert: { enabled: true }, validate: { enabled: true }, ...(o.fix ? { fix: { enabled: true, ...o.fix } } : {}) },
  output: { directory: o.dir, format: 'qcow2' },
  ...o.extra,
});

/** What the outputs held, read back in one read-only appliance for all three disks. */
interface ReadBack {
  plain: Record<string, string | null>; lvm: Record<string, string | null>; lvmBoot: Record<string, string | null>;
  stats: Record<string, { mode: number; uid: number; gid: number }>; ids: Record<string, Record<string, string>>;
  xfsSourceUuid: string; sshLink: string | null;
}
/** Everything the checks read, from one run of every conversion (fresh or the record's). */
interface Evidence {
  /** the run's temporary folder and the plain source (the reports name paths under them) */
  tmp: string; plainVmdk: string;
  srcSha: { plain: string; lvm: string }; srcShaAfter: { plain: string; lvm: string };
  reports: { plain: Report; lvm: Report };
  onDisk: Record<'plain' | 'lvm', { report: Report; sha256: string }>;
  readback: ReadBack;
  dry: { report: Report; dirExists: boolean; srcShaAfter: string };
  nofix: { report: Report; dir: string };
  badsum: { report: Report; files: string[]; onDisk: Report };
  fmt: { report: Report };
}

async function readOutputs(g: Guests, tmp: string): Promise<ReadBack> {
  const xfsSourceUuid = await xfsUuidOf(g.xfsVmdk, tmp);
  const s = await GuestSession.open(['plain/plain.qcow2', 'lvm/lvm.qcow2', 'lvm/data.qcow2'].map((f) => ({ path: path.join(tmp, f), format: 'qcow2' })), { readonly: true });
  try {
    const ids = { plainRoot: await s.blkid('/dev/sda1'), plainSwap: await s.blkid('/dev/sda2'), lvmBoot: await s.blkid('/dev/sdb1'), data: await s.blkid('/dev/sdc1') };
    await s.cmd('mount-ro', '/dev/sda1', '/');
    const stats: ReadBack['stats'] = {};
    for (const f of STAT_OF) stats[f] = (await s.exists(f)) ? await s.stat(f) : { mode: -1, uid: -1, gid: -1 };
    const sshLink = (await s.tryCmd('readlink', '/etc/systemd/system/multi-user.target.wants/ssh.service'))?.trim() ?? null;
    await s.cmd('umount-all');
    const plain = await readFiles(s, '/dev/sda1', PLAIN_FILES);
    const lvm = await readFiles(s, '/dev/vgferry/root', ['/etc/fstab', '/ferry-backup/etc/fstab', '/etc/netplan/50-cloud-init.yaml', '/etc/netplan/90-ferry.yaml', '/etc/initramfs-tools/modules', TOOL_LOG]);
    const lvmBoot = await readFiles(s, '/dev/sdb1', ['/grub/grub.cfg', '/initrd.img-5.10.0-ferry']);
    return { plain, lvm, lvmBoot, stats, ids, xfsSourceUuid, sshLink };
  } finally { await s.close(); }
}

/** The runs that fail or write nothing: a dry run, one without fix (compressed), a checksum mismatch, a wrong format. */
async function sideRuns(g: Guests, tmp: string): Promise<Pick<Evidence, 'dry' | 'nofix' | 'badsum' | 'fmt'>> {
  const dryDir = path.join(tmp, 'dry');
  const dry = await runPipeline(manifest({ id: 'dry', src: g.plainVmdk, dir: dryDir, fix: {}, extra: { options: { dry_run: true } } })) as Report;
  const dirExists = await fs.stat(dryDir).then(() => true, () => false);
  const drySha = await sha256File(g.plainVmdk);
  const nofixDir = path.join(tmp, 'nofix');
  const nofix = await runPipeline(validateManifest({
    manifest_version: '1.0',
    disks: [{ id: 'a', source_format: 'vmdk', bytes: 134217728, local_path: g.plainVmdk }],
    pipeline: { convert: { enabled: true, compress: true, compress_level: 9 }, validate: { enabled: true } },
    output: { directory: nofixDir, filename: 'custom.qcow2' },
  })) as Report;
  const badDir = path.join(tmp, 'badsum');
  const badsum = await runPipeline(validateManifest({
    manifest_version: '1.0',
    disks: [{ id: 'a', source_format: 'vmdk', bytes: 134217728, local_path: g.plainVmdk, checksum: `sha256:${'0'.repeat(64)}` }],
    pipeline: { convert: { enabled: true }, validate: { enabled: true } },
    output: { directory: badDir },
  })) as Report;
  const badFiles = (await fs.readdir(badDir)).sort();
  const badOnDisk = JSON.parse(await fs.readFile(path.join(badDir, 'report.json'), 'utf8')) as Report;
  const fmt = await runPipeline(validateManifest({ manifest_version: '1.0', disks: [{ id: 'a', source_format: 'qcow2', bytes: 1, local_path: g.plainVmdk }], output: { directory: path.join(tmp, 'fmt') } })) as Report;
  return { dry: { report: dry, dirExists, srcShaAfter: drySha }, nofix: { report: nofix, dir: nofixDir }, badsum: { report: badsum, files: badFiles, onDisk: badOnDisk }, fmt: { report: fmt } };
}

/** Every conversion of the file, then the outputs read back: the evidence, in the JSON form a record keeps. */
async function produce(g: Guests, tmp: string): Promise<Evidence> {
  const srcSha = { plain: await sha256File(g.plainVmdk), lvm: await sha256File(g.lvmVmdk) };
  // The two fix runs share nothing, so they run side by side (one appliance each).
  const [plain, lvm] = await Promise.all([
    runPipeline(manifest({ id: 'plain', src: g.plainVmdk, dir: path.join(tmp, 'plain'), checksum: `sha256:${srcSha.plain}`, fix: { print_fstab: true, remove_source_hv_tools: true }, extra: { configuration: PLAIN_CONFIGURATION } })),
    // The LVM guest with its XFS data disk (sdb1 /data in its fstab), whose UUID is regenerated.
    runPipeline(manifest({ id: 'lvm', src: g.lvmVmdk, dir: path.join(tmp, 'lvm'), fix: { backup: false, xfs_regenerate_uuid: true, remove_source_hv_tools: true }, more: [{ id: 'data', source_format: 'vmdk', bytes: 335544320, local_path: g.xfsVmdk, boot_order_hint: 1 }], extra: { configuration: LVM_CONFIGURATION } })),
  ]);
  const onDisk = async (k: string) => ({
    report: JSON.parse(await fs.readFile(path.join(tmp, k, 'report.json'), 'utf8')) as Report,
    sha256: await sha256File(path.join(tmp, k, `${k}.qcow2`)).catch((e: unknown) => `unreadable: ${errorText(e)}`),
  });
  const e: Evidence = {
    tmp, plainVmdk: g.plainVmdk, srcSha, srcShaAfter: { plain: await sha256File(g.plainVmdk), lvm: await sha256File(g.lvmVmdk) },
    reports: { plain: plain as Report, lvm: lvm as Report }, onDisk: { plain: await onDisk('plain'), lvm: await onDisk('lvm') },
    ...(await sideRuns(g, tmp)), readback: await readOutputs(g, tmp),
  };
  return JSON.parse(JSON.stringify(e)) as Evidence;
}

/** One `it`'s assertions. */
type Check = ProofCheck<Evidence>;

const RUN_CHECKS: Check[] = [
  ['completes both runs and writes a report.json that matches the documented schema', (e) => {
    for (const k of ['plain', 'lvm'] as const) {
      expect(e.reports[k].errors, k).to.deep.equal([]);
      expect(e.reports[k].success, k).to.equal(true);
      const onDisk = e.onDisk[k].report;
      const { error } = reportSchema.validate(onDisk);
      expect(error?.message).to.equal(undefined);
      expect(onDisk.stages.fix.success).to.equal(true);
      expect(onDisk.artifacts[0]).to.include({ disk_id: k, format: 'qcow2', boot_order: 0, modified_by_fix: true, path: path.join(e.tmp, k, `${k}.qcow2`) });
      expect(onDisk.artifacts[0].sha256).to.equal(e.onDisk[k].sha256);
    }
    expect(e.reports.plain.artifacts[0].source_sha256).to.equal(e.srcSha.plain);
  }],
  ['leaves the sources untouched (same sha256 before and after)', (e) => {
    expect(e.srcShaAfter.plain).to.equal(e.srcSha.plain);
    expect(e.srcShaAfter.lvm).to.equal(e.srcSha.lvm);
  }],
  ['reports guest inspection: OS, distro, root, LVM, hypervisor tools, kernels', ({ reports }) => {
    const gi = reports.plain.stages.inspect.result.guest;
    expect(gi).to.include({ os: 'linux', distro: 'debian', root_device: '/dev/sda1', lvm: false, hostname: 'plain-src' });
    expect(gi.hypervisor_tools).to.include('open-vm-tools'); // from libguestfs's reading of the dpkg database
    expect(gi.package_format).to.equal('deb');
    expect(gi.kernels).to.deep.equal(['5.10.0-ferry']);
    expect(reports.lvm.stages.inspect.result.guest).to.include({ os: 'linux', lvm: true });
  }],
  ['says plainly that grub-mkconfig and the initramfs tools are absent (warnings, not success)', ({ reports }) => {
    const acts = reports.plain.stages.fix.result.actions;
    expect(acts.find((a) => a.action === 'regen_initramfs')).to.include({ status: 'warning' });
    expect(acts.find((a) => a.action === 'regen_initramfs')!.detail).to.match(/no initramfs tool in the guest/);
    expect(acts.filter((a) => a.action === 'update_grub' && a.status === 'warning').map((a) => a.detail).join()).to.match(/grub-mkconfig is not installed in the guest/);
    expect(reports.plain.warnings.join('\n')).to.match(/fix: regen_initramfs: no initramfs tool/);
  }],
  ['runs the guest\'s own grub-mkconfig, update-initramfs and dpkg inside it when it has them (LVM guest)', ({ reports }) => {
    const acts = reports.lvm.stages.fix.result.actions.filter((a) => ['update_grub', 'regen_initramfs', 'remove_source_hv_tools'].includes(a.action)).map((a) => [a.action, a.status, a.detail]);
    // In the order that lets each hold: packages, the initramfs (with the modules list it reads), grub last.
    expect(acts).to.deep.equal([
      ['remove_source_hv_tools', 'done', 'ran dpkg --purge open-vm-tools'],
      ['remove_source_hv_tools', 'done', 'disabled vmtoolsd.service (removed /etc/systemd/system/multi-user.target.wants/vmtoolsd.service)'],
      ['regen_initramfs', 'done', '/etc/initramfs-tools/modules: added virtio_pci, virtio_blk, virtio_scsi, virtio_net'],
      ['regen_initramfs', 'done', 'ran update-initramfs -u -k 5.10.0-ferry: rebuilt rather than appended, because the kernel has no image to append to'],
      ['update_grub', 'done', 'ran /usr/sbin/grub-mkconfig -o /boot/grub/grub.cfg'],
      // grub.cfg read back after the generator (issue 34's grub.ts): its kernel lines needed no mending.
      ['update_grub', 'skipped', '/boot/grub/grub.cfg: root=/resume= arguments are already stable'],
    ]);
    // Read back at the end: the package database no longer lists open-vm-tools, grub.cfg names no kernel device.
    const verify = reports.lvm.stages.fix.result.actions.filter((a) => a.action === 'verify').map((a) => [a.status, a.check]);
    expect(verify).to.deep.include.members([['done', '/etc/fstab'], ['done', '/boot/grub/grub.cfg'], ['done', 'source hypervisor tools']]);
    expect(reports.lvm.warnings.join('\n')).not.to.match(/regen_initramfs|update_grub|remove_source_hv_tools/);
  }],
  ['without dpkg in the guest the hypervisor tools are only disabled, and the report says so (plain guest)', ({ reports }) => {
    const acts = reports.plain.stages.fix.result.actions.filter((a) => a.action === 'remove_source_hv_tools').map((a) => [a.status, a.detail]);
    expect(acts).to.deep.equal([
      ['warning', 'packages open-vm-tools are installed but /usr/bin/dpkg is not in the guest; services disabled only'],
      ['done', 'disabled vmtoolsd.service (removed /etc/systemd/system/multi-user.target.wants/vmtoolsd.service)'],
    ]);
  }],
  ['dry_run modifies nothing and writes nothing, yet reports what it would do', ({ dry, tmp, srcSha }) => {
    const r = dry.report;
    expect(r.success, r.errors.join()).to.equal(true);
    expect(r.dry_run).to.equal(true);
    expect(dry.dirExists).to.equal(false);
    const fstab = r.stages.fix.result.actions.find((a) => a.action === 'fstab');
    expect(fstab).to.include({ status: 'would_do' });
    expect((fstab!.changes as FstabChange[]).map((c) => c.from)).to.deep.equal(['/dev/sda1', '/dev/disk/by-path/pci-0000:00:10.0-scsi-0:0:0:0-part2']);
    expect(r.stages.convert.result.files[0]).to.have.property('would_write', path.join(tmp, 'dry', 'dry.qcow2'));
    expect(dry.srcShaAfter).to.equal(srcSha.plain);
  }],
  ['without fix: compressed qcow2, compress_level reported as not honoured, compare against the source passes', ({ nofix }) => {
    const r = nofix.report;
    expect(r.success, r.errors.join()).to.equal(true);
    expect(r.artifacts[0].path).to.equal(path.join(nofix.dir, 'custom.qcow2'));
    expect(r.stages.validate.result.checks[0]).to.include({ compare: 'identical to source', integrity: 'ok' });
    expect(r.warnings.join()).to.match(/compress_level 9 is not honoured/);
    expect(['zstd', 'zlib']).to.include(r.stages.convert.result.compression);
  }],
  ['fails on a checksum mismatch, removes the partial output, still writes report.json', ({ badsum }) => {
    const r = badsum.report;
    expect(r.success).to.equal(false);
    expect(r.stages.convert).to.include({ success: false });
    expect(r.stages.convert.error).to.match(/checksum mismatch/);
    expect(r.retryable, 'the same bytes fail the same way').to.equal(false);
    expect(r.stages.validate.skipped_reason).to.equal('an earlier stage failed');
    expect(badsum.files).to.deep.equal(['report.json']);
    expect(badsum.onDisk.summary.stages_failed).to.deep.equal(['convert']);
  }],
  ['fails inspect when source_format does not match the file', ({ fmt, plainVmdk }) => {
    expect(fmt.report.success).to.equal(false);
    expect(fmt.report.stages.inspect.error).to.equal(`disk a: source_format is qcow2 but ${plainVmdk} is vmdk`);
  }],
];

const READBACK_CHECKS: Check[] = [
  ['rewrites fstab, grub root= and hostname, with backups', ({ readback: { plain, ids, stats, sshLink }, reports }) => {
    const want = PLAIN_FSTAB
      .replace('/dev/sda1                                             /', `UUID=${ids.plainRoot.UUID}                                             /`)
      .replace('/dev/disk/by-path/pci-0000:00:10.0-scsi-0:0:0:0-part2 none', `UUID=${ids.plainSwap.UUID} none`);
    expect(plain['/etc/fstab']).to.equal(want);
    expect(plain['/etc/fstab']).to.contain('proc\t/proc\tproc\tdefaults\t0\t0\ntmpfs   /tmp   tmpfs   defaults,size=64m   0 0\nLABEL=scratch /scratch ext4');
    // Originals go into one root-only tree that mirrors their paths, never beside the file (a directory read
    // whole, such as RHEL's network-scripts, would read the copy as configuration).
    expect(plain['/ferry-backup/etc/fstab']).to.equal(PLAIN_FSTAB);
    expect(plain['/etc/fstab.ferry-backup']).to.equal(null);
    expect(stats['/ferry-backup'].mode & 0o7777).to.equal(0o700);
    expect(plain['/boot/grub/grub.cfg']).to.contain(`root=UUID=${ids.plainRoot.UUID} ro`);
    expect(plain['/ferry-backup/boot/grub/grub.cfg']).to.contain('root=/dev/sda1 ro');
    expect(plain['/etc/hostname']).to.equal('kvm-plain\n');
    expect(plain['/etc/hosts']).to.contain('127.0.1.1\tkvm-plain');
    expect(plain['/etc/systemd/system/multi-user.target.wants/vmtoolsd.service']).to.equal(null);
    expect(sshLink).to.equal('/lib/systemd/system/ssh.service');
    expect(reports.plain.stages.fix.result.fstab_before).to.equal(PLAIN_FSTAB);
  }],
  ['LVM guest: /dev/mapper root stays, /boot and the XFS /data become UUID=, no backup asked for', ({ readback: { lvm, ids } }) => {
    expect(lvm['/etc/fstab']).to.equal(LVM_FSTAB
      .replace('/dev/sda1                 /boot', `UUID=${ids.lvmBoot.UUID}                 /boot`)
      .replace('/dev/sdb1                 /data', `UUID=${ids.data.UUID}                 /data`));
    expect(lvm['/ferry-backup/etc/fstab']).to.equal(null);
  }],
  ['the guest tools ran in the guest with the expected arguments and wrote their files; virtio modules were added first', ({ readback: { lvm, lvmBoot } }) => {
    expect(lvm[TOOL_LOG]).to.equal('dpkg --purge open-vm-tools\nupdate-initramfs -u -k 5.10.0-ferry\ngrub-mkconfig -o /boot/grub/grub.cfg\n');
    expect(lvmBoot['/grub/grub.cfg']).to.equal('# generated by grub-mkconfig (ferry test double)\nmenuentry "Debian" {\n\tlinux /vmlinuz-5.10.0-ferry root=/dev/mapper/vgferry-root ro\n}\n');
    expect(lvm['/etc/initramfs-tools/modules']).to.equal('# initramfs modules\n# Ferry: the virtio drivers KVM\'s disks and NICs need\nvirtio_pci\nvirtio_blk\nvirtio_scsi\nvirtio_net\n');
    expect(lvmBoot['/initrd.img-5.10.0-ferry']).to.equal('initramfs for 5.10.0-ferry, modules:\n' + '# initramfs modules\n# Ferry: the virtio drivers KVM\'s disks and NICs need\nvirtio_pci\nvirtio_blk\nvirtio_scsi\nvirtio_net\n');
  }],
  ['xfs_regenerate_uuid: the output XFS has a new UUID (the source keeps its own), and fstab names the new one', ({ readback: { ids, xfsSourceUuid }, reports }) => {
    const act = reports.lvm.stages.fix.result.actions.find((a) => a.action === 'xfs_regenerate_uuid');
    expect(act).to.include({ status: 'done', device: '/dev/sdb1', old_uuid: xfsSourceUuid, new_uuid: ids.data.UUID });
    expect(ids.data.TYPE).to.equal('xfs');
    expect(ids.data.UUID).to.match(/^[0-9a-f-]{36}$/);
    expect(ids.data.UUID).not.to.equal(xfsSourceUuid);
    expect(reports.lvm.artifacts.map((x) => [x.disk_id, x.boot_order, x.modified_by_fix])).to.deep.equal([['lvm', 0, true], ['data', 1, true]]);
  }],
  ['configuration.users: account lines, hashed password, groups, home from /etc/skel, keys, sudoers; modes kept', ({ readback: { plain, stats }, reports }) => {
    expect(plain['/etc/passwd']).to.match(/\nalice:x:1000:1000::\/home\/alice:\/bin\/bash\n$/);
    expect(plain['/ferry-backup/etc/passwd']).not.to.contain('alice');
    const shadow = plain['/etc/shadow']!.split('\n').find((l) => l.startsWith('alice:'))!.split(':');
    expect(shadow[1]).to.match(/^\$6\$[./A-Za-z0-9]+\$[./A-Za-z0-9]{86}$/);
    expect(plain['/etc/shadow']).not.to.contain('S3cret-pass!');
    expect(plain['/etc/group']).to.contain('\nadm:x:4:alice\nsudo:x:27:alice\n');
    expect(plain['/etc/group']).to.match(/\nalice:x:1000:\n$/);
    expect(plain['/etc/gshadow']).to.contain('\nsudo:*::alice\n');
    expect(stats['/etc/shadow']).to.deep.equal({ mode: 0o100640, uid: 0, gid: 42 });
    expect(stats['/etc/gshadow']).to.deep.equal({ mode: 0o100640, uid: 0, gid: 42 });
    expect(plain['/home/alice/.bashrc']).to.equal('# ~/.bashrc\n');
    expect(stats['/home/alice']).to.deep.equal({ mode: 0o40750, uid: 1000, gid: 1000 });
    expect(stats['/home/alice/.bashrc']).to.include({ uid: 1000, gid: 1000 });
    expect(plain['/home/alice/.ssh/authorized_keys']).to.equal(`${KEY}\n`);
    expect(stats['/home/alice/.ssh']).to.deep.equal({ mode: 0o40700, uid: 1000, gid: 1000 });
    expect(stats['/home/alice/.ssh/authorized_keys']).to.deep.equal({ mode: 0o100600, uid: 1000, gid: 1000 });
    expect(plain['/root/.ssh/authorized_keys']).to.equal(`${KEY}\n`);
    expect(plain['/etc/sudoers.d/90-ferry-alice']).to.contain('\nalice ALL=(ALL:ALL) ALL\n');
    expect(stats['/etc/sudoers.d/90-ferry-alice']).to.deep.equal({ mode: 0o100440, uid: 0, gid: 0 });
    const acts = reports.plain.stages.fix.result.actions.filter((a) => a.action === 'configuration.users');
    expect(acts.map((a) => [a.status, a.detail])).to.deep.equal([
      ['done', 'created alice (uid 1000, gid 1000, new group, home /home/alice); password set; added to sudo, adm; 1 authorized key(s); sudo'],
      ['done', 'updated root; 1 authorized key(s)'],
    ]);
    expect(JSON.stringify(reports.plain)).not.to.contain('S3cret-pass!');
  }],
  ['configuration.network: ifupdown (detected) gets an interfaces.d file, the old MAC rules go; netplan (detected) a 0600 file matched by MAC', ({ readback: { plain, lvm }, reports }) => {
    expect(plain['/etc/network/interfaces.d/90-ferry']).to.contain('auto enp1s0\nallow-hotplug enp1s0\niface enp1s0 inet dhcp\n');
    expect(plain['/etc/network/interfaces']).to.equal(IFUPDOWN_INTERFACES);
    expect(plain['/etc/udev/rules.d/70-persistent-net.rules']).to.equal(null);
    expect(plain['/ferry-backup/etc/udev/rules.d/70-persistent-net.rules']).to.equal(PERSISTENT_NET);
    expect(lvm['/etc/netplan/50-cloud-init.yaml']).to.equal(NETPLAN_CLOUD);
    expect(lvm['/etc/netplan/90-ferry.yaml']).to.contain('    ferry0:\n      match:\n        macaddress: \'52:54:00:12:34:56\'\n      dhcp4: false\n      addresses:\n        - 192.0.2.10/24\n      routes:\n        - to: default\n          via: 192.0.2.1\n      nameservers:\n        addresses:\n          - 192.0.2.53\n');
    const net = reports.lvm.stages.fix.result.actions.filter((a) => a.action === 'configuration.network');
    expect(net.map((a) => a.detail)).to.deep.equal(['netplan: wrote /etc/netplan/90-ferry.yaml']);
  }],
];

describe('pipeline on real guests (libguestfs) @vm', function () {
  this.timeout(1_800_000);
  let tmp: string | undefined;
  let g: Guests | undefined;
  after(async () => { if (tmp) await fs.rm(tmp, { recursive: true, force: true }); });

  proofTests<Evidence>({
    spec: () => { g = buildGuests(); return { name: 'pipeline-real-guests', entries: [__filename], extra: fixtureInputs(g.plainVmdk, g.lvmVmdk, g.xfsVmdk) }; },
    produce: async () => { tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'ferry-pipeline-')); return produce(g!, tmp); },
    runTitle: 'runs every conversion (or reuses the record of the same inputs) and records it',
    checks: RUN_CHECKS,
    groups: [{ title: 'the outputs, read back with libguestfs (one appliance for all three disks)', checks: READBACK_CHECKS }],
  });
});
