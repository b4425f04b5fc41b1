// Templates on the real Debian 12 guest (test/fixtures/debian-guest.ts), on the run's private libvirtd: POST
// /virt/template/create with `seal` really runs virt-sysprep, and POST /virt/template/deploy with `customize`
// really runs virt-customize (hostname, root password hash, SSH key, first-boot command). Both are checked in the
// disks themselves by one separate read-only libguestfs appliance, the untouched source disk giving the baseline;
// then the deployed domain boots (SATA disk: the guest names its root /dev/sda1) and its serial console shows the
// login prompt under the new hostname and the first-boot command's line. The template's disk is a qcow2 overlay
// on the cached VMDK, which stays unchanged. Three appliance launches and one boot under TCG: 2:45 at load average
// 5-6, 5:31 at 11 on 2 cores. (The fixture has no sshd, so there are no SSH host keys for virt-sysprep to remove; planting some would
// cost one more appliance launch, so the seal is shown by the machine id and the log files.)
// The whole is a reused proof (test/helpers/proofs.ts; the virt stack starts only when it runs): with every input
// unchanged (the code the daemon loads, the fixture, virt-sysprep's and virt-customize's package among the tools) the
// same check() re-asserts the evidence of the last passing run.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { GuestSession } from '../../domain/converter/guestfs';
import { Virsh } from '../../domain/libvirt';
import { ensureDebianGuest } from '../fixtures/debian-guest';
import { bootAndWatch, okData, startVirtStack, VirtStack } from './stack';
import { tolerate } from '../helpers/teardown';
import { fixtureInputs, readBack, reusedProof } from '../helpers/proofs';
import type { deployTemplate } from '../../domain/libvirt/templates';

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

  /** The virt stack with the source domain on a qcow2 overlay of the cached VMDK, the password hash and an SSH key:
   *  made only when the proof runs (a reused one needs none of it). */
  async function start() {
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
  }
  after(async () => {
    await s?.lv.virsh(['destroy', DEPLOYED]).catch(tolerate(`destroy ${DEPLOYED}`)); // booted by the test: its libvirtd ends anyway
    await s?.stop();
    rmSync(work, { recursive: true, force: true });
  });

  /** What the check reads: the API's answers, what the daemon logged, the three disks read back, libvirt's XML of the
   *  deployed domain, its console until both lines showed, and the cached VMDK's modification time. */
  interface Evidence {
    hash: string; pubKey: string; t: Record<string, unknown>; d: Deployed; daemonLog: string; disks: string[];
    readback: { files: Record<string, string | null>; srcFirstboot: boolean; tplFirstboot: boolean; hashFile: boolean; scripts: string[]; script: string | null; wants: string[] };
    xml: string; console: string; vmdkMtime: number[];
  }

  async function sealDeployBoot(): Promise<Evidence> {
    await start();
    const B = s.daemon.url;
    const t = await okData<Record<string, unknown>>(B, 'POST', '/virt/template/create', { domain: SOURCE, name: TEMPLATE, description: 'Debian 12 base', seal: true }, 201);
    const d = await okData<Deployed>(B, 'POST', '/virt/template/deploy', {
      template: TEMPLATE, name: DEPLOYED, memory: 640, vcpus: 1,
      customize: { hostname: HOSTNAME, root_password_hash: hash, ssh_keys: [pubKey], first_boot_command: 'echo FERRY-FIRSTBOOT-RAN host=$(hostname) > /dev/ttyS0' },
    }, 201);
    const diskOf = async (dom: string) => /<source file=['"]([^'"]+)['"]/.exec(await s.lv.virsh(['dumpxml', '--inactive', dom]))![1];
    const [src, tpl, dep] = await Promise.all([SOURCE, TEMPLATE, DEPLOYED].map(diskOf));

    // One read-only appliance for all three disks: the source untouched, the template sealed, the clone customized.
    const gs = await GuestSession.open([src, tpl, dep].map((p) => ({ path: p, format: 'qcow2' })), { readonly: true });
    let readback: Evidence['readback'];
    try {
      for (const m of ['/src', '/tpl', '/dep']) await gs.cmd('mkmountpoint', m);
      await gs.cmd('mount-ro', '/dev/sda1', '/src');
      await gs.cmd('mount-ro', '/dev/sdb1', '/tpl');
      await gs.cmd('mount-ro', '/dev/sdc1', '/dep');
      const scripts = gs.lines(await gs.cmd('ls', '/dep/usr/lib/virt-sysprep/scripts'));
      readback = {
        files: await readBack(gs, ['/src/etc/machine-id', '/tpl/etc/machine-id', '/dep/etc/hostname', '/dep/etc/shadow', '/dep/root/.ssh/authorized_keys', '/dep/etc/machine-id']),
        srcFirstboot: await gs.isFile('/src/var/log/ferry-firstboot.log'), tplFirstboot: await gs.exists('/tpl/var/log/ferry-firstboot.log'),
        hashFile: await gs.exists('/dep/root/.ferry-root-hash'), scripts,
        script: scripts.length === 1 ? await gs.read(`/dep/usr/lib/virt-sysprep/scripts/${scripts[0]}`) : null,
        wants: gs.lines(await gs.cmd('glob-expand', '/dep/etc/systemd/system/*.wants/guestfs-firstboot.service')),
      };
    } finally { await gs.close(); }
    const xml = await s.lv.virsh(['dumpxml', '--inactive', DEPLOYED]);
    // The boot: getty's prompt under the new hostname, and the first-boot command's own line.
    const text = await bootAndWatch(v, DEPLOYED, [/FERRY-FIRSTBOOT-RAN host=ferry-web1/, /ferry-web1 login:/], 420_000,
      () => okData(B, 'POST', '/virt/domain/start', { name: DEPLOYED, paused: true }));
    return { hash, pubKey, t, d, daemonLog: s.daemon.logs.join(''), disks: [src, tpl, dep], readback, xml, console: text, vmdkMtime: [vmdkMtime, statSync(vmdk).mtimeMs] };
  }

  /** The assertions, on a fresh run's evidence or on the record's. */
  function check(e: Evidence) {
    expect(e.t).to.include({ name: TEMPLATE, source: SOURCE, sealed: true });
    expect(e.d).to.include({ name: DEPLOYED, template: TEMPLATE });
    expect(e.d.customized).to.have.members(['hostname', 'root_password_hash', 'ssh_keys', 'first_boot_command']);
    // Neither the hash nor the key's body ever reached the daemon's log.
    expect(e.daemonLog).not.to.include(e.hash.split('$').pop());
    expect(new Set(e.disks).size, 'three domains, three disks').to.equal(3);
    const { files, ...rb } = e.readback;
    // The baseline: the source domain (the template was a clone of it) keeps its machine id and logs.
    const machineId = (files['/src/etc/machine-id'] ?? '').trim();
    expect(machineId).to.match(/^[0-9a-f]{32}$/);
    expect(rb.srcFirstboot).to.equal(true);
    // virt-sysprep ran on the template: machine id emptied (not replaced: each clone makes its own), logs removed.
    expect(files['/tpl/etc/machine-id']).to.equal('');
    expect(rb.tplFirstboot).to.equal(false);
    // virt-customize ran on the deployed clone.
    expect((files['/dep/etc/hostname'] ?? '').trim()).to.equal(HOSTNAME);
    const shadowRoot = (files['/dep/etc/shadow'] ?? '').split('\n').find((l) => l.startsWith('root:'))!;
    expect(shadowRoot.split(':')[1]).to.equal(e.hash);
    expect(rb.hashFile, 'the uploaded hash file is removed').to.equal(false);
    expect(files['/dep/root/.ssh/authorized_keys']).to.include(e.pubKey);
    expect(rb.scripts).to.have.length(1);
    expect(rb.script).to.include('echo FERRY-FIRSTBOOT-RAN');
    expect(rb.wants, 'the first-boot service enabled').to.have.length(1);
    // The deployed guest got its own machine id (virt-customize makes one when it is empty), not the source's.
    expect((files['/dep/etc/machine-id'] ?? '').trim()).to.match(/^[0-9a-f]{32}$/).and.not.equal(machineId);
    // libvirt's view of the deployed domain: the memory asked for, no template marker.
    expect(e.xml).to.match(/<memory unit=['"]KiB['"]>655360<\/memory>/);
    expect(e.xml).not.to.include('ferry.dev/xmlns/libvirt/template');
    // The boot showed both lines (bootAndWatch waited for them), not the source's hostname.
    expect(e.console).to.match(/FERRY-FIRSTBOOT-RAN host=ferry-web1/).and.match(/ferry-web1 login:/);
    expect(e.console).not.to.match(/ferry-guest-plain login:/);
    expect(e.vmdkMtime[1], 'the cached VMDK is never written').to.equal(e.vmdkMtime[0]);
  }

  it('seals a clone with virt-sysprep, deploys it customized with virt-customize, and the deployed guest boots with both', async () => {
    const g = await ensureDebianGuest('plain');
    vmdk = g.vmdk;
    const spec = { name: 'virt-template-guest', entries: [__filename], extra: fixtureInputs(g.vmdk) };
    await reusedProof(spec, sealDeployBoot, check);
  });
});
