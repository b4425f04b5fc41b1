// virt_test: boot the converted disks once on this host to see that they start on KVM's virtual hardware
// (q35, virtio-blk disks, virtio-net, BIOS or UEFI firmware as the guest needs: firmware.ts). The disks are opened with snapshot=on: every write of the test
// boot goes to a throw-away overlay, so the output a migration produced is never changed by testing it.
// qemu runs directly (no libvirt needed), with KVM when usable, otherwise TCG (slow, but it boots).
import { spawn } from 'node:child_process';
import { copyFileSync, createWriteStream, mkdtempSync, rmSync, WriteStream } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { kvmUsable } from './guestfs';
import { bootDomain, Virsh } from '../libvirt';
import { judgeAdded, printableConsole, timeoutVerdict } from './boot-judge';
import { OVMF_CODE, OVMF_VARS } from './firmware';
import type { Firmware } from './types';
import { setting } from '../../platform/settings';

export interface TestBootOptions {
  /** Disks in boot order; the first is the boot disk. `bus` puts one disk on another controller than `bus` below
   *  (qemu runner only): `pvscsi` is VMware's paravirtual SCSI, where VMware guests often keep data disks. */
  disks: { path: string; format: string; bus?: 'pvscsi' }[];
  name?: string; memoryMiB?: number; vcpus?: number;
  /** Serial-console text that proves the guest came up. When given, no match by the timeout is `failed`. */
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
  /** MAC address of the NIC (the VM's own, as it will have on KVM); qemu's default otherwise. */
  mac?: string;
  /** Boot on this libvirt host (a transient domain) instead of FERRY_LIBVIRT_URI or qemu here. */
  virtUri?: string;
  /** Also write the whole serial console to this file (kept beside the outputs, or as a test's artifact). */
  consoleLog?: string;
  /** `bios` (SeaBIOS; the default) or `uefi` (OVMF without Secure Boot, with a fresh NVRAM from its template). */
  firmware?: Firmware;
  /** UEFI: boot with a copy of this NVRAM (a VM's own variables) instead of the template (qemu runner only). */
  nvram?: string;
  /** Write to the disks themselves, not to a throw-away snapshot (qemu runner only): for a caller's own overlay
   *  whose writes a later boot must see (the guest tests' second boot). Never on a migration's output. */
  persist?: boolean;
}

export interface TestBootResult {
  /** passed: the console showed `expect`; failed: the console showed a failed boot (boot-judge.ts: the
   *  initramfs shell, a kernel panic, emergency mode, a GRUB prompt, the UEFI shell; judged at once), the VM
   *  stopped by itself (no bootable disk, reset, crash), could not start, `expect` was given and never showed, or
   *  the console showed no boot milestone at all by the timeout; inconclusive: only with the default milestones,
   *  still running at the timeout and visibly running userspace, with nothing matched (boot-judge.ts
   *  timeoutVerdict; the detail says what the console showed). */
  status: 'passed' | 'failed' | 'inconclusive';
  detail: string; seconds: number; accelerator: 'kvm' | 'tcg'; matched?: string; console_tail: string;
  /** The firmware the VM booted with. */
  firmware: Firmware;
}

/** Linux milestones on a serial console that only a booted system prints (systemd's multi-user target, a getty's
 *  login prompt). Not the kernel banner or systemd's welcome line: the initramfs prints those too. */
export const DEFAULT_EXPECT = /\slogin: |Reached target[^\n]*(?:Multi-User System|Graphical Interface)/;
const QEMU = setting('FERRY_QEMU_SYSTEM');

/** With a libvirt URI (the option `virtUri`, else FERRY_LIBVIRT_URI) the boot runs on the virtualization host as
 *  a transient libvirt domain (domain/libvirt/boot.ts); otherwise, or for VMware-shaped hardware, qemu runs here. */
export function testBoot(o: TestBootOptions): Promise<TestBootResult> {
  const uri = o.virtUri || setting('FERRY_LIBVIRT_URI');
  // VMware's hardware (a SATA disk, a NIC in a given slot or model) is the qemu runner's alone.
  const vmwareShaped = (o.bus && o.bus !== 'virtio') || (o.nic && o.nic !== 'virtio') || o.nicSlot !== undefined;
  return againAfterTimerPanic(() => (uri && !vmwareShaped ? testBootLibvirt(o, new Virsh(uri)) : testBootQemu(o)));
}

/** What an emulated kernel prints when a busy host delays its boot-time timer check: the guest is fine, the host
 *  was slow (TCG only; KVM's timer never misses it). */
export const TCG_TIMER_PANIC = /IO-APIC \+ timer doesn't work/;

