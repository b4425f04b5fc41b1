// Rolling one VM back: what its job recorded in its ledger that it made on the target goes (the domain by its UUID,
// with its NVRAM; each volume by its key, the import's partial copies included), and the source is powered back on
// when it was on before. Nothing is looked up by name: a domain or volume the ledger does not list is never
// touched, whatever it is called, nor one another job made since at the same path (domain/libvirt/ledger.ts).
// Idempotent: each entry is checked first.
import { removeMade, type Made, type MadeGuard } from '../libvirt/ledger';
import { findVm, waitForTask } from '../vsphere/actions';
import { vmDetail } from '../vsphere/inventory';
import { moref } from '../vsphere/xml';
import type { Manager } from '../vsphere/client';

export interface RollbackTarget { source_was_on: boolean; vm_path: string }

async function powerOnSource(m: Manager | null, t: RollbackTarget): Promise<string | null> {
  if (!t.source_was_on || !m) return null;
  const d = await vmDetail(m, t.vm_path);
  if (d.power_state === 'poweredOn') return `${t.vm_path} is on`;
  const vm = await findVm(m, t.vm_path);
  await waitForTask(m, moref(await m.call('PowerOnVM_Task', vm))!, `power-on of ${t.vm_path}`);
  return `${t.vm_path} powered back on`;
}

/** `made`: the ledger of the VM's job (JobStore.made), acted on while that job owns each entry (`guard`); `m`: its
 *  source's manager (null: the source stays as it is). Run by the worker's rollback_kvm job
 *  (services/worker/operations/plan-effects.ts), never in the daemon. */
export async function rollbackVm(m: Manager | null, t: RollbackTarget, made: Made[], guard: MadeGuard): Promise<string> {
  const did = await removeMade(made, guard);
  const on = await powerOnSource(m, t);
  return [...(did.length ? did : ['nothing of Ferry\'s was on the target']), ...(on ? [on] : [])].join('; ');
}
