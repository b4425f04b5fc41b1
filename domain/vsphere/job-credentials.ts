// Remote-manager credentials of a daemon job (the daemon API and scheduled runs). Defaults come from the environment with govc's names
// (domain/vsphere/credentials.ts); a job may override them. A per-job password is stored only encrypted
// (platform/secretbox.ts) in its own key beside the job, never in the spec, the meta, a response or a log. Without
// FERRY_SECRET_KEY a per-job password is refused.
import { fieldError } from '../../platform/errors';
import type { Keys, RedisClient } from '../../platform/redis';
import { canEncrypt, encryptSecret } from '../../platform/secretbox';
import { configuredInsecure, managerEnv } from './credentials';
import { adminOnly } from '../../platform/admin-only';
import type { Caller } from '../../platform/auth';


export interface ManagerDefaults { manager_url?: string; username?: string; insecure: boolean; hasPassword: boolean }

export function managerDefaults(env: NodeJS.ProcessEnv = process.env): ManagerDefaults {
  const d = managerEnv(env);
  return { manager_url: d.url, username: d.username, insecure: d.insecure, hasPassword: !!d.password };
}

/** Refuses a per-job password when it could not be stored encrypted (400 naming the field). */
export function checkPasswordStorable(field: string, password: string | undefined) {
  if (password !== undefined && !canEncrypt()) {
    throw fieldError(400, field, 'needs FERRY_SECRET_KEY on the daemon',
      `${field} cannot be accepted: the daemon has no FERRY_SECRET_KEY to store it encrypted (set it, or use GOVC_PASSWORD)`);
  }
}

export async function storePassword(redis: RedisClient, k: Keys, jobId: string, password: string, ttlSeconds: number) {
  await redis.set(k.credentials(jobId), encryptSecret(password), 'EX', Math.max(60, Math.ceil(ttlSeconds)));
}

/** `insecure` (no TLS verification) for a manager the operator did not configure as insecure (GOVC_INSECURE,
 *  for GOVC_URL's manager) is an admin's choice: 403 naming `field` for other keys. */
export function checkInsecure(caller: Caller | null | undefined, managerUrl: string | undefined, insecure: boolean | undefined, field: string) {
  if (insecure && !configuredInsecure(managerUrl)) adminOnly(caller, field,
    'it turns off TLS verification for a manager not configured as insecure; give its CA in FERRY_VSPHERE_CA instead');
}
