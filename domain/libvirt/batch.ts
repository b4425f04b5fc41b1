// Batch actions over many domains: each domain on its own (one failing never changes the others), at most
// FERRY_VIRT_BATCH_CONCURRENCY (default 4) at once, answered with the seed's batch result object.
import { checkName } from './names';
import { createSnapshot, domainState, listSnapshots } from './domains';
import { Virsh } from './virsh';
import { setting } from '../../platform/settings';

export interface BatchResult {
  operation: string; total: number; successful: number; failed: number;
  results: { domain: string; success: boolean; error?: string; detail?: string }[];
  start_time: string; end_time: string; duration: string;
}

export const batchConcurrency = () => setting('FERRY_VIRT_BATCH_CONCURRENCY');

export async function runBatch(operation: string, domains: string[], each: (domain: string) => Promise<unknown>,
  limit = batchConcurrency()): Promise<BatchResult> {
  const t0 = Date.now();
  const results = new Array<BatchResult['results'][number]>(domains.length);
  let next = 0;
  const lane = async () => {
    for (let i = next++; i < domains.length; i = next++) {
      const domain = domains[i];
      try {
        checkName(domain, 'domains[]');
        const r = await each(domain);
        const detail = (r as { detail?: unknown } | undefined)?.detail;
        results[i] = { domain, success: true, ...(typeof detail === 'string' ? { detail } : {}) };
      } catch (e) {
        results[i] = { domain, success: false, error: (e as Error).message };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, domains.length) }, lane));
  const t1 = Date.now();
  const ok = results.filter((r) => r.success).length;
  return { operation, total: domains.length, successful: ok, failed: domains.length - ok, results, start_time: new Date(t0).toISOString(),
    end_time: new Date(t1).toISOString(), duration: `${((t1 - t0) / 1000).toFixed(3)}s` };
}

/** A graceful stop: `virsh shutdown` (ACPI power button, or the guest agent) is only a request the guest may ignore
 *  (no ACPI handler: a busybox guest), so success is the domain really shut off within `timeoutS`. After that it is
 *  destroyed when `forceAfter`, else it is a failure and the domain is left running. The detail says which. */
export async function shutdownAndWait(v: Virsh, d: string, timeoutS: number, forceAfter: boolean): Promise<{ detail: string }> {
  const t0 = Date.now();
  await v.run(['shutdown', d]);
  for (;;) {
    if (await domainState(v, d) === 'shut off') return { detail: `shut down by the guest in ${((Date.now() - t0) / 1000).toFixed(1)} s` };
    if (Date.now() - t0 >= timeoutS * 1000) break;
    await new Promise((r) => setTimeout(r, 500)); // libvirt's state, polled: its events would need a second connection
  }
  if (!forceAfter) throw new Error(
    `still running ${timeoutS} s after the shutdown request (the guest did not act on it): left running; force or force_after_timeout destroys it`);
  await v.run(['destroy', d]);
  return { detail: `still running ${timeoutS} s after the shutdown request: destroyed (force_after_timeout)` };
}

/** One domain's part of each batch operation. */
export const batchOps = {
  start: (v: Virsh, o: { paused?: boolean }) => (d: string) => v.run(['start', d, ...(o.paused ? ['--paused'] : [])]),
  stop: (v: Virsh, o: { force?: boolean; timeout?: number; force_after_timeout?: boolean }) => (d: string) =>
    (o.force ? v.run(['destroy', d]) : shutdownAndWait(v, d, o.timeout ?? 60, !!o.force_after_timeout)),
  reboot: (v: Virsh, o: { force?: boolean }) => (d: string) => v.run([o.force ? 'reset' : 'reboot', d]),
  pause: (v: Virsh) => (d: string) => v.run(['suspend', d]),
  resume: (v: Virsh) => (d: string) => v.run(['resume', d]),
  snapshot: (v: Virsh, o: { name_prefix: string; description?: string; atomic?: boolean; disk_only?: boolean }, stamp: string) =>
    (d: string) => createSnapshot(v, d, `${o.name_prefix}-${stamp}`, { description: o.description, atomic: o.atomic, diskOnly: o.disk_only }),
  /** snapshots_only: delete the domain's snapshots and keep it; otherwise stop it if it runs and undefine it with
   *  its snapshot metadata (and its volumes when remove_storage). */
  delete: (v: Virsh, o: { remove_storage?: boolean; snapshots_only?: boolean }) => async (d: string) => {
    if (o.snapshots_only) {
      for (const s of await listSnapshots(v, d)) await v.run(['snapshot-delete', d, s]);
      return;
    }
    const state = await domainState(v, d);
    if (state !== 'shut off') await v.run(['destroy', d]);
    await v.run(['undefine', d, '--managed-save', '--snapshots-metadata', '--nvram', ...(o.remove_storage ? ['--remove-all-storage'] : [])]);
  },
};

/** A snapshot name suffix shared by one batch: 20261123T204512Z. */
export const batchStamp = () => new Date().toISOString().replace(/[-:]/g, '').replace(/\.\d+Z$/, 'Z');
