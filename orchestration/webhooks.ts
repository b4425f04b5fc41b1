// Webhooks in Redis (a list, addressed by position as the seed does), their delivery log, the check that keeps
// deliveries off private and loopback addresses (domain/targets.ts), and the BullMQ queue deliveries go through.
import { Queue } from 'bullmq';
import { randomUUID } from 'node:crypto';
import { ApiError, fieldError } from '../platform/errors';
import type { Keys, RedisClient } from '../platform/redis';
import { canEncrypt, encryptSecret } from '../platform/secretbox';
import { isSensitiveKey, redact, REDACTED } from '../platform/sensitive';
import { expectedError, ignoreError } from '../platform/log';
import { onBullError } from '../queue/router';
import { publish } from '../queue/bus';

export const WEBHOOK_QUEUE = 'webhooks';
export const SIGNATURE_HEADER = 'X-Ferry-Signature';

export interface Webhook {
  id: string; url: string; events: string[]; enabled: boolean; timeout: number; retry_count: number;
  headers: Record<string, string>; secret_box?: string; created_at: string;
  /** Sensitive header values (authorization, tokens...), each stored only encrypted. */
  sealed_headers?: Record<string, string>;
}

export interface Delivery {
  delivery_id: string; webhook_id: string; event: string; status: 'pending' | 'retrying' | 'delivered' | 'failed';
  attempts: number; max_attempts: number; response_status: number | null; last_error: string | null; duration_ms: number | null;
  created_at: string; updated_at: string;
}

/** A webhook as the API shows it: header values never (the list, as the seed has it, shows no headers at all). */
export function publicView(w: Webhook, index: number) {
  const header_names = [...Object.keys(w.headers), ...Object.keys(w.sealed_headers || {})].sort();
  return { id: w.id, index, url: w.url, events: w.events, enabled: w.enabled, timeout: w.timeout, retry_count: w.retry_count, has_secret: !!w.secret_box,
    header_names, created_at: w.created_at };
}

/** The answer to POST /webhooks: the headers too, sensitive values as [redacted]. */
export function createdView(w: Webhook, index: number) {
  const headers = Object.fromEntries([
    ...Object.entries(w.headers).map(([k, v]): [string, string] => [k, isSensitiveKey(k) ? REDACTED : v]),
    ...Object.keys(w.sealed_headers || {}).map((k): [string, string] => [k, REDACTED]),
  ]);
  return { ...publicView(w, index), headers };
}

// Removes the element at an index only if it is still the one read (no lost update against a racing delete).
const DELETE_AT = `
local v = redis.call('LINDEX', KEYS[1], ARGV[1])
if not v or v ~= ARGV[2] then return 0 end
redis.call('LSET', KEYS[1], ARGV[1], '__deleted__')
redis.call('LREM', KEYS[1], 1, '__deleted__')
return 1`;

export class WebhookStore {
  readonly queue: Queue;
  constructor(readonly redis: RedisClient, readonly k: Keys) {
    this.queue = new Queue(WEBHOOK_QUEUE, { connection: redis, prefix: k.bullPrefix });
    this.queue.on('error', onBullError('webhooks', this.queue.name, 'the command that failed reports it to its caller; BullMQ reconnects'));
  }

  async list(): Promise<Webhook[]> {
    return (await this.redis.lrange(this.k.webhooks, 0, -1)).map((s) => JSON.parse(s) as Webhook); // written by add()
  }

  async add(input: Omit<Webhook, 'id' | 'created_at' | 'secret_box'> & { secret?: string }) {
    if (input.secret !== undefined && !canEncrypt()) {
      throw fieldError(400, 'secret', 'needs FERRY_SECRET_KEY', 'secret cannot be accepted: the daemon has no FERRY_SECRET_KEY to store it encrypted');
    }
    const sensitive = Object.keys(input.headers || {}).filter((h) => isSensitiveKey(h));
    if (sensitive.length && !canEncrypt()) {
      throw new ApiError(400, `headers ${sensitive.join(', ')} cannot be accepted: the daemon has no FERRY_SECRET_KEY to store them encrypted`,
        { fields: sensitive.map((h) => ({ field: `headers.${h}`, message: 'needs FERRY_SECRET_KEY' })) });
    }
    const { secret, ...rest } = input;
    const headers = Object.fromEntries(Object.entries(rest.headers || {}).filter(([h]) => !sensitive.includes(h)));
    const sealed = Object.fromEntries(sensitive.map((h) => [h, encryptSecret(rest.headers[h])]));
    const w: Webhook = {
      ...rest, headers, id: `wh-${randomUUID().slice(0, 12)}`, created_at: new Date().toISOString(),
      ...(sensitive.length ? { sealed_headers: sealed } : {}),
      ...(secret ? { secret_box: encryptSecret(secret) } : {}),
    };
    const len = await this.redis.rpush(this.k.webhooks, JSON.stringify(w));
    await publish(this.redis, this.k, 'webhooks', 'added');
    return { webhook: w, index: len - 1 };
  }

