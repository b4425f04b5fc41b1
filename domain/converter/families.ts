// The converter's families (steps.ts): Linux (linux/index.ts) and Windows (below). familyFor picks the family of an
// inspected guest, refusing by name one no family handles; fixGuest (guest.ts) runs its list;
// `ferry-convert --explain` prints the lists (explainSteps).
import type { ConverterFamily, ConverterStep } from './steps';
import type { GuestInfo } from './types';
import { LINUX } from './linux';
import { injectVirtioDrivers } from './windows';
import { CHECK_SUPPORTED, osOf, unsupportedReason } from './prechecks';
import { UnsupportedGuest } from './errors';

const WINDOWS_STEPS: ConverterStep[] = [
  CHECK_SUPPORTED,
  { name: 'inject_virtio_drivers', does: 'copies the virtio drivers (virtio-win) into the guest and registers them so Windows boots from a virtio disk',
    run: async ({ g, info, o, r, act }) => { if (o.inject_virtio_drivers) r.modified = await injectVirtioDrivers(g, info.root_device, o, act); } },
  { name: 'linux_fixes', does: 'records that fstab, GRUB and initramfs repairs do not apply to Windows',
    run: ({ act }) => { act({ action: 'linux_fixes', status: 'skipped', detail: 'the guest is Windows: fstab, grub and initramfs repairs do not apply' }); } },
  { name: 'sync', does: 'flushes the guest\'s writes to the disk',
    run: async ({ g, r }) => { if (r.modified) await g.cmd('sync'); } },
];

export const WINDOWS: ConverterFamily = { os: 'windows', title: 'Windows', steps: WINDOWS_STEPS };
export const FAMILIES: ConverterFamily[] = [LINUX, WINDOWS];

/** The family whose steps repair this guest; an UnsupportedGuest (a guest fault, not retried) when none does. */
export function familyFor(info: GuestInfo): ConverterFamily {
  const why = unsupportedReason(info);
  const family = FAMILIES.find((f) => f.os === info.os);
  if (why || !family) throw new UnsupportedGuest(osOf(info), why ?? `no converter family for "${info.os}"`);
  return family;
}

/** The families' step lists as text, in the order they run: `ferry-convert --explain [--os linux|windows]`. */
export function explainSteps(os?: string): string {
  const out: string[] = [];
  for (const f of FAMILIES.filter((x) => !os || x.os === os)) {
    out.push(`${f.title} (${f.steps.length} steps, in order):`);
    f.steps.forEach((s, i) => out.push(`${String(i + 1).padStart(3)}. ${s.name}${s.precheck ? ' [pre-check]' : ''}: ${s.does}`));
  }
  return out.join('\n') + '\n';
}
