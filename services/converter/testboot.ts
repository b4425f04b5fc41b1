// virt_test: boot the converted disks once on this host to see that they start on KVM's virtual hardware
// (virtio-blk disks, virtio-net, BIOS firmware). The disks are opened with snapshot=on: every write of the test
// boot goes to a throw-away overlay, so the output a migration produced is never changed by testing it.
// qemu runs directly (no libvirt needed), with KVM when usable, otherwise TCG (slow, but it boots).
import { spawn } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import { kvmUsable } from './guestfs';
import { judgeConsole, printableConsole } from './boot-judge';

export interface TestBootOptions {
  /** Disks in boot order; the first is the boot disk. */
  disks: { path: string; format: string }[];
  name?: string; memoryMiB?: number; vcpus?: number;
  /** Serial-console text that proves the guest came up. When given, no match by the timeout is `failed`. */
  expect?: RegExp;
  /** MAC address of the virtio NIC (the VM's own, as it will have on KVM); qemu's default otherwise. */
  mac?: string;
  /** Also write the whole serial console to this file (kept beside the outputs, or as a test's artifact). */
  consoleLog?: string;
  timeoutSeconds?: number;
  signal?: AbortSignal;
}

export interface TestBootResult {
  /** passed: the console showed `expect`; failed: the console showed a failed boot (boot-judge.ts: the
   *  initramfs shell, a kernel panic, emergency mode, a GRUB prompt; judged at once), the VM stopped by itself
   *  (no bootable disk, reset, crash), could not start, or `expect` was given and never showed; inconclusive:
   *  only with the default milestones, still running at the timeout with nothing matched (many guests do not
   *  log to a serial console). */
  status: 'passed' | 'failed' | 'inconclusive';
  detail: string; seconds: number; accelerator: 'kvm' | 'tcg'; matched?: string; console_tail: string;
}

/** Linux milestones on a serial console that only a booted system prints (systemd's multi-user target, a getty's
 *  login prompt). Not the kernel banner or systemd's welcome line: the initramfs prints those too. */
export const DEFAULT_EXPECT = /\slogin: |Reached target[^\n]*(?:Multi-User System|Graphical Interface)/;
const QEMU = process.env.FERRY_QEMU_SYSTEM || 'qemu-system-x86_64';

export function testBoot(o: TestBootOptions): Promise<TestBootResult> {
  const accel = kvmUsable() ? 'kvm' : 'tcg';
  const expect = o.expect || DEFAULT_EXPECT;
  const strict = !!o.expect;
  const timeout = (o.timeoutSeconds ?? 300) * 1000;
  const args = [
    '-name', o.name || 'ferry-virt-test', '-machine', `pc,accel=${accel}`, '-m', String(o.memoryMiB || 1024), '-smp', String(o.vcpus || 1),
    '-nodefaults', '-display', 'none', '-monitor', 'none', '-serial', 'stdio',
    // A reset ends qemu (-no-reboot), and with no bootable disk SeaBIOS resets after 1 s instead of 60.
    '-no-reboot', '-boot', 'strict=on,reboot-timeout=1000',
    '-nic', `user,model=virtio-net-pci,restrict=on${o.mac ? `,mac=${o.mac}` : ''}`,
    ...o.disks.flatMap((d, i) => ['-drive', `file=${d.path.replace(/,/g, ',,')},format=${d.format},if=virtio,snapshot=on,index=${i}`]),
  ];
  const t0 = Date.now();
  return new Promise((resolve, reject) => {
    const child = spawn(QEMU, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let serial = '';
    let stderr = '';
    let outcome: Omit<TestBootResult, 'seconds' | 'accelerator' | 'console_tail'> | undefined;
    const stop = (r: typeof outcome) => { if (!outcome) { outcome = r; child.kill('SIGKILL'); } };
    const timer = setTimeout(() => stop(strict
      ? { status: 'failed', detail: `the serial console did not show ${expect} within ${timeout / 1000} s (the VM was still running)` }
      : { status: 'inconclusive', detail: `the VM was still running after ${timeout / 1000} s and its serial console showed nothing matching ${expect}` }), timeout);
    const onAbort = () => stop({ status: 'failed', detail: 'aborted' });
    o.signal?.addEventListener('abort', onAbort, { once: true });
    const log = o.consoleLog ? createWriteStream(o.consoleLog) : undefined;
    child.stdout.setEncoding('latin1').on('data', (s: string) => {
      log?.write(s, 'latin1');
      serial = (serial + s).slice(-65536);
      const v = judgeConsole(serial, expect);
      if (v.status !== 'running') stop(v);
    });
    child.stderr.setEncoding('utf8').on('data', (s: string) => { if (stderr.length < 8192) stderr += s; });
    child.on('error', (e: any) => { clearTimeout(timer); reject(e.code === 'ENOENT' ? new Error(`${QEMU} is not installed (Debian qemu-system-x86)`) : e); });
    child.on('close', (code, sig) => {
      clearTimeout(timer);
      log?.end();
      o.signal?.removeEventListener('abort', onAbort);
      const r = outcome || {
        status: 'failed' as const,
        detail: code === 0
          ? 'the VM stopped by itself before the console showed a boot milestone (a reset: no bootable disk, or the guest crashed)'
          : `qemu failed (${sig || `exit ${code}`}): ${stderr.trim().slice(0, 2000)}`,
      };
      const printable = printableConsole(serial);
      resolve({ ...r, seconds: (Date.now() - t0) / 1000, accelerator: accel, console_tail: printable.slice(-2000) });
    });
  });
}
