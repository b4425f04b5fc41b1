// Templates on the real Debian 12 guest (test/fixtures/debian-guest.ts), on the run's private libvirtd: POST
// /virt/template/create with `seal` really runs virt-sysprep, and POST /virt/template/deploy with `customize`
// really runs virt-customize (hostname, root password hash, SSH key, first-boot command). Both are checked in the
// disks themselves by one separate read-only libguestfs appliance, the untouched source disk giving the baseline;
// then the deployed domain boots (SATA disk: the guest names its root /dev/sda1) and its serial console shows the
// login prompt under the new hostname and the first-boot command's line. The template's disk is a qcow2 overlay
// on the cached VMDK, which stays unchanged. Three appliance launches and one boot under TCG: 2:45 at load average
// 5-6, 5:31 at 11 on 2 cores. (The fixture has no sshd, so there are no SSH host keys for virt-sysprep to remove; planting some would
// cost one more appliance launch, so the seal is shown by the machine id and the log files.)
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { GuestSession } from '../../shared/converter/guestfs';
import { Virsh } from '../../shared/libvirt';
import { ensureDebianGuest } from '../fixtures/debian-guest';
import { bootAndWatch, okData, startVirtStack, VirtStack } from './stack';
import { tolerate } from '../helpers/teardown';
import type { deployTemplate } from '../../shared/libvirt/templates';

/** POST /virt/template/deploy's data. */
type Deployed = Awaited<ReturnType<typeof deployTemplate>>;

const SOURCE = 'deb-src';
const TEMPLATE = 'deb-tpl';
const DEPLOYED = 'deb-web1';
const HOSTNAME = 'ferry-web1';