/** Runs `boot`, and once more when an emulated boot failed only on TCG_TIMER_PANIC; the result says so. */
export async function againAfterTimerPanic(boot: () => Promise<TestBootResult>): Promise<TestBootResult> {
  const first = await boot();
  if (first.status !== 'failed' || first.accelerator !== 'tcg' || !TCG_TIMER_PANIC.test(`${first.detail}\n${first.console_tail}`)) return first;
  const again = await boot();
  return {
    ...again,
    detail: `${again.detail} (the second boot: the first panicked in the kernel's timer check, "IO-APIC + timer doesn't work!", `
      + 'which a busy host causes under emulation)',
  };
}

/** A domain's console text from its first instruction, ending with the domain's type (kvm or qemu). */
export type ConsoleSource = (signal: AbortSignal) => AsyncGenerator<string, { domain_type: string }, undefined>;

/** The same judgement (boot-judge.ts) over the console text of a transient libvirt domain, removed afterwards
 *  (or of any domain's first start, given its console as `boot`).
 *  The libvirt domain has virtio disks and no NIC options: `bus`, `nic`, `nicSlot` and `mac` are qemu-runner only. */
/** Ends the console log and waits until it is on disk: whoever reads it after the boot must see all of it
 *  (a reader right after end() found the file without its last lines). */
function closeLog(log: WriteStream | undefined): Promise<void> {
  return log ? new Promise((resolve) => log.end(() => resolve())) : Promise.resolve();
}

export async function testBootLibvirt(
  o: TestBootOptions, v: Virsh,
  boot: ConsoleSource = (signal) => bootDomain(v, {
    disks: o.disks, name: o.name ? `${o.name}-${Date.now().toString(36)}` : undefined,
    memoryMiB: o.memoryMiB || 1024, vcpus: o.vcpus, firmware: o.firmware, signal,
  }),
): Promise<TestBootResult> {
  const firmware = o.firmware || 'bios';
  const expect = o.expect || DEFAULT_EXPECT;
  const strict = !!o.expect;
  const timeout = (o.timeoutSeconds ?? 300) * 1000;
  const t0 = Date.now();
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), timeout);
  const onAbort = () => stop.abort();
  o.signal?.addEventListener('abort', onAbort, { once: true });
  const log = o.consoleLog ? createWriteStream(o.consoleLog) : undefined;
  let serial = '';
  let r: Omit<TestBootResult, 'seconds' | 'accelerator' | 'console_tail' | 'firmware'> | undefined;
  let accelerator: 'kvm' | 'tcg' = 'tcg';
  try {
    const con = boot(stop.signal);
    for (;;) {
      const next = await con.next();
      if (next.done) {
        accelerator = next.value.domain_type === 'kvm' ? 'kvm' : 'tcg';
        if (o.signal?.aborted) r = { status: 'failed', detail: 'aborted' };
        else if (stop.signal.aborted) r = timeoutVerdict(serial, expect, strict, timeout / 1000, firmware);
        else {
          r = {
            status: 'failed',
            detail: 'the domain stopped by itself before the console showed a boot milestone (a reset: no bootable disk, or the guest crashed)',
          };
        }
        break;
      }
      log?.write(next.value);
      serial = (serial + next.value).slice(-65536);
      const verdict = judgeAdded(serial, next.value.length, expect);
      if (verdict.status !== 'running') { r = verdict; await con.return(undefined as never); break; }
    }
  } catch (e) {
    r = { status: 'failed', detail: `the libvirt test domain could not run on ${v.uri}: ${(e as Error).message}` };
  } finally {
    clearTimeout(timer);
    await closeLog(log);
    o.signal?.removeEventListener('abort', onAbort);
  }
  return { ...r, seconds: (Date.now() - t0) / 1000, accelerator, firmware, console_tail: printableConsole(serial).slice(-2000) };
}

/** UEFI: OVMF's code read-only and a private copy of the NVRAM (the template, or the VM's own), removed by
 *  `cleanup`; BIOS: nothing (qemu's SeaBIOS). */
