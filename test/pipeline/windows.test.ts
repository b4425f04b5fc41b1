// Windows virtio driver injection (domain/converter/windows.ts).
// Pure parts (version mapping, paths, registry encoding) and host-only parts (driver tree, hive generator with
// hivexregedit) need no appliance. On the real phony Windows Server 2019 guest (test/fixtures/windows.ts), appliance
// launches: fixture build (cached across runs), one pipeline run through the CLI (ferry-convert --config), and one
// read-only read-back session, which also runs the dry-run and missing-tree cases (they write nothing).
// Not a reused proof (test/helpers/proofs.ts) yet: its appliance part (one ferry-convert pipeline and one read-only
// read-back, no emulated boot: the cheapest of the heavy files) feeds eight checks whose expected values name this
// run's temporary folder (the driver tree's and the missing tree's paths) and compare raw registry bytes, so its
// evidence would first have to be made independent of the folder and stored with its bytes; not done.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { existsSync, promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import yaml from 'js-yaml';
import { sha256File } from '../../domain/qemu';
import { validateConfig } from '../../domain/schemas/converter-config';
import { main } from '../../services/converter/cli';
import { fixGuest, inspectAndMount } from '../../domain/converter/guest';
import type { FixAction, FixResult } from '../../domain/converter/types';
import type { PipelineReport } from '../../domain/converter/stages/report';
import { GuestSession } from '../../domain/converter/guestfs';
import { BOOT_DRIVERS, injectVirtioDrivers, SCSI_CLASS_GUID, systemHiveEdits } from '../../domain/converter/windows';
import { extendDevicePath, HiveReader, REG, regFile, regValue, withParents } from '../../domain/converter/registry';
import {
  ARCH_DIRS, driverSet, driverVersions, findCi, locateVirtioWin, pickVersionDir, underSystemRoot, VIRTIO_WIN_DEFAULT, virtioWinCandidates, windowsVersionDir,
} from '../../domain/converter/virtio-win';
import { buildWindowsGuest, emptyHive, fakeVirtioWin, WIN } from '../fixtures/windows';

const LAYOUT = {
  viostor: ['2k16/amd64', '2k19/amd64', '2k19/x86', 'w10/amd64'], vioscsi: ['2k19/amd64'], NetKVM: ['2k19/amd64', '2k22/amd64'],
  Balloon: ['2k19/amd64'], vioserial: ['2k19/amd64'], qxldod: ['w10/amd64'],
};
const DRIVERS_2K19 = ['Balloon', 'NetKVM', 'vioscsi', 'vioserial', 'viostor'];