describe('templates on the real Debian guest: seal (virt-sysprep), deploy with customize (virt-customize), boot @vm', function () {
  this.timeout(1_800_000); // a fresh machine builds the guest fixture first
  let s: VirtStack;
  let v: Virsh;
  let vmdk: string;
  let vmdkMtime: number;
  const work = mkdtempSync(path.join(os.tmpdir(), 'ferry-tpl-guest-'));
  let hash: string;
  let pubKey: string;

  before(async () => {
    const g = await ensureDebianGuest('plain');
    vmdk = g.vmdk;
    vmdkMtime = statSync(vmdk).mtimeMs;
    s = await startVirtStack();
    v = new Virsh(s.lv.uri);
    const disk = path.join(s.lv.poolDir, `${SOURCE}.qcow2`);
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-b', vmdk, '-F', 'vmdk', disk]);
    await s.lv.virsh(['pool-refresh', s.lv.pool]);
    // As the guest lived on VMware: a SATA disk (its fstab and kernel line say /dev/sda1), BIOS, a serial console.
    const xml = path.join(work, 'src.xml');
    writeFileSync(xml, `<domain type='qemu'><name>${SOURCE}</name><memory unit='MiB'>512</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os><features><acpi/></features>
<on_reboot>destroy</on_reboot><devices><disk type='file' device='disk'><driver name='qemu' type='qcow2'/>
<source file='${disk}'/><target dev='sda' bus='sata'/></disk><serial type='pty'><target port='0'/></serial>
<console type='pty'><target type='serial' port='0'/></console><memballoon model='none'/></devices></domain>`);
    await s.lv.virsh(['define', xml]);
    hash = execFileSync('openssl', ['passwd', '-6', '-salt', 'ferrytestsalt', 'not-this-password']).toString().trim();
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'ops@ferry-test', '-f', path.join(work, 'id')]);
    pubKey = readFileSync(path.join(work, 'id.pub'), 'utf8').trim();
  });
  after(async () => {
    await s?.lv.virsh(['destroy', DEPLOYED]).catch(tolerate(`destroy ${DEPLOYED}`)); // booted by the test: its libvirtd ends anyway
    await s?.stop();
    rmSync(work, { recursive: true, force: true });
  });

  it('seals a clone with virt-sysprep, deploys it customized with virt-customize, and the deployed guest boots with both', async () => {
    const B = s.daemon.url;
    const t = await okData(B, 'POST', '/virt/template/create', { domain: SOURCE, name: TEMPLATE, description: 'Debian 12 base', seal: true }, 201);
    expect(t).to.include({ name: TEMPLATE, source: SOURCE, sealed: true });

    const d = await okData<Deployed>(B, 'POST', '/virt/template/deploy', {
      template: TEMPLATE, name: DEPLOYED, memory: 640, vcpus: 1,
      customize: { hostname: HOSTNAME, root_password_hash: hash, ssh_keys: [pubKey], first_boot_command: 'echo FERRY-FIRSTBOOT-RAN host=$(hostname) > /dev/ttyS0' },
    }, 201);
    expect(d).to.include({ name: DEPLOYED, template: TEMPLATE });
    expect(d.customized).to.have.members(['hostname', 'root_password_hash', 'ssh_keys', 'first_boot_command']);
    // Neither the hash nor the key's body ever reached the daemon's log.
    expect(s.daemon.logs.join('')).not.to.include(hash.split('$').pop());

    const diskOf = async (dom: string) => /<source file=['"]([^'"]+)['"]/.exec(await s.lv.virsh(['dumpxml', '--inactive', dom]))![1];
    const [src, tpl, dep] = await Promise.all([SOURCE, TEMPLATE, DEPLOYED].map(diskOf));
    expect(new Set([src, tpl, dep]).size, 'three domains, three disks').to.equal(3);

    // One read-only appliance for all three disks: the source untouched, the template sealed, the clone customized.
    const gs = await GuestSession.open([src, tpl, dep].map((p) => ({ path: p, format: 'qcow2' })), { readonly: true });
    try {
      for (const m of ['/src', '/tpl', '/dep']) await gs.cmd('mkmountpoint', m);
      await gs.cmd('mount-ro', '/dev/sda1', '/src');
      await gs.cmd('mount-ro', '/dev/sdb1', '/tpl');
      await gs.cmd('mount-ro', '/dev/sdc1', '/dep');
      // The baseline: the source domain (the template was a clone of it) keeps its machine id and logs.
      const machineId = (await gs.read('/src/etc/machine-id')).trim();
      expect(machineId).to.match(/^[0-9a-f]{32}$/);
      expect(await gs.isFile('/src/var/log/ferry-firstboot.log')).to.equal(true);
      // virt-sysprep ran on the template: machine id emptied (not replaced: each clone makes its own), logs removed.
      expect(await gs.read('/tpl/etc/machine-id')).to.equal('');
      expect(await gs.exists('/tpl/var/log/ferry-firstboot.log')).to.equal(false);
      // virt-customize ran on the deployed clone.
      expect((await gs.read('/dep/etc/hostname')).trim()).to.equal(HOSTNAME);
      const shadowRoot = (await gs.read('/dep/etc/shadow')).split('\n').find((l) => l.startsWith('root:'))!;
      expect(shadowRoot.split(':')[1]).to.equal(hash);
      expect(await gs.exists('/dep/root/.ferry-root-hash'), 'the uploaded hash file is removed').to.equal(false);
      expect(await gs.read('/dep/root/.ssh/authorized_keys')).to.include(pubKey);
      const scripts = gs.lines(await gs.cmd('ls', '/dep/usr/lib/virt-sysprep/scripts'));
      expect(scripts).to.have.length(1);
      expect(await gs.read(`/dep/usr/lib/virt-sysprep/scripts/${scripts[0]}`)).to.include('echo FERRY-FIRSTBOOT-RAN');
      expect(gs.lines(await gs.cmd('glob-expand', '/dep/etc/systemd/system/*.wants/guestfs-firstboot.service')), 'the first-boot service enabled').to.have.length(1);
      // The deployed guest got its own machine id (virt-customize makes one when it is empty), not the source's.
      expect((await gs.read('/dep/etc/machine-id')).trim()).to.match(/^[0-9a-f]{32}$/).and.not.equal(machineId);
    } finally { await gs.close(); }

    // libvirt's view of the deployed domain: the memory asked for, no template marker.
    const xml = await s.lv.virsh(['dumpxml', '--inactive', DEPLOYED]);
    expect(xml).to.match(/<memory unit=['"]KiB['"]>655360<\/memory>/);
    expect(xml).not.to.include('ferry.dev/xmlns/libvirt/template');

    // The boot: getty's prompt under the new hostname, and the first-boot command's own line.
    const text = await bootAndWatch(v, DEPLOYED, [/FERRY-FIRSTBOOT-RAN host=ferry-web1/, /ferry-web1 login:/], 420_000,
      () => okData(B, 'POST', '/virt/domain/start', { name: DEPLOYED, paused: true }));
    expect(text).not.to.match(/ferry-guest-plain login:/);
    expect(statSync(vmdk).mtimeMs, 'the cached VMDK is never written').to.equal(vmdkMtime);
  });
});
