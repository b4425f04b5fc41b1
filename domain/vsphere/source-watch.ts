// Detecting a source VM that changes while its disks are copied: a snapshot taken or removed, a disk added,
// removed or grown, the VM powered on. Any of these makes the copy a mix of two states, so the export fails with
// the reason instead (docs/plans.md, "Guarding the source"). The VM is read again every
// FERRY_SOURCE_CHECK_SECONDS (default 5) while the files download, and once more after the last byte.
import type { Manager } from './client';
import { VsphereError } from './errors';
import { vmDetail, type VmDetail, type VmSnapshot } from './inventory';
import type { Logger } from '../../platform/log';
import { setting } from '../../platform/settings';

export interface SourceFingerprint { power_state: string; snapshots: string[]; current_snapshot: string | null; disks: Record<string, number> }

const ids = (l: VmSnapshot[]): string[] => l.flatMap((s) => [s.id || s.name, ...ids(s.children)]);

export const fingerprint = (d: VmDetail): SourceFingerprint => ({
  power_state: d.power_state, snapshots: ids(d.snapshots).sort(), current_snapshot: d.current_snapshot,
  disks: Object.fromEntries(d.disks.map((x) => [x.label, x.capacity_bytes])),
});

/** What changed between two readings of the VM, in words, or null. */
export function sourceChange(was: SourceFingerprint, now: SourceFingerprint): string | null {
  const out: string[] = [];
  if (now.power_state !== was.power_state) out.push(`it was powered on (${was.power_state} -> ${now.power_state})`);
  const added = now.snapshots.filter((s) => !was.snapshots.includes(s)).length;
  const removed = was.snapshots.filter((s) => !now.snapshots.includes(s)).length;
  if (added) out.push(`${added} new snapshot(s) were taken`);
  if (removed) out.push(`${removed} snapshot(s) were removed`);
  if (!added && !removed && now.current_snapshot !== was.current_snapshot) out.push('it was reverted to another snapshot');
  for (const [label, bytes] of Object.entries(now.disks)) {
    if (!(label in was.disks)) out.push(`${label} was added`);
    else if (was.disks[label] !== bytes) out.push(`${label} changed size (${was.disks[label]} -> ${bytes} bytes)`);
  }
  for (const label of Object.keys(was.disks)) if (!(label in now.disks)) out.push(`${label} was removed`);
  return out.length ? out.join('; ') : null;
}

export const sourceCheckMs = () => setting('FERRY_SOURCE_CHECK_SECONDS') * 1000;

/** Watches the VM from `was` on: `signal` aborts (with the reason) the moment a reading differs; `final()` reads
 *  once more and throws when anything changed. A reading that fails is logged and the next one tries again. */
export function watchSource(m: Manager, vmPath: string, was: SourceFingerprint, outer: AbortSignal, log?: Pick<Logger, 'warn'>) {
  const ac = new AbortController();
  const onOuter = () => ac.abort(outer.reason);
  outer.addEventListener('abort', onOuter, { once: true });
  let changed: string | null = null;
  const check = async () => {
    const why = sourceChange(was, fingerprint(await vmDetail(m, vmPath)));
    if (why && !changed) { changed = why; ac.abort(new VsphereError('state', refusal(vmPath, why))); }
  };
  const timer = setInterval(() => {
    check().catch((e) => log?.warn('the source check could not read the VM; the next check tries again', { vm_path: vmPath, error: (e as Error).message }));
  }, sourceCheckMs());
  timer.unref();
  const stop = () => { clearInterval(timer); outer.removeEventListener('abort', onOuter); };
  return {
    signal: ac.signal,
    get changed() { return changed; },
    stop,
    final: async () => { stop(); await check(); if (changed) throw new VsphereError('state', refusal(vmPath, changed)); },
  };
}

const refusal = (vmPath: string, why: string) => `the source ${vmPath} changed while its disks were copied: ${why}; `
  + 'the copy would mix two states, so this VM fails (run it again once the source is as it should be)';
