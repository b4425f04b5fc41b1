// The Linux repair steps that need no boot to be shown (issue 20 items 3-5), on one small real disk made and
// repaired in one appliance: a root that names ens192 in every network stack (ifupdown, netplan, a
// NetworkManager keyfile, RHEL ifcfg, systemd-networkd) with cloud-init installed, and that pins the old disk
// everywhere (LVM's devices file and metadata cache, blkid's cache, crypttab, the resume device of initramfs-tools
// and dracut, a btrfs subvol= mount by device name, a multipath alias), with booster as its only initramfs
// generator. fixGuest runs on it; every file is then read back from the disk.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { GuestSession } from '../../domain/converter/guestfs';
import { fixGuest } from '../../domain/converter/guest';
import type { FixOptions, FixResult, GuestInfo } from '../../domain/converter/types';
import { kvmNicName } from '../../domain/converter/nic-names';

const NIC = kvmNicName(0);
const FILES: Record<string, string> = {
  '/etc/fstab': '/dev/sda1  /      ext4   defaults  0 1\n/dev/sda1  /home  btrfs  subvol=@home,compress=zstd  0 0\n/dev/mapper/mpatha1  /srv  ext4  defaults  0 2\n',
  '/etc/network/interfaces': 'auto lo\niface lo inet loopback\n\nallow-hotplug ens192\niface ens192 inet static\n\taddress 10.0.2.15/24\n',
  '/etc/netplan/50-cloud-init.yaml': 'network:\n  version: 2\n  renderer: NetworkManager\n  ethernets:\n    ens192:\n      addresses: [10.0.2.15/24]\n',
  '/etc/NetworkManager/system-connections/ens192.nmconnection': '[connection]\nid=ens192\ntype=ethernet\ninterface-name=ens192\n\n[ipv4]\nmethod=manual\naddress1=10.0.2.15/24,10.0.2.2\n',
  '/etc/sysconfig/network-scripts/ifcfg-ens192': 'DEVICE=ens192\nBOOTPROTO=none\nIPADDR=10.0.2.15\nPREFIX=24\nONBOOT=yes\n',
  '/etc/systemd/network/10-ens192.network': '[Match]\nName=ens192\n\n[Network]\nAddress=10.0.2.15/24\n',
  '/etc/cloud/cloud.cfg': 'datasource_list: [ VMware, None ]\n',
  '/etc/lvm/lvm.conf': 'devices {\n\tuse_devicesfile = 1\n}\n',
  '/etc/lvm/devices/system.devices': 'VERSION=1.1.1\nIDTYPE=sys_wwid IDNAME=t10.ATA_VMware_Virtual_SATA_Hard_Drive_00000000000000000001 DEVNAME=/dev/sda2 PVID=abc PART=2\n',
  '/etc/lvm/cache/.cache': 'persistent_filter_cache { valid_devices=[ "/dev/sda2" ] }\n',
  '/etc/blkid.tab': '<device DEVNO="0x0802" UUID="x" TYPE="LVM2_member">/dev/sda2</device>\n',
  '/etc/multipath/bindings': '# Multipath bindings\nmpatha 36000c29aa1b2c3d4e5f6a7b8c9d0e1f2\n',
  '/etc/crypttab': 'cr_data /dev/sda1 none luks\n',
  '/etc/initramfs-tools/conf.d/resume': 'RESUME=/dev/sda1\n',
  '/etc/dracut.conf.d/resume.conf': 'add_device+=" /dev/sda1 "\n',
  '/usr/bin/booster': '#!/bin/sh\nexit 1\n',
};

