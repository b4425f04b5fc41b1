// Which manager and credentials a request or job uses: its own fields first, then the process environment with
// govc's names (GOVC_URL, GOVC_USERNAME, GOVC_PASSWORD, GOVC_INSECURE; GOVC_URL may carry user:password@ as
// govc accepts). A per-job password lives encrypted beside the job (`credentials` = 'job'), never in its spec.
import type { Keys, RedisClient } from '../redis';
import { decryptSecret } from '../secretbox';
import { VsphereError } from './errors';
import type { ManagerCredentials } from './client';

export interface ManagerEnv { url?: string; username?: string; password?: string; insecure: boolean }

const truthy = (v: string | undefined) => /^(1|true|yes|on)$/i.test(v || '');

export function managerEnv(env: NodeJS.ProcessEnv = process.env): ManagerEnv {
  let url = env.GOVC_URL || undefined;
  let username = env.GOVC_USERNAME || undefined;
  let password = env.GOVC_PASSWORD || undefined;
  if (url) {
    try {
      const u = new URL(/^[a-z]+:\/\//i.test(url) ? url : `https://${url}`);
      if (u.username && !username) username = decodeURIComponent(u.username);
      if (u.password && !password) password = decodeURIComponent(u.password);
      u.username = ''; u.password = '';
      url = u.href;
    } catch { /* left as given: the client reports it */ }
  }
  return { url, username, password, insecure: truthy(env.GOVC_INSECURE) };
}

export interface CredentialOverrides { manager_url?: string; username?: string; password?: string; insecure?: boolean }

function hostPort(raw: string): { host: string; port: string } | null {
  try {
    const u = new URL(/^[a-z]+:\/\//i.test(raw) ? raw : `https://${raw}`);
    return { host: u.hostname.toLowerCase(), port: u.port || (u.protocol === 'http:' ? '80' : '443') };
  } catch { return null; }
}

/** Whether a service may contact this manager: GOVC_URL's, or one named in FERRY_VSPHERE_MANAGERS (comma-separated
 *  hosts, host:port or URLs; a bare host allows any port). A request or job cannot make Ferry reach other hosts. */
export function managerAllowed(raw: string, env: NodeJS.ProcessEnv = process.env): boolean {
  const want = hostPort(raw);
  if (!want) return false;
  const d = managerEnv(env).url;
  const entries = [...(d ? [d] : []), ...(env.FERRY_VSPHERE_MANAGERS || '').split(',').map((x) => x.trim()).filter(Boolean)];
  return entries.some((e) => {
    const bare = !/^[a-z]+:\/\//i.test(e) && !/:\d+$/.test(e) && !e.includes('/');
    const h = hostPort(e);
    return !!h && h.host === want.host && (bare || h.port === want.port);
  });
}

/** A request's own fields over the environment's defaults; an error naming what is missing or not allowed.
 *  `anyManager`: the command-line tool, whose configuration is its user's own, may name any manager. */
export function resolveCredentials(o: CredentialOverrides, env: NodeJS.ProcessEnv = process.env, anyManager = false): ManagerCredentials {
  const d = managerEnv(env);
  const url = o.manager_url ?? d.url;
  if (!url) throw new VsphereError('config', 'no vSphere manager given: pass manager_url (or server), or set GOVC_URL');
  if (o.manager_url !== undefined && !anyManager && !managerAllowed(o.manager_url, env)) {
    throw new VsphereError('config', `manager_url ${hostPort(o.manager_url) ? `${hostPort(o.manager_url)!.host}:${hostPort(o.manager_url)!.port}` : '(not a URL)'} is not a vSphere manager this service may contact: it must be GOVC_URL's or listed in FERRY_VSPHERE_MANAGERS`);
  }
  return { url, username: o.username ?? d.username, password: o.password ?? d.password, insecure: o.insecure ?? d.insecure };
}

/** The password a job uses: its own (stored encrypted by the daemon), or the environment's. */
export async function jobPassword(redis: RedisClient, k: Keys, jobId: string, source: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  if (source === 'job') {
    const box = await redis.get(k.credentials(jobId));
    if (!box) throw new VsphereError('auth', 'the job\'s own manager password is no longer stored (it expires with the job timeout); submit the job again');
    try { return decryptSecret(box, env); } catch (e) { throw new VsphereError('auth', `the job's manager password cannot be decrypted on this worker (${(e as Error).message}): give every service the same FERRY_SECRET_KEY`); }
  }
  return managerEnv(env).password;
}
