// What a worker's API key may do on the job protocol: the worker ids it registered, the capabilities it allows.
import type Koa from 'koa';
import { fieldError } from '../../platform/errors';
import { capabilitiesBeyond } from '../../platform/auth';
import type { Registry } from '../../queue/registry';
import { apiKeyOf } from './route-kit';

/** A worker id registered with one API key cannot be used with another (admin keys excepted): a worker key
 *  cannot keep another worker's registration alive or claim jobs in its name. */
export async function checkWorkerId(registry: Registry, ctx: Koa.Context, workerId: string) {
  const key = apiKeyOf(ctx);
  if (!key || key.role === 'admin') return;
  const owner = await registry.keyOf(workerId);
  if (owner && owner !== key.name) throw fieldError(403, 'worker_id', 'registered with another API key',
    `worker ${workerId} is registered with another API key`);
}

/** The key name a registration binds the worker id to (admin keys act on any worker and bind none). */
export const boundKey = (ctx: Koa.Context): string | undefined => {
  const key = apiKeyOf(ctx);
  return key && key.role !== 'admin' ? key.name : undefined;
};

/** A worker key limited to some capabilities (keys file) cannot claim more. */
export function checkCapabilities(ctx: Koa.Context, caps: string[]) {
  const key = apiKeyOf(ctx) ?? null; // capabilitiesBeyond allows everything to no key, null or undefined alike
  const beyond = capabilitiesBeyond(key, caps);
  if (key && beyond.length) throw fieldError(403, 'capabilities', `not allowed for this key: ${beyond.join(', ')}`,
    `the API key "${key.name}" does not allow capabilities ${beyond.join(', ')}`);
}
