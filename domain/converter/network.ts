// configuration.network for Linux guests: static or DHCP settings per interface, written in the format of the
// network stack the guest already uses (netplan, NetworkManager, RHEL ifcfg, Debian ifupdown, systemd-networkd).
// Interfaces are best matched by MAC address: a VMware NIC named ens192 comes back under another name on KVM.
// Renderers are pure functions (tested without an appliance); applyNetwork does the guest I/O.
import { randomUUID } from 'node:crypto';
import { isIP } from 'node:net';
import { dump } from 'js-yaml';
import type { GuestSession } from './guestfs';
import type { FixAction } from './types';

export const RENDERERS = ['netplan', 'networkmanager', 'ifcfg', 'ifupdown', 'networkd'] as const;
export type Renderer = typeof RENDERERS[number];

export interface Iface {
  name?: string; mac?: string; dhcp4: boolean; addresses: string[]; gateway4?: string; gateway6?: string; dns: string[]; mtu?: number;
}

const MAC = /^([0-9a-f]{2}:){5}[0-9a-f]{2}$/;
const IFNAME = /^[A-Za-z0-9_.-]{1,15}$/;

type Warn = (path: string, message: string) => void;

function cidr(s: unknown): boolean {
  if (typeof s !== 'string') return false;
  const [ip, len, ...rest] = s.split('/');
  const v = isIP(ip);
  return !rest.length && v > 0 && /^\d{1,3}$/.test(len ?? '') && Number(len) <= (v === 4 ? 32 : 128);
}

/** An array of strings each passing `ok`. */
const listOf = (v: unknown, ok: (s: unknown) => boolean): v is string[] => Array.isArray(v) && v.every(ok);

type RawIface = Record<string, unknown>;
const isStr = (v: unknown): v is string => typeof v === 'string';
const strOr = (v: unknown) => (isStr(v) ? v : undefined);
type IfaceRule = readonly [field: string, message: string, broken: (r: RawIface) => boolean];
const gatewayRule = (f: 'gateway4' | 'gateway6', v: 4 | 6): IfaceRule =>
  [f, `must be an IPv${v} address`, (r) => { const g = r[f]; return g !== undefined && !(isStr(g) && isIP(g) === v); }];
const mtuOk = (m: unknown) => typeof m === 'number' && Number.isInteger(m) && m >= 576 && m <= 65535;

/** The checks of one interface in the order they are reported; the first broken one skips the interface. The address
 * rules come before the static-interface rule, which may then read `addresses` as an array. */
const IFACE_RULES: readonly IfaceRule[] = [
  ['name', 'give name or mac (or both)', (r) => r.name === undefined && r.mac === undefined],
  ['name', 'is not an interface name (at most 15 of A-Z a-z 0-9 _ . -)', (r) => r.name !== undefined && !(isStr(r.name) && IFNAME.test(r.name))],
  ['mac', 'must look like 00:50:56:aa:bb:cc', (r) => r.mac !== undefined && !(isStr(r.mac) && MAC.test(r.mac))],
  ['addresses', 'must be an array of addresses with a prefix length ("10.0.0.5/24")', (r) => !listOf(r.addresses ?? [], cidr)],
  ['dhcp4', 'must be a boolean', (r) => r.dhcp4 !== undefined && typeof r.dhcp4 !== 'boolean'],
  ['addresses', 'a static interface (dhcp4: false) needs at least one address', (r) => r.dhcp4 === false && !(r.addresses as string[] | undefined)?.length],
  gatewayRule('gateway4', 4), gatewayRule('gateway6', 6),
  ['dns', 'must be an array of IP addresses', (r) => !listOf(r.dns ?? [], (d) => isStr(d) && isIP(d) !== 0)],
  ['mtu', 'must be an integer from 576 to 65535', (r) => r.mtu !== undefined && !mtuOk(r.mtu)],
];

/** One interface, checked against IFACE_RULES; undefined (after a warning naming the field) when it is skipped. */
function readInterface(item: unknown, p: string, warn: Warn): Iface | undefined {
  if (!item || typeof item !== 'object') { warn(p, 'must be an object'); return undefined; }
  const src = item as RawIface;
  const r: RawIface = { ...src, mac: isStr(src.mac) ? src.mac.toLowerCase().replace(/-/g, ':') : src.mac };
  const broken = IFACE_RULES.find(([, , isBroken]) => isBroken(r));
  if (broken) { warn(`${p}.${broken[0]}`, broken[1]); return undefined; }
  const addresses = (r.addresses ?? []) as string[];
  return {
    name: strOr(r.name), mac: strOr(r.mac), dhcp4: typeof r.dhcp4 === 'boolean' ? r.dhcp4 : !addresses.length, addresses,
    gateway4: strOr(r.gateway4), gateway6: strOr(r.gateway6), dns: (r.dns ?? []) as string[], mtu: typeof r.mtu === 'number' ? r.mtu : undefined,
  };
}

