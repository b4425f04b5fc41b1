// Where outbound HTTP (webhook deliveries) may go. An address is classified by ipaddr.js (IPv4-mapped IPv6 is
// unwrapped first, so [::ffff:127.0.0.1] is loopback); only public unicast is allowed by default. The check runs
// twice: before a target is accepted (a readable 400), and inside the connection's DNS lookup, so the socket goes
// to the very address that was checked and a DNS answer that changes in between (rebinding) cannot slip through.
import dns from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import ipaddr from 'ipaddr.js';

export interface TargetPolicy {
  /** 127.0.0.0/8 and ::1 (a receiver on the same host; the tests use it). */
  allow_loopback: boolean;
  /** RFC 1918, unique-local fc00::/7 and CGNAT 100.64.0.0/10: a receiver on the operator's own network. */
  allow_private: boolean;
}

const PRIVATE = new Set(['private', 'uniqueLocal', 'carrierGradeNat']);

/** Why `ip` may not be connected to under `policy`, or null when it may. Link-local (which holds the cloud
 *  metadata address 169.254.169.254), unspecified (0.0.0.0, ::), multicast, broadcast and reserved ranges are
 *  never allowed: no receiver lives there. */
export function refuseAddress(ip: string, policy: TargetPolicy): string | null {
  if (!ipaddr.isValid(ip)) return `${ip} is not an IP address`;
  const addr = ipaddr.process(ip);
  const range = addr.range();
  if (range === 'unicast') return null;
  if (range === 'loopback') return policy.allow_loopback ? null : `loopback address ${addr.toString()} refused (webhooks.allow_loopback is false)`;
  if (PRIVATE.has(range)) return policy.allow_private ? null : `private address ${addr.toString()} (${range}) refused (webhooks.allow_private is false)`;
  return `address ${addr.toString()} (${range}) is never a webhook target`;
}

function hostOf(url: string): string {
  return new URL(url).hostname.replace(/^\[|\]$/g, '');
}

/** Resolves the URL's host now and refuses it when any address it resolves to is refused (the readable check
 *  at POST /webhooks and before each delivery; the connection itself is guarded by `guardedAgent`). */
export async function checkTarget(url: string, policy: TargetPolicy): Promise<string | null> {
  let host: string;
  try { host = hostOf(url); } catch { return `${url} is not a URL`; }
  if (net.isIP(host)) { const r = refuseAddress(host, policy); return r && `target ${host}: ${r}`; }
  let addrs: string[];
  try {
    addrs = (await dns.promises.lookup(host, { all: true })).map((a) => a.address);
  } catch (e) {
    return `cannot resolve ${host}: ${(e as Error).message}`;
  }
  for (const ip of addrs) {
    const r = refuseAddress(ip, policy);
    if (r) return `target ${host} resolves to ${ip}: ${r}`;
  }
  return null;
}

/** A dns.lookup replacement that answers only addresses the policy allows (every address of a name must pass). */
export function guardedLookup(policy: TargetPolicy): net.LookupFunction {
  return (hostname, options, callback) => {
    dns.lookup(hostname, { ...options, all: true }, (err, addrs) => {
      if (err) return callback(err, '', 0);
      const list = addrs;
      for (const a of list) {
        const r = refuseAddress(a.address, policy);
        if (r) {
          const e = Object.assign(new Error(`connection to ${hostname} refused: ${r}`), { code: 'EFERRYREFUSED' });
          return callback(e, '', 0);
        }
      }
      if ((options).all) callback(null, list);
      else callback(null, list[0].address, list[0].family);
    });
  };
}

/** http and https agents whose connections resolve through `guardedLookup`. net.connect skips the lookup for an
 *  IP literal, so `post` checks literals itself before connecting. */
export function guardedAgents(policy: TargetPolicy) {
  const lookup = guardedLookup(policy);
  return { http: new http.Agent({ keepAlive: false, lookup }), https: new https.Agent({ keepAlive: false, lookup }) };
}

export interface PostResult { status: number }

/** POSTs `body` to `url` through the guarded agents; redirects are not followed (a 3xx is the answer). */
export function guardedPost(url: string, body: string, headers: Record<string, string>, timeoutMs: number, agents: ReturnType<typeof guardedAgents>,
  policy: TargetPolicy): Promise<PostResult> {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const host = u.hostname.replace(/^\[|\]$/g, '');
    if (net.isIP(host)) {
      const r = refuseAddress(host, policy);
      if (r) return reject(new Error(`connection to ${host} refused: ${r}`));
    }
    const mod = u.protocol === 'https:' ? https : http;
    const req = mod.request(u, { method: 'POST', headers: { ...headers, 'content-length': String(Buffer.byteLength(body)) },
      agent: u.protocol === 'https:' ? agents.https : agents.http }, (res) => {
      res.resume();
      res.on('end', () => { clearTimeout(timer); resolve({ status: res.statusCode || 0 }); });
      res.on('error', (e) => { clearTimeout(timer); reject(e); });
    });
    // The whole attempt, connect to last byte, not only socket idleness.
    const timer = setTimeout(() => req.destroy(Object.assign(new Error(`timed out after ${timeoutMs / 1000} s`), { name: 'TimeoutError' })), timeoutMs);
    req.on('error', (e) => { clearTimeout(timer); reject(e); });
    req.end(body);
  });
}
