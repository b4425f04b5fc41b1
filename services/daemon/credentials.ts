// Remote-manager credentials. Defaults come from the daemon's environment; a job may override them. A per-job
// password is stored only encrypted (AES-256-GCM, key derived from FERRY_SECRET_KEY) in its own key beside the
// job, never in the spec, the meta, a response or a log. Without FERRY_SECRET_KEY a per-job password is refused.
import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto';
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

function key(env: NodeJS.ProcessEnv = process.env): Buffer | null {
  const k = env.FERRY_SECRET_KEY;
  return k ? createHash('sha256').update(k).digest() : null;
}

export function canEncrypt(env: NodeJS.ProcessEnv = process.env) { return key(env) !== null; }

export function encryptSecret(plain: string, env: NodeJS.ProcessEnv = process.env): string {
  const k = key(env);
  if (!k) throw new Error('FERRY_SECRET_KEY is not set');
  const iv = randomBytes(12);
  const c = createCipheriv('aes-256-gcm', k, iv);
  const ct = Buffer.concat([c.update(plain, 'utf8'), c.final()]);
  return ['v1', iv.toString('base64'), c.getAuthTag().toString('base64'), ct.toString('base64')].join(':');
}

export function decryptSecret(box: string, env: NodeJS.ProcessEnv = process.env): string {
  const k = key(env);
  if (!k) throw new Error('FERRY_SECRET_KEY is not set');
  const [v, iv, tag, ct] = box.split(':');
  if (v !== 'v1') throw new Error('unknown secret format');
  const d = createDecipheriv('aes-256-gcm', k, Buffer.from(iv, 'base64'));
  d.setAuthTag(Buffer.from(tag, 'base64'));
  return Buffer.concat([d.update(Buffer.from(ct, 'base64')), d.final()]).toString('utf8');
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
