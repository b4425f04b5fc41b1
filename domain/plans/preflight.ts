// A plan's preflight: every VM's facts from vSphere, the target's from libvirt, the rules (rules.ts), the
// operator's overrides applied, and where each VM would go (ESXi host, datastores, pool) for the limits.
import { fieldError } from '../../platform/errors';
import { confusableName } from '../libvirt/names';
import { managerFor, managerName } from '../vsphere/client';
import { resolveCredentials } from '../vsphere/credentials';
import { VsphereError } from '../vsphere/errors';
import { vmFacts, type VmFacts } from './facts';
import { checkVm, planMacClashes, type Finding } from './rules';
import { nameCollisions, targetName } from './names';
import { Placer } from './placement';
import { guestPreflightDefault } from './guest-preflight';
import type { Override, Plan, PlanOptions } from './types';

/** Reads the guests of `facts` (orchestration/guest-read.ts: a worker job), giving each VM its guest findings. */
export type ReadGuests = (p: Plan, facts: VmFacts[]) => Promise<Map<string, Finding[]>>;

/** Blockers no override can lift: without them the job itself cannot run (or would destroy what is there). */
export const NOT_OVERRIDABLE = new Set(['vm_not_found', 'target_unreachable', 'network_unmapped', 'datastore_unmapped', 'pool_missing',
  'name', 'name_exists', 'name_collision', 'network_missing', 'vm_running',
  // The warm job itself refuses such a VM (services/worker/operations/warm-rounds.ts): accepting it changes nothing.
  'warm_vm_off', 'warm_snapshots', 'warm_cbt_off']);

export interface VmResult {
  vm_path: string; findings: (Finding & { overridable: boolean; overridden?: Override })[];
  placement?: { esxi_host: string; datastores: string[]; virt_uri: string; pool: string; domain: string; target_existed: boolean; source_was_on: boolean };
}

export const planManager = (p: Pick<Plan, 'source'>) => managerFor(resolveCredentials({ manager_url: p.source.manager_url, insecure: p.source.insecure }));
export const planManagerName = (p: Pick<Plan, 'source'>) => managerName(resolveCredentials({ manager_url: p.source.manager_url }).url);
export const vmOption = <K extends string>(p: Plan, vmPath: string, key: K): PlanOptions[K] => {
  const own = p.vms.find((v) => v.vm_path === vmPath)?.options?.[key];
  return own !== undefined ? own : p.options[key];
};

// An accepted blocker no longer blocks; an accepted warning is shown as acknowledged (and not counted).
const withOverrides = (v: Plan['vms'][number], findings: Finding[]) => findings.map((f) => withOverride(f, v.overrides[f.rule]));

/** `readGuests`: the guest read, which runs on a worker (the daemon passes orchestration/guest-read.ts's reader). */
export async function preflight(p: Plan, readGuests: ReadGuests): Promise<VmResult[]> {
  const m = planManager(p);
  const placer = await Placer.of(p);
  const facts = new Map<string, VmFacts | Finding>();
  for (const v of p.vms) {
    try { facts.set(v.vm_path, await vmFacts(m, v.vm_path)); } catch (e) {
      if (!(e instanceof VsphereError) || e.kind !== 'not_found') throw e;
      facts.set(v.vm_path, { rule: 'vm_not_found', severity: 'blocker', message: e.message, fix: 'remove it from the plan or correct its path' });
    }
  }
  const found = [...facts.values()].filter((x): x is VmFacts => 'disks' in x);
  const clashes = planMacClashes(found);
  const names = new Map(found.map((x) => [x.vm_path, targetName(vmOption(p, x.vm_path, 'target_name'), x)]));
  refuseConfusable(p, names);
  const collisions = nameCollisions(names);
  const results: VmResult[] = p.vms.map((v) => {
    const x = facts.get(v.vm_path)!;
    if (!('disks' in x)) return { vm_path: v.vm_path, findings: [withOverride(x, undefined)] };
    const warmOpts = vmOption(p, v.vm_path, 'warm') as { enable_cbt?: boolean } | undefined;
    const warm = !!warmOpts;
    // A warm VM's power_off defaults to shutdown (domain/schemas/daemon.ts), a cold one's to none.
    const power_off = String(vmOption(p, v.vm_path, 'power_off') ?? (warm ? 'shutdown' : 'none'));
    const target = placer.pick(x.memory_mb);
    const domain = names.get(v.vm_path)!;
    const findings = [
      ...checkVm(x, target, {
        network_map: p.network_map, storage_map: p.storage_map, power_off, warm, enable_cbt: warmOpts?.enable_cbt !== false,
        poolUse: placer.poolUse.get(target.uri)!, domain,
      }),
      ...(clashes.get(v.vm_path) ?? []), ...(collisions.get(v.vm_path) ?? []),
    ];
    const datastores = [...new Set(x.disks.map((d) => d.datastore))];
    return {
      vm_path: v.vm_path,
      findings: withOverrides(v, findings),
      placement: {
        esxi_host: x.esxi_host, datastores, virt_uri: target.uri, pool: p.storage_map[datastores[0]] ?? '', domain,
        target_existed: target.domains.has(domain), source_was_on: x.power_state === 'poweredOn',
      },
    };
  });
  // The guests of the VMs nothing else stops, read in place on a worker (guest-preflight.ts), unless the plan or VM says no.
  const read = results.filter((r) => !blocks(r) && (vmOption(p, r.vm_path, 'guest_preflight') ?? guestPreflightDefault()) !== false)
    .map((r) => facts.get(r.vm_path) as VmFacts);
  if (read.length) {
    const guest = await readGuests(p, read);
    for (const r of results) r.findings.push(...withOverrides(p.vms.find((v) => v.vm_path === r.vm_path)!, guest.get(r.vm_path) ?? []));
  }
  return results;
}

/** A target_name rule that gives a VM a domain name virsh could read as an ID or a UUID (also a plan stored before
 *  the schema refused such rules): a 400 naming the rule's field. A VM's own name of that kind, without a rule, is
 *  a `name` blocker instead (rules.ts), so the other VMs still run. */
function refuseConfusable(p: Plan, names: Map<string, string>) {
  for (const [i, v] of p.vms.entries()) {
    const name = names.get(v.vm_path);
    const why = name === undefined ? null : confusableName(name);
    const own = v.options?.target_name !== undefined;
    if (!why || (!own && p.options.target_name === undefined)) continue;
    const field = own ? `vms.${i}.options.target_name` : 'options.target_name';
    throw fieldError(400, field,
      `gives ${v.vm_path} the domain name "${name}", which virsh could take for another domain: it ${why}; give a name with a letter`);
  }
}

/** A finding says whether an override may lift it, and carries the override that did. */
function withOverride(f: Finding, o: Override | undefined) {
  const overridable = !NOT_OVERRIDABLE.has(f.rule);
  return o && overridable ? { ...f, overridable, overridden: o } : { ...f, overridable };
}

export const blocks = (r: Pick<VmResult, 'findings'>) => r.findings.some((f) => f.severity === 'blocker' && !f.overridden);

/** The plan's manager must be one this daemon may contact (GOVC_URL or FERRY_VSPHERE_MANAGERS): a 400 naming
 *  source.manager_url before anything is stored. */
export function checkManager(source: Plan['source']) {
  try { return planManagerName({ source }); } catch (e) {
    throw fieldError(400, 'source.manager_url', e instanceof VsphereError ? e.message : `not a URL: ${(e as Error).message}`);
  }
}
