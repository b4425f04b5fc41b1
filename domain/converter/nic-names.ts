// Network interface names across the move. A guest configured for VMware's NIC (`ens192`: a PCI slot name)
// meets a virtio NIC on KVM that udev names after its own place on the bus, so its configuration would match
// nothing and the guest would come up without network. Ferry renames the interface to what the virtio NIC is
// called in Ferry's KVM layout (kvmNicName: q35, NIC n alone behind PCIe root port n+1, as the libvirt import
// and the test boot place it), rewrites the configuration to that name, and adds a systemd .link file (read by
// udev in the initramfs and in the running system) that gives the NIC that name by MAC address (a VM keeps its
// MAC on KVM: the old MAC-to-name rules or the manifest's NICs), or by the virtio driver when the guest
// configures exactly one NIC and no MAC is known, so the name holds on a host whose PCI layout differs too.
// Pure functions; linux/nics.ts does the I/O.

import { nicBus } from '../libvirt/nic-layout';

/** What udev calls NIC `index` (0-based, the VM's NIC order) in Ferry's KVM layout (domain/libvirt/nic-layout.ts:
 *  each NIC alone on the bus behind its own PCIe root port), which systemd's path-based naming calls `enp<bus>s0`. */
export const kvmNicName = (index: number) => `enp${nicBus(index)}s0`;

/** Names of physical-NIC style that a hypervisor's bus decides (not bridges, bonds, VLANs or lo). */
const NIC_NAME = /^(?:eth\d+|ens\d+(?:f\d+)?|enp\d+s\d+(?:f\d+)?|eno\d+|enx[0-9a-f]{12}|em\d+)$/;

