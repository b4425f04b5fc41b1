// The pure parts of the boot-chain repair and of the boot judge, on real texts (a Debian 12 console stuck in
// the initramfs, a /etc/default/grub of a hardened VMware template), and the judge inside a real qemu boot: a
// disk whose boot code prints a kernel panic is `failed` at once, not after the timeout.
import { expect } from 'chai';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { judgeAdded, judgeConsole } from '../../domain/converter/boot-judge';
import type { BootVerdict } from '../../domain/converter/boot-judge';
import { againAfterTimerPanic, TestBootResult } from '../../domain/converter/testboot';
import { crypttabLeftovers, grubDefaultsLeftovers, kernelArgLeftovers, resumeLeftovers, rewriteCrypttab, rewriteGrubDefaults, rewriteResume } from '../../domain/converter/bootchain';
import type { FstabContext } from '../../domain/converter/fstab';
import { configuredInterfaces, kvmNicName, namesInterface, persistentNetNames, planNicFileEdits, planNicRenames, renameInterfaces } from '../../domain/converter/nic-names';
import { testBoot } from '../../domain/converter/testboot';
import { makeBootableImage } from '../helpers/images';

const ctx: FstabContext = {
  disks: ['/dev/sda'],
  ids: { '/dev/sda1': { uuid: 'u-root' }, '/dev/sda2': { uuid: 'u-swap' }, '/dev/sda3': { uuid: 'u-luks' } },
  rootDevice: '/dev/sda1',
};

const STUCK = `[    2.9] sd 2:0:0:0: [sda] Attached SCSI disk
Begin: Running /scripts/local-block ... done.
Gave up waiting for root file system device.  Common problems:
 - Boot args (cat /proc/cmdline)
ALERT!  /dev/sda1 does not exist.  Dropping to a shell!


BusyBox v1.35.0 (Debian 1:1.35.0-4+b3) built-in shell (ash)
Enter 'help' for a list of built-in commands.

(initramfs) `;

