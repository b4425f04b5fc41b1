// virt_test: boot the converted disks once on this host to see that they start on KVM's virtual hardware
// (virtio-blk disks, virtio-net, BIOS firmware). The disks are opened with snapshot=on: every write of the test
// boot goes to a throw-away overlay, so the output a migration produced is never changed by testing it.
// qemu runs directly (no libvirt needed), with KVM when usable, otherwise TCG (slow, but it boots).
import { spawn } from 'node:child_process';
import { kvmUsable } from './guestfs';
import { bootDomain, Virsh } from '../../shared/libvirt';

export interface TestBootOptions {
  /** Disks in boot order; the first is the boot disk. */
  disks: { path: string; format: string }[];
  name?: string; memoryMiB?: number; vcpus?: number;
  /** Serial-console text that proves the guest came up. */
  expect?: RegExp;
  timeoutSeconds?: number;
  signal?: AbortSignal;
}

export interface TestBootResult {
  /** passed: the console showed `expect`; failed: the VM stopped by itself (no bootable disk, reset, crash) or
   *  could not start; inconclusive: still running at the timeout with nothing matched (many guests do not log
   *  to a serial console). */
  status: 'passed' | 'failed' | 'inconclusive';
  detail: string; seconds: number; accelerator: 'kvm' | 'tcg'; matched?: string; console_tail: string;
}

/** Linux boot milestones on a serial console (kernel, systemd, getty). */
export const DEFAULT_EXPECT = /login:|Reached target|Welcome to|Linux version \d/;
const QEMU = process.env.FERRY_QEMU_SYSTEM || 'qemu-system-x86_64';

/** With a libvirt URI configured (FERRY_LIBVIRT_URI) the boot runs on the virtualization host as a transient
 *  libvirt domain (shared/libvirt/boot.ts); otherwise qemu runs here directly. */
export function testBoot(o: TestBootOptions): Promise<TestBootResult> {
  return process.env.FERRY_LIBVIRT_URI ? testBootLibvirt(o, new Virsh(process.env.FERRY_LIBVIRT_URI)) : testBootQemu(o);
}

const printable = (serial: string) => serial.replace(/\x1b\[[0-9;?]*[A-Za-z]/g, '').replace(/[^\x09\x0a\x20-\x7e]/g, '');

/** The same judgement over the console text of a transient libvirt domain (removed afterwards). */
export async function testBootLibvirt(o: TestBootOptions, v: Virsh): Promise<TestBootResult> {
  const expect = o.expect || DEFAULT_EXPECT;
  const timeout = (o.timeoutSeconds ?? 300) * 1000;
  const t0 = Date.now();
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), timeout);
  const onAbort = () => stop.abort();
  o.signal?.addEventListener('abort', onAbort, { once: true });
  let serial = '';
  let r: Omit<TestBootResult, 'seconds' | 'accelerator' | 'console_tail'> | undefined;
  let accelerator: 'kvm' | 'tcg' = 'tcg';
  try {
    const boot = bootDomain(v, { disks: o.disks, name: o.name ? `${o.name}-${Date.now().toString(36)}` : undefined, memoryMiB: o.memoryMiB || 1024, vcpus: o.vcpus, signal: stop.signal });
    for (;;) {
      const next = await boot.next();
      if (next.done) {
        accelerator = next.value.domain_type === 'kvm' ? 'kvm' : 'tcg';
        if (o.signal?.aborted) r = { status: 'failed', detail: 'aborted' };
        else if (stop.signal.aborted) r = { status: 'inconclusive', detail: `the domain was still running after ${timeout / 1000} s and its serial console showed nothing matching ${expect}` };
        else r = { status: 'failed', detail: 'the domain stopped by itself before the console showed a boot milestone (a reset: no bootable disk, or the guest crashed)' };
        break;
      }
      serial = (serial + next.value).slice(-65536);
      const m = expect.exec(serial);
      if (m) { r = { status: 'passed', detail: `the serial console showed "${m[0]}"`, matched: m[0] }; await boot.return(undefined as never); break; }
    }
  } catch (e) {
    r = { status: 'failed', detail: `the libvirt test domain could not run on ${v.uri}: ${(e as Error).message}` };
  } finally {
    clearTimeout(timer);
    o.signal?.removeEventListener('abort', onAbort);
  }
  return { ...r!, seconds: (Date.now() - t0) / 1000, accelerator, console_tail: printable(serial).slice(-2000) };
}

export function testBootQemu(o: TestBootOptions): Promise<TestBootResult> {
  const accel = kvmUsable() ? 'kvm' : 'tcg';
  const expect = o.expect || DEFAULT_EXPECT;
  const timeout = (o.timeoutSeconds ?? 300) * 1000;
  const args = [
    '-name', o.name || 'ferry-virt-test', '-machine', `pc,accel=${accel}`, '-m', String(o.memoryMiB || 1024), '-smp', String(o.vcpus || 1),
    '-nodefaults', '-display', 'none', '-monitor', 'none', '-serial', 'stdio',
    // A reset ends qemu (-no-reboot), and with no bootable disk SeaBIOS resets after 1 s instead of 60.
    '-no-reboot', '-boot', 'strict=on,reboot-timeout=1000',
    '-nic', 'user,model=virtio-net-pci,restrict=on',
    ...o.disks.flatMap((d, i) => ['-drive', `file=${d.path.replace(/,/g, ',,')},format=${d.format},if=virtio,snapshot=on,index=${i}`]),
  ];
  const t0 = Date.now();
  return new Promise((resolve, reject) => {
    const child = spawn(QEMU, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let serial = '';
    let stderr = '';
    let outcome: Omit<TestBootResult, 'seconds' | 'accelerator' | 'console_tail'> | undefined;
    const stop = (r: typeof outcome) => { if (!outcome) { outcome = r; child.kill('SIGKILL'); } };
    const timer = setTimeout(() => stop({ status: 'inconclusive', detail: `the VM was still running after ${timeout / 1000} s and its serial console showed nothing matching ${expect}` }), timeout);
    const onAbort = () => stop({ status: 'failed', detail: 'aborted' });
    o.signal?.addEventListener('abort', onAbort, { once: true });
    child.stdout.setEncoding('latin1').on('data', (s: string) => {
      serial = (serial + s).slice(-65536);
      const m = expect.exec(serial);
      if (m) stop({ status: 'passed', detail: `the serial console showed "${m[0]}"`, matched: m[0] });
    });
    child.stderr.setEncoding('utf8').on('data', (s: string) => { if (stderr.length < 8192) stderr += s; });
    child.on('error', (e: any) => { clearTimeout(timer); reject(e.code === 'ENOENT' ? new Error(`${QEMU} is not installed (Debian qemu-system-x86)`) : e); });
    child.on('close', (code, sig) => {
      clearTimeout(timer);
      o.signal?.removeEventListener('abort', onAbort);
      const r = outcome || {
        status: 'failed' as const,
        detail: code === 0
          ? 'the VM stopped by itself before the console showed a boot milestone (a reset: no bootable disk, or the guest crashed)'
          : `qemu failed (${sig || `exit ${code}`}): ${stderr.trim().slice(0, 2000)}`,
      };
      resolve({ ...r, seconds: (Date.now() - t0) / 1000, accelerator: accel, console_tail: printable(serial).slice(-2000) });
    });
  });
}
