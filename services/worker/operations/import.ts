// import_kvm: disks into a libvirt storage pool and a domain around them, on the job's virt_uri or the worker's
// FERRY_LIBVIRT_URI. The result names the domain and its UUID.
import { importDisk, Virsh } from '../../../shared/libvirt';
import { jobUri } from '../../../shared/libvirt/uri';
import { checkRunPath } from '../../../shared/roots';
import { checkRunImage } from '../../../shared/image-confine';
import type { Operation } from './types';

/** An import_kvm job's parameters, as its schema (shared/operations.ts) validated them (defaults filled in). */
type ImportParameters = {
  disks: { path: string; format?: string }[]; name: string; memory: number; cpus: number; networks: string[];
  pool?: string; firmware: 'bios' | 'uefi'; virt_uri?: string;
};

export const importKvm: Operation = async (ctx) => {
  const p = ctx.spec.parameters as ImportParameters;
  const v = new Virsh(jobUri(p.virt_uri, 'parameters.virt_uri'));
  // The disks are read here: checked against this worker's input roots right before.
  const disks = [];
  for (const [i, d] of p.disks.entries()) {
    const field = `parameters.disks[${i}].path`;
    const real = await checkRunPath({ field, path: d.path, kind: 'input' });
    // The header's format goes to qemu-img and libvirt, so neither probes; a disk referencing others is refused.
    const { format } = await checkRunImage({ field, path: real, format: d.format, selfContained: true });
    disks.push({ ...d, path: real, format });
  }
  await ctx.progress('importing', 0, `importing into ${v.uri}`);
  const r = await importDisk(v, {
    disks, name: p.name, memoryMiB: p.memory, cpus: p.cpus, networks: p.networks, networkField: (i) => `parameters.networks[${i}]`, pool: p.pool, firmware: p.firmware,
    onProgress: (stage, pct) => void ctx.progress('importing', pct, stage),
  });
  await ctx.progress('importing', 100, `domain ${r.domain} defined`);
  return { ...r, virt_uri: v.uri };
};
