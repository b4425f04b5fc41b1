// Domains: the list (one `virsh domstats --raw` call for every domain), start, snapshots, XML, interfaces.
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { checkName, randomMac } from './names';
import { buildXml, list, Many, parseXml, text, XmlAttrs, XmlValue } from './xml';
import { LibvirtError, Virsh } from './virsh';

/** virDomainState codes as virsh names them. */
export const DOMAIN_STATES = ['no state', 'running', 'blocked', 'paused', 'in shutdown', 'shut off', 'crashed', 'pmsuspended'] as const;

export type RawStats = Map<string, Record<string, string>>;

/** Parses `virsh domstats --raw`: "Domain: 'name'" followed by "  key=value" lines. */
export function parseDomstats(out: string): RawStats {
  const all: RawStats = new Map();
  let cur: Record<string, string> | undefined;
  for (const line of out.split('\n')) {
    const d = /^Domain: '(.*)'$/.exec(line);
    if (d) { cur = {}; all.set(d[1], cur); continue; }
    const kv = /^\s+([^=]+)=(.*)$/.exec(line);
    if (kv && cur) cur[kv[1]] = kv[2];
  }
  return all;
}

export interface DomainSummary { name: string; state: string; state_reason: number }

/** What `virsh list --all` shows, from `domstats --raw --state` (one call; the balloon and vCPU groups would ask
 *  every running guest's QEMU and cost 1.8x a bare list: memory and vCPUs are in /virt/stats). */
export async function listDomains(v: Virsh): Promise<DomainSummary[]> {
  const stats = parseDomstats(await v.run(['domstats', '--raw', '--state']));
  return [...stats].map(([name, s]) => ({
    name, state: DOMAIN_STATES[Number(s['state.state'])] || 'no state', state_reason: Number(s['state.reason'] || 0),
  })).sort((a, b) => a.name.localeCompare(b.name));
}

export async function domainState(v: Virsh, name: string): Promise<string> {
  const s = parseDomstats(await v.run(['domstats', '--raw', '--state', checkName(name, 'name')])).get(name);
  return DOMAIN_STATES[Number(s?.['state.state'])] || 'no state';
}

export async function domainExists(v: Virsh, name: string): Promise<boolean> {
  try { await v.run(['domuuid', checkName(name, 'name')]); return true; } catch (e) {
    if (e instanceof LibvirtError && e.status === 404) return false;
    throw e;
  }
}

/** An `<interface>` of a domain definition; libvirt always writes its type. */
interface DomainNicXml extends XmlAttrs { '@_type': string; mac?: XmlAttrs; source?: XmlAttrs; model?: XmlAttrs; target?: XmlAttrs }
interface DomainDiskXml extends XmlAttrs { target?: XmlAttrs; source?: XmlAttrs; driver?: XmlAttrs }
interface DomainDevicesXml {
  interface?: Many<DomainNicXml>; disk?: Many<DomainDiskXml>; serial?: Many<XmlValue>; console?: Many<XmlValue>;
  [other: string]: unknown;
}

/** A domain definition (`virsh dumpxml`): the elements Ferry reads or changes are named, every other one is kept
 *  as parsed so that the document can be built back whole. */
export interface DomainXml {
  name?: XmlValue; uuid?: XmlValue; metadata?: XmlValue; memory?: XmlValue; currentMemory?: XmlValue; vcpu?: string | XmlAttrs;
  devices?: DomainDevicesXml;
  [other: string]: unknown;
}
export interface DomainDoc { domain: DomainXml }

interface SnapshotDoc { domainsnapshot: { description?: XmlValue; state?: XmlValue; creationTime?: XmlValue } }

export async function domainXml(v: Virsh, name: string, inactive = false): Promise<DomainDoc> {
  return parseXml<DomainDoc>(await v.run(['dumpxml', ...(inactive ? ['--inactive'] : []), checkName(name, 'name')]));
}

