// Rolling one VM back: what Ferry created on the target goes (the domain with its NVRAM and the volumes it
// names, and any volume of the import's names left by an import that stopped before the domain was defined),
// and the source is powered back on when it was on before. Idempotent: each step checks first. It never touches
// a domain that existed before the plan ran (preflight recorded that) nor volumes of other names.
import { domainExists, LibvirtError, Virsh } from '../libvirt';
import { deleteVolume } from '../libvirt/volumes';
import { findVm, waitForTask } from '../vsphere/actions';
import { vmDetail } from '../vsphere/inventory';
import { moref } from '../vsphere/xml';
import type { Manager } from '../vsphere/client';

export interface RollbackTarget { virt_uri: string; domain: string; pool: string; target_existed: boolean; source_was_on: boolean; vm_path: string }

const lines = (s: string) => s.split('\n').map((x) => x.trim()).filter(Boolean);

async function removeTarget(t: RollbackTarget): Promise<string[]> {
  const v = new Virsh(t.virt_uri);
  const did: string[] = [];
  if (t.target_existed) return [`domain ${t.domain} existed before the plan: left as it is`];
  if (await domainExists(v, t.domain)) {
    await v.run(['destroy', t.domain]).catch((e) => { if (!(e instanceof LibvirtError)) throw e; }); // already off is fine
    await v.run(['undefine', '--nvram', '--remove-all-storage', t.domain]);
    did.push(`domain ${t.domain} with its NVRAM and volumes removed from ${t.virt_uri}`);
  }
  if (t.pool) {
    await v.run(['pool-refresh', t.pool]);
    const mine = new RegExp(`^${t.domain.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}(-disk\\d+)?\\.(qcow2|raw)(\\.part)?$`);
    for (const vol of lines(await v.run(['vol-list', '--pool', t.pool])).map((l) => l.split(/\s+/)[0]).filter((n) => mine.test(n))) {
      await deleteVolume(v, t.pool, vol);
      did.push(`leftover volume ${vol} removed from pool ${t.pool}`);
    }
  }
  return did;
}

async function powerOnSource(m: Manager, t: RollbackTarget): Promise<string | null> {
  if (!t.source_was_on) return null;
  const d = await vmDetail(m, t.vm_path);
  if (d.power_state === 'poweredOn') return `${t.vm_path} is on`;
  const vm = await findVm(m, t.vm_path);
  await waitForTask(m, moref(await m.call('PowerOnVM_Task', vm))!, `power-on of ${t.vm_path}`);
  return `${t.vm_path} powered back on`;
}

export async function rollbackVm(m: Manager, t: RollbackTarget): Promise<string> {
  const did = await removeTarget(t);
  const on = await powerOnSource(m, t);
  return [...did, ...(on ? [on] : [])].join('; ') || 'nothing of Ferry\'s was on the target';
}
