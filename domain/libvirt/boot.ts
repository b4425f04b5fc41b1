// Boots disks once in a transient libvirt domain and yields its serial console text: virt_test on the
// virtualization host. The disks are attached <transient/> (QEMU writes to a throw-away overlay), so testing never
// changes them; the domain is destroyed when the caller stops reading or the domain ends by itself.
import { randomBytes } from 'node:crypto';
import { buildXml } from './xml';
import { withXmlFile } from './domains';
import { domainType } from './import';
import { openConsole } from './console';
import { Virsh } from './virsh';
import { expectedError } from '../../platform/log';

export interface BootSpec { disks: { path: string; format: string }[]; name?: string; memoryMiB?: number; vcpus?: number; firmware?: 'bios' | 'uefi';
  signal?: AbortSignal }
export interface BootEnd { ended: 'stopped' | 'caller'; domain: string; domain_type: string }

export async function* bootDomain(v: Virsh, s: BootSpec): AsyncGenerator<string, BootEnd, undefined> {
  const name = s.name || `ferry-virt-test-${randomBytes(4).toString('hex')}`;
  const type = await domainType(v);
  const letters = 'abcdefghijklmnopqrstuvwxyz';
  const doc = { domain: {
    '@_type': type, name, memory: { '@_unit': 'MiB', '#text': String(s.memoryMiB || 1024) }, vcpu: String(s.vcpus || 1),
    // UEFI without Secure Boot, as the import defines it (import.ts); a transient domain gets a fresh NVRAM.
    os: { ...(s.firmware === 'uefi' ? { '@_firmware': 'efi', firmware: {
      feature: [{ '@_enabled': 'no', '@_name': 'secure-boot' }, { '@_enabled': 'no', '@_name': 'enrolled-keys' }] } } : {}),
      type: { '@_arch': 'x86_64', '@_machine': 'pc', '#text': 'hvm' }, boot: { '@_dev': 'hd' }, bios: { '@_rebootTimeout': '1000' } },
    // A reset ends the test (no bootable disk makes SeaBIOS reset after rebootTimeout).
    on_poweroff: 'destroy', on_reboot: 'destroy', on_crash: 'destroy',
    devices: {
      disk: s.disks.map((d, i) => ({ '@_type': 'file', '@_device': 'disk', driver: { '@_name': 'qemu', '@_type': d.format }, source: { '@_file': d.path },
        target: { '@_dev': `vd${letters[i]}`, '@_bus': 'virtio' }, transient: '' })),
      serial: { '@_type': 'pty', target: { '@_port': '0' } }, console: { '@_type': 'pty', target: { '@_type': 'serial', '@_port': '0' } },
      memballoon: { '@_model': 'none' },
    },
  } };
  await withXmlFile(buildXml(doc), (f) => v.run(['create', f, '--paused']));
  try {
    const ended = yield* watchFromStart(v, name, s.signal);
    return { ended, domain: name, domain_type: type };
  } finally {
    await v.run(['destroy', name]).catch(expectedError('the domain is already gone when it stopped by itself', { domain: name }));
  }
}

/**
 * The console of a domain that is defined or created paused, from its first instruction: the console is
 * attached, then the domain resumed, so nothing the guest prints is missed. Yields the console text until the
 * domain stops ('stopped') or the caller stops reading or aborts ('caller'); the domain is left as it is.
 */
export async function* watchFromStart(v: Virsh, name: string, signal?: AbortSignal): AsyncGenerator<string, 'stopped' | 'caller', undefined> {
  const con = openConsole(v, name);
  const queue: string[] = [];
  let closed = false;
  let wake: (() => void) | undefined;
  con.on('data', (t: string) => { queue.push(t); wake?.(); });
  con.on('close', () => { closed = true; wake?.(); });
  const attached = new Promise<void>((r) => { con.once('ready', r); con.once('close', r); });
  let aborted = false;
  const onAbort = () => { aborted = true; wake?.(); };
  signal?.addEventListener('abort', onAbort, { once: true });
  try {
    await attached;
    await v.run(['resume', name]);
    for (;;) {
      while (queue.length) yield queue.shift()!;
      if (aborted) return 'caller';
      if (closed) return 'stopped';
      await new Promise<void>((r) => { wake = r; });
      wake = undefined;
    }
  } finally {
    signal?.removeEventListener('abort', onAbort);
    con.close();
  }
}