/** configuration.network.interfaces, checked: a bad interface is a warning naming its path and is skipped. */
export function readInterfaces(net: unknown, warn: Warn): Iface[] {
  const list = net && typeof net === 'object' ? (net as Record<string, unknown>).interfaces : undefined;
  if (!Array.isArray(list) || !list.length) { warn('configuration.network.interfaces', 'must be a non-empty array of interfaces'); return []; }
  return list.flatMap((item: unknown, i: number) => readInterface(item, `configuration.network.interfaces[${i}]`, warn) ?? []);
}

const v4 = (a: string) => isIP(a.split('/')[0]) === 4;
const label = (f: Iface, i: number) => f.name || `ferry${i}`;

/** The ifupdown stanzas of one interface (auto, allow-hotplug and its iface blocks), ending with a newline. */
function ifupdownStanza(f: Iface): string {
  const a4 = f.addresses.filter(v4);
  const a6 = f.addresses.filter((a) => !v4(a));
  const lines = [`auto ${f.name}`, `allow-hotplug ${f.name}`];
  if (f.dhcp4) lines.push(`iface ${f.name} inet dhcp`);
  a4.forEach((a, k) => {
    lines.push(`iface ${f.name} inet static`, `    address ${a}`);
    if (k === 0 && f.gateway4) lines.push(`    gateway ${f.gateway4}`);
    if (k === 0 && f.dns.length) lines.push(`    dns-nameservers ${f.dns.join(' ')}`);
    if (k === 0 && f.mtu) lines.push(`    mtu ${f.mtu}`);
  });
  a6.forEach((a, k) => {
    lines.push(`iface ${f.name} inet6 static`, `    address ${a}`);
    if (k === 0 && f.gateway6) lines.push(`    gateway ${f.gateway6}`);
  });
  return lines.join('\n') + '\n';
}

