// Virtual networks: list, detail (net-dumpxml), create (XML built by the library), delete, start, stop.
import net from 'node:net';
import { LibvirtError, Virsh } from './virsh';
import { checkName } from './names';
import { config } from '../../platform/config';
import { fieldError } from '../../platform/errors';
import { buildXml, list, Many, parseXml, text, XmlAttrs, XmlValue } from './xml';
import { withXmlFile } from './domains';

const names = async (v: Virsh, flags: string[]) => new Set((await v.run(['net-list', '--name', ...flags])).split('\n').map((s) => s.trim()).filter(Boolean));

/** Active, persistent and autostart sets from `net-list --name` (a list of names, not a table). */
async function flagsOf(v: Virsh) {
  const [all, active, persistent, autostart] = await Promise.all([names(v, ['--all']), names(v, []), names(v, ['--all', '--persistent']),
    names(v, ['--all', '--autostart'])]);
  return { all, active, persistent, autostart };
}

type NetworkIpXml = XmlAttrs & { dhcp?: { range?: Many<XmlAttrs> } };

/** A network definition (`virsh net-dumpxml`), as far as Ferry reads it. */
interface NetworkDoc { network: { name?: XmlValue; uuid?: XmlValue; bridge?: XmlAttrs; forward?: XmlAttrs; ip?: Many<NetworkIpXml> } }

function describe(xml: string, f: Awaited<ReturnType<typeof flagsOf>>) {
  const n = parseXml<NetworkDoc>(xml).network;
  const name = text(n.name)!;
  const ips = list(n.ip).map((ip) => ({
    address: ip['@_address'], netmask: ip['@_netmask'] ?? null, prefix: ip['@_prefix'] !== undefined ? Number(ip['@_prefix']) : null, family: ip['@_family'] ||
      'ipv4',
    dhcp: ip.dhcp ? list(ip.dhcp.range).map((r) => ({ start: r['@_start'], end: r['@_end'] })) : [],
  }));
  return {
    name, uuid: text(n.uuid), active: f.active.has(name), persistent: f.persistent.has(name), autostart: f.autostart.has(name),
    bridge: n.bridge?.['@_name'] ?? null, forward: n.forward?.['@_mode'] ?? (n.forward ? 'nat' : 'none'), ip: ips,
  };
}

export async function listNetworks(v: Virsh) {
  const f = await flagsOf(v);
  return Promise.all([...f.all].sort().map(async (name) => describe(await v.run(['net-dumpxml', name]), f)));
}

export async function networkDetail(v: Virsh, name: string) {
  const xml = await v.run(['net-dumpxml', checkName(name, 'name')]);
  return { ...describe(xml, await flagsOf(v)), xml };
}

export async function networkExists(v: Virsh, name: string): Promise<boolean> {
  try { await v.run(['net-uuid', name]); return true; } catch (e) { if (e instanceof LibvirtError && e.status === 404) return false; throw e; }
}

/** What a NIC named `name` attaches to on `v`: the libvirt network of that name, else a host bridge the operator
 *  listed in FERRY_LIBVIRT_BRIDGES; anything else is refused (400 naming `field`). Every path that attaches a NIC
 *  (imports, a migration's network_mapping, a template's clone) asks here. */
export async function nicSource(v: Virsh, name: string, field: string): Promise<{ type: 'network' | 'bridge'; source: string }> {
  checkName(name, field);
  if (await networkExists(v, name)) return { type: 'network', source: name };
  if (bridgeAllowed(name)) return { type: 'bridge', source: name };
  throw fieldError(400, field, `"${name}" is neither a libvirt network on ${v.uri} nor a host bridge listed in FERRY_LIBVIRT_BRIDGES`);
}

/** Whether the operator listed `name` in FERRY_LIBVIRT_BRIDGES. */
export const bridgeAllowed = (name: string) => config.libvirtBridges.includes(name);

export interface NetworkSpec { name: string; bridge?: string; forward?: 'nat' | 'none' | 'route'; subnet?: string; ip_start?: string; ip_end?: string }

const ipNum = (ip: string) => ip.split('.').reduce((a, b) => a * 256 + Number(b), 0);
const numIp = (n: number) => [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join('.');
const bad = (field: string, message: string) => new LibvirtError(400, `${field}: ${message}`, message);

/** The `<network>` document of a create request: the gateway is the subnet's first host address, DHCP hands out
 *  ip_start..ip_end (both inside the subnet). */
export function networkDoc(s: NetworkSpec) {
  checkName(s.name, 'name');
  const doc: { network: { name: string; forward?: XmlAttrs; bridge?: XmlAttrs; ip?: NetworkIpXml } } = { network: { name: s.name } };
  if (s.forward && s.forward !== 'none') doc.network.forward = { '@_mode': s.forward };
  if (s.bridge) doc.network.bridge = { '@_name': s.bridge, '@_stp': 'on', '@_delay': '0' };
  if (s.subnet) {
    const m = /^(\d+\.\d+\.\d+\.\d+)\/(\d{1,2})$/.exec(s.subnet);
    if (!m || !net.isIPv4(m[1]) || Number(m[2]) < 8 || Number(m[2]) > 30) throw bad('subnet',
      'must be an IPv4 network in CIDR form, prefix 8-30, such as 192.168.150.0/24');
    const prefix = Number(m[2]);
    const size = 2 ** (32 - prefix);
    const base = ipNum(m[1]) - (ipNum(m[1]) % size);
    const inside = (ip: string, field: string) => {
      if (!net.isIPv4(ip)) throw bad(field, 'must be an IPv4 address');
      const n = ipNum(ip);
      if (n <= base + 1 || n >= base + size - 1) throw bad(field, `must be a host address of ${s.subnet} other than the gateway ${numIp(base + 1)}`);
      return n;
    };
    const ip: NetworkIpXml = { '@_address': numIp(base + 1), '@_prefix': String(prefix) };
    if (s.ip_start || s.ip_end) {
      if (!s.ip_start || !s.ip_end) throw bad(s.ip_start ? 'ip_end' : 'ip_start', 'DHCP needs both ip_start and ip_end');
      if (inside(s.ip_start, 'ip_start') > inside(s.ip_end, 'ip_end')) throw bad('ip_end', 'must not come before ip_start');
      ip.dhcp = { range: { '@_start': s.ip_start, '@_end': s.ip_end } };
    }
    doc.network.ip = ip;
  } else if (s.ip_start || s.ip_end) throw bad('subnet', 'a DHCP range needs a subnet');
  return doc;
}

/** Defines a persistent network. It is not started: POST /virt/network/start does that (docs/virt.md). */
export async function createNetwork(v: Virsh, s: NetworkSpec) {
  const doc = networkDoc(s);
  if (await networkExists(v, s.name)) throw new LibvirtError(409, `network ${s.name} already exists`, 'exists');
  await withXmlFile(buildXml(doc), (f) => v.run(['net-define', f]));
  return networkDetail(v, s.name);
}

export async function deleteNetwork(v: Virsh, name: string) {
  const d = await networkDetail(v, name);
  if (d.active) await v.run(['net-destroy', name]);
  if (d.persistent) await v.run(['net-undefine', name]);
  return { name, deleted: true, was_active: d.active };
}

export async function startNetwork(v: Virsh, name: string) {
  await v.run(['net-start', checkName(name, 'name')]);
  return networkDetail(v, name);
}

export async function stopNetwork(v: Virsh, name: string) {
  await v.run(['net-destroy', checkName(name, 'name')]);
  return networkDetail(v, name);
}