/** Interface names the guest's network configuration files use, by file kind (path decides the parser). */
export function configuredInterfaces(files: { path: string; text: string }[]): string[] {
  const names = new Set<string>();
  for (const f of files) {
    const lines = f.text.split('\n').map((l) => l.replace(/#.*/, '').trim()).filter(Boolean);
    if (f.path.startsWith('/etc/network/interfaces')) addIfupdownNames(lines, names);
    else if (f.path.startsWith('/etc/netplan/')) addNetplanNames(f.text, names);
    else if (f.path.startsWith('/etc/systemd/network/') && f.path.endsWith('.network')) {
      for (const l of lines) { const m = /^Name=(.+)$/.exec(l); if (m) m[1].split(/\s+/).forEach((n) => names.add(n)); }
    } else if (f.path.startsWith('/etc/NetworkManager/')) {
      for (const l of lines) { const m = /^interface-name=(\S+)$/.exec(l); if (m) names.add(m[1]); }
    } else if (f.path.startsWith('/etc/sysconfig/network-scripts/')) {
      for (const l of lines) { const m = /^DEVICE=["']?([^"'\s]+)/.exec(l); if (m) names.add(m[1]); }
    }
  }
  return [...names].filter((n) => NIC_NAME.test(n)).sort();
}

/** Adds the interfaces an ifupdown file's iface, auto and allow-* stanzas name (`lines` without comments). */
function addIfupdownNames(lines: string[], names: Set<string>): void {
  for (const l of lines) {
    const m = /^(iface|auto|allow-hotplug|allow-auto)\s+(.*)$/.exec(l);
    if (m) (m[1] === 'iface' ? [m[2].split(/\s+/)[0]] : m[2].split(/\s+/)).forEach((n) => names.add(n));
  }
}

/** Adds the interfaces a netplan file's ethernets name: keys without a `match:` (the key is the name), and set-name. */
function addNetplanNames(raw: string, names: Set<string>): void {
  const text = raw.replace(/#.*/g, '');
  const eth = /^(\s*)ethernets:\s*\n((?:\1\s+.*\n?|\s*\n)*)/m.exec(text);
  if (eth) {
    const body = eth[2];
    const indent = /^(\s+)\S/m.exec(body)?.[1] ?? '';
    const blocks = body.split(new RegExp(`^${indent}(?=\\S)`, 'm')).filter((b) => b.trim());
    for (const b of blocks) {
      const key = /^["']?([^:"'\s]+)["']?:/.exec(b)?.[1];
      if (key && !/\bmatch:/.test(b)) names.add(key);
      const set = /\bset-name:\s*["']?([^\s"']+)/.exec(b)?.[1];
      if (set) names.add(set);
    }
  }
}

/** MAC-to-name bindings of udev's old persistent-net rules (as VMware-era guests carry them). */
export function persistentNetNames(rules: string): { mac: string; name: string }[] {
  const out: { mac: string; name: string }[] = [];
  for (const l of rules.split('\n')) {
    if (/^\s*#/.test(l)) continue;
    const mac = /ATTR\{address\}=="([0-9a-fA-F:]{17})"/.exec(l)?.[1];
    const name = /NAME="([^"]+)"/.exec(l)?.[1];
    if (mac && name) out.push({ mac: mac.toLowerCase(), name });
  }
  return out;
}

export type NicMatch = { mac: string } | { driver: 'virtio_net' };
export interface NicRename { from: string; to: string; match: NicMatch; link: { path: string; text: string } }

export const LINK_DIR = '/etc/systemd/network';

const normMac = (m: string) => m.toLowerCase().replace(/-/g, ':');

/** The .link file that gives `name` to the NIC `match` picks. */
export function linkFile(name: string, match: NicMatch): { path: string; text: string } {
  return {
    path: `${LINK_DIR}/10-ferry-${name}.link`,
    text: [
      '# Written by Ferry: the name of this NIC on KVM, which the guest\'s network configuration now uses. It is',
      '# what udev calls the NIC in Ferry\'s KVM layout; this file keeps it on any other PCI layout too.',
      '[Match]', 'mac' in match ? `MACAddress=${match.mac}` : `Driver=${match.driver}`, '',
      '[Link]', `Name=${name}`, '',
    ].join('\n'),
  };
}

/**
 * What each configured NIC name becomes on KVM, or why it cannot be told. `macs` are the VM's NIC MAC addresses
 * from the manifest (in its order: the order of the NICs on KVM), `bindings` the old persistent-net rules. A NIC
 * whose MAC is in `macs` takes its place there; the others take the first free places, in name order.
 */
export function planNicRenames(names: string[], bindings: { mac: string; name: string }[], macs: string[]): { renames: NicRename[]; problem?: string } {
  if (!names.length) return { renames: [] };
  const vmMacs = macs.map(normMac);
  const bound = names.map((n) => bindings.find((b) => b.name === n)?.mac);
  let matches: NicMatch[];
  if (bound.every(Boolean)) matches = bound.map((mac) => ({ mac: normMac(mac!) }));
  else if (names.length === 1) matches = [vmMacs.length === 1 ? { mac: vmMacs[0] } : { driver: 'virtio_net' }];
  else {
    return { renames: [], problem: `the guest configures ${names.length} NICs (${names.join(', ')}) and which new NIC is which cannot be told `
      + '(no MAC-to-name rules in the guest); the names are left as they are and may not match the NICs on KVM' };
  }
  const places = matches.map((m) => ('mac' in m ? vmMacs.indexOf(m.mac) : -1));
  const taken = new Set(places.filter((i) => i >= 0));
  let next = 0;
  for (const [i, p] of places.entries()) {
    if (p >= 0) continue;
    while (taken.has(next)) next++;
    places[i] = next;
    taken.add(next);
  }
  return { renames: names.map((from, i) => { const to = kvmNicName(places[i]); return { from, to, match: matches[i], link: linkFile(to, matches[i]) }; }) };
}

/** Interface-name tokens in a configuration file: not part of a longer name (`ens192` in `ens1920` or
 *  `br-ens192`), but a VLAN or alias of it (`ens192.100`, `ens192:0`) is renamed with it. */
const token = (name: string) => `(?<![A-Za-z0-9_-])${name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}(?![A-Za-z0-9_-])`;

/** `text` with every old name of `renames` replaced by its new one, all at once (a new name may be another's old). */
export function renameInterfaces(text: string, renames: Map<string, string>): string {
  if (!renames.size) return text;
  const re = new RegExp([...renames.keys()].map(token).join('|'), 'g');
  return text.replace(re, (m) => renames.get(m) ?? m);
}

/** Whether `text` still names `name` as an interface. */
export function namesInterface(text: string, name: string): boolean {
  return new RegExp(token(name)).test(text);
}

const IFCFG_DIR = '/etc/sysconfig/network-scripts';

/**
 * The edits that carry `renames` through the guest's network files: each file whose text names an old name gets
 * the new text, and RHEL's `ifcfg-<old>` moves to `ifcfg-<new>` (`dest`). `renamed` is what its text renames
 * (empty when only its file name changes); files with nothing to change are left out.
 */
export function planNicFileEdits(
  files: { path: string; text: string }[], renames: Map<string, string>,
): { path: string; dest: string; text: string; renamed: Record<string, string> }[] {
  const out = [];
  for (const f of files) {
    const text = renameInterfaces(f.text, renames);
    const base = f.path.startsWith(`${IFCFG_DIR}/ifcfg-`) ? f.path.slice(IFCFG_DIR.length + '/ifcfg-'.length) : undefined;
    const dest = base !== undefined && renames.has(base) ? `${IFCFG_DIR}/ifcfg-${renames.get(base)}` : f.path;
    if (text === f.text && dest === f.path) continue;
    out.push({ path: f.path, dest, text, renamed: Object.fromEntries([...renames].filter(([from]) => namesInterface(f.text, from))) });
  }
  return out;
}