/** Writes XML to a private temporary file for virsh (it reads files on the client side, also for remote URIs). */
export async function withXmlFile<T>(xml: string, fn: (file: string) => Promise<T>): Promise<T> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'ferry-virsh-'));
  const file = path.join(dir, 'def.xml');
  try {
    await fs.writeFile(file, xml, { mode: 0o600 });
    return await fn(file);
  } finally {
    await fs.rm(dir, { recursive: true, force: true });
  }
}

export async function defineDomain(v: Virsh, doc: DomainDoc): Promise<void> {
  await withXmlFile(buildXml(doc), (f) => v.run(['define', f]));
}

export async function startDomain(v: Virsh, name: string, paused = false) {
  await v.run(['start', checkName(name, 'name'), ...(paused ? ['--paused'] : [])]);
  return { name, state: await domainState(v, name) };
}

export async function domainInfo(v: Virsh, name: string) {
  const x = (await domainXml(v, name)).domain;
  const uuid = text(x.uuid);
  return {
    name, uuid,
    interfaces: list(x.devices?.interface).map((i) => ({
      type: i['@_type'], mac: i.mac?.['@_address'], source: i.source?.['@_network'] || i.source?.['@_bridge'], model: i.model?.['@_type'],
      target: i.target?.['@_dev'],
    })),
    disks: list(x.devices?.disk).map((d) => ({
      device: d['@_device'], target: d.target?.['@_dev'], bus: d.target?.['@_bus'], source: d.source?.['@_file'] || d.source?.['@_dev'] ||
        d.source?.['@_volume'], format: d.driver?.['@_type'],
    })),
    serials: list(x.devices?.serial).length + list(x.devices?.console).length,
  };
}

export interface SnapshotOptions { description?: string; atomic?: boolean; diskOnly?: boolean }

/** A snapshot from `<domainsnapshot>` XML built by the XML library. */
export async function createSnapshot(v: Virsh, domain: string, snapshot: string, o: SnapshotOptions = {}) {
  checkName(domain, 'domain_name');
  const doc = { domainsnapshot: { name: checkName(snapshot, 'snapshot_name'), ...(o.description ? { description: o.description } : {}) } };
  await withXmlFile(buildXml(doc), (f) => v.run(['snapshot-create', domain, '--xmlfile', f, ...(o.atomic ? ['--atomic'] : []),
    ...(o.diskOnly ? ['--disk-only'] : [])]));
  const info = parseXml<SnapshotDoc>(await v.run(['snapshot-dumpxml', domain, snapshot])).domainsnapshot;
  return { domain, name: snapshot, description: text(info.description) ?? null, state: text(info.state),
    creation_time: new Date(Number(text(info.creationTime)) * 1000).toISOString() };
}

export async function listSnapshots(v: Virsh, domain: string): Promise<string[]> {
  return (await v.run(['snapshot-list', checkName(domain, 'domain'), '--name'])).split('\n').map((s) => s.trim()).filter(Boolean);
}

const isActive = (state: string) => state !== 'shut off' && state !== 'crashed';

/** Adds a virtio NIC on a libvirt network (or a bridge, `type: 'bridge'`) with a new MAC: to the persistent
 *  definition, and live too when the domain runs. */
export async function attachInterface(v: Virsh, domain: string, network: string, model = 'virtio', type: 'network' | 'bridge' = 'network') {
  checkName(domain, 'vm_name'); checkName(network, 'network');
  const mac = randomMac();
  const live = isActive(await domainState(v, domain));
  await v.run(['attach-interface', '--domain', domain, '--type', type, '--source', network, '--model', model, '--mac', mac, '--config',
    ...(live ? ['--live'] : [])]);
  return { vm_name: domain, network, model, mac, live };
}

export async function detachInterface(v: Virsh, domain: string, mac: string) {
  const info = await domainInfo(v, domain);
  const nic = info.interfaces.find((i) => (i.mac || '').toLowerCase() === mac.toLowerCase());
  if (!nic) throw new LibvirtError(404, `domain ${domain} has no interface with MAC ${mac}`, 'interface not found');
  const live = isActive(await domainState(v, domain));
  await v.run(['detach-interface', '--domain', domain, '--type', nic.type, '--mac', mac, '--config', ...(live ? ['--live'] : [])]);
  return { vm_name: domain, mac, live };
}
