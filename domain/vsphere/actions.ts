// Power and device actions on a VM, and waiting for vSphere tasks with their errors surfaced.
import type { Manager } from './client';
import { VsphereError } from './errors';
import { findVm, vmDetail, VmDetail } from './inventory';
import { retrieve } from './properties';
import { child, el, moref, MoRef, text, XmlValue, xsiType } from './xml';

const sleep = (ms: number, signal?: AbortSignal) => new Promise<void>((resolve, reject) => {
  // abort() reasons are Errors here (an AbortError unless the caller passes its own)
  if (signal?.aborted) { reject(signal.reason as Error); return; }
  const t = setTimeout(() => { signal?.removeEventListener('abort', onAbort); resolve(); }, ms);
  const onAbort = () => { clearTimeout(t); reject(signal!.reason as Error); };
  signal?.addEventListener('abort', onAbort, { once: true });
});

/** Waits for a task to finish; a failed task throws its localized message and fault type. */
export async function waitForTask(m: Manager, task: MoRef, what: string, signal?: AbortSignal, timeoutMs = 30 * 60_000): Promise<XmlValue | undefined> {
  const until = Date.now() + timeoutMs;
  for (let delay = 100; ; delay = Math.min(1000, delay * 2)) {
    const [o] = await retrieve(m, [task], [{ type: 'Task', paths: ['info.state', 'info.error', 'info.result'] }]);
    const state = text(o?.props['info.state']);
    if (state === 'success') return o.props['info.result'];
    if (state === 'error') {
      const err = o.props['info.error'];
      const fault = xsiType(child(err, 'fault')) ?? 'unknown';
      throw new VsphereError('task', `${what} failed on vSphere manager ${m.name}: ${text(child(err, 'localizedMessage')) || fault} (${fault})`, fault);
    }
    if (Date.now() > until) throw new VsphereError('task', `${what} did not finish within ${Math.round(timeoutMs / 1000)} s on vSphere manager ${m.name}`);
    await sleep(delay, signal);
  }
}

async function powerState(m: Manager, vm: MoRef): Promise<string> {
  const [o] = await retrieve(m, [vm], [{ type: 'VirtualMachine', paths: ['runtime.powerState'] }]);
  return text(o?.props['runtime.powerState']) ?? 'unknown';
}

/** Asks the guest to shut down (VMware Tools must run); returns when it is asked, not when it is off. */
export async function shutdownGuest(m: Manager, vmPath: string): Promise<VmDetail> {
  const d = await vmDetail(m, vmPath);
  if (d.power_state !== 'poweredOn') throw new VsphereError('state', `${vmPath} is ${d.power_state}; a guest shutdown needs a powered-on VM`);
  if (d.tools_status !== 'guestToolsRunning') throw new VsphereError('state',
    `VMware Tools are not running in ${vmPath} (${d.tools_status}), so the guest cannot be asked to shut down; use poweroff to force it`);
  await m.call('ShutdownGuest', d.moref);
  return d;
}

/** Forced power-off (a PowerOffVM task, waited on). */
export async function powerOff(m: Manager, vmPath: string, signal?: AbortSignal): Promise<VmDetail> {
  const d = await vmDetail(m, vmPath);
  if (d.power_state === 'poweredOff') throw new VsphereError('state', `${vmPath} is already powered off`);
  await waitForTask(m, moref(await m.call('PowerOffVM_Task', d.moref))!, `power-off of ${vmPath}`, signal);
  return d;
}

/** Waits until the VM reports poweredOff. */
export async function waitPoweredOff(m: Manager, vm: MoRef, vmPath: string, timeoutMs: number, signal?: AbortSignal) {
  const until = Date.now() + timeoutMs;
  for (let delay = 200; ; delay = Math.min(2000, delay * 2)) {
    if ((await powerState(m, vm)) === 'poweredOff') return;
    if (Date.now() > until) throw new VsphereError('state', `${vmPath} did not power off within ${Math.round(timeoutMs / 1000)} s after the guest shutdown`);
    await sleep(delay, signal);
  }
}

/** Removes every CD-ROM device in one reconfigure task; returns the labels removed. */
export async function removeCdroms(m: Manager, vmPath: string, signal?: AbortSignal): Promise<string[]> {
  const d = await vmDetail(m, vmPath);
  if (!d.cdroms.length) return [];
  const changes = d.cdroms.map(
    (c) => `<deviceChange><operation>remove</operation><device xsi:type="VirtualCdrom">${el('key', c.key)}</device></deviceChange>`).join('');
  await waitForTask(m, moref(await m.call('ReconfigVM_Task', d.moref, `<spec>${changes}</spec>`))!, `CD-ROM removal on ${vmPath}`, signal);
  return d.cdroms.map((c) => c.label);
}

export { findVm, sleep };

/** Deletes a powered-off VM with its files (a Destroy task, waited on): a plan's options.remove_source after
 *  the migrated VM booted. A VM that is not powered off is refused (it was started again since its export). */
export async function destroyVm(m: Manager, vmPath: string, signal?: AbortSignal): Promise<void> {
  const d = await vmDetail(m, vmPath);
  if (d.power_state !== 'poweredOff') throw new VsphereError('state', `${vmPath} is ${d.power_state}; Ferry deletes only a powered-off source`);
  await waitForTask(m, moref(await m.call('Destroy_Task', d.moref))!, `deletion of ${vmPath}`, signal);
}