/** The files a renderer writes for `ifaces`: [{path, text, mode}]. */
export function render(r: Renderer, ifaces: Iface[]): { path: string; text: string; mode: number }[] {
  const head = '# Written by Ferry from the manifest\'s configuration.network.\n';
  switch (r) {
    case 'netplan': {
      const ethernets: Record<string, unknown> = {};
      ifaces.forEach((f, i) => {
        const e: Record<string, unknown> = {};
        if (f.mac) e.match = { macaddress: f.mac };
        else e.match = { name: f.name };
        if (f.mac && f.name) e['set-name'] = f.name;
        e.dhcp4 = f.dhcp4;
        if (f.addresses.length) e.addresses = f.addresses;
        const routes = [...(f.gateway4 ? [{ to: 'default', via: f.gateway4 }] : []), ...(f.gateway6 ? [{ to: 'default', via: f.gateway6 }] : [])];
        if (routes.length) e.routes = routes;
        if (f.dns.length) e.nameservers = { addresses: f.dns };
        if (f.mtu) e.mtu = f.mtu;
        ethernets[label(f, i)] = e;
      });
      return [{ path: '/etc/netplan/90-ferry.yaml', text: head + dump({ network: { version: 2, ethernets } }, { lineWidth: -1 }), mode: 0o600 }];
    }
    case 'networkd':
      return ifaces.map((f, i) => ({
        path: `/etc/systemd/network/90-ferry-${label(f, i)}.network`, mode: 0o644,
        text: head + [
          '[Match]', f.mac ? `MACAddress=${f.mac}` : `Name=${f.name}`, '',
          '[Network]', ...(f.dhcp4 ? ['DHCP=ipv4'] : []), ...f.addresses.map((a) => `Address=${a}`),
          ...[f.gateway4, f.gateway6].filter(Boolean).map((g) => `Gateway=${g}`), ...f.dns.map((d) => `DNS=${d}`),
          ...(f.mtu ? ['', '[Link]', `MTUBytes=${f.mtu}`] : []), '',
        ].join('\n'),
      }));
    case 'networkmanager':
      return ifaces.map((f, i) => {
        const a4 = f.addresses.filter(v4);
        const a6 = f.addresses.filter((a) => !v4(a));
        return {
          path: `/etc/NetworkManager/system-connections/ferry-${label(f, i)}.nmconnection`, mode: 0o600,
          text: head + [
            '[connection]', `id=ferry-${label(f, i)}`, `uuid=${randomUUID()}`, 'type=ethernet',
            ...(f.name && !f.mac ? [`interface-name=${f.name}`] : []), 'autoconnect=true', '',
            '[ethernet]', ...(f.mac ? [`mac-address=${f.mac.toUpperCase()}`] : []), ...(f.mtu ? [`mtu=${f.mtu}`] : []), '',
            '[ipv4]', `method=${f.dhcp4 ? 'auto' : a4.length ? 'manual' : 'disabled'}`,
            ...a4.map((a, k) => `address${k + 1}=${a}${k === 0 && f.gateway4 ? `,${f.gateway4}` : ''}`),
            ...(f.dns.filter((d) => isIP(d) === 4).length ? [`dns=${f.dns.filter((d) => isIP(d) === 4).join(';')};`] : []), '',
            '[ipv6]', `method=${a6.length ? 'manual' : 'auto'}`, ...a6.map((a, k) => `address${k + 1}=${a}${k === 0 && f.gateway6 ? `,${f.gateway6}` : ''}`),
            ...(f.dns.filter((d) => isIP(d) === 6).length ? [`dns=${f.dns.filter((d) => isIP(d) === 6).join(';')};`] : []), '',
          ].join('\n'),
        };
      });
    case 'ifcfg':
      return ifaces.map((f, i) => {
        const a4 = f.addresses.filter(v4);
        return {
          path: `/etc/sysconfig/network-scripts/ifcfg-${label(f, i)}`, mode: 0o644,
          text: head + [
            `DEVICE=${label(f, i)}`, ...(f.mac ? [`HWADDR=${f.mac}`] : []), 'TYPE=Ethernet', 'ONBOOT=yes', `BOOTPROTO=${f.dhcp4 ? 'dhcp' : 'none'}`,
            ...a4.flatMap((a, k) => { const [ip, len] = a.split('/'); const n = k ? String(k) : ''; return [`IPADDR${n}=${ip}`, `PREFIX${n}=${len}`]; }),
            ...(f.gateway4 ? [`GATEWAY=${f.gateway4}`] : []), ...f.dns.map((d, k) => `DNS${k + 1}=${d}`), ...(f.mtu ? [`MTU=${f.mtu}`] : []),
            ...(f.addresses.some((a) => !v4(a))
              ? ['IPV6INIT=yes', `IPV6ADDR=${f.addresses.find((a) => !v4(a))}`, ...(f.gateway6 ? [`IPV6_DEFAULTGW=${f.gateway6}`] : [])]
              : []),
            '',
          ].join('\n'),
        };
      });
    case 'ifupdown':
      return [{
        path: '/etc/network/interfaces.d/90-ferry', mode: 0o644,
        text: head + ifaces.map(ifupdownStanza).join('\n'),
      }];
  }
}

/** Comments out the stanzas of `names` in an ifupdown interfaces file (they would clash with ours). */
export function disableIfupdownStanzas(text: string, names: string[]): { text: string; disabled: string[] } {
  const disabled = new Set<string>();
  const out: string[] = [];
  let inside = false;
  for (const line of text.split('\n')) {
    const m = /^\s*(iface|auto|allow-hotplug|allow-auto)\s+(.*)$/.exec(line);
    if (m) {
      const which = m[1] === 'iface' ? [m[2].split(/\s+/)[0]] : m[2].split(/\s+/);
      inside = m[1] === 'iface' && names.includes(which[0]);
      if (which.some((n) => names.includes(n))) {
        which.filter((n) => names.includes(n)).forEach((n) => disabled.add(n));
        out.push(`# ferry: ${line}`);
        continue;
      }
    } else if (/^\S/.test(line)) inside = false;
    out.push(inside && line.trim() ? `# ferry: ${line}` : line);
  }
  return { text: out.join('\n'), disabled: [...disabled] };
}

/** Which network stack the guest uses, from what is installed; the first found wins. */
export async function detectRenderer(g: GuestSession): Promise<Renderer | undefined> {
  if (await g.isDir('/etc/netplan')) return 'netplan';
  if ((await g.isFile('/etc/NetworkManager/NetworkManager.conf'))
    && ((await g.exists('/usr/sbin/NetworkManager')) || (await g.isDir('/etc/NetworkManager/system-connections')))) return 'networkmanager';
  if (await g.isDir('/etc/sysconfig/network-scripts')) return 'ifcfg';
  if (await g.isFile('/etc/network/interfaces')) return 'ifupdown';
  if (await g.isDir('/etc/systemd/network')) return 'networkd';
  return undefined;
}

const PERSISTENT_NET_RULES = '/etc/udev/rules.d/70-persistent-net.rules';