describe('Windows virtio drivers: version mapping, paths, registry encoding (no appliance)', () => {
  const server = (major: number, minor: number, productName: string, build?: number) => ({ major, minor, variant: 'Server', productName, build, arch: 'x86_64' });
  const client = (major: number, minor: number, productName: string, build?: number) => ({ major, minor, variant: 'Client', productName, build, arch: 'x86_64' });
  const dir = (r: ReturnType<typeof windowsVersionDir>) => ('dir' in r ? r.dir : r.error);

  it('an explicit windows_version wins over inspection; 2012 is told apart from 2012 R2 by the minor version', () => {
    const f = client(10, 0, 'Windows 10 Pro', 19045);
    expect(['2012', '2016', '2019', '2022', '10', '11'].map((v) => dir(windowsVersionDir(v, f)))).to.deep.equal(['2k12', '2k16', '2k19', '2k22', 'w10', 'w11']);
    expect(dir(windowsVersionDir(2019, f))).to.equal('2k19');
    expect(dir(windowsVersionDir('2012', server(6, 3, 'Windows Server 2012 R2 Standard')))).to.equal('2k12R2');
    expect(dir(windowsVersionDir('2012', server(6, 2, 'Windows Server 2012 Standard')))).to.equal('2k12');
    expect(dir(windowsVersionDir('2008', f))).to.match(/windows_version 2008 is not one of/);
    expect((windowsVersionDir('2019', f) as { reason: string }).reason).to.match(/windows_version 2019; inspection: Windows 10 Pro \(10\.0, build 19045, Client\)/);
  });

  it('derives the directory from inspection: version, Server/Client, product name, build number', () => {
    expect(dir(windowsVersionDir(undefined, server(6, 2, 'Windows Server 2012 Standard')))).to.equal('2k12');
    expect(dir(windowsVersionDir(undefined, server(6, 3, 'Windows Server 2012 R2 Datacenter')))).to.equal('2k12R2');
    expect(dir(windowsVersionDir(undefined, client(6, 3, 'Windows 8.1 Pro')))).to.equal('w8.1');
    expect(dir(windowsVersionDir(undefined, client(6, 1, 'Windows 7 Professional')))).to.equal('w7');
    expect(dir(windowsVersionDir(undefined, server(10, 0, 'Windows Server 2016 Datacenter')))).to.equal('2k16');
    expect(dir(windowsVersionDir(undefined, server(10, 0, 'Windows Server 2019 Standard')))).to.equal('2k19');
    expect(dir(windowsVersionDir(undefined, server(10, 0, 'Windows Server 2022 Datacenter Azure Edition')))).to.equal('2k22');
    expect(dir(windowsVersionDir(undefined, server(10, 0, 'Windows Server Datacenter', 20348)))).to.equal('2k22');
    expect(dir(windowsVersionDir(undefined, client(10, 0, 'Windows 10 Enterprise', 19045)))).to.equal('w10');
    expect(dir(windowsVersionDir(undefined, client(10, 0, 'Windows 11 Pro')))).to.equal('w11');
    // Windows 11 still says "Windows 10" in ProductName; the build number tells.
    expect(dir(windowsVersionDir(undefined, client(10, 0, 'Windows 10 Pro', 22631)))).to.equal('w11');
    // No InstallationType (older Windows): the product name says Server or not.
    expect(dir(windowsVersionDir(undefined, { major: 6, minor: 3, variant: 'unknown', productName: 'Windows Server 2012 R2 Standard' }))).to.equal('2k12R2');
    expect(dir(windowsVersionDir(undefined, server(10, 0, 'Windows Server Datacenter')))).to.match(/cannot tell .* set windows_version/);
    expect(dir(windowsVersionDir(undefined, client(5, 1, 'Microsoft Windows XP')))).to.match(/cannot tell/);
  });

  it('falls back to the nearest older version directory of the same line, case-insensitively', () => {
    expect(pickVersionDir(['2k16', '2k19', 'w10'], '2k19')).to.deep.equal({ dir: '2k19', fallback: false });
    expect(pickVersionDir(['2K19'], '2k19')).to.deep.equal({ dir: '2K19', fallback: false });
    expect(pickVersionDir(['2k16', '2k19', 'w10'], '2k22')).to.deep.equal({ dir: '2k19', fallback: true });
    expect(pickVersionDir(['2k12R2', 'w10'], '2k16')).to.deep.equal({ dir: '2k12R2', fallback: true });
    expect(pickVersionDir(['2k16', 'w10'], 'w11')).to.deep.equal({ dir: 'w10', fallback: true });
    expect(pickVersionDir(['2k19', 'w11'], 'w10')).to.equal(undefined); // newer ones and the server line do not count
    expect(pickVersionDir(['2k19'], '2k12')).to.equal(undefined);
    expect([ARCH_DIRS.x86_64, ARCH_DIRS.i386, ARCH_DIRS.aarch64]).to.deep.equal(['amd64', 'x86', 'ARM64']);
  });

  it('builds guest paths below the systemroot from Windows paths', () => {
    expect(underSystemRoot('/Windows', 'System32\\drivers')).to.equal('/Windows/System32/drivers');
    expect(underSystemRoot('/WINNT', '\\Drivers\\VirtIO\\')).to.equal('/WINNT/Drivers/VirtIO');
    expect(underSystemRoot('/Windows', 'System32/drivers/viostor.sys')).to.equal('/Windows/System32/drivers/viostor.sys');
  });

  it('encodes registry values as Windows stores them (UTF-16LE with NUL, little-endian dwords)', () => {
    expect(regValue.sz('A', 'ab')).to.deep.include({ type: REG.SZ, data: Buffer.from([0x61, 0, 0x62, 0, 0, 0]) });
    expect(regValue.expandSz('P', '%x%').type).to.equal(2);
    expect(regValue.expandSz('P', '%x%').data.toString('utf16le')).to.equal('%x%\0');
    expect(regValue.dword('S', 1).data).to.deep.equal(Buffer.from([1, 0, 0, 0]));
    expect(regValue.dword('S', 0x12345678).data).to.deep.equal(Buffer.from([0x78, 0x56, 0x34, 0x12]));
    expect(regValue.multiSz('M', ['a', 'b']).data).to.deep.equal(Buffer.from('a\0b\0\0', 'utf16le'));
    expect(regFile('HKLM\\SYSTEM', [{ path: ['A', 'B'], values: [regValue.dword('x "q"\\', 1), regValue.sz('', 'v')] }])).to.equal([
      'Windows Registry Editor Version 5.00', '',
      '[HKLM\\SYSTEM\\A]', '',
      '[HKLM\\SYSTEM\\A\\B]', '"x \\"q\\"\\\\"=hex(4):01,00,00,00', '@=hex(1):76,00,00,00', '',
    ].join('\n'));
    expect(withParents([{ path: ['a', 'b'] }, { path: ['A', 'c'] }]).map((k) => k.path.join('\\'))).to.deep.equal(['a', 'a\\b', 'A\\c']);
  });

  it('extends DevicePath once, keeping what is there', () => {
    expect(extendDevicePath('%SystemRoot%\\inf', ['%SystemRoot%\\Drivers\\VirtIO'])).to.deep.equal({ value: '%SystemRoot%\\inf;%SystemRoot%\\Drivers\\VirtIO', added: ['%SystemRoot%\\Drivers\\VirtIO'] });
    expect(extendDevicePath('%systemroot%\\inf;%SYSTEMROOT%\\drivers\\virtio', ['%SystemRoot%\\Drivers\\VirtIO']).added).to.deep.equal([]);
    expect(extendDevicePath(undefined, ['a', 'a'])).to.deep.equal({ value: 'a', added: ['a'] });
  });

  it('SYSTEM hive edits: Services + CriticalDeviceDatabase always, DriverDatabase only when the hive has one', () => {
    const cdb = systemHiveEdits('ControlSet002', ['viostor'], false);
    expect(cdb.map((k) => k.path.join('\\'))).to.deep.equal([
      'ControlSet002\\Services\\viostor',
      'ControlSet002\\Control\\CriticalDeviceDatabase\\pci#ven_1af4&dev_1001&subsys_00021af4&rev_00',
      'ControlSet002\\Control\\CriticalDeviceDatabase\\pci#ven_1af4&dev_1042&subsys_11001af4&rev_01',
    ]);
    expect(cdb[0].values!.map((v) => [v.name, v.type])).to.deep.equal([['Type', 4], ['Start', 4], ['ErrorControl', 4], ['Group', 1], ['ImagePath', 2]]);
    const ddb = systemHiveEdits('ControlSet001', ['viostor', 'vioscsi'], true).map((k) => k.path.join('\\'));
    expect(ddb).to.include('DriverDatabase\\DeviceIds\\PCI\\VEN_1AF4&DEV_1048&SUBSYS_11001AF4&REV_01');
    expect(ddb).to.include('DriverDatabase\\DriverPackages\\ferry-vioscsi.inf_tmp\\Configurations\\ferry_vioscsi_conf');
  });
});

