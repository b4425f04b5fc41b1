// Network interface names across the move. A guest configured for VMware's NIC (`ens192`: a PCI slot name)
// meets a virtio NIC on KVM that udev names after another slot (`ens3`, `enp1s0`), so its configuration would
// match nothing and the guest would come up without network. Rather than guess the new slot name and rewrite
// every network stack's files, Ferry pins the old name on the new NIC with a systemd .link file (read by udev
// in the initramfs and in the running system): by MAC address when it is known (the old MAC-to-name rules, or
// the manifest's single NIC; a VM keeps its MAC on KVM), else by the virtio driver when the guest configures
// exactly one NIC. The guest's own configuration stays as it was. Pure functions; guest.ts does the I/O.

/** Names of physical-NIC style that a hypervisor's bus decides (not bridges, bonds, VLANs or lo). */
const NIC_NAME = /^(?:eth\d+|ens\d+(?:f\d+)?|enp\d+s\d+(?:f\d+)?|eno\d+|enx[0-9a-f]{12}|em\d+)$/;

/** Interface names the guest's network configuration files use, by file kind (path decides the parser). */
export function configuredInterfaces(files: { path: string; text: string }[]): string[] {
  const names = new Set<string>();
  for (const f of files) {
    const lines = f.text.split('\n').map((l) => l.replace(/#.*/, '').trim()).filter(Boolean);
    if (f.path.startsWith('/etc/network/interfaces')) {
      for (const l of lines) {
        const m = /^(iface|auto|allow-hotplug|allow-auto)\s+(.*)$/.exec(l);
        if (m) (m[1] === 'iface' ? [m[2].split(/\s+/)[0]] : m[2].split(/\s+/)).forEach((n) => names.add(n));
      }
    } else if (f.path.startsWith('/etc/netplan/')) {
      // ethernets keys without a `match:` use the key as the interface name.
      const text = f.text.replace(/#.*/g, '');
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
    } else if (f.path.startsWith('/etc/systemd/network/') && f.path.endsWith('.network')) {
      for (const l of lines) { const m = /^Name=(.+)$/.exec(l); if (m) m[1].split(/\s+/).forEach((n) => names.add(n)); }
    } else if (f.path.startsWith('/etc/NetworkManager/')) {
      for (const l of lines) { const m = /^interface-name=(\S+)$/.exec(l); if (m) names.add(m[1]); }
    } else if (f.path.startsWith('/etc/sysconfig/network-scripts/')) {
      for (const l of lines) { const m = /^DEVICE=["']?([^"'\s]+)/.exec(l); if (m) names.add(m[1]); }
    }
  }
  return [...names].filter((n) => NIC_NAME.test(n)).sort();
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

export interface NicPin { name: string; match: { mac: string } | { driver: 'virtio_net' }; path: string; text: string }

export const LINK_DIR = '/etc/systemd/network';

/**
 * The .link files that keep the configured names on KVM, or why none can be written. `macs` are the VM's
 * NIC MAC addresses from the manifest (in its order), `bindings` the old persistent-net rules.
 */
export function planNicPins(names: string[], bindings: { mac: string; name: string }[], macs: string[]): { pins: NicPin[]; problem?: string } {
  const file = (name: string, match: NicPin['match']): NicPin => ({
    name, match, path: `${LINK_DIR}/10-ferry-${name}.link`,
    text: [
      '# Written by Ferry: keeps the name this NIC had on the source hypervisor, which the guest\'s network',
      '# configuration uses, now that the NIC is a virtio NIC on another PCI slot.',
      '[Match]', 'mac' in match ? `MACAddress=${match.mac}` : `Driver=${match.driver}`, '',
      '[Link]', `Name=${name}`, '',
    ].join('\n'),
  });
  if (!names.length) return { pins: [] };
  const bound = names.map((n) => bindings.find((b) => b.name === n));
  if (bound.every(Boolean)) return { pins: names.map((n, i) => file(n, { mac: bound[i]!.mac })) };
  if (names.length === 1) return { pins: [file(names[0], macs.length === 1 ? { mac: macs[0].toLowerCase().replace(/-/g, ':') } : { driver: 'virtio_net' })] };
  return { pins: [], problem: `the guest configures ${names.length} NICs (${names.join(', ')}) and which new NIC is which cannot be told (no MAC-to-name rules in the guest); the names are left to udev and may not match the configuration` };
}
