// The pipeline on real guests built with libguestfs: fstab rewritten in the output (read back with libguestfs),
// backups, the grub/initramfs tools reported missing, the source untouched, report.json, dry run, checksums.
// Appliance launches: fixture build (cached across runs), plain + LVM fix (in parallel), dry run, one read-back.
import { expect } from 'chai';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { sha256File } from '../../shared/qemu';
import { validateManifest } from '../../shared/schemas/manifest';
import { reportSchema } from '../../shared/schemas/report';
import { runPipeline } from '../../services/converter/pipeline';
import { GuestSession } from '../../services/converter/guestfs';
import { buildGuests, Guests, readFiles, PLAIN_FSTAB, LVM_FSTAB } from '../fixtures/guests';

describe('pipeline on real guests (libguestfs)', function () {
  this.timeout(600_000);
  let g: Guests;
  let tmp: string;
  let srcSha: { plain: string; lvm: string };
  const reports: Record<string, any> = {};

  const manifest = (o: { id: string; src: string; dir: string; fix?: Record<string, unknown>; extra?: Record<string, unknown>; checksum?: string }) => validateManifest({
    manifest_version: '1.0',
    disks: [{ id: o.id, source_format: 'vmdk', bytes: 134217728, local_path: o.src, boot_order_hint: 0, ...(o.checksum ? { checksum: o.checksum } : {}) }],
    pipeline: { inspect: { enabled: true, collect_guest_info: true }, convert: { enabled: true }, validate: { enabled: true }, ...(o.fix ? { fix: { enabled: true, ...o.fix } } : {}) },
    output: { directory: o.dir, format: 'qcow2' },
    ...o.extra,
  });

  before(async function () {
    g = buildGuests();
    tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'ferry-pipeline-'));
    srcSha = { plain: await sha256File(g.plainVmdk), lvm: await sha256File(g.lvmVmdk) };
    // The two fix runs share nothing, so they run side by side (one appliance each).
    const [plain, lvm] = await Promise.all([
      runPipeline(manifest({ id: 'plain', src: g.plainVmdk, dir: path.join(tmp, 'plain'), checksum: `sha256:${srcSha.plain}`, fix: { print_fstab: true, remove_source_hv_tools: true }, extra: { configuration: { hostname: { name: 'kvm-plain' } } } })),
      runPipeline(manifest({ id: 'lvm', src: g.lvmVmdk, dir: path.join(tmp, 'lvm'), fix: { backup: false } })),
    ]);
    reports.plain = plain;
    reports.lvm = lvm;
  });
  after(async () => { if (tmp) await fs.rm(tmp, { recursive: true, force: true }); });

  it('completes both runs and writes a report.json that matches the documented schema', async () => {
    for (const k of ['plain', 'lvm']) {
      expect(reports[k].errors, k).to.deep.equal([]);
      expect(reports[k].success, k).to.equal(true);
      const onDisk = JSON.parse(await fs.readFile(path.join(tmp, k, 'report.json'), 'utf8'));
      const { error } = reportSchema.validate(onDisk);
      expect(error?.message).to.equal(undefined);
      expect(onDisk.stages.fix.success).to.equal(true);
      expect(onDisk.artifacts[0]).to.include({ disk_id: k, format: 'qcow2', boot_order: 0, modified_by_fix: true, path: path.join(tmp, k, `${k}.qcow2`) });
      expect(onDisk.artifacts[0].sha256).to.equal(await sha256File(path.join(tmp, k, `${k}.qcow2`)));
    }
    expect(reports.plain.artifacts[0].source_sha256).to.equal(srcSha.plain);
  });

  it('leaves the sources untouched (same sha256 before and after)', async () => {
    expect(await sha256File(g.plainVmdk)).to.equal(srcSha.plain);
    expect(await sha256File(g.lvmVmdk)).to.equal(srcSha.lvm);
  });

  it('reports guest inspection: OS, distro, root, LVM, hypervisor tools, kernels', () => {
    const gi = reports.plain.stages.inspect.result.guest;
    expect(gi).to.include({ os: 'linux', distro: 'debian', root_device: '/dev/sda1', lvm: false, hostname: 'plain-src' });
    expect(gi.hypervisor_tools).to.include('open-vm-tools');
    expect(gi.kernels).to.deep.equal(['5.10.0-ferry']);
    expect(reports.lvm.stages.inspect.result.guest).to.include({ os: 'linux', lvm: true });
  });

  it('says plainly that grub-mkconfig and the initramfs tools are absent (warnings, not success)', () => {
    for (const k of ['plain', 'lvm']) {
      const acts = reports[k].stages.fix.result.actions as any[];
      expect(acts.find((a) => a.action === 'regen_initramfs')).to.include({ status: 'warning' });
      expect(acts.find((a) => a.action === 'regen_initramfs').detail).to.match(/no initramfs tool in the guest/);
      expect(acts.filter((a) => a.action === 'update_grub' && a.status === 'warning').map((a) => a.detail).join()).to.match(/grub-mkconfig is not installed in the guest/);
      expect(reports[k].warnings.join('\n')).to.match(/fix: regen_initramfs: no initramfs tool/);
    }
  });

  it('rewrites fstab, grub root= and hostname in the output, with backups; read back with libguestfs', async () => {
    const s = await GuestSession.open([{ path: path.join(tmp, 'plain', 'plain.qcow2'), format: 'qcow2' }, { path: path.join(tmp, 'lvm', 'lvm.qcow2'), format: 'qcow2' }], { readonly: true });
    try {
      const blk = await s.blkid('/dev/sda1');
      const swap = await s.blkid('/dev/sda2');
      const files = await readFiles(s, '/dev/sda1', ['/etc/fstab', '/etc/fstab.ferry-backup', '/boot/grub/grub.cfg', '/boot/grub/grub.cfg.ferry-backup', '/etc/hostname', '/etc/hosts', '/etc/systemd/system/multi-user.target.wants/vmtoolsd.service']);
      const want = PLAIN_FSTAB
        .replace('/dev/sda1                                             /', `UUID=${blk.UUID}                                             /`)
        .replace('/dev/disk/by-path/pci-0000:00:10.0-scsi-0:0:0:0-part2 none', `UUID=${swap.UUID} none`);
      expect(files['/etc/fstab']).to.equal(want);
      expect(files['/etc/fstab']).to.contain('proc\t/proc\tproc\tdefaults\t0\t0\ntmpfs   /tmp   tmpfs   defaults,size=64m   0 0\nLABEL=scratch /scratch ext4');
      expect(files['/etc/fstab.ferry-backup']).to.equal(PLAIN_FSTAB);
      expect(files['/boot/grub/grub.cfg']).to.contain(`root=UUID=${blk.UUID} ro`);
      expect(files['/boot/grub/grub.cfg.ferry-backup']).to.contain('root=/dev/sda1 ro');
      expect(files['/etc/hostname']).to.equal('kvm-plain\n');
      expect(files['/etc/hosts']).to.contain('127.0.1.1\tkvm-plain');
      expect(files['/etc/systemd/system/multi-user.target.wants/vmtoolsd.service']).to.equal(null);
      // LVM guest: /dev/mapper root stays, /boot (sda1 in the guest, sdb1 here) becomes UUID=, no backup asked for.
      const boot = await s.blkid('/dev/sdb1');
      const lvm = await readFiles(s, '/dev/vgferry/root', ['/etc/fstab', '/etc/fstab.ferry-backup']);
      expect(lvm['/etc/fstab']).to.equal(LVM_FSTAB.replace('/dev/sda1                 /boot', `UUID=${boot.UUID}                 /boot`));
      expect(lvm['/etc/fstab.ferry-backup']).to.equal(null);
    } finally { await s.close(); }
    expect(reports.plain.stages.fix.result.fstab_before).to.equal(PLAIN_FSTAB);
  });

  it('dry_run modifies nothing and writes nothing, yet reports what it would do', async () => {
    const dir = path.join(tmp, 'dry');
    const r = await runPipeline(manifest({ id: 'dry', src: g.plainVmdk, dir, fix: {}, extra: { options: { dry_run: true } } }));
    expect(r.success, r.errors.join()).to.equal(true);
    expect(r.dry_run).to.equal(true);
    expect(await fs.stat(dir).then(() => true, () => false)).to.equal(false);
    const fstab = r.stages.fix.result.actions.find((a: any) => a.action === 'fstab');
    expect(fstab).to.include({ status: 'would_do' });
    expect(fstab.changes.map((c: any) => c.from)).to.deep.equal(['/dev/sda1', '/dev/disk/by-path/pci-0000:00:10.0-scsi-0:0:0:0-part2']);
    expect(r.stages.convert.result.files[0]).to.have.property('would_write', path.join(dir, 'dry.qcow2'));
    expect(await sha256File(g.plainVmdk)).to.equal(srcSha.plain);
  });

  it('without fix: compressed qcow2, compress_level reported as not honoured, compare against the source passes', async () => {
    const dir = path.join(tmp, 'nofix');
    const m = validateManifest({
      manifest_version: '1.0',
      disks: [{ id: 'a', source_format: 'vmdk', bytes: 134217728, local_path: g.plainVmdk }],
      pipeline: { convert: { enabled: true, compress: true, compress_level: 9 }, validate: { enabled: true } },
      output: { directory: dir, filename: 'custom.qcow2' },
    });
    const r = await runPipeline(m);
    expect(r.success, r.errors.join()).to.equal(true);
    expect(r.artifacts[0].path).to.equal(path.join(dir, 'custom.qcow2'));
    expect(r.stages.validate.result.checks[0]).to.include({ compare: 'identical to source', integrity: 'ok' });
    expect(r.warnings.join()).to.match(/compress_level 9 is not honoured/);
    expect(['zstd', 'zlib']).to.include(r.stages.convert.result.compression);
  });

  it('fails on a checksum mismatch, removes the partial output, still writes report.json', async () => {
    const dir = path.join(tmp, 'badsum');
    const m = validateManifest({
      manifest_version: '1.0',
      disks: [{ id: 'a', source_format: 'vmdk', bytes: 134217728, local_path: g.plainVmdk, checksum: `sha256:${'0'.repeat(64)}` }],
      pipeline: { convert: { enabled: true }, validate: { enabled: true } },
      output: { directory: dir },
    });
    const r = await runPipeline(m);
    expect(r.success).to.equal(false);
    expect(r.stages.convert).to.include({ success: false });
    expect(r.stages.convert.error).to.match(/checksum mismatch/);
    expect(r.stages.validate.skipped_reason).to.equal('an earlier stage failed');
    expect((await fs.readdir(dir)).sort()).to.deep.equal(['report.json']);
    const onDisk = JSON.parse(await fs.readFile(path.join(dir, 'report.json'), 'utf8'));
    expect(onDisk.summary.stages_failed).to.deep.equal(['convert']);
  });

  it('fails inspect when source_format does not match the file', async () => {
    const m = validateManifest({ manifest_version: '1.0', disks: [{ id: 'a', source_format: 'qcow2', bytes: 1, local_path: g.plainVmdk }], output: { directory: path.join(tmp, 'fmt') } });
    const r = await runPipeline(m);
    expect(r.success).to.equal(false);
    expect(r.stages.inspect.error).to.equal(`disk a: source_format is qcow2 but ${g.plainVmdk} is vmdk`);
  });
});
