// After Ferry, the real Debian 12 guest (test/fixtures/debian-guest.ts: root by /dev/sda1 or on LVM, an initramfs
// without virtio, GRUB_DISABLE_LINUX_UUID=true, ens192 configured statically, open-vm-tools) boots on virtio-blk
// with a virtio NIC and prints its marker, its interface renamed to the virtio NIC's name and configured as
// before; open-vm-tools is gone; the source
// VMDK is byte-identical. Once through `ferry-convert` (mode local) and once through a `migrate` job on the
// gateway with a real worker, side by side, both with virt_test (a real qemu boot of the output, judged from the
// console). The LVM variant goes through the migrate job only: both entry points run the same pipeline
// (shared/converter), the plain variant shows they agree, and a fourth appliance and boot would add minutes to a
// suite held under 25. Both variants run at once (the worker has two job slots). That the source itself does not
// boot on virtio-blk is shown by test/guest/fixture.test.ts.
// The outputs are then read back in one read-only appliance per variant. Serial logs of a failed boot are kept in
// test/artifacts/. Cached fixture: about 4 min for plain and under 3 for LVM under TCG (fresh-clone run, load ~2).
import { expect } from 'chai';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { imageInfo, sha256File } from '../../shared/qemu';
import { GuestSession } from '../../shared/converter/guestfs';
import { kvmNicName } from '../../shared/converter/nic-names';
import { ensureDebianGuest, DebianGuest, DebianVariant, GUEST_CACHE } from '../fixtures/debian-guest';
import { keepOnFailure } from '../helpers/boot-logs';
import { ferryConvert, startStack } from '../helpers/procs';
import { req, until } from '../helpers/http';

const BOOT_TIMEOUT = 420;

/** The boot judged in the report: passed on the marker, naming the interface the guest configured, with its address. */
function expectBooted(name: string, g: DebianGuest, report: any) {
  keepOnFailure(`guest-repair-${name}`, report?.test_boot?.console_log, () => {
    expect(report.test_boot, 'test boot').to.include({ status: 'passed' });
    const m = g.ready.exec(report.test_boot.matched);
    expect(m, `marker ${report.test_boot.matched}`).to.not.equal(null);
    // The interface is renamed to what the virtio NIC is called on KVM (in Ferry's layout, where the test boot
    // puts it) and comes up configured as before, with its static address.
    expect(m![1]).to.equal(kvmNicName(0));
    const consoleText = readFileSync(report.test_boot.console_log, 'latin1');
    expect(consoleText).to.match(g.ready);
    expect(consoleText).to.match(new RegExp(`virtio_net \\S+ ${kvmNicName(0)}: renamed from eth0`));
  });
}

