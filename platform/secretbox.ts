// Secrets Ferry must keep (per-job manager passwords, webhook secrets and sensitive headers, the sensitive values
// of a job's spec) are stored only encrypted: AES-256-GCM with a key derived from FERRY_SECRET_KEY.
import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto';
import { setting } from './settings';

// The key derived last: every submission seals its spec, and deriving the same key again each time showed in the
// gateway's profile.
let derived: { from: string; key: Buffer } | undefined;
function key(env: NodeJS.ProcessEnv = process.env): Buffer | null {
  const k = setting('FERRY_SECRET_KEY', env);
  if (!k) return null;
  if (derived?.from !== k) derived = { from: k, key: createHash('sha256').update(k).digest() };
  return derived.key;
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