describe('Windows virtio drivers: driver tree and hives on the host (no appliance)', () => {
  let tmp: string;
  before(async () => { tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'ferry-virtio-host-')); });
  after(async () => { if (tmp) await fs.rm(tmp, { recursive: true, force: true }); });

  it('lists, in order, the virtio_win key, FERRY_VIRTIO_WIN and the default, without duplicates', () => {
    expect(virtioWinCandidates('/a', { FERRY_VIRTIO_WIN: '/b' })).to.deep.equal([{ path: '/a', from: 'virtio_win' }, { path: '/b', from: 'FERRY_VIRTIO_WIN' }, { path: VIRTIO_WIN_DEFAULT, from: 'default' }]);
    expect(virtioWinCandidates(undefined, { FERRY_VIRTIO_WIN: VIRTIO_WIN_DEFAULT }).map((c) => c.from)).to.deep.equal(['FERRY_VIRTIO_WIN']);
  });

  it('locates the first directory and says why each earlier candidate was not used', async () => {
    const tree = path.join(tmp, 'vw');
    fakeVirtioWin(tree, { viostor: ['2k19/amd64'] });
    await fs.writeFile(path.join(tmp, 'virtio-win.iso'), 'not really an ISO');
    const r = await locateVirtioWin([{ path: path.join(tmp, 'virtio-win.iso'), from: 'virtio_win' }, { path: path.join(tmp, 'nope'), from: 'FERRY_VIRTIO_WIN' }, { path: tree, from: 'default' }]);
    expect(r.root).to.equal(tree);
    expect(r.from).to.equal('default');
    expect(r.looked[0]).to.match(new RegExp(`^${path.join(tmp, 'virtio-win.iso').replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} \\(virtio_win: an ISO image bsdtar could not unpack: .+\\)$`));
    expect(r.looked[1]).to.equal(`${path.join(tmp, 'nope')} (FERRY_VIRTIO_WIN: does not exist)`);
  });

  it('unpacks a virtio-win ISO image into a private directory for the injection, and removes it afterwards', async () => {
    const tree = path.join(tmp, 'iso-tree');
    fakeVirtioWin(tree, { viostor: ['2k19/amd64', 'w10/amd64'], NetKVM: ['2k19/amd64'] });
    const iso = path.join(tmp, 'virtio-win-0.1.240.iso');
    execFileSync('bsdtar', ['-cf', iso, '--format', 'iso9660', '-C', tree, '.']);
    const r = await locateVirtioWin([{ path: iso, from: 'virtio_win' }]);
    expect(r.root).to.match(/ferry-virtio-win-/);
    expect(r.from).to.equal(`virtio_win, unpacked from ${iso}`);
    expect((await driverVersions(r.root!, 'viostor', 'amd64')).sort()).to.deep.equal(['2k19', 'w10']);
    expect((await driverSet(r.root!, '2k19', 'amd64')).map((d) => d.driver).sort()).to.deep.equal(['NetKVM', 'viostor']);
    await r.cleanup!();
    expect(await fs.stat(r.root!).then(() => true, () => false)).to.equal(false);
  });

  it('finds every driver of a version/arch, case-insensitively, with its files', async () => {
    const tree = path.join(tmp, 'tree');
    const files = fakeVirtioWin(tree, { ...LAYOUT, vioserial: ['2K19/AMD64'] });
    expect((await driverVersions(tree, 'VIOSTOR', 'amd64')).sort()).to.deep.equal(['2k16', '2k19', 'w10']);
    expect(await driverVersions(tree, 'viostor', 'ARM64')).to.deep.equal([]);
    expect(await findCi(tree, 'netkvm', 'dir')).to.equal('NetKVM');
    expect(await findCi(tree, 'netkvm', 'file')).to.equal(undefined);
    const set = await driverSet(tree, '2k19', 'amd64');
    expect(set.map((d) => d.driver)).to.deep.equal(DRIVERS_2K19);
    expect(set.find((d) => d.driver === 'vioserial')!.dir).to.equal(path.join(tree, 'vioserial', '2K19', 'AMD64'));
    expect(set.find((d) => d.driver === 'NetKVM')!.files).to.deep.equal(['netkvm.cat', 'netkvm.inf', 'netkvm.sys', 'netkvmco.exe']);
    expect(files['viostor/2k19/amd64/viostor.sys'.split('/').join(path.sep)]).to.equal('dummy viostor/2k19/amd64/viostor.sys\n');
  });

  it('the generated empty hive is a valid regf file that hivexregedit merges into and exports', async () => {
    const hive = path.join(tmp, 'SYSTEM');
    await fs.writeFile(hive, emptyHive());
    expect(execFileSync('hivexregedit', ['--export', hive, '\\'], { encoding: 'utf8' })).to.match(/^\[\\\]$/m);
    await fs.writeFile(`${hive}.reg`, regFile('HKLM\\SYSTEM', systemHiveEdits('ControlSet001', ['viostor'], false)));
    execFileSync('hivexregedit', ['--merge', '--prefix', 'HKLM\\SYSTEM', hive, `${hive}.reg`]);
    const out = execFileSync('hivexregedit', ['--export', '--prefix', 'HKLM\\SYSTEM', hive, '\\ControlSet001\\Services\\viostor'], { encoding: 'utf8' });
    expect(out).to.contain('"Start"=dword:00000000');
    expect(out).to.contain('"Type"=dword:00000001');
    expect(out).to.contain(`"Group"=hex(1):${[...Buffer.from('SCSI miniport\0', 'utf16le')].map((b) => b.toString(16).padStart(2, '0')).join(',')}`);
    expect(out).to.contain(`"ImagePath"=hex(2):${[...Buffer.from('system32\\drivers\\viostor.sys\0', 'utf16le')].map((b) => b.toString(16).padStart(2, '0')).join(',')}`);
  });
});

