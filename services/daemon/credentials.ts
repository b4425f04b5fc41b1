// Remote-manager credentials. Defaults come from the daemon's environment; a job may override them. A per-job
// password is stored only encrypted (AES-256-GCM, key derived from FERRY_SECRET_KEY) in its own key beside the
// job, never in the spec, the meta, a response or a log. Without FERRY_SECRET_KEY a per-job password is refused.
import { canEncrypt, encryptSecret } from '../../shared/secretbox';
import { ApiError } from '../../shared/errors';
import type { Keys, RedisClient } from '../../shared/redis';

export interface ManagerDefaults { manager_url?: string; username?: string; insecure: boolean; hasPassword: boolean }

export function managerDefaults(env: NodeJS.ProcessEnv = process.env): ManagerDefaults {
  return {
    manager_url: env.FERRY_MANAGER_URL || undefined,
    username: env.FERRY_MANAGER_USERNAME || undefined,
    insecure: /^(1|true|yes)$/i.test(env.FERRY_MANAGER_INSECURE || ''),
    hasPassword: !!env.FERRY_MANAGER_PASSWORD,
  };
}

/** Refuses a per-job password when it could not be stored encrypted (400 naming the field). */
export function checkPasswordStorable(field: string, password: string | undefined) {
  if (password !== undefined && !canEncrypt()) {
    throw new ApiError(400, `${field} cannot be accepted: the daemon has no FERRY_SECRET_KEY to store it encrypted (set it, or use FERRY_MANAGER_PASSWORD)`, { fields: [{ field, message: 'needs FERRY_SECRET_KEY on the daemon' }] });
  }
}

export async function storePassword(redis: RedisClient, k: Keys, jobId: string, password: string, ttlSeconds: number) {
  await redis.set(k.credentials(jobId), encryptSecret(password), 'EX', Math.max(60, Math.ceil(ttlSeconds)));
}

export { canEncrypt, decryptSecret, encryptSecret } from '../../shared/secretbox';
