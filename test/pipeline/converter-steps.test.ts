// The converter's shape (issue 35 item 4): one ordered list of named steps per OS family, printed by
// `ferry-convert --explain` in the order they run; an unsupported guest refused by name before any change, with a
// typed guest-fault error; the job runner retrying a migration only when the converter said its failure may pass.
// Appliance launches: one session that makes the unsupported guest (a copy of the tiny guest whose os-release says
// Void Linux) and repairs it, then one migrate job on it; the retryable job's launches are cut at 0.1 s (both jobs
// run side by side).
import { expect } from 'chai';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { GuestSession } from '../../domain/converter/guestfs';
import { fixGuest, inspectAndMount } from '../../domain/converter/guest';
import { familyFor } from '../../domain/converter/families';
import { UnsupportedGuest } from '../../domain/converter/errors';
import type { FixOptions, GuestInfo } from '../../domain/converter/types';
import type { PipelineReport } from '../../domain/converter/stages/report';
import { ensureTinyGuest, TINY_GUEST_BYTES } from '../fixtures/tiny-guest';
import { startStack } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';

const CLI = path.join(__dirname, '..', '..', 'services', 'converter', 'ferry-convert.js');
const LINUX_ORDER = ['check_supported', 'check_filesystems', 'check_free_space', 'inject_virtio_drivers', 'device_ids', 'xfs_regenerate_uuid', 'fstab', 'remove_source_hv_tools',
  'configuration', 'unpin_old_disk', 'nic_names', 'regen_initramfs', 'update_grub', 'uefi_fallback', 'verify', 'sync',
  'recheck_filesystems'];
const WINDOWS_ORDER = ['check_supported', 'inject_virtio_drivers', 'linux_fixes', 'sync'];
const TINY_FSTAB = '/dev/sda1 / ext4 errors=remount-ro 0 1\n';

