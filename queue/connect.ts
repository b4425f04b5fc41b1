// The queue layer as a service process opens it: one Redis connection, the job store, the BullMQ router, the
// worker registry and the lifecycle on top of them. Every service wires the same four the same way.
import { createRedis, RedisClient } from '../platform/redis';
import type { Logger } from '../platform/log';
import { JobStore } from './store';
import { QueueRouter } from './router';
import { Registry } from './registry';
import { Lifecycle } from './lifecycle';

export interface QueueLayer { redis: RedisClient; store: JobStore; router: QueueRouter; registry: Registry; life: Lifecycle }

/** `redisErrors`: the level Redis connection errors are logged at (a worker, which retries quietly, uses debug). */
export function connectQueue(log: Logger, routerOpts: ConstructorParameters<typeof QueueRouter>[1], redisErrors: 'warn' | 'debug' = 'warn'): QueueLayer {
  const redis = createRedis();
  redis.on('error', (e: Error) => log[redisErrors]('redis error', { error: e.message }));
  const store = new JobStore(redis);
  const router = new QueueRouter(redis, routerOpts);
  const registry = new Registry(redis);
  return { redis, store, router, registry, life: new Lifecycle(store, router, registry) };
}
