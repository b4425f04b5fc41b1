// Which manager and credentials a request or job uses: its own fields first, then the process environment with
// govc's names (GOVC_URL, GOVC_USERNAME, GOVC_PASSWORD, GOVC_INSECURE; GOVC_URL may carry user:password@ as
// govc accepts). A per-job password lives encrypted beside the job (`credentials` = 'job'), never in its spec.
import type { Keys, RedisClient } from '../../platform/redis';
import { decryptSecret } from '../../platform/secretbox';
import { VsphereError } from './errors';
import type { ManagerCredentials } from './client';
import { setting } from '../../platform/settings';

export interface ManagerEnv { url?: string; username?: string; password?: string; insecure: boolean }

export function managerEnv(env: NodeJS.ProcessEnv = process.env): ManagerEnv {
  let url = setting('GOVC_URL', env);
  let username = setting('GOVC_USERNAME', env);
  let password = setting('GOVC_PASSWORD', env);
  if (url) {
    try {
      const u = new URL(/^[a-z]+:\/\//i.test(url) ? url : `https://${url}`);
      if (u.username && !username) username = decodeURIComponent(u.username);
      if (u.password && !password) password = decodeURIComponent(u.password);
      u.username = ''; u.password = '';
      url = u.href;
    } catch { /* left as given: the client reports it */ }
  }
  return { url, username, password, insecure: setting('GOVC_INSECURE', env) };
}

export interface CredentialOverrides { manager_url?: string; username?: string; password?: string; insecure?: boolean }

interface Endpoint { scheme: string; host: string; port: string }

/** scheme, host and port of a manager as given (a bare host is https), or null when it is not a URL. */
function endpoint(raw: string): Endpoint | null {
  try {
    const u = new URL(/^[a-z][a-z0-9+.-]*:\/\//i.test(raw) ? raw : `https://${raw}`);
    const scheme = u.protocol.replace(/:$/, '').toLowerCase();
    return { scheme, host: u.hostname.toLowerCase(), port: u.port || (scheme === 'http' ? '80' : '443') };
  } catch { return null; }
}

const same = (a: Endpoint | null, b: Endpoint | null) => !!a && !!b && a.scheme === b.scheme && a.host === b.host && a.port === b.port;
const listed = (env: NodeJS.ProcessEnv) => setting('FERRY_VSPHERE_MANAGERS', env);

/** Why a manager URL cannot be used, or null: credentials only travel over TLS, so anything but https:// (or a
 *  bare host, which means https) is refused by name rather than sent in clear. */
export function refuseManagerScheme(raw: string): string | null {
  const e = endpoint(raw);
  if (!e) return 'is not a URL';
  return e.scheme === 'https' ? null : `uses ${e.scheme}://: vSphere credentials only travel over verified TLS, give https://`;
}

/** Whether a service may contact this manager: GOVC_URL's, or one named in FERRY_VSPHERE_MANAGERS (comma-separated
 *  hosts, host:port or URLs; a bare host allows any port). A request or job cannot make Ferry reach other hosts. */
export function managerAllowed(raw: string, env: NodeJS.ProcessEnv = process.env): boolean {
  const want = endpoint(raw);
  if (!want || want.scheme !== 'https') return false;
  const d = managerEnv(env).url;
  return [...(d ? [d] : []), ...listed(env)].some((e) => {
    const bare = !/^[a-z]+:\/\//i.test(e) && !/:\d+$/.test(e) && !e.includes('/');
    const h = endpoint(e);
    return !!h && h.host === want.host && (bare || h.port === want.port);
  });
}

/** The managers an operator configured, for a picker: GOVC_URL's (the default) and each FERRY_VSPHERE_MANAGERS entry
 *  that names one endpoint (a URL or host:port; a bare host is a pattern allowing any port, not a manager), without
 *  user information, one per scheme, host and port. */
export function configuredManagers(env: NodeJS.ProcessEnv = process.env): { url: string; default: boolean }[] {
  const d = managerEnv(env).url;
  const out: { url: string; default: boolean; at: Endpoint | null }[] = d ? [{ url: d, default: true, at: endpoint(d) }] : [];
  for (const e of listed(env)) {
    if (!/^[a-z]+:\/\//i.test(e) && !/:\d+$/.test(e)) continue;
    const at = endpoint(e);
    if (!at || at.scheme !== 'https' || out.some((o) => same(o.at, at))) continue;
    const u = new URL(/^[a-z]+:\/\//i.test(e) ? e : `https://${e}`);
    u.username = ''; u.password = '';
    out.push({ url: u.href, default: false, at });
  }
  return out.map(({ url, default: isDefault }) => ({ url, default: isDefault }));
}

/** Whether the default credentials (GOVC_USERNAME, GOVC_PASSWORD) may go to this manager: GOVC_URL's own, or an
 *  entry of FERRY_VSPHERE_MANAGERS, compared by scheme, host and port (a bare host is https on 443). Any other
 *  manager a job or request names must bring its own credentials. */
export function getsDefaultCredentials(raw: string, env: NodeJS.ProcessEnv = process.env): boolean {
  const want = endpoint(raw);
  const d = managerEnv(env).url;
  return [...(d ? [d] : []), ...listed(env)].some((e) => same(endpoint(e), want));
}

/** Whether the operator set this manager up as insecure: GOVC_INSECURE, for GOVC_URL's manager only. */
export function configuredInsecure(raw: string | undefined, env: NodeJS.ProcessEnv = process.env): boolean {
  const d = managerEnv(env);
  return d.insecure && (raw === undefined || (!!d.url && same(endpoint(raw), endpoint(d.url))));
}

const shown = (raw: string) => { const e = endpoint(raw); return e ? `${e.host}:${e.port}` : '(not a URL)'; };

/** A request's own fields over the environment's defaults; an error naming what is missing or not allowed.
 *  `anyManager`: the command-line tool, whose configuration is its user's own, may name any manager. */
export function resolveCredentials(o: CredentialOverrides, env: NodeJS.ProcessEnv = process.env, anyManager = false): ManagerCredentials {
  const d = managerEnv(env);
  const url = o.manager_url ?? d.url;
  if (!url) throw new VsphereError('config', 'no vSphere manager given: pass manager_url (or server), or set GOVC_URL');
  const scheme = refuseManagerScheme(url);
  if (scheme) throw new VsphereError('config', `manager_url ${shown(url)} ${scheme}`);
  if (o.manager_url !== undefined && !anyManager && !managerAllowed(o.manager_url, env)) {
    throw new VsphereError('config',
      `manager_url ${shown(o.manager_url)} is not a vSphere manager this service may contact: it must be GOVC_URL's or listed in FERRY_VSPHERE_MANAGERS`);
  }
  const defaults = anyManager || o.manager_url === undefined || getsDefaultCredentials(o.manager_url, env);
  if (o.password === undefined && !defaults && d.password !== undefined) {
    throw new VsphereError('config',
      `password: the default credentials (GOVC_*) go only to GOVC_URL's manager and to FERRY_VSPHERE_MANAGERS entries of the same scheme, host and port; ` +
      `${shown(url)} needs its own username and password`);
  }
  return {
    url, username: o.username ?? (defaults ? d.username : undefined), password: o.password ?? (defaults ? d.password : undefined),
    insecure: o.insecure ?? (anyManager ? d.insecure : configuredInsecure(o.manager_url, env)),
  };
}

/** The job's own password (stored encrypted by the daemon), or undefined: the environment's is then applied by
 *  resolveCredentials, which gives it only to the managers allowed to receive it. */
export async function jobPassword(redis: RedisClient, k: Keys, jobId: string, source: string | undefined,
  env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  if (source !== 'job') return undefined;
  const box = await redis.get(k.credentials(jobId));
  if (!box) throw new VsphereError('auth', 'the job\'s own manager password is no longer stored (it expires with the job timeout); submit the job again');
  try { return decryptSecret(box, env); } catch (e) { throw new VsphereError('auth',
    `the job's manager password cannot be decrypted on this worker (${(e as Error).message}): give every service the same FERRY_SECRET_KEY`); }
}
