// import_kvm: disks into a libvirt storage pool and a domain around them, on the job's virt_uri or the worker's
// FERRY_LIBVIRT_URI. The result names the domain and its UUID.
import { configuredUri, importDisk, Virsh } from '../../../shared/libvirt';
import type { Operation } from './types';

export const importKvm: Operation = async (ctx) => {
  const p = ctx.spec.parameters as any;
  const v = new Virsh(p.virt_uri || configuredUri());
  await ctx.progress('importing', 0, `importing into ${v.uri}`);
  const r = await importDisk(v, {
    disks: p.disks, name: p.name, memoryMiB: p.memory, cpus: p.cpus, networks: p.networks, pool: p.pool, firmware: p.firmware,
    onProgress: (stage, pct) => void ctx.progress('importing', pct, stage),
  });
  await ctx.progress('importing', 100, `domain ${r.domain} defined`);
  return { ...r, virt_uri: v.uri };
};
