// The initramfs reader and verdict (domain/converter/initrd-image.ts, linux/initrd-check.ts) on images built here
// with the host's real cpio and compressors, as the distributions' generators build them: an uncompressed early
// (microcode) archive, then the main archive compressed (gzip, xz, zstd, lz4 legacy, bzip2). Each corruption the
// kernel's unpacker stops at is caught: a truncated archive, a bad magic mid-stream, a member that decompresses
// wrong; a kernel whose image lacks one virtio module is named. Then the appended archive (linux/initrd-append.ts) is
// made from this host's real kernel modules and depmod, read back, and each case it must refuse is refused.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { effectiveTree, InitrdParseError, newcArchive, readInitrd, S_IFREG, type Compression } from '../../domain/converter/initrd-image';
import { bootEntries, concatInitrds, initrdProblems, moduleClosure } from '../../domain/converter/linux/initrd-check';
import { planAppend, type AppendPlan } from '../../domain/converter/linux/initrd-append';

const COMPRESSORS: Record<Exclude<Compression, 'none'>, string[]> = {
  gzip: ['gzip', '-c', '-9'], xz: ['xz', '--check=crc32', '-c'], zstd: ['zstd', '-q', '-c', '-19'], 'lz4-legacy': ['lz4', '-l', '-c'], bzip2: ['bzip2', '-c'],
};
const VIRTIO = ['virtio_pci', 'virtio_blk', 'virtio_scsi', 'virtio_net'];

/** The host's kernel module tree that has the virtio modules (the test's stand-in for a guest's /lib/modules). */
function hostKernel(): string {
  const k = readdirSync('/lib/modules').sort().find((v) => existsSync(`/lib/modules/${v}/modules.dep`) && /virtio_blk\.ko/.test(readFileSync(`/lib/modules/${v}/modules.dep`, 'utf8')));
  if (!k) throw new Error('this host has no /lib/modules tree with virtio_blk: the test needs one (Debian package linux-image-amd64)');
  return k;
}