  async removeAt(index: number) {
    for (let tries = 0; tries < 5; tries++) {
      const v = await this.redis.lindex(this.k.webhooks, index);
      if (v === null) throw new ApiError(404, `no webhook at index ${index}`);
      if (await this.redis.eval(DELETE_AT, 1, this.k.webhooks, index, v)) {
        const w = JSON.parse(v) as Webhook;
        await this.redis.del(this.k.webhookDeliveries(w.id), this.k.webhookDeliveryOrder(w.id));
        await publish(this.redis, this.k, 'webhooks', 'removed');
        return w;
      }
    }
    throw new ApiError(409, 'the webhook list changed while deleting; try again');
  }

  async record(d: Delivery, onlyIfNew = false) {
    const m = this.redis.multi();
    if (onlyIfNew) m.hsetnx(this.k.webhookDeliveries(d.webhook_id), d.delivery_id, JSON.stringify(d));
    else m.hset(this.k.webhookDeliveries(d.webhook_id), d.delivery_id, JSON.stringify(d));
    // Attempt outcomes, cluster-wide, for svc_webhook_deliveries_total (exported by the daemon).
    if (d.status !== 'pending') m.hincrby(this.k.webhookStats, d.status, 1);
    await m
      .zadd(this.k.webhookDeliveryOrder(d.webhook_id), Date.parse(d.created_at), d.delivery_id)
      .exec();
    // Keep the newest 500 per webhook.
    const old = await this.redis.zrange(this.k.webhookDeliveryOrder(d.webhook_id), 0, -501);
    if (old.length) await this.redis.multi().zrem(this.k.webhookDeliveryOrder(d.webhook_id), ...old).hdel(this.k.webhookDeliveries(d.webhook_id),
      ...old).exec();
  }

  async deliveries(webhookId: string, limit = 100): Promise<Delivery[]> {
    const ids = await this.redis.zrevrange(this.k.webhookDeliveryOrder(webhookId), 0, limit - 1);
    if (!ids.length) return [];
    const vals = await this.redis.hmget(this.k.webhookDeliveries(webhookId), ...ids);
    return vals.filter((v): v is string => !!v).map((v) => JSON.parse(v) as Delivery); // written by record()
  }

  /** Queues one delivery per webhook subscribed to `event`; the BullMQ job id dedups replicas that saw the same change. */
  async enqueue(event: string, data: Record<string, unknown>, dedup: string, opts: { backoffMs: number; only?: Webhook[] }) {
    const hooks = opts.only || (await this.list()).filter((w) => w.enabled && w.events.includes(event));
    const ids: string[] = [];
    for (const w of hooks) {
      const delivery_id = `${w.id}.${event}.${dedup}`.replace(/[^A-Za-z0-9._-]/g, '_');
      const body = { delivery_id, event, timestamp: new Date().toISOString(), data: redact(data) };
      const now = new Date().toISOString();
      const added = await this.queue.add('deliver', { webhook_id: w.id, delivery_id, event, body }, {
        jobId: delivery_id, attempts: w.retry_count + 1, backoff: { type: 'exponential', delay: opts.backoffMs, jitter: 0.5 },
        removeOnComplete: { age: 3600, count: 10000 }, removeOnFail: { age: 3600, count: 10000 },
      });
      if (added) await this.record({ delivery_id, webhook_id: w.id, event, status: 'pending', attempts: 0, max_attempts: w.retry_count + 1,
        response_status: null, last_error: null, duration_ms: null, created_at: now, updated_at: now },
        true).catch(ignoreError('could not write the pending row of the delivery log; the delivery itself is queued and writes its outcome', { delivery_id }));
      ids.push(delivery_id);
    }
    return ids;
  }

  async close() { await this.queue.close().catch(expectedError('closing: a connection already gone has nothing left to close')); }
}
