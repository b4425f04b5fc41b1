// What preflight needs to know about the target host, in a few virsh calls: its pools with their free bytes,
// its domains' names and MACs, its networks, and whether it offers UEFI (an OVMF loader in domcapabilities).
import { LibvirtError, Virsh, virshFor } from '../libvirt/virsh';
import { checkDomainName } from '../libvirt/names';
import { conflict } from '../../platform/errors';
import { DomainDoc, listDomains } from '../libvirt/domains';
import type { PoolDoc } from '../libvirt/volumes';
import { list, Many, parseXml, sizeBytes, XmlAttrs, XmlValue } from '../libvirt/xml';

export interface TargetFacts {
  uri: string; reachable: boolean; error?: string;
  pools: Map<string, { available: number; active: boolean }>;
  domains: Set<string>; macs: Map<string, string>; networks: Set<string>; uefi: boolean; secureBoot: boolean;
  /** free + buffers + cached, from `virsh nodememstats` (placement most_free_memory) */
  free_memory_bytes: number;
}

const lines = (s: string) => s.split('\n').map((x) => x.trim()).filter(Boolean);

async function pools(v: Virsh) {
  const out = new Map<string, { available: number; active: boolean }>();
  const active = new Set(lines(await v.run(['pool-list', '--name'])));
  for (const name of lines(await v.run(['pool-list', '--all', '--name']))) {
    const p = parseXml<PoolDoc>(await v.run(['pool-dumpxml', name])).pool;
    out.set(name, { available: sizeBytes(p.available) ?? 0, active: active.has(name) });
  }
  return out;
}

/** MAC -> domain, from every domain's definition. */
async function macs(v: Virsh, domains: string[]) {
  const out = new Map<string, string>();
  for (const d of domains) {
    const x = parseXml<DomainDoc>(await v.run(['dumpxml', '--inactive', d])).domain;
    for (const i of list(x?.devices?.interface)) { const mac = (i).mac?.['@_address']; if (mac) out.set(String(mac).toLowerCase(), d); }
  }
  return out;
}

/** `virsh domcapabilities`, as far as the firmware loaders are read from it. */
interface DomainCapsDoc { domainCapabilities?: { os?: { loader?: XmlAttrs & { value?: Many<XmlValue> } } } }

async function firmware(v: Virsh) {
  const caps = await v.run(['domcapabilities', '--arch', 'x86_64', '--machine', 'q35']).catch(() => v.run(['domcapabilities']));
  const loader = parseXml<DomainCapsDoc>(caps).domainCapabilities?.os?.loader;
  const values = list(loader?.value).map(String);
  const ok = loader?.['@_supported'] === 'yes' && values.some((p) => /ovmf|edk2/i.test(p));
  return { uefi: ok, secureBoot: ok && values.some((p) => /secboot|\.ms\./i.test(p)) };
}

export interface TargetInventory {
  virt_uri: string; default: boolean; reachable: boolean; error: string | null;
  networks: string[]; pools: { name: string; active: boolean; available: number }[];
}

/** The right side of a plan's maps on one target: its networks and pools (two virsh calls and one per pool); an
 *  unreachable target says why instead of failing the listing of the others. */
export async function targetInventory(uri: string, isDefault: boolean): Promise<TargetInventory> {
  const v = virshFor(uri);
  try {
    const [p, n] = await Promise.all([pools(v), v.run(['net-list', '--all', '--name'])]);
    return {
      virt_uri: uri, default: isDefault, reachable: true, error: null, networks: lines(n).sort(),
      pools: [...p].map(([name, x]) => ({ name, ...x })).sort((a, b) => a.name.localeCompare(b.name)),
    };
  } catch (e) {
    if (e instanceof LibvirtError) return { virt_uri: uri, default: isDefault, reachable: false, error: e.message, networks: [], pools: [] };
    throw e;
  }
}

/** What the host's kernel could give a new guest now: free, buffers and cached memory (KiB in virsh's answer). */
async function freeMemory(v: Virsh) {
  const kib = (k: string, out: string) => Number(new RegExp(`^\\s*${k}\\s*:\\s*(\\d+)`, 'm').exec(out)?.[1] ?? 0);
  const out = await v.run(['nodememstats']);
  return (kib('free', out) + kib('buffers', out) + kib('cached', out)) * 1024;
}

export async function targetFacts(uri: string): Promise<TargetFacts> {
  const v = virshFor(uri);
  const empty: TargetFacts = {
    uri, reachable: false, pools: new Map(), domains: new Set(), macs: new Map(), networks: new Set(), uefi: false, secureBoot: false,
    free_memory_bytes: 0,
  };
  try {
    const doms = (await listDomains(v)).map((d) => d.name);
    const [p, m, n, fw, mem] = await Promise.all([pools(v), macs(v, doms), v.run(['net-list', '--all', '--name']), firmware(v), freeMemory(v)]);
    return { uri, reachable: true, pools: p, domains: new Set(doms), macs: m, networks: new Set(lines(n)), ...fw, free_memory_bytes: mem };
  } catch (e) {
    // Preflight reports an unreachable target as a blocker on every VM rather than failing the request.
    if (e instanceof LibvirtError) return { ...empty, error: e.message };
    throw e;
  }
}

/** Right before a plan VM's job is submitted: its target name is still free on its host (a domain may have been
 *  defined under it since preflight found it free). The names are listed, never looked up: virsh would resolve a
 *  name argument as an ID or UUID first. Throws (409) when it is taken; the VM then fails without a job. */
export async function recheckTarget(placement: { virt_uri: string; domain: string }): Promise<void> {
  checkDomainName(placement.domain, 'options.target_name');
  const names = lines(await virshFor(placement.virt_uri).run(['list', '--all', '--name']));
  if (names.includes(placement.domain)) {
    throw conflict(`${placement.virt_uri} has had a domain named ${placement.domain} since the plan's preflight found the name free: `
      + 'not migrated, so nothing of that domain is touched');
  }
}