describe('Windows virtio drivers on a real phony Windows guest (libguestfs) @vm', function () {
  this.timeout(900_000);
  let tmp: string;
  let vmdk: string;
  let srcSha: string;
  let tree: string;
  let treeFiles: Record<string, string>;
  let code: number;
  let stderrText: string;
  let report: PipelineReport;
  let output: string;
  // Collected in one read-only session on the output.
  const back: {
    files: Record<string, string | null>; storeListing: string[]; system: Record<string, { type: number; data: Buffer } | null>;
    devicePath?: { type: number; text: string }; backupSystemHasViostor?: boolean; backupDevicePath?: string; servicesDiskStart?: Buffer;
    dry?: FixResult; missing?: FixAction[]; csp?: string; failedCmd?: string; afterFailure?: string; outShaBefore?: string;
  } = { files: {}, storeListing: [], system: {} };

  // main() takes process.stdout/stderr; a non-TTY Writable stands in for both.
  // (Typed as the stream it stands in for: main() uses only write() and isTTY.)
  const sink = <S extends NodeJS.WriteStream>(collect: string[]) => Object.assign(new Writable({ write(c, _e, cb) { collect.push(String(c)); cb(); } }), { isTTY: false }) as S;

  before(async function () {
    vmdk = buildWindowsGuest().vmdk;
    tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'ferry-windows-'));
    srcSha = await sha256File(vmdk);
    tree = path.join(tmp, 'virtio-win');
    treeFiles = fakeVirtioWin(tree, LAYOUT);
    // The CLI's path: a config file with the seed keys plus virtio_win, mapped onto the fix stage by cli.ts.
    const cfg = path.join(tmp, 'convert.yaml');
    await fs.writeFile(cfg, yaml.dump({ command: 'local', vmdk, output_dir: 'out', to_output: 'win2019.qcow2', inject_virtio_drivers: true, windows_version: '2019', virtio_win: 'virtio-win' }));
    expect(validateConfig(yaml.load(await fs.readFile(cfg, 'utf8')))).to.include({ virtio_win: 'virtio-win', inject_virtio_drivers: true });
    const out: string[] = [];
    const err: string[] = [];
    code = await main(['--config', cfg], sink<typeof process.stdout>(out), sink<typeof process.stderr>(err));
    stderrText = err.join('');
    output = path.join(tmp, 'out', 'win2019.qcow2');
    report = JSON.parse(await fs.readFile(path.join(tmp, 'out', 'report.json'), 'utf8')) as PipelineReport;
    if (code !== 0) return;

    back.outShaBefore = await sha256File(output);
    const s = await GuestSession.open([{ path: output, format: 'qcow2' }], { readonly: true });
    try {
      const info = await inspectAndMount(s, true);
      const want = [
        '/Windows/System32/Drivers/viostor.sys', '/Windows/System32/Drivers/vioscsi.sys', '/Windows/System32/Drivers/disk.sys', '/Windows/System32/Drivers/netkvm.sys',
        '/ferry-backup/Windows/System32/config/SYSTEM', '/ferry-backup/Windows/System32/config/SOFTWARE',
        ...Object.keys(treeFiles).map((rel) => { const [drv, , , f] = rel.split(path.sep); return `/Windows/Drivers/VirtIO/${drv}/${f}`; }),
      ];
      for (const f of want) back.files[f] = (await s.isFile(f)) ? await s.read(f) : null;
      back.storeListing = s.lines(await s.cmd('ls', '/Windows/Drivers/VirtIO'));
      // Registry read back with guestfish's hivex-* commands.
      const h = new HiveReader(s);
      const raw = async (node: string, key: string) => { const v = await h.value(node, key); return v ? { type: v.type, data: await s.cmdBytes('hivex-value-value', v.handle) } : null; };
      let root = await h.open('/Windows/System32/config/SYSTEM');
      for (const drv of Object.keys(BOOT_DRIVERS)) {
        const n = await h.node(root, [WIN.controlSet, 'Services', drv]);
        for (const k of ['Type', 'Start', 'ErrorControl', 'Group', 'ImagePath']) back.system[`Services\\${drv}\\${k}`] = n ? await raw(n, k) : null;
        for (const id of BOOT_DRIVERS[drv]) {
          const c = await h.node(root, [WIN.controlSet, 'Control', 'CriticalDeviceDatabase', `pci#${id.toLowerCase()}`]);
          for (const k of ['Service', 'ClassGUID']) back.system[`CDD\\${id}\\${k}`] = c ? await raw(c, k) : null;
          const d = await h.node(root, ['DriverDatabase', 'DeviceIds', 'PCI', id]);
          back.system[`DDB\\${id}`] = d ? await raw(d, `ferry-${drv}.inf`) : null;
        }
      }
      back.servicesDiskStart = (await raw((await h.node(root, [WIN.controlSet, 'Services', 'disk']))!, 'Start'))?.data;
      await h.close();
      root = await h.open('/ferry-backup/Windows/System32/config/SYSTEM');
      back.backupSystemHasViostor = !!(await h.node(root, [WIN.controlSet, 'Services', 'viostor']));
      await h.close();
      root = await h.open('/Windows/System32/config/SOFTWARE');
      const wcv = (await h.node(root, ['Microsoft', 'Windows', 'CurrentVersion']))!;
      back.devicePath = { type: (await h.value(wcv, 'DevicePath'))!.type, text: (await h.string(wcv, 'DevicePath'))! };
      await h.close();
      root = await h.open('/ferry-backup/Windows/System32/config/SOFTWARE');
      back.backupDevicePath = await h.string((await h.node(root, ['Microsoft', 'Windows', 'CurrentVersion']))!, 'DevicePath');
      await h.close();

      // A failed command is an answer, not the end of the session.
      back.csp = await s.cmd('case-sensitive-path', '/windows/system32/drivers/VIOSTOR.SYS');
      back.failedCmd = await s.cmd('hivex-open', '/Windows/System32/config/NOPE').then(() => 'no error', (e: Error) => e.message);
      back.afterFailure = await s.cmd('is-dir', '/Windows');

      // dry_run through fixGuest on this read-only session: any write would fail here. windows_version 2022 is
      // not in the tree for viostor, so the nearest older (2k19) is chosen with a warning.
      back.dry = await fixGuest(s, info, {
        enabled: true, backup: true, print_fstab: false, update_grub: true, regen_initramfs: true, fstab_mode: 'stabilize-all', remove_source_hv_tools: false,
        inject_virtio_drivers: true, windows_version: '2022', virtio_win: tree, dry_run: true,
      }, () => undefined); // the repair's log lines are not what this test checks
      // Missing tree: a warning naming every place looked at (the default must not exist on this host).
      if (!existsSync(VIRTIO_WIN_DEFAULT)) {
        back.missing = [];
        await injectVirtioDrivers(s, info.root_device, { dry_run: false, backup: true, windows_version: '2019', virtio_win: path.join(tmp, 'no-such-tree'), env: { FERRY_VIRTIO_WIN: path.join(tmp, 'virtio-win.iso') } }, (a) => back.missing!.push(a));
      }
    } finally { await s.close(); }
  });
  after(async () => { if (tmp) await fs.rm(tmp, { recursive: true, force: true }); });

  it('the CLI run succeeds with the fix stage on the Windows guest', () => {
    expect(code, stderrText).to.equal(0);
    expect(report.success).to.equal(true);
    expect(report.stages.fix.result!.guest).to.include({ os: 'windows', version: '10.0', root_device: '/dev/sda1' });
    expect(report.stages.inspect.result!.guest).to.include({ os: 'windows', product_name: WIN.productName, hostname: WIN.hostname });
    expect(report.artifacts[0]).to.include({ modified_by_fix: true, path: output });
    expect(report.warnings.filter((w: string) => /inject_virtio_drivers/.test(w))).to.deep.equal([]);
  });

  it('reports each step: version dir, files copied, keys written, DevicePath', () => {
    const acts = (report.stages.fix.result!.actions as FixAction[]).filter((a) => a.action === 'inject_virtio_drivers');
    expect(acts.every((a) => a.status === 'done'), JSON.stringify(acts, null, 1)).to.equal(true);
    const version = acts.find((a) => a.step === 'version')!;
    expect(version).to.include({ version_dir: '2k19', arch: 'amd64', source: tree });
    expect(version.detail).to.match(/^2k19\/amd64 from .*virtio-win \(virtio_win\); windows_version 2019; inspection: Windows Server 2019 Standard \(10\.0, build 17763, Server\)/);
    expect(acts.filter((a) => a.step === 'boot_drivers').map((a) => a.file).sort()).to.deep.equal(['/Windows/System32/Drivers/vioscsi.sys', '/Windows/System32/Drivers/viostor.sys']);
    expect(acts.filter((a) => a.step === 'driver_store').map((a) => a.driver)).to.deep.equal(DRIVERS_2K19);
    const sys = acts.find((a) => a.step === 'system_hive')!;
    expect(sys).to.include({ hive: '/Windows/System32/config/SYSTEM', backup: '/ferry-backup/Windows/System32/config/SYSTEM', driver_database: true });
    expect(sys.detail).to.contain('HKLM\\SYSTEM\\ControlSet001\\Services\\viostor {Type=dword:1, Start=dword:0, ErrorControl=dword:1, Group=sz:"SCSI miniport", ImagePath=expand_sz:"system32\\drivers\\viostor.sys"}');
    const sw = acts.find((a) => a.step === 'software_hive')!;
    expect(sw).to.include({ backup: '/ferry-backup/Windows/System32/config/SOFTWARE' });
    expect(sw.detail).to.contain(`DevicePath "${WIN.devicePath}" -> "${WIN.devicePath};%SystemRoot%\\Drivers\\VirtIO;`);
  });

  it('copies the boot drivers into System32\\drivers (resolved case-insensitively) and the whole 2k19/amd64 set into Drivers\\VirtIO', () => {
    expect(back.files['/Windows/System32/Drivers/viostor.sys']).to.equal(treeFiles[path.join('viostor', '2k19', 'amd64', 'viostor.sys')]);
    expect(back.files['/Windows/System32/Drivers/vioscsi.sys']).to.equal(treeFiles[path.join('vioscsi', '2k19', 'amd64', 'vioscsi.sys')]);
    expect(back.files['/Windows/System32/Drivers/disk.sys']).to.equal('phony disk driver');
    expect(back.files['/Windows/System32/Drivers/netkvm.sys']).to.equal(null);
    expect(back.storeListing).to.deep.equal(DRIVERS_2K19);
    for (const [rel, content] of Object.entries(treeFiles)) {
      const [drv, ver, arch, f] = rel.split(path.sep);
      const inGuest = back.files[`/Windows/Drivers/VirtIO/${drv}/${f}`];
      if (ver === '2k19' && arch === 'amd64') expect(inGuest, rel).to.equal(content);
      else if (!DRIVERS_2K19.includes(drv)) expect(inGuest, rel).to.equal(null);
    }
  });

  it('writes the SYSTEM hive keys with the right types and data (read back with hivex-*)', () => {
    const dword = (n: number) => ({ type: 4, data: Buffer.from([n, 0, 0, 0]) });
    const sz = (t: number, s: string) => ({ type: t, data: Buffer.from(`${s}\0`, 'utf16le') });
    for (const drv of Object.keys(BOOT_DRIVERS)) {
      expect(back.system[`Services\\${drv}\\Type`], drv).to.deep.equal(dword(1));
      expect(back.system[`Services\\${drv}\\Start`], drv).to.deep.equal(dword(0));
      expect(back.system[`Services\\${drv}\\ErrorControl`], drv).to.deep.equal(dword(1));
      expect(back.system[`Services\\${drv}\\Group`], drv).to.deep.equal(sz(1, 'SCSI miniport'));
      expect(back.system[`Services\\${drv}\\ImagePath`], drv).to.deep.equal(sz(2, `system32\\drivers\\${drv}.sys`));
      for (const id of BOOT_DRIVERS[drv]) {
        expect(back.system[`CDD\\${id}\\Service`], id).to.deep.equal(sz(1, drv));
        expect(back.system[`CDD\\${id}\\ClassGUID`], id).to.deep.equal(sz(1, SCSI_CLASS_GUID));
        expect(back.system[`DDB\\${id}`], id).to.deep.equal({ type: 3, data: Buffer.from([0x01, 0xff, 0x00, 0x00]) });
      }
    }
    expect(back.servicesDiskStart).to.deep.equal(Buffer.from([0, 0, 0, 0])); // other services untouched
  });

  it('extends DevicePath in the SOFTWARE hive (REG_EXPAND_SZ) and keeps backups of both hives as they were', () => {
    expect(back.devicePath!.type).to.equal(2);
    expect(back.devicePath!.text).to.equal([WIN.devicePath, '%SystemRoot%\\Drivers\\VirtIO', ...DRIVERS_2K19.map((d) => `%SystemRoot%\\Drivers\\VirtIO\\${d}`)].join(';'));
    expect(back.backupDevicePath).to.equal(WIN.devicePath);
    expect(back.backupSystemHasViostor).to.equal(false);
  });

  it('leaves the source vmdk untouched, and a failed guestfish command does not end the session', async () => {
    expect(await sha256File(vmdk)).to.equal(srcSha);
    expect(back.csp!.trim()).to.equal('/Windows/System32/Drivers/viostor.sys');
    expect(back.failedCmd).to.match(/^guestfish hivex-open: .*NOPE/);
    expect(back.afterFailure!.trim()).to.equal('true');
  });

  it('dry_run: reports would_do for every step (with the version fallback warning) and writes nothing', async () => {
    const acts = back.dry!.actions.filter((a) => a.action === 'inject_virtio_drivers');
    expect(back.dry!.modified).to.equal(false);
    const fallback = acts.find((a) => a.step === 'version')!;
    expect(fallback).to.include({ status: 'warning', wanted: '2k22', version_dir: '2k19' });
    expect(fallback.detail).to.match(/^2k22\/amd64 is not in .*; using the nearest older 2k19\/amd64 \(windows_version 2022;/);
    expect(acts.filter((a) => a.step !== 'version').map((a) => `${String(a.step)}:${String(a.status)}`)).to.deep.equal([
      'boot_drivers:would_do', 'boot_drivers:would_do', ...DRIVERS_2K19.map(() => 'driver_store:would_do'), 'system_hive:would_do', 'software_hive:skipped',
    ]);
    expect(acts.find((a) => a.step === 'system_hive')!.backup).to.equal(undefined);
    expect(acts.find((a) => a.step === 'software_hive')!.detail).to.match(/^DevicePath already lists/);
    expect(await sha256File(output)).to.equal(back.outShaBefore);
  });

  it('a missing driver tree is a warning naming every path looked at, and nothing else happens', function () {
    if (!back.missing) this.skip();
    expect(back.missing).to.have.length(1);
    expect(back.missing[0]).to.include({ action: 'inject_virtio_drivers', step: 'source', status: 'warning' });
    expect(back.missing[0].detail).to.equal(`no virtio-win driver tree found (looked in ${path.join(tmp, 'no-such-tree')} (virtio_win: does not exist); `
      + `${path.join(tmp, 'virtio-win.iso')} (FERRY_VIRTIO_WIN: does not exist); ${VIRTIO_WIN_DEFAULT} (default: does not exist)); Windows 2019 drivers not injected`);
  });
});