describe('Ferry on the real Debian 12 guest: the output boots on virtio', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the fixture first
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guest-repair-'));
  let stack: Awaited<ReturnType<typeof startStack>> | undefined;
  let gw: Awaited<ReturnType<typeof startStack>>['gw'];

  before(async () => {
    // The cached fixture lies outside the default storage roots (the temp dir, /srv): the job may read it.
    // Two job slots: the variants' migrate jobs run side by side (below).
    stack = await startStack('guest-worker', ['img_tool', 'mount_operations'], { FERRY_INPUT_ROOTS: [os.tmpdir(), GUEST_CACHE].join(':'), FERRY_WORKER_CONCURRENCY: '2' });
    gw = stack.gw;
  });
  after(async () => {
    await stack?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  /** The two base variants (each layer on the plain disk has its own file in test/guest/). */
  type BiosVariant = Extract<DebianVariant, 'plain' | 'lvm'>;
  const ENTRIES: Record<BiosVariant, ('cli' | 'job')[]> = { plain: ['cli', 'job'], lvm: ['job'] };
  /** One variant end to end: the conversions, the boots judged, the read-back. Throws on the first failed check. */
  async function convertAndCheck(variant: BiosVariant) {
    const entries = ENTRIES[variant];
    const g = await ensureDebianGuest(variant);
    const before = await sha256File(g.vmdk);
    const cliOut = path.join(dir, `${variant}-cli`);
    const jobOut = path.join(dir, `${variant}-job`);
    const cfg = path.join(cliOut, 'ferry.yaml');
    const withCli = entries.includes('cli');
    if (withCli) {
      mkdirSync(cliOut, { recursive: true });
      writeFileSync(cfg, yaml.dump({
        command: 'local', vmdk: g.vmdk, output_dir: cliOut, to_output: `${variant}.qcow2`, fstab_mode: 'stabilize-all', update_grub: true, regen_initramfs: true,
        remove_source_hv_tools: true, virt_test: true, virt_test_expect: g.ready.source, virt_test_timeout: BOOT_TIMEOUT, memory: 1024,
      }));
    }
    const jobId = `guest-${variant}`;
    const manifest = {
      manifest_version: '1.0', source: { provider: 'test', vm_name: `debian-${variant}` },
      disks: [{ id: 'root', source_format: 'vmdk', bytes: (await imageInfo(g.vmdk, 'vmdk'))['virtual-size'], local_path: g.vmdk, boot_order_hint: 0, disk_type: 'boot' }],
      pipeline: { inspect: { enabled: true }, convert: { enabled: true }, fix: { enabled: true, fstab_mode: 'stabilize-all', update_grub: true, regen_initramfs: true, remove_source_hv_tools: true }, validate: { enabled: true } },
      output: { directory: jobOut, format: 'qcow2', filename: `${variant}.qcow2` },
    };
    const job = (async () => {
      const sub = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: jobId, operation: 'migrate', parameters: { manifest, virt_test: { expect: g.ready.source, timeout_seconds: BOOT_TIMEOUT, memory_mib: 1024 } } });
      expect(sub.status, sub.text).to.equal(201);
      return until(async () => { const j = (await req(gw.url, 'GET', `/jobs/${jobId}`)).body; return ['COMPLETED', 'FAILED', 'CANCELLED'].includes(j.state) && j; }, 40 * 60_000, `job ${jobId} finished`);
    })();
    const [cli, final] = await Promise.all([withCli ? ferryConvert(['--config', cfg]) : null, job]);

    const reports = [];
    if (cli) {
      const cliReport = JSON.parse(readFileSync(path.join(cliOut, 'report.json'), 'utf8'));
      expectBooted(`${variant}-cli`, g, cliReport);
      expect(cli.code, cli.stderr).to.equal(0);
      expect(cliReport.success).to.equal(true);
      reports.push(cliReport);
    }
    const jobReport = JSON.parse(readFileSync(path.join(jobOut, 'report.json'), 'utf8'));
    expectBooted(`${variant}-job`, g, jobReport);
    expect(final.state, JSON.stringify(final.error || final.result?.errors)).to.equal('COMPLETED');
    reports.push(jobReport);

    // What the reports say held at the end, read back by Ferry itself: every check done, none failed.
    for (const r of reports) {
      const verify = (r.stages.fix.result.actions as any[]).filter((a) => a.action === 'verify');
      expect(verify.filter((a) => a.status !== 'done').map((a) => a.detail)).to.deep.equal([]);
      expect(verify.map((a) => a.check)).to.include.members(['/etc/fstab', '/etc/default/grub', '/boot/grub/grub.cfg', 'source hypervisor tools']);
    }

    // Read back independently: one read-only appliance with every output (LVM: one disk's volume group at a time).
    const outs = entries.map((e) => path.join(e === 'cli' ? cliOut : jobOut, `${variant}.qcow2`));
    const s = await GuestSession.open(outs.map((p) => ({ path: p, format: 'qcow2' })), { readonly: true });
    try {
      for (const [i, dev] of ['/dev/sda', '/dev/sdb'].slice(0, outs.length).entries()) {
        if (variant === 'lvm') { await s.cmd('lvm-set-filter', dev); await s.cmd('vg-activate-all', 'true'); }
        const root = variant === 'lvm' ? '/dev/vgferry/root' : `${dev}1`;
        await s.cmd('mount-ro', root, '/');
        if (variant === 'lvm') await s.cmd('mount-ro', `${dev}1`, '/boot');
        const status = await s.read('/var/lib/dpkg/status');
        expect(status, outs[i]).not.to.match(/^Package: open-vm-tools\nStatus: install ok installed/m);
        expect(await s.tryCmd('is-symlink', '/etc/systemd/system/multi-user.target.wants/open-vm-tools.service')).to.not.match(/true/);
        const fstab = await s.read('/etc/fstab');
        expect(fstab, outs[i]).not.to.match(/^\/dev\/sd/m);
        const grubCfg = await s.read('/boot/grub/grub.cfg');
        expect(grubCfg, outs[i]).not.to.match(/root=\/dev\/sd/);
        expect(grubCfg).to.match(variant === 'lvm' ? /root=\/dev\/mapper\/vgferry-root/ : /root=UUID=[0-9a-f-]{36}/);
        expect(await s.read('/etc/default/grub')).not.to.match(/^GRUB_DISABLE_LINUX_UUID=true/m);
        const ifaces = await s.read('/etc/network/interfaces');
        expect(ifaces).to.match(new RegExp(`iface ${kvmNicName(0)} inet static`));
        expect(ifaces).not.to.contain(g.vmwareNic);
        // The original is kept in Ferry's backup tree, not beside the file where ifupdown or initscripts would read it.
        expect(await s.read('/ferry-backup/etc/network/interfaces')).to.match(new RegExp(`iface ${g.vmwareNic} inet static`));
        expect(s.lines(await s.cmd('ls', '/etc/network')).filter((f) => f.includes('ferry-backup'))).to.deep.equal([]);
        const links = s.lines(await s.cmd('ls', '/etc/systemd/network'));
        expect(links).to.include(`10-ferry-${kvmNicName(0)}.link`);
        await s.cmd('umount-all');
        // The next disk's filter replaces this one (clearing it would activate both copies of the same VG at once).
        if (variant === 'lvm') await s.cmd('vg-activate-all', 'false');
      }
    } finally { await s.close(); }

    expect(await sha256File(g.vmdk), 'the source VMDK is byte-identical').to.equal(before);
  }

  // Both variants run side by side (three pipelines and boots on the machine at once, where one after the other
  // took over 7 minutes of a suite held under 25); each test waits for its own. A failure is kept for its test,
  // not raised as an unhandled rejection while the other runs.
  const VARIANTS: BiosVariant[] = ['plain', 'lvm'];
  const runs = new Map<BiosVariant, Promise<void>>();
  /** Starts every variant on first use (the hooks have run by then) and gives this variant's run. */
  const run = (variant: BiosVariant) => {
    if (!runs.size) for (const v of VARIANTS) { const r = convertAndCheck(v); r.catch(() => undefined); runs.set(v, r); } // each is awaited by its test; this catch only keeps an early rejection from being unhandled meanwhile
    return runs.get(variant)!;
  };
  for (const variant of VARIANTS) {
    const how = ENTRIES[variant].length === 2 ? 'ferry-convert and a migrate job each make an output' : 'a migrate job makes an output';
    it(`${variant}: ${how} that boots on virtio-blk with its network as before; open-vm-tools gone; source unchanged`, async () => {
      await run(variant);
    });
  }
});