describe('initramfs images: every archive read, corruption caught, virtio verified per kernel', function () {
  this.timeout(120_000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-initrd-test-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  /** A cpio (newc) archive of `files` made by the host's cpio, parents listed first. */
  function cpio(name: string, files: Record<string, string | Buffer>): Buffer {
    const root = path.join(dir, `${name}-tree`);
    for (const [f, data] of Object.entries(files)) { mkdirSync(path.dirname(path.join(root, f)), { recursive: true }); writeFileSync(path.join(root, f), data); }
    const list = execFileSync('find', ['.', '-mindepth', '1'], { cwd: root, encoding: 'utf8' }).split('\n').filter(Boolean).sort().join('\n');
    return execFileSync('cpio', ['-o', '-H', 'newc', '--quiet'], { cwd: root, input: `${list}\n`, maxBuffer: 1 << 28 });
  }
  const compress = (c: Compression, b: Buffer) => (c === 'none' ? b : execFileSync(COMPRESSORS[c][0], COMPRESSORS[c].slice(1), { input: b, maxBuffer: 1 << 28 }));
  /** The main archive of a kernel: a module for each name in `modules`, and a modules.dep listing them. */
  const mainFiles = (kver: string, modules: string[]) => ({
    ...Object.fromEntries(modules.map((m) => [`usr/lib/modules/${kver}/kernel/drivers/virtio/${m}.ko`, `ELF of ${m}`])),
    [`usr/lib/modules/${kver}/modules.dep`]: modules.map((m) => `kernel/drivers/virtio/${m}.ko:`).join('\n') + '\n',
    'usr/lib/udev/rules.d/80-drivers.rules': 'ENV{MODALIAS}=="?*", RUN{builtin}+="kmod load \'$env{MODALIAS}\'"\n',
    init: '#!/bin/sh\n',
  });
  const early = () => cpio('early', { 'kernel/x86/microcode/GenuineIntel.bin': Buffer.alloc(1000, 7) });
  /** early + main(compressed), as initramfs-tools and dracut write them. */
  const image = (c: Compression, kver = '6.1.0-1-amd64', modules = VIRTIO) => Buffer.concat([early(), compress(c, cpio(`main-${c}-${kver}`, mainFiles(kver, modules)))]);
  const parseError = async (b: Buffer): Promise<InitrdParseError> => {
    try { await readInitrd(b); } catch (e) { if (e instanceof InitrdParseError) return e; throw e; }
    return expect.fail('the corrupt image was read as good');
  };

  for (const c of ['none', ...Object.keys(COMPRESSORS)] as Compression[]) {
    it(`${c}: every archive is read, the early one first, and the image holds every virtio module for its kernel`, async () => {
      const archives = await readInitrd(image(c));
      expect(archives.map((a) => a.compression)).to.deep.equal(['none', c]);
      expect(archives[0].entries.map((e) => e.name)).to.include('kernel/x86/microcode/GenuineIntel.bin');
      const tree = effectiveTree(archives);
      expect(tree.get('usr/lib/modules/6.1.0-1-amd64/kernel/drivers/virtio/virtio_net.ko')?.data.toString()).to.equal('ELF of virtio_net');
      expect(initrdProblems(tree, '6.1.0-1-amd64', VIRTIO.map((m) => `kernel/drivers/virtio/${m}.ko`))).to.deep.equal([]);
    });
  }

  for (const c of ['none', 'gzip', 'xz', 'zstd', 'bzip2', 'lz4-legacy'] as Compression[]) {
    it(`${c}: a truncated image is refused, saying where`, async () => {
      const b = image(c);
      const e = await parseError(b.subarray(0, b.length - Math.max(40, Math.floor((b.length - early().length) / 2))));
      expect(e.reason).to.match(/truncated|cannot decompress|does not decompress|not a cpio archive|no stream footer|no end-of-stream/);
    });
  }

  for (const c of ['gzip', 'xz', 'zstd', 'bzip2'] as Compression[]) {
    it(`${c}: a member that decompresses wrong (one byte changed inside it) is refused`, async () => {
      const b = Buffer.from(image(c));
      const at = early().length + Math.floor((b.length - early().length) / 2);
      b[at] ^= 0x55;
      const e = await parseError(b);
      expect(e.offset, 'the corrupt member is named by its offset').to.equal(early().length);
    });
  }

  it('a bad magic mid-stream is refused: garbage between archives, and a header inside the early archive', async () => {
    const e1 = await parseError(Buffer.concat([early(), Buffer.from('JUNK'), compress('zstd', cpio('m', mainFiles('k', VIRTIO)))]));
    expect(e1.reason).to.match(/^invalid magic 4a554e4b/);
    expect(e1.offset).to.equal(early().length);
    const b = Buffer.from(early());
    const second = b.indexOf('070701', 6, 'latin1');
    b.write('07X701', second, 'latin1');
    expect((await parseError(b)).reason).to.match(/bad cpio magic "07X701"/);
    // The kernel looks for an uncompressed archive only on a 4-byte boundary: one right after a compressed archive
    // that ends elsewhere is no archive to it.
    const gz = compress('gzip', cpio('g', { a: 'x' }));
    const odd = gz.length % 4 ? gz : Buffer.concat([gz, Buffer.from([1])]);
    expect((await parseError(Buffer.concat([odd, early()]))).reason).to.match(/invalid magic/);
  });

  it('a kernel whose image lacks one virtio module is named, the other kernel passes; a module missing from modules.dep too', async () => {
    const a = effectiveTree(await readInitrd(image('zstd', '6.1.0-1-amd64')));
    const b = effectiveTree(await readInitrd(image('zstd', '6.1.0-2-amd64', VIRTIO.filter((m) => m !== 'virtio_net'))));
    const want = VIRTIO.map((m) => `kernel/drivers/virtio/${m}.ko`);
    expect(initrdProblems(a, '6.1.0-1-amd64', want)).to.deep.equal([]);
    expect(initrdProblems(b, '6.1.0-2-amd64', want)).to.deep.equal(['lacks virtio_net for kernel 6.1.0-2-amd64']);
    expect(initrdProblems(a, '6.1.0-2-amd64', want)).to.deep.equal(['holds no modules.dep for kernel 6.1.0-2-amd64: no module can be loaded']);
    const files = mainFiles('k', VIRTIO);
    files['usr/lib/modules/k/modules.dep'] = 'kernel/drivers/virtio/virtio_pci.ko:\n';
    const c = effectiveTree(await readInitrd(compress('gzip', cpio('nodep', files))));
    expect(initrdProblems(c, 'k', want.slice(0, 2))).to.deep.equal(['holds virtio_blk but its modules.dep does not list it (modprobe cannot load it)']);
  });

  it('an appended archive replaces an earlier file; GRUB\'s concatenation of two initrd files reads as one image', async () => {
    const base = image('xz');
    const extra = newcArchive([{ name: 'init', mode: S_IFREG | 0o755, data: Buffer.from('#!/bin/sh\necho new\n') }]);
    const joined = concatInitrds([early(), base.subarray(early().length), Buffer.from(extra)]);
    const archives = await readInitrd(joined);
    expect(archives.map((x) => x.compression)).to.deep.equal(['none', 'xz', 'none']);
    expect(effectiveTree(archives).get('init')!.data.toString()).to.equal('#!/bin/sh\necho new\n');
  });

  it('the kernels the boot loader offers: GRUB menu entries with microcode first, and BLS entries', () => {
    const grub = [
      "menuentry 'Debian' {", '\tlinux\t/boot/vmlinuz-6.1.0-50-amd64 root=UUID=x ro', '\tinitrd\t/boot/intel-ucode.img /boot/initrd.img-6.1.0-50-amd64', '}',
      "submenu 'Advanced' {", "\tmenuentry 'old' {", '\t\tlinux /@/boot/vmlinuz-6.1.0-40-amd64 root=UUID=x', '\t\tinitrd /@/boot/initrd.img-6.1.0-40-amd64', '\t}',
      "\tmenuentry 'recovery' {", '\t\tlinux /boot/vmlinuz-6.1.0-50-amd64 single', '\t\tinitrd /boot/intel-ucode.img /boot/initrd.img-6.1.0-50-amd64', '\t}', '}',
    ].join('\n');
    const bls = 'title RHEL\nversion 5.14.0\nlinux /vmlinuz-5.14.0-1.el9.x86_64\ninitrd /initramfs-5.14.0-1.el9.x86_64.img $tuned_initrd\noptions root=/dev/mapper/rhel-root\n';
    expect(bootEntries([grub, bls])).to.deep.equal([
      { kver: '6.1.0-50-amd64', initrds: ['intel-ucode.img', 'initrd.img-6.1.0-50-amd64'] },
      { kver: '6.1.0-40-amd64', initrds: ['initrd.img-6.1.0-40-amd64'] },
      { kver: '5.14.0-1.el9.x86_64', initrds: ['initramfs-5.14.0-1.el9.x86_64.img', '$tuned_initrd'] },
    ]);
  });

  describe('the appended archive, from this host\'s kernel modules and depmod', () => {
    const kver = hostKernel();
    const mods = `/lib/modules/${kver}`;
    const etc = path.join(dir, 'guest-etc');
    /** The guest: this host's module tree, and /etc files of the test's own. */
    const guest = (paths: string[]) => Promise.resolve(new Map(paths.flatMap((p) => {
      const f = p.startsWith('/lib/modules/') ? p : path.join(etc, p);
      return existsSync(f) ? [[p, readFileSync(f)] as const] : [];
    })));
    /** A MODULES=dep image built on SATA: ahci and sd_mod with their dependencies, indexed by depmod. */
    function sataImage(c: Compression): Buffer {
      const dep = readFileSync(`${mods}/modules.dep`, 'utf8');
      const need = moduleClosure(dep, '', ['ahci', 'sd_mod']).files;
      const files: Record<string, Buffer | string> = Object.fromEntries(need.map((f) => [`usr/lib/modules/${kver}/${f}`, readFileSync(`${mods}/${f}`)]));
      files['usr/lib/udev/rules.d/80-drivers.rules'] = readFileSync('/lib/udev/rules.d/80-drivers.rules');
      files['conf/conf.d/resume'] = 'RESUME=/dev/sda2\n';
      files['etc/lvm/devices/system.devices'] = 'DEVNAME=/dev/sda2\n';
      const tree = path.join(dir, `sata-${c}`);
      for (const [f, d] of Object.entries(files)) { mkdirSync(path.dirname(path.join(tree, f)), { recursive: true }); writeFileSync(path.join(tree, f), d); }
      execFileSync('depmod', ['-b', path.join(tree, 'usr'), kver]);
      const dirFiles = execFileSync('find', ['.', '-mindepth', '1'], { cwd: tree, encoding: 'utf8' }).split('\n').filter(Boolean).sort().join('\n');
      return Buffer.concat([early(), compress(c, execFileSync('cpio', ['-o', '-H', 'newc', '--quiet'], { cwd: tree, input: `${dirFiles}\n`, maxBuffer: 1 << 28 }))]);
    }
    before(() => {
      mkdirSync(path.join(etc, 'etc/systemd/network'), { recursive: true });
      mkdirSync(path.join(etc, 'etc/initramfs-tools/conf.d'), { recursive: true });
      writeFileSync(path.join(etc, 'etc/systemd/network/10-ferry-enp1s0.link'), '[Match]\nMACAddress=52:54:00:12:34:56\n[Link]\nName=enp1s0\n');
      writeFileSync(path.join(etc, 'etc/initramfs-tools/conf.d/resume'), 'RESUME=UUID=1234\n');
    });

    it('zstd image: virtio and its dependencies added, the index regenerated (aliases for udev), the changed files placed', async () => {
      const before = sataImage('zstd');
      const plan = await planAppend(before, kver, 'update-initramfs', VIRTIO, ['/etc/systemd/network/10-ferry-enp1s0.link', '/etc/initramfs-tools/conf.d/resume'], guest) as AppendPlan;
      expect(plan, JSON.stringify((plan as unknown as { why?: string }).why)).to.have.property('image');
      expect(plan.image.subarray(0, before.length).equals(before), 'the old image is kept as it was').to.equal(true);
      const archives = await readInitrd(plan.image);
      expect(archives.map((a) => a.compression)).to.deep.equal(['none', 'zstd', 'gzip']);
      const tree = effectiveTree(archives);
      const need = moduleClosure(readFileSync(`${mods}/modules.dep`, 'utf8'), readFileSync(`${mods}/modules.builtin`, 'utf8'), VIRTIO);
      expect(initrdProblems(tree, kver, need.files)).to.deep.equal([]);
      expect(plan.added).to.include.members(['virtio_blk.ko', 'virtio_pci.ko', 'virtio_net.ko', 'virtio.ko', 'virtio_ring.ko']);
      expect(plan.present, 'already in the SATA image').to.include('scsi_mod.ko');
      // udev loads by alias: the regenerated modules.alias maps the virtio PCI device and the virtio block device.
      const alias = tree.get(`usr/lib/modules/${kver}/modules.alias`)!.data.toString();
      expect(alias).to.match(/^alias pci:v00001AF4d\*sv\*sd\*bc\*sc\*i\* virtio_pci$/m);
      expect(alias).to.match(/^alias virtio:d00000002v\* virtio_blk$/m);
      expect(alias, 'the image\'s own modules stay indexed').to.match(/ ahci$/m);
      expect(tree.get('usr/lib/systemd/network/10-ferry-enp1s0.link')!.data.toString()).to.contain('Name=enp1s0');
      expect(tree.get('conf/conf.d/resume')!.data.toString()).to.equal('RESUME=UUID=1234\n');
      expect(plan.placed).to.deep.equal([{ image: 'usr/lib/systemd/network/10-ferry-enp1s0.link', guest: '/etc/systemd/network/10-ferry-enp1s0.link' }, { image: 'conf/conf.d/resume', guest: '/etc/initramfs-tools/conf.d/resume' }]);
      // The kernel's unpacker creates no parent directory: each new one has its entry before the files.
      const names = archives[2].entries.map((e) => e.name);
      expect(names.indexOf(`usr/lib/modules/${kver}/kernel/drivers/virtio`)).to.be.within(0, names.findIndex((n) => n.endsWith('/virtio_pci.ko')));
    });

    it('refuses, saying why, where only a rebuild works', async () => {
      const why = async (img: Buffer, tool: string, baked: string[]) => ((await planAppend(img, kver, tool, VIRTIO, baked, guest)) as { why?: string }).why;
      expect(await why(sataImage('lz4-legacy'), 'update-initramfs', [])).to.match(/lz4 legacy archive has no end marker/);
      expect(await why(sataImage('gzip'), 'update-initramfs', ['/etc/lvm/devices/system.devices'])).to.match(/system\.devices must disappear from the image/);
      mkdirSync(path.join(etc, 'etc/dracut.conf.d'), { recursive: true });
      writeFileSync(path.join(etc, 'etc/dracut.conf.d/90-resume.conf'), 'add_device+=" UUID=1234 "\n');
      expect(await why(sataImage('gzip'), 'dracut', ['/etc/dracut.conf.d/90-resume.conf'])).to.match(/dracut's configuration\) changed/);
      expect(await why(sataImage('gzip'), 'mkinitcpio', [])).to.match(/generator is mkinitcpio/);
      const cut = sataImage('gzip');
      expect(await why(cut.subarray(0, cut.length - 100), 'update-initramfs', [])).to.match(/^the image does not parse/);
      const noUdev = Buffer.concat([early(), compress('gzip', cpio('noudev', { [`usr/lib/modules/${kver}/modules.dep`]: '' }))]);
      expect(await why(noUdev, 'update-initramfs', [])).to.match(/80-drivers\.rules/);
    });
  });
});
