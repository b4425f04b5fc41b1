// The one answer to "which client sent this request" (the audit's `ip`, the rate limits' client address): the
// socket's peer, unless that peer is a proxy the operator listed in FERRY_TRUSTED_PROXIES; then X-Forwarded-For is
// read from the right, skipping the listed proxies, and the first address no listed proxy vouches for is the
// client. Koa's own `proxy` setting (ctx.ip) believes any sender's header, so it stays off.
import type http from 'node:http';
import ipaddr from 'ipaddr.js';
import { config } from './config';

type Range = [ipaddr.IPv4 | ipaddr.IPv6, number];

/** An address with IPv4-mapped IPv6 unwrapped (::ffff:10.0.0.1 is 10.0.0.1), or null when it is none. */
function parse(a: string): ipaddr.IPv4 | ipaddr.IPv6 | null {
  const s = a.trim().replace(/^\[(.*)\]$/, '$1');
  if (!ipaddr.isValid(s)) return null;
  const ip = ipaddr.parse(s);
  return ip.kind() === 'ipv6' && (ip as ipaddr.IPv6).isIPv4MappedAddress() ? (ip as ipaddr.IPv6).toIPv4Address() : ip;
}

let parsedFrom: string | undefined;
let ranges: Range[] = [];
/** FERRY_TRUSTED_PROXIES as ranges (parsed again only when the setting changed); a bad entry throws, naming it. */
export function trustedRanges(list = config.trustedProxies): Range[] {
  const key = list.join(',');
  if (key === parsedFrom) return ranges;
  ranges = list.map((e) => {
    try {
      if (e.includes('/')) { const [ip, bits] = ipaddr.parseCIDR(e); return [parse(ip.toString()) ?? ip, ip.kind() === 'ipv6' &&
        (ip as ipaddr.IPv6).isIPv4MappedAddress() ? bits - 96 : bits] as Range; }
      const ip = parse(e);
      if (!ip) throw new Error('not an address');
      return [ip, ip.kind() === 'ipv4' ? 32 : 128] as Range;
    } catch { throw new Error(`FERRY_TRUSTED_PROXIES: "${e}" is not an address or CIDR`); }
  });
  parsedFrom = key;
  return ranges;
}

function trusted(ip: ipaddr.IPv4 | ipaddr.IPv6, list: Range[]): boolean {
  return list.some(([net, bits]) => net.kind() === ip.kind() && ip.match(net, bits));
}

/** The client address of a request (see the top of this file); the peer's own address when it is no listed proxy. */
export function clientAddress(req: Pick<http.IncomingMessage, 'headers' | 'socket'>): string {
  const peer = req.socket.remoteAddress ?? '';
  const list = trustedRanges();
  const peerIp = parse(peer);
  if (!list.length || !peerIp || !trusted(peerIp, list)) return peerIp?.toString() ?? peer;
  const raw = req.headers['x-forwarded-for'];
  const hops = (Array.isArray(raw) ? raw.join(',') : raw ?? '').split(',').map((h) => h.trim()).filter(Boolean);
  let client = peerIp.toString();
  for (let i = hops.length - 1; i >= 0; i--) {
    const ip = parse(hops[i]);
    if (!ip) break; // a hop that is no address: the last good one stands
    client = ip.toString();
    if (!trusted(ip, list)) break;
  }
  return client;
}