/** Applies configuration.network to the mounted guest. */
const isRenderer = (v: unknown): v is Renderer => (RENDERERS as readonly unknown[]).includes(v);

export async function applyNetwork(g: GuestSession, given: unknown, o: { dry_run: boolean; backup: boolean }, act: (a: FixAction) => void): Promise<boolean> {
  const warn: Warn = (path, message) => act({ action: 'configuration.network', status: 'warning', detail: `${path}: ${message}` });
  if (!given || typeof given !== 'object' || Array.isArray(given)) { warn('configuration.network', 'must be an object'); return false; }
  const net = given as Record<string, unknown>;
  if (net.renderer !== undefined && net.renderer !== 'auto' && !isRenderer(net.renderer)) {
    warn('configuration.network.renderer', `must be auto or one of ${RENDERERS.join(', ')}`);
    return false;
  }
  const ifaces = readInterfaces(net, warn);
  if (!ifaces.length) return false;
  const renderer = isRenderer(net.renderer) ? net.renderer : await detectRenderer(g);
  if (!renderer) {
    warn('configuration.network', 'no network configuration system found in the guest '
      + '(netplan, NetworkManager, ifcfg, ifupdown, systemd-networkd); set configuration.network.renderer');
    return false;
  }
  const usable = renderer === 'ifupdown'
    ? ifaces.filter((f, i) => f.name || (warn(`configuration.network.interfaces[${i}].name`, 'ifupdown matches interfaces by name only; give name'), false))
    : ifaces;
  if (!usable.length) return false;
  const files = render(renderer, usable);
  const st = o.dry_run ? 'would_do' : 'done';
  let modified = await writeRendered(g, files, renderer, o, act);
  if (renderer === 'ifupdown' && (await includeFerryStanzas(g, usable, o, act))) modified = true;
  // Old MAC-to-name bindings from the source hypervisor would rename the new NICs unpredictably.
  if (net.remove_persistent_rules !== false && (await g.isFile(PERSISTENT_NET_RULES))) {
    if (!o.dry_run) { if (o.backup) await g.backup(PERSISTENT_NET_RULES); await g.cmd('rm', PERSISTENT_NET_RULES); modified = true; }
    act({ action: 'configuration.network', status: st, detail: `removed ${PERSISTENT_NET_RULES} (MAC bindings of the source NICs)` });
  }
  return modified;
}

/** Writes the rendered files (not on a dry run), each with its action; true when the guest was modified. */
async function writeRendered(
  g: GuestSession, files: { path: string; text: string; mode: number }[], renderer: Renderer, o: { dry_run: boolean }, act: (a: FixAction) => void,
): Promise<boolean> {
  const st = o.dry_run ? 'would_do' : 'done';
  let modified = false;
  for (const f of files) {
    if (!o.dry_run) {
      await g.cmd('mkdir-p', f.path.slice(0, f.path.lastIndexOf('/')));
      await g.writeFile(f.path, f.text);
      await g.cmd('chmod', `0${f.mode.toString(8)}`, f.path);
      modified = true;
    }
    act({ action: 'configuration.network', status: st, detail: `${renderer}: wrote ${f.path}`, file: f.path, renderer });
  }
  return modified;
}

/** Comments out ifupdown's own stanzas of the interfaces and sources interfaces.d from /etc/network/interfaces;
 *  true when the guest was modified. */
async function includeFerryStanzas(
  g: GuestSession, usable: Iface[], o: { dry_run: boolean; backup: boolean }, act: (a: FixAction) => void,
): Promise<boolean> {
  const st = o.dry_run ? 'would_do' : 'done';
  let modified = false;
  const main = '/etc/network/interfaces';
  const text = (await g.isFile(main)) ? await g.read(main) : '';
  const dis = disableIfupdownStanzas(text, usable.map((f) => f.name!));
  const sources = /^\s*source(-directory)?\s+\/etc\/network\/interfaces\.d/m.test(dis.text);
  const next = sources ? dis.text : `${dis.text.replace(/\n?$/, '\n')}source /etc/network/interfaces.d/*\n`;
  if (next !== text) {
    if (!o.dry_run) { if (o.backup && text) await g.backup(main); await g.writeFile(main, next); modified = true; }
    const done = [
      dis.disabled.length ? `commented out the stanzas of ${dis.disabled.join(', ')}` : '',
      sources ? '' : 'added "source /etc/network/interfaces.d/*"',
    ].filter(Boolean).join('; ');
    act({ action: 'configuration.network', status: st, detail: `${main}: ${done}` });
  }
  return modified;
}