describe('Linux repair steps on one real disk: every network stack, every pin of the old disk (issue 20) @vm', function () {
  this.timeout(20 * 60 * 1000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-layouts-'));
  let s: GuestSession;
  let r: FixResult;
  let uuid: string;
  const files: Record<string, string | null> = {};

  before(async () => {
    const disk = path.join(dir, 'disk.raw');
    execFileSync('qemu-img', ['create', '-q', '-f', 'raw', disk, '64M']);
    s = await GuestSession.open([{ path: disk, format: 'raw' }]);
    await s.cmd('part-disk', '/dev/sda', 'mbr');
    await s.cmd('mkfs', 'ext4', '/dev/sda1');
    await s.cmd('mount', '/dev/sda1', '/');
    for (const [f, text] of Object.entries(FILES)) { await s.cmd('mkdir-p', path.posix.dirname(f)); await s.writeFile(f, text); }
    uuid = (await s.blkid('/dev/sda1')).UUID;
    const info: GuestInfo = {
      os: 'linux', distro: 'debian', root_device: '/dev/sda1', mountpoints: { '/': '/dev/sda1' }, filesystems: { '/dev/sda1': 'ext4' },
      lvm: false, kernels: ['6.1.0-test'], hypervisor_tools: [], package_format: 'deb',
    };
    r = await fixGuest(s, info, { fstab_mode: 'stabilize-all', dry_run: false, backup: true, regen_initramfs: true, update_grub: false } as FixOptions, () => undefined); // the repair's log lines are not what this test checks
    const read = [...Object.keys(FILES), '/etc/sysconfig/network-scripts/ifcfg-' + NIC, '/etc/cloud/cloud.cfg.d/99-ferry-network.cfg', '/ferry-backup/etc/lvm/devices/system.devices'];
    for (const f of read) files[f] = (await s.isFile(f)) ? await s.read(f) : null;
  });
  after(async () => { await s?.close(); rmSync(dir, { recursive: true, force: true }); });

  const acts = (action: string) => r.actions.filter((a) => a.action === action);

  it('renames ens192 in ifupdown, netplan (NetworkManager renderer), the keyfile, ifcfg (file renamed) and networkd', () => {
    expect(files['/etc/network/interfaces']).to.contain(`iface ${NIC} inet static`);
    expect(files['/etc/netplan/50-cloud-init.yaml']).to.match(new RegExp(`^    ${NIC}:$`, 'm'));
    expect(files['/etc/NetworkManager/system-connections/ens192.nmconnection']).to.contain(`interface-name=${NIC}`);
    expect(files['/etc/sysconfig/network-scripts/ifcfg-ens192']).to.equal(null);
    expect(files[`/etc/sysconfig/network-scripts/ifcfg-${NIC}`]).to.contain(`DEVICE=${NIC}`);
    expect(files['/etc/systemd/network/10-ens192.network']).to.contain(`Name=${NIC}`);
    for (const [f, t] of Object.entries(files)) if (t && !f.startsWith('/ferry-backup') && !f.includes('lvm') && !f.includes('blkid')) expect(t, f).not.to.match(/\bens192\b(?!\.)/);
  });

  it('keeps cloud-init from rendering the network again at boot', () => {
    expect(files['/etc/cloud/cloud.cfg.d/99-ferry-network.cfg']).to.match(/^network: \{config: disabled\}$/m);
    expect(acts('cloud_init').map((a) => a.status)).to.deep.equal(['done']);
  });

  it('removes LVM\'s devices file (kept in the backup tree) and the caches of the old devices', () => {
    for (const f of ['/etc/lvm/devices/system.devices', '/etc/lvm/cache/.cache', '/etc/blkid.tab']) expect(files[f], f).to.equal(null);
    expect(files['/ferry-backup/etc/lvm/devices/system.devices']).to.equal(FILES['/etc/lvm/devices/system.devices']);
    expect(acts('disk_pins').filter((a) => a.status === 'done').map((a) => a.file)).to.have.members(['/etc/lvm/devices/system.devices', '/etc/lvm/cache/.cache', '/etc/blkid.tab']);
  });

  it('names the disk by UUID in fstab (subvol= kept), crypttab and both resume settings; warns of the multipath alias', () => {
    expect(files['/etc/fstab']).to.equal(`UUID=${uuid}  /      ext4   defaults  0 1\nUUID=${uuid}  /home  btrfs  subvol=@home,compress=zstd  0 0\n/dev/mapper/mpatha1  /srv  ext4  defaults  0 2\n`);
    expect(files['/etc/crypttab']).to.equal(`cr_data UUID=${uuid} none luks\n`);
    expect(files['/etc/initramfs-tools/conf.d/resume']).to.equal(`RESUME=UUID=${uuid}\n`);
    expect(files['/etc/dracut.conf.d/resume.conf']).to.equal(`add_device+=" UUID=${uuid} "\n`);
    expect(acts('disk_pins').filter((a) => a.status === 'warning').map((a) => a.detail)).to.deep.equal([
      '/etc/fstab mounts the multipath alias mpatha, bound to a WWID of the VMware disk in /etc/multipath/bindings: a virtio disk has no WWID, so the alias will not appear; mount it by UUID=',
    ]);
  });

  it('fails naming an initramfs generator it does not support; every other check read back holds', () => {
    expect(acts('regen_initramfs').map((a) => [a.status, a.detail])).to.deep.equal([['failed', 'the guest\'s initramfs generator is booster (/usr/bin/booster), which Ferry does not support: its images keep lacking virtio_pci, virtio_blk; add them with that tool, or convert with virt-v2v']]);
    expect(r.failures).to.have.length(1);
    const verify = acts('verify');
    expect(verify.filter((a) => a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);
    expect(verify.map((a) => a.check)).to.include.members(['/etc/fstab', '/etc/crypttab', '/etc/dracut.conf.d/resume.conf', '/etc/lvm/devices/system.devices', '/etc/cloud/cloud.cfg.d/99-ferry-network.cfg']);
  });
});