/** `ferry-convert --explain ...`, not blocking: several runs of the command load side by side. */
const explain = (...args: string[]) => new Promise<{ status: number | null; stdout: string; stderr: string }>((resolve) => {
  const child = spawn(process.execPath, [CLI, '--explain', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => { stdout += d; });
  child.stderr.setEncoding('utf8').on('data', (d: string) => { stderr += d; });
  child.on('close', (status) => resolve({ status, stdout, stderr }));
});
/** The step names of each family section of --explain's output, in the order printed. */
function sections(out: string): Record<string, string[]> {
  const got: Record<string, string[]> = {};
  let cur = '';
  for (const l of out.split('\n')) {
    const head = /^(\w+) \(\d+ steps, in order\):$/.exec(l);
    const step = /^\s+\d+\. (\w+)( \[pre-check\])?: \S/.exec(l);
    if (head) got[cur = head[1]] = [];
    else if (step) got[cur].push(step[1]);
  }
  return got;
}

describe('the converter\'s steps per OS family: ferry-convert --explain', () => {
  let runs: Awaited<ReturnType<typeof explain>>[];
  // The three runs the tests read, side by side: each is a start of the command (seconds of module loading).
  before(async () => { runs = await Promise.all([explain(), explain('--os', 'windows'), explain('--os', 'beos')]); });

  it('prints the Linux and Windows steps in the order they run, pre-checks first, each with what it does', () => {
    const r = runs[0];
    expect(r.status, r.stderr).to.equal(0);
    expect(sections(r.stdout)).to.deep.equal({ Linux: LINUX_ORDER, Windows: WINDOWS_ORDER });
    expect(r.stdout).to.match(/^ {2}1\. check_supported \[pre-check\]: refuses, by name and before any change/m);
    expect(r.stdout).to.match(/^ {2}2\. check_filesystems \[pre-check\]: checks the file systems the repair writes on/m);
    expect(r.stdout).to.match(/^ {2}3\. check_free_space \[pre-check\]: reads the free space on \/ and \/boot/m);
  });

  it('--os picks one family; an unknown one is a usage error naming --os', () => {
    const [, w, bad] = runs;
    expect(w.status, w.stderr).to.equal(0);
    expect(sections(w.stdout)).to.deep.equal({ Windows: WINDOWS_ORDER });
    expect(bad.status).to.equal(2);
    expect(bad.stdout).to.equal('');
    expect(bad.stderr).to.equal('ferry-convert: --os: "beos" is not one of linux, windows\n');
  });

  it('a guest that is neither Linux nor Windows has no family: refused by name as a guest fault, not retryable', () => {
    const info: GuestInfo = { os: 'freebsd', distro: 'freebsd', version: '13.2', root_device: '/dev/sda2', mountpoints: {}, filesystems: {}, lvm: false, kernels: [], hypervisor_tools: [] };
    expect(() => familyFor(info)).to.throw(UnsupportedGuest, 'unsupported guest Freebsd 13.2 (freebsd): the converter\'s steps handle Linux and Windows guests, and this is "freebsd"; nothing in the guest was changed');
    expect(familyFor({ ...info, os: 'linux', distro: 'debian', package_format: 'deb' }).steps.map((s) => s.name)).to.deep.equal(LINUX_ORDER);
  });
});

describe('an unsupported guest is refused by name before any change; the job runner retries only what may pass @vm', function () {
  this.timeout(15 * 60 * 1000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-conv-steps-'));
  const voidDisk = path.join(dir, 'void.qcow2');
  let refused: unknown;
  let seen: { fstab: string; interfaces: string; backup: boolean; info: GuestInfo } | undefined;

  before(async () => {
    // The tiny guest (Debian 12) with Void Linux's os-release: libguestfs names it voidlinux, with xbps packages.
    const overlay = path.join(dir, 'void-overlay.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', '-b', await ensureTinyGuest(), '-F', 'vmdk', overlay]);
    const s = await GuestSession.open([{ path: overlay, format: 'qcow2' }]);
    try {
      await s.cmd('mount', '/dev/sda1', '/');
      await s.writeFile('/etc/os-release', 'NAME="Void"\nID="void"\nPRETTY_NAME="Void Linux"\n');
      await s.cmd('rm', '/etc/debian_version');
      await s.cmd('umount-all');
      const info = await inspectAndMount(s, false);
      refused = await fixGuest(s, info, { fstab_mode: 'stabilize-all', dry_run: false, backup: true, regen_initramfs: true, update_grub: true, remove_source_hv_tools: true } as FixOptions, () => undefined)
        .then(() => undefined, (e: unknown) => e); // the refusal is what the checks read
      seen = { fstab: await s.read('/etc/fstab'), interfaces: await s.read('/etc/network/interfaces'), backup: await s.exists('/ferry-backup'), info };
    } finally { await s.close(); }
    execFileSync('qemu-img', ['convert', '-q', '-f', 'qcow2', '-O', 'qcow2', overlay, voidDisk]);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('names the guest and why, as a guest fault (not retryable), and writes nothing: fstab, NIC and backups as they were', () => {
    expect(seen!.info).to.include({ os: 'linux', distro: 'voidlinux', package_format: 'xbps' });
    expect(refused).to.be.instanceOf(UnsupportedGuest);
    const e = refused as UnsupportedGuest;
    expect(e.message).to.equal('unsupported guest Voidlinux 0.0 (linux, Void Linux): the Linux steps know the deb, rpm, apk and pacman families, and this distribution uses Void Linux\'s xbps; nothing in the guest was changed');
    expect(e).to.include({ retryable: false, fault: 'guest', step: 'check_supported' });
    expect(seen!.fstab).to.equal(TINY_FSTAB);
    expect(seen!.interfaces).to.contain('allow-hotplug ens192');
    expect(seen!.backup).to.equal(false);
  });

  /** A migrate job (convert and repair) of the Void guest on a stack whose worker has `env`; its final record. */
  async function migrateJob(id: string, env: Record<string, string>, retries: number) {
    const stack = await startStack(`conv-${id}`, ['img_tool', 'mount_operations'], env);
    try {
      const out = path.join(dir, id);
      const manifest = {
        manifest_version: '1.0', source: { provider: 'test', vm_name: id },
        disks: [{ id: 'root', source_format: 'qcow2', bytes: TINY_GUEST_BYTES, local_path: voidDisk }],
        pipeline: { inspect: { enabled: true }, convert: { enabled: true }, fix: { enabled: true }, validate: { enabled: true } },
        output: { directory: out, format: 'qcow2', filename: 'root.qcow2' },
      };
      const sub = await req(stack.gw.url, 'POST', '/jobs?queue=true', { job_id: id, operation: 'migrate', parameters: { manifest }, execution_policy: { retry_count: retries } });
      expect(sub.status, sub.text).to.equal(201);
      const j = await until(async () => { const x = (await req<JobStatus>(stack.gw.url, 'GET', `/jobs/${id}`)).body; return ['FAILED', 'COMPLETED'].includes(x.state) && x; }, 10 * 60_000, `${id} finished`);
      const report = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as PipelineReport;
      return { j, report, placed: existsSync(path.join(out, 'root.qcow2')) };
    } finally { await stack.stop(); }
  }

  // Both jobs side by side, each on a stack of its own (the second's appliance launches end in 0.1 s); each test
  // reads its own job's outcome, and fails on its own if that job could not be run.
  let jobs: PromiseSettledResult<Awaited<ReturnType<typeof migrateJob>>>[];
  before(async () => { jobs = await Promise.allSettled([migrateJob('conv-void', {}, 2), migrateJob('conv-hang', { FERRY_GUESTFS_LAUNCH_SECONDS: '0.1' }, 1)]); });
  const outcome = (i: number) => { const r = jobs[i]; if (r.status === 'rejected') throw r.reason; return r.value; };

  it('a migrate job of it fails once, not retried though retry_count allows two more; report.json says guest fault at check_supported', () => {
    const { j, report, placed } = outcome(0);
    expect(j.state).to.equal('FAILED');
    expect(j.error).to.contain('fix: unsupported guest Voidlinux 0.0 (linux, Void Linux)');
    expect(j.state_history.filter((h) => h.state === 'RUNNING'), JSON.stringify(j.state_history)).to.have.length(1);
    expect(report).to.include({ success: false, retryable: false });
    expect(report.failures).to.have.length(1);
    expect(report.failures![0]).to.include({ retryable: false, fault: 'guest', step: 'check_supported' });
    expect(placed).to.equal(false);
  });

  it('a job whose appliance launch hangs (an appliance fault, retryable) is retried until its attempts run out', () => {
    const { j, report } = outcome(1);
    expect(j.state).to.equal('FAILED');
    expect(j.error).to.contain('the appliance gave no answer within 0.1 s of its launch');
    expect(j.state_history.filter((h) => h.state === 'RUNNING'), JSON.stringify(j.state_history)).to.have.length(2);
    expect(report).to.include({ success: false, retryable: true });
    expect(report.failures![0]).to.include({ retryable: true, fault: 'appliance' });
  });
});