describe('boot judge (the console decides, at once)', () => {
  const marker = /FERRY-GUEST-UP iface=\S+ addr=\S+/;
  it('the initramfs giving up on the root device is failed, naming why', () => {
    const v = judgeConsole(STUCK, marker);
    expect(v.status).to.equal('failed');
    expect((v as Extract<BootVerdict, { status: 'failed' }>).detail).to.equal('the initramfs gave up waiting for the root device: the serial console showed "Gave up waiting for root file system device"');
    expect(judgeConsole(STUCK.replace(/^Gave up.*$/m, ''), marker)).to.include({ status: 'failed', matched: 'ALERT!  /dev/sda1 does not exist.  Dropping to a shell!' });
  });
  it('recognises a kernel panic, emergency mode, GRUB prompts and a bare initramfs prompt', () => {
    const cases: [string, RegExp][] = [
      ['Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)\n', /kernel panic/],
      ['You are in emergency mode. After logging in, type "journalctl -xb"\n', /emergency mode/],
      ['Welcome to GRUB!\n\nerror: unknown filesystem.\nEntering rescue mode...\ngrub rescue> ', /GRUB rescue prompt/],
      ['                             Minimal BASH-like line editing is supported.\ngrub> ', /GRUB command prompt/],
      ['mount: mounting /dev/vda1 on /root failed\n(initramfs) ', /initramfs shell prompt/],
      ['[  OK  ] Started foo\n[ TIME ] Timed out waiting for device /dev/sdb1.\n', /timed out waiting for a device/],
      ['[ TIME ] Timed out waiting for device dev-disk-by\\x2duuid-c2f1.device - /dev/disk/by-uuid/c2f1.\n', /timed out waiting for a device/],
      ['[ TIME ] Timed out waiting for device dev-mapper-rhel\\x2dhome.device - /dev/mapper/rhel-home.\n', /timed out waiting for a device/],
    ];
    for (const [text, reason] of cases) {
      const v = judgeConsole(text, marker);
      expect(v.status, text).to.equal('failed');
      expect((v as Extract<BootVerdict, { status: 'failed' }>).detail, text).to.match(reason);
    }
  });
  it('a serial port announced late (a starved host) is not a failed boot: the guest goes on to its marker', () => {
    const late = '[ TIME ] Timed out waiting for device dev-ttyS0.device - /dev/ttyS0.\n';
    expect(judgeConsole(late, marker)).to.deep.equal({ status: 'running' });
    expect(judgeConsole(`${late}FERRY-GUEST-UP iface=enp1s0 addr=10.0.2.15/24\n`, marker)).to.include({ status: 'passed' });
  });
  it('the expected text passes; whichever of it and a failure the console shows first decides', () => {
    expect(judgeConsole('Booting\r\nFERRY-GUEST-UP iface=ens192 addr=10.0.2.15/24\r\n', marker)).to.include({ status: 'passed', matched: 'FERRY-GUEST-UP iface=ens192 addr=10.0.2.15/24' });
    expect(judgeConsole(STUCK + '\nFERRY-GUEST-UP iface=ens3 addr=10.0.2.15/24\n', marker).status).to.equal('failed');
    expect(judgeConsole('FERRY-GUEST-UP iface=ens3 addr=10.0.2.15/24\nKernel panic - not syncing: at shutdown\n', marker).status).to.equal('passed');
    expect(judgeConsole(STUCK, /Gave up waiting for root/).status).to.equal('passed'); // a test that expects the failure
    expect(judgeConsole('Loading Linux 6.1.0 ...\nBegin: Mounting root file system ... ', marker).status).to.equal('running');
  });
  it('an emulated boot that panicked only in the timer check (a busy host) runs once more and says so; other failures do not', async () => {
    const panic: TestBootResult = { status: 'failed', detail: 'kernel panic: the serial console showed "Kernel panic - not syncing: IO-APIC + timer doesn\'t work!"', seconds: 1, accelerator: 'tcg', firmware: 'bios', console_tail: '..MP-BIOS bug: 8254 timer not connected to IO-APIC' };
    const passed: TestBootResult = { status: 'passed', detail: 'the serial console showed "login: "', seconds: 9, accelerator: 'tcg', firmware: 'bios', console_tail: 'login: ' };
    const boots = (...r: TestBootResult[]) => { let n = 0; return { run: () => Promise.resolve(r[Math.min(n++, r.length - 1)]), count: () => n }; };
    const a = boots(panic, passed);
    const r = await againAfterTimerPanic(a.run);
    expect(a.count()).to.equal(2);
    expect(r.status).to.equal('passed');
    expect(r.detail).to.match(/the first panicked in the kernel's timer check/);
    const b = boots(panic, panic);
    expect((await againAfterTimerPanic(b.run)).status, 'twice is a real failure').to.equal('failed');
    expect(b.count()).to.equal(2);
    for (const other of [{ ...panic, accelerator: 'kvm' }, { ...panic, detail: 'kernel panic: VFS: Unable to mount root fs', console_tail: '' }] as TestBootResult[]) {
      const c = boots(other, passed);
      expect((await againAfterTimerPanic(c.run)).status).to.equal('failed');
      expect(c.count()).to.equal(1);
    }
  });
  it('judged as it streams (each chunk with the text just before it), a console gets the verdict the whole of it gets', () => {
    const stream = (text: string, size: number, re: RegExp) => {
      let seen = '';
      for (let i = 0; i < text.length; i += size) {
        const chunk = text.slice(i, i + size);
        seen += chunk;
        const v = judgeAdded(seen, chunk.length, re);
        if (v.status !== 'running') return v;
      }
      return { status: 'running' };
    };
    // Past the overlap: 16 KiB of boot noise first; the marker and the failure split across chunk boundaries.
    const noise = Array.from({ length: 300 }, (_, i) => `[  ${i}.000] probing device ${i} of the AHCI bus, nothing here`).join('\n') + '\n';
    // The same status; the matched text as far as it had arrived (a runner stops at the first chunk that matches).
    const same = (a: { status: string; matched?: string }, b: BootVerdict, what: string) => { expect(a.status, what).to.equal(b.status); expect((b as Extract<BootVerdict, { matched: string }>).matched.startsWith(a.matched!), `${what}: ${a.matched}`).to.equal(true); };
    for (const size of [13, 512, 4096]) {
      const up = `${noise}FERRY-GUEST-UP iface=enp1s0 addr=10.0.2.15/24\n`;
      same(stream(up, size, marker), judgeConsole(up, marker), `marker, chunks of ${size}`);
      same(stream(noise + STUCK, size, marker), judgeConsole(noise + STUCK, marker), `stuck, chunks of ${size}`);
      expect(stream(`${noise}(initramfs) `, size, marker).status, `prompt at a line start, chunks of ${size}`).to.equal('failed');
    }
  });
});

describe('boot-chain device names (pure)', () => {
  const grub = [
    'GRUB_DEFAULT=0',
    'GRUB_TIMEOUT=1',
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet"',
    'GRUB_CMDLINE_LINUX="console=tty0 console=ttyS0,115200n8 resume=/dev/sda2"',
    'GRUB_DISABLE_LINUX_UUID=true',
    'GRUB_DEVICE=/dev/sda1',
    '#GRUB_DISABLE_LINUX_UUID=true',
    '',
  ].join('\n');
  it('/etc/default/grub: the settings that make grub-mkconfig write device names go; kernel args become UUID=', () => {
    expect(grubDefaultsLeftovers(grub)).to.deep.equal(['GRUB_DISABLE_LINUX_UUID=true', 'GRUB_DEVICE=/dev/sda1', 'resume=/dev/sda2']);
    const r = rewriteGrubDefaults(grub, ctx);
    expect(r.changes.map((c) => c.from)).to.deep.equal(['GRUB_DISABLE_LINUX_UUID=true', 'GRUB_DEVICE=/dev/sda1', '/dev/sda2']);
    expect(grubDefaultsLeftovers(r.text)).to.deep.equal([]);
    expect(r.text).to.contain('GRUB_CMDLINE_LINUX="console=tty0 console=ttyS0,115200n8 resume=UUID=u-swap"');
    expect(r.text).to.contain('GRUB_DEFAULT=0\nGRUB_TIMEOUT=1\n');
    expect(rewriteGrubDefaults('GRUB_DISABLE_LINUX_UUID=false\nGRUB_DEVICE=/dev/mapper/vg-root\n', ctx).changes).to.deep.equal([]);
  });
  it('grub.cfg leftovers: kernel names and by-path are unstable; UUID=, LVM names are not', () => {
    expect(kernelArgLeftovers('linux /vmlinuz root=/dev/sda1 ro\nlinux /vmlinuz root=/dev/sda1 ro single\n')).to.deep.equal(['root=/dev/sda1']);
    expect(kernelArgLeftovers('linux /vmlinuz root=UUID=x ro resume=/dev/mapper/vg-swap\nlinux /v root=/dev/mapper/vg-root')).to.deep.equal([]);
  });
  it('crypttab and RESUME: the device field becomes UUID=, the rest stays byte for byte', () => {
    const c = rewriteCrypttab('# <target> <source> <key> <options>\nsda3_crypt  /dev/sda3  none  luks,discard\nswap UUID=x /dev/urandom swap\n', ctx);
    expect(c.text).to.equal('# <target> <source> <key> <options>\nsda3_crypt  UUID=u-luks  none  luks,discard\nswap UUID=x /dev/urandom swap\n');
    expect(crypttabLeftovers(c.text)).to.deep.equal([]);
    expect(crypttabLeftovers('x /dev/sdb1 none luks\n')).to.deep.equal(['/dev/sdb1']);
    const r = rewriteResume('RESUME=/dev/sda2\n', ctx);
    expect(r.text).to.equal('RESUME=UUID=u-swap\n');
    expect(resumeLeftovers('RESUME="/dev/sdc9"\n')).to.deep.equal(['/dev/sdc9']);
    expect(rewriteResume('RESUME=/dev/sdc9\n', ctx).unresolved).to.deep.equal(['/dev/sdc9']);
  });
});

describe('NIC names across the move (pure)', () => {
  it('finds the names each network stack configures, not lo, bridges or VLANs', () => {
    expect(configuredInterfaces([
      { path: '/etc/network/interfaces', text: 'auto lo\niface lo inet loopback\nallow-hotplug ens192\niface ens192 inet static\n  address 10.0.2.15/24\n# iface eth9 inet dhcp\n' },
      { path: '/etc/netplan/50.yaml', text: 'network:\n  ethernets:\n    ens160:\n      dhcp4: true\n    any:\n      match:\n        macaddress: 00:50:56:aa:bb:cc\n      set-name: ens224\n  bridges:\n    br0: {}\n' },
      { path: '/etc/systemd/network/10.network', text: '[Match]\nName=eno1\n' },
      { path: '/etc/sysconfig/network-scripts/ifcfg-eth0', text: 'DEVICE=eth0\nONBOOT=yes\n' },
      { path: '/etc/NetworkManager/system-connections/a.nmconnection', text: '[connection]\ninterface-name=enp11s0\n' },
      { path: '/etc/network/interfaces.d/vlan', text: 'iface ens192.10 inet manual\n' },
    ])).to.deep.equal(['eno1', 'enp11s0', 'ens160', 'ens192', 'ens224', 'eth0']);
  });
  it('renames each NIC to its KVM name, matched by the old MAC rules, else the one MAC the manifest gives, else the virtio driver for a single NIC', () => {
    const rules = persistentNetNames('# comment\nSUBSYSTEM=="net", ACTION=="add", ATTR{address}=="00:50:56:AA:BB:01", NAME="ens192"\n');
    expect(rules).to.deep.equal([{ mac: '00:50:56:aa:bb:01', name: 'ens192' }]);
    const byRule = planNicRenames(['ens192'], rules, []).renames[0];
    expect(byRule).to.deep.include({ from: 'ens192', to: 'enp1s0', match: { mac: '00:50:56:aa:bb:01' } });
    expect(byRule.link.path).to.equal('/etc/systemd/network/10-ferry-enp1s0.link');
    expect(byRule.link.text).to.match(/\[Match\]\nMACAddress=00:50:56:aa:bb:01\n\n\[Link\]\nName=enp1s0\n/);
    expect(planNicRenames(['ens192'], [], ['00-50-56-AA-BB-02']).renames[0].link.text).to.contain('MACAddress=00:50:56:aa:bb:02');
    expect(planNicRenames(['ens192'], [], []).renames[0].link.text).to.contain('Driver=virtio_net');
    // Several NICs: each takes its place in the VM's NIC order (the manifest's), which is the order on KVM.
    const two = planNicRenames(['ens192', 'ens224'], persistentNetNames('ATTR{address}=="00:50:56:aa:bb:01", NAME="ens224"\nATTR{address}=="00:50:56:aa:bb:02", NAME="ens192"\n'), ['00:50:56:aa:bb:01', '00:50:56:aa:bb:02']);
    expect(two.renames.map((r) => `${r.from}>${r.to}`)).to.deep.equal(['ens192>enp2s0', 'ens224>enp1s0']);
    const unknown = planNicRenames(['ens192', 'ens224'], [], []);
    expect(unknown.renames).to.deep.equal([]);
    expect(unknown.problem).to.match(/configures 2 NICs \(ens192, ens224\)/);
    expect(planNicRenames([], [], []).renames).to.deep.equal([]);
  });
  it('rewrites interface names as tokens: VLANs and aliases with them, longer names and other words not, swaps at once', () => {
    const m = new Map([['ens192', 'enp1s0'], ['ens224', 'ens192']]);
    expect(renameInterfaces('auto ens192\niface ens192 inet static\niface ens192.10 inet manual\niface ens192:0 inet static\n# ens1920 br-ens192\nbridge_ports ens224\n', m))
      .to.equal('auto enp1s0\niface enp1s0 inet static\niface enp1s0.10 inet manual\niface enp1s0:0 inet static\n# ens1920 br-ens192\nbridge_ports ens192\n');
    expect(renameInterfaces('DEVICE="ens192"\nNAME=ens192\n', m)).to.equal('DEVICE="enp1s0"\nNAME=enp1s0\n');
    expect(renameInterfaces('network:\n  ethernets:\n    ens192:\n      dhcp4: true\n', m)).to.equal('network:\n  ethernets:\n    enp1s0:\n      dhcp4: true\n');
    expect(namesInterface('iface ens1920 inet dhcp', 'ens192')).to.equal(false);
    expect(namesInterface('iface ens192 inet dhcp', 'ens192')).to.equal(true);
    expect(kvmNicName(0)).to.equal('enp1s0');
  });
  it('plans the file edits: each file renames only the names it has, ifcfg-<old> moves to ifcfg-<new>, untouched files are left out', () => {
    const m = new Map([['ens192', 'enp1s0'], ['ens224', 'enp2s0']]);
    const edits = planNicFileEdits([
      { path: '/etc/sysconfig/network-scripts/ifcfg-ens192', text: 'DEVICE=ens192\nONBOOT=yes\n' },
      { path: '/etc/sysconfig/network-scripts/ifcfg-ens224', text: 'ONBOOT=yes\n' },
      { path: '/etc/network/interfaces', text: 'iface ens224 inet dhcp\n' },
      { path: '/etc/network/interfaces.d/lo', text: 'iface lo inet loopback\n' },
    ], m);
    expect(edits).to.deep.equal([
      { path: '/etc/sysconfig/network-scripts/ifcfg-ens192', dest: '/etc/sysconfig/network-scripts/ifcfg-enp1s0', text: 'DEVICE=enp1s0\nONBOOT=yes\n', renamed: { ens192: 'enp1s0' } },
      { path: '/etc/sysconfig/network-scripts/ifcfg-ens224', dest: '/etc/sysconfig/network-scripts/ifcfg-enp2s0', text: 'ONBOOT=yes\n', renamed: {} },
      { path: '/etc/network/interfaces', dest: '/etc/network/interfaces', text: 'iface enp2s0 inet dhcp\n', renamed: { ens224: 'enp2s0' } },
    ]);
  });
});

describe('virt_test judges from the console (real qemu) @vm', function () {
  this.timeout(120_000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-judge-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('a guest that panics is failed as soon as the console shows it, long before the timeout', async () => {
    const disk = makeBootableImage(dir, 'panic', 'raw', 'Kernel panic - not syncing: VFS: Unable to mount root fs');
    const r = await testBoot({ disks: [{ path: disk, format: 'raw' }], memoryMiB: 64, expect: /FERRY-GUEST-UP/, timeoutSeconds: 600 });
    expect(r.status, r.console_tail).to.equal('failed');
    expect(r.detail).to.match(/^kernel panic: the serial console showed "Kernel panic - not syncing"/);
    expect(r.seconds).to.be.below(60);
  });

  it('with expect given, a guest that shows nothing matching by the timeout is failed, not inconclusive', async () => {
    const disk = makeBootableImage(dir, 'quiet', 'raw', 'still booting...');
    const r = await testBoot({ disks: [{ path: disk, format: 'raw' }], memoryMiB: 64, expect: /FERRY-GUEST-UP/, timeoutSeconds: 5 });
    expect(r.status).to.equal('failed');
    expect(r.detail).to.match(/did not show \/FERRY-GUEST-UP\/ within 5 s/);
    expect(r.console_tail).to.contain('still booting...');
  });
});
