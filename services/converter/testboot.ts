// virt_test: boot the converted disks once on this host to see that they start on KVM's virtual hardware
// (virtio-blk disks, virtio-net, BIOS firmware). The disks are opened with snapshot=on: every write of the test
// boot goes to a throw-away overlay, so the output a migration produced is never changed by testing it.
// qemu runs directly (no libvirt needed), with KVM when usable, otherwise TCG (slow, but it boots).
import { spawn } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import { kvmUsable } from './guestfs';

export interface TestBootOptions {
  /** Disks in boot order; the first is the boot disk. */
  disks: { path: string; format: string }[];
  name?: string; memoryMiB?: number; vcpus?: number;
  /** Serial-console text that proves the guest came up. */
  expect?: RegExp;
  timeoutSeconds?: number;
  signal?: AbortSignal;
  /** Disk controller: `virtio` (virtio-blk, KVM's; the default) or `sata` (AHCI, as a VMware guest's SATA disk). */
  bus?: 'virtio' | 'sata';
  /** NIC model (default virtio-net-pci); `vmxnet3` is VMware's. */
  nic?: 'virtio' | 'vmxnet3' | 'e1000';
  /** Put the NIC behind a PCIe root port with this physical slot number (q35): the kernel then names it ens<slot>,
   *  as VMware's slot 192 makes `ens192`. */
  nicSlot?: number;
  mac?: string;
  /** Also write the whole serial console to this file (for a test's artifact). */
  consoleLog?: string;
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

export function testBoot(o: TestBootOptions): Promise<TestBootResult> {
  const accel = kvmUsable() ? 'kvm' : 'tcg';
  const expect = o.expect || DEFAULT_EXPECT;
  const timeout = (o.timeoutSeconds ?? 300) * 1000;
  const nicModel = { virtio: 'virtio-net-pci', vmxnet3: 'vmxnet3', e1000: 'e1000' }[o.nic || 'virtio'];
  const nic = `${nicModel},netdev=n0${o.mac ? `,mac=${o.mac}` : ''}`;
  const args = [
    '-name', o.name || 'ferry-virt-test', '-machine', `${o.nicSlot === undefined ? 'pc' : 'q35'},accel=${accel}`,
    // Native PCIe hotplug (pciehp) registers the root port's physical slot number, which names the NIC; with qemu's
    // ACPI hotplug the slot would be ACPI's instead.
    ...(o.nicSlot === undefined ? [] : ['-global', 'ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off']), '-m', String(o.memoryMiB || 1024), '-smp', String(o.vcpus || 1),
    '-nodefaults', '-display', 'none', '-monitor', 'none', '-serial', 'stdio',
    // A reset ends qemu (-no-reboot), and with no bootable disk SeaBIOS resets after 1 s instead of 60.
    '-no-reboot', '-boot', 'strict=on,reboot-timeout=1000',
    '-netdev', 'user,id=n0,restrict=on',
    ...(o.nicSlot === undefined ? ['-device', nic] : ['-device', `pcie-root-port,id=rp0,chassis=1,slot=${o.nicSlot}`, '-device', `${nic},bus=rp0`]),
    ...(o.bus === 'sata' ? ['-device', 'ahci,id=ahci0'] : []),
    ...o.disks.flatMap((d, i) => {
      const file = `file=${d.path.replace(/,/g, ',,')},format=${d.format},snapshot=on`;
      return o.bus === 'sata'
        ? ['-drive', `${file},if=none,id=d${i}`, '-device', `ide-hd,drive=d${i},bus=ahci0.${i}${i === 0 ? ',bootindex=0' : ''}`]
        : ['-drive', `${file},if=virtio,index=${i}`];
    }),
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
    const log = o.consoleLog ? createWriteStream(o.consoleLog) : undefined;
    child.stdout.setEncoding('latin1').on('data', (s: string) => {
      log?.write(s, 'latin1');
      serial = (serial + s).slice(-65536);
      const m = expect.exec(serial);
      if (m) stop({ status: 'passed', detail: `the serial console showed "${m[0]}"`, matched: m[0] });
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
      const printable = serial.replace(/\x1b\[[0-9;?]*[A-Za-z]/g, '').replace(/[^\x09\x0a\x20-\x7e]/g, '');
      resolve({ ...r, seconds: (Date.now() - t0) / 1000, accelerator: accel, console_tail: printable.slice(-2000) });
    });
  });
}
