// Which manager and credentials a request or job uses: its own fields first, then the process environment with
// govc's names (GOVC_URL, GOVC_USERNAME, GOVC_PASSWORD, GOVC_INSECURE; GOVC_URL may carry user:password@ as
// govc accepts). A per-job password lives encrypted beside the job (`credentials` = 'job'), never in its spec.
import type { Keys, RedisClient } from '../redis';
import { decryptSecret } from '../secrets';
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

/** A request's own fields over the environment's defaults; an error naming what is missing. */
export function resolveCredentials(o: CredentialOverrides, env: NodeJS.ProcessEnv = process.env): ManagerCredentials {
  const d = managerEnv(env);
  const url = o.manager_url ?? d.url;
  if (!url) throw new VsphereError('config', 'no vSphere manager given: pass manager_url (or server), or set GOVC_URL');
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