function firmwareArgs(o: TestBootOptions): { args: string[]; cleanup: () => void } {
  if (o.firmware !== 'uefi') return { args: [], cleanup: () => { /* BIOS: no NVRAM copy to remove */ } };
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-nvram-'));
  const vars = path.join(dir, 'VARS.fd');
  copyFileSync(o.nvram || OVMF_VARS, vars);
  return {
    args: ['-drive', `if=pflash,format=raw,unit=0,readonly=on,file=${OVMF_CODE.replace(/,/g, ',,')}`, '-drive', `if=pflash,format=raw,unit=1,file=${vars.replace(/,/g, ',,')}`],
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}

export function testBootQemu(o: TestBootOptions): Promise<TestBootResult> {
  const accel = kvmUsable() ? 'kvm' : 'tcg';
  const firmware = o.firmware || 'bios';
  const fw = firmwareArgs(o);
  const expect = o.expect || DEFAULT_EXPECT;
  const strict = !!o.expect;
  const timeout = (o.timeoutSeconds ?? 300) * 1000;
  const nicModel = { virtio: 'virtio-net-pci', vmxnet3: 'vmxnet3', e1000: 'e1000' }[o.nic || 'virtio'];
  const nic = `${nicModel},netdev=n0${o.mac ? `,mac=${o.mac}` : ''}`;
  const args = [
    // q35, as the libvirt import defines its domains: the NIC sits where the import puts NIC 0 (alone behind PCIe
    // root port 1), so the guest names it what it will be called after the import (nic-names.ts kvmNicName).
    '-name', o.name || 'ferry-virt-test', '-machine', `q35,accel=${accel}`,
    // Native PCIe hotplug (pciehp) registers the root port's physical slot number, which names the NIC; with qemu's
    // ACPI hotplug the slot would be ACPI's instead.
    ...(o.nicSlot === undefined ? [] : ['-global', 'ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off']),
    '-m', String(o.memoryMiB || 1024), '-smp', String(o.vcpus || 1),
    '-nodefaults', '-display', 'none', '-monitor', 'none', '-serial', 'stdio', ...fw.args,
    // A reset ends qemu (-no-reboot), and with no bootable disk SeaBIOS resets after 1 s instead of 60.
    '-no-reboot', '-boot', 'strict=on,reboot-timeout=1000',
    '-netdev', 'user,id=n0,restrict=on',
    '-device', `pcie-root-port,id=rp0,chassis=1${o.nicSlot === undefined ? '' : `,slot=${o.nicSlot}`}`, '-device', `${nic},bus=rp0`,
    ...(o.bus === 'sata' ? ['-device', 'ahci,id=ahci0'] : []),
    ...(o.disks.some((d) => d.bus === 'pvscsi') ? ['-device', 'pvscsi,id=scsi0'] : []),
    ...o.disks.flatMap((d, i) => {
      const file = `file=${d.path.replace(/,/g, ',,')},format=${d.format}${o.persist ? '' : ',snapshot=on'}`;
      if (d.bus === 'pvscsi') return ['-drive', `${file},if=none,id=d${i}`, '-device', `scsi-hd,drive=d${i},bus=scsi0.0,scsi-id=${i}`];
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
    let outcome: Omit<TestBootResult, 'seconds' | 'accelerator' | 'console_tail' | 'firmware'> | undefined;
    const stop = (r: typeof outcome) => { if (!outcome) { outcome = r; child.kill('SIGKILL'); } };
    const timer = setTimeout(() => stop(timeoutVerdict(serial, expect, strict, timeout / 1000, firmware)), timeout);
    const onAbort = () => stop({ status: 'failed', detail: 'aborted' });
    o.signal?.addEventListener('abort', onAbort, { once: true });
    const log = o.consoleLog ? createWriteStream(o.consoleLog) : undefined;
    child.stdout.setEncoding('latin1').on('data', (s: string) => {
      log?.write(s, 'latin1');
      serial = (serial + s).slice(-65536);
      const v = judgeAdded(serial, s.length, expect);
      if (v.status !== 'running') stop(v);
    });
    child.stderr.setEncoding('utf8').on('data', (s: string) => { if (stderr.length < 8192) stderr += s; });
    child.on('error', (e: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      fw.cleanup();
      reject(e.code === 'ENOENT' ? new Error(`${QEMU} is not installed (Debian qemu-system-x86)`) : e);
    });
    child.on('close', (code, sig) => {
      clearTimeout(timer);
      fw.cleanup();
      o.signal?.removeEventListener('abort', onAbort);
      // The console log is closed before the outcome is given, so a caller reads it whole.
      closeLog(log).then(() => settle(code, sig), reject);
    });
    const settle = (code: number | null, sig: NodeJS.Signals | null) => {
      const r = outcome || {
        status: 'failed' as const,
        detail: code === 0
          ? 'the VM stopped by itself before the console showed a boot milestone (a reset: no bootable disk, or the guest crashed)'
          : `qemu failed (${sig || `exit ${code}`}): ${stderr.trim().slice(0, 2000)}`,
      };
      const printable = printableConsole(serial);
      resolve({ ...r, seconds: (Date.now() - t0) / 1000, accelerator: accel, firmware, console_tail: printable.slice(-2000) });
    };
  });
}
