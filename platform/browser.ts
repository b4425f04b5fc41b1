// Browsers kept out unless invited (docs/security.md, "Browsers"), auth on or off, the way Jupyter and Vite do it:
// - Host must be a name this service answers to, so a DNS-rebound page (evil.example resolving to 127.0.0.1)
//   is refused: localhost and *.localhost, any IP literal (a rebinding needs a name), the listen host, and
//   FERRY_ALLOWED_HOSTS (exact names, `.example.com` for a domain and its subdomains, `*` for any). Else 421.
// - Origin, when a browser sends one, must be the service's own (same host:port as Host) or in
//   FERRY_CORS_ORIGINS: on every WebSocket upgrade and every HTTP request. Else 403.
// - Sec-Fetch-Site cross-site/same-site on a state-changing request is refused unless its Origin is invited,
//   and the simple content types a form can send cross-site without a preflight (text/plain,
//   application/x-www-form-urlencoded, multipart/form-data) are refused on state-changing methods (415):
//   Ferry's APIs read only JSON and YAML.
// Clients that send no Origin (curl, SDKs, Prometheus) are not browsers and pass the Origin rules.
import { isIP } from 'node:net';
import type { IncomingHttpHeaders } from 'node:http';
import { config } from './config';
import { fieldError, ApiError } from './errors';
import { setting } from './settings';

export interface BrowserRule { names: Set<string>; suffixes: string[]; anyHost: boolean; origins: string[] }

const WILDCARD = new Set(['0.0.0.0', '::', '[::]', '']);
const SAFE = new Set(['GET', 'HEAD', 'OPTIONS']);
const SIMPLE_TYPES = /^\s*(text\/plain|application\/x-www-form-urlencoded|multipart\/form-data)\b/i;

/** The rule of a service listening on `listenHost` (FERRY_ALLOWED_HOSTS and FERRY_CORS_ORIGINS from the env). */
export function browserRule(listenHost?: string, env: NodeJS.ProcessEnv = process.env): BrowserRule {
  const names = new Set(['localhost']);
  const suffixes = ['.localhost'];
  let anyHost = false;
  if (listenHost && !WILDCARD.has(listenHost)) names.add(hostname(listenHost));
  for (const raw of setting('FERRY_ALLOWED_HOSTS', env).map((h) => h.toLowerCase())) {
    if (raw === '*') anyHost = true;
    else if (raw.startsWith('.')) { suffixes.push(raw); names.add(raw.slice(1)); } else names.add(hostname(raw));
  }
  return { names, suffixes, anyHost, origins: config.corsOrigins };
}

/** The host name of a Host header or origin authority: lowercased, without port, brackets or a trailing dot. */
function hostname(authority: string): string {
  const a = authority.trim().toLowerCase();
  const h = a.startsWith('[') ? a.slice(1, a.indexOf(']') > 0 ? a.indexOf(']') : undefined) : a.replace(/:\d*$/, '');
  return h.replace(/\.$/, '');
}

export function hostAllowed(rule: BrowserRule, host: string | undefined): boolean {
  if (host === undefined || rule.anyHost) return true; // HTTP/1.0 without Host: not a browser
  const h = hostname(host);
  return isIP(h) !== 0 || rule.names.has(h) || rule.suffixes.some((s) => h.endsWith(s));
}

/** An Origin is invited when it is the service's own (same host and port as the request's Host) or listed. */
export function originAllowed(rule: BrowserRule, origin: string, host: string | undefined): boolean {
  const o = origin.trim().replace(/\/+$/, '');
  if (rule.origins.includes('*') || rule.origins.includes(o)) return true;
  try {
    const u = new URL(o);
    return !!host && (u.protocol === 'http:' || u.protocol === 'https:') && u.host === new URL(`http://${host.trim()}`).host;
  } catch { return false; }
}

const one = (v: string | string[] | undefined) => (Array.isArray(v) ? v[0] : v);
const clip = (s: string) => s.slice(0, 200);

/** Why a request (or, with `upgrade`, a WebSocket upgrade) is refused by the browser rule; undefined if it is not. */
export function browserRefusal(rule: BrowserRule, method: string, headers: IncomingHttpHeaders, upgrade = false): ApiError | undefined {
  const host = one(headers.host);
  if (!hostAllowed(rule, host)) return fieldError(421, 'Host', 'not a name this service answers to',
    `Host: ${clip(String(host))} is not a name this service answers to (localhost, an IP address, the listen host or FERRY_ALLOWED_HOSTS)`);
  const origin = one(headers.origin);
  const invited = origin !== undefined && originAllowed(rule, origin, host);
  if (origin !== undefined && !invited) return fieldError(403, 'Origin', 'not this service nor in FERRY_CORS_ORIGINS',
    `Origin ${clip(origin)} is not this service's own nor in FERRY_CORS_ORIGINS`);
  if (upgrade || SAFE.has(method.toUpperCase())) return undefined;
  const site = String(one(headers['sec-fetch-site']) || '').toLowerCase();
  if ((site === 'cross-site' || site === 'same-site') && !invited) return fieldError(403, 'Sec-Fetch-Site', 'a cross-site request without an invited Origin',
    `Sec-Fetch-Site: ${clip(site)}: a cross-site request needs an Origin in FERRY_CORS_ORIGINS`);
  const type = String(one(headers['content-type']) || '');
  if (SIMPLE_TYPES.test(type)) return fieldError(415, 'Content-Type', 'not accepted (send application/json or YAML)',
    `Content-Type: ${clip(type)} is not accepted on ${method} (a form can send it from any site): send application/json or YAML`);
  return undefined;
}
