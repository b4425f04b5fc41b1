// Delivers one webhook message: POST of the JSON body with the configured headers, an HMAC-SHA256 signature
// when a secret is set, a timeout per attempt, and a delivery-log entry after every attempt. A failed attempt
// throws, and BullMQ retries it with exponential backoff and jitter until retry_count is used up.
import { createHmac } from 'node:crypto';
import { Job, UnrecoverableError } from 'bullmq';
import { decryptSecret } from '../../platform/secretbox';
import { checkTarget, guardedAgents, guardedPost, TargetPolicy } from '../../domain/targets';
import { Delivery, SIGNATURE_HEADER, Webhook, WebhookStore } from '../../orchestration/webhooks';
import { ignoreError } from '../../platform/log';

export function sign(secret: string, body: string) {
  return 'sha256=' + createHmac('sha256', secret).update(body).digest('hex');
}

/** A delivery job's data, as WebhookStore (orchestration/webhooks.ts) adds it to WEBHOOK_QUEUE. */
export interface DeliveryJob { webhook_id: string; delivery_id: string; event: string; body: object }

export function makeDeliverer(store: WebhookStore, allow: TargetPolicy) {
  const agents = guardedAgents(allow);
  // The webhook list changes rarely; read it at most once a second.
  let cache: { at: number; hooks: Map<string, Webhook> } | undefined;
  const hook = async (id: string) => {
    if (!cache || Date.now() - cache.at > 1000 || !cache.hooks.has(id)) cache = { at: Date.now(), hooks: new Map((await store.list()).map((w) => [w.id, w])) };
    return cache.hooks.get(id);
  };

  return async (job: Job<DeliveryJob>) => {
    const { webhook_id, delivery_id, event, body } = job.data;
    const w = await hook(webhook_id);
    if (!w) return { skipped: 'webhook deleted' };
    const attempt = job.attemptsMade + 1;
    const max = job.opts.attempts || 1;
    const created = new Date(job.timestamp).toISOString();
    const log = (status: Delivery['status'], response_status: number | null, last_error: string | null, duration_ms: number | null) =>
      store.record({ delivery_id, webhook_id, event, status, attempts: attempt, max_attempts: max, response_status, last_error, duration_ms,
        created_at: created, updated_at: new Date().toISOString() }).catch(
        ignoreError('could not record a delivery log row: the delivery itself went ahead, and the next attempt or outcome writes the row again',
        { delivery_id }));

    const refused = await checkTarget(w.url, allow);
    if (refused) { await log('failed', null, refused, null); throw new UnrecoverableError(refused); }
    const text = JSON.stringify(body);
    const headers: Record<string, string> = {
      ...w.headers,
      ...Object.fromEntries(Object.entries(w.sealed_headers || {}).map(([h, box]) => [h, decryptSecret(box)])),
      'content-type': 'application/json',
      'user-agent': 'ferry-notifier/1.0',
      'x-ferry-event': event,
      'x-ferry-delivery': delivery_id,
      'x-ferry-attempt': String(attempt),
    };
    if (w.secret_box) headers[SIGNATURE_HEADER.toLowerCase()] = sign(decryptSecret(w.secret_box), text);
    const t0 = Date.now();
    let status: number | null = null;
    try {
      status = (await guardedPost(w.url, text, headers, w.timeout * 1000, agents, allow)).status;
      if (status < 200 || status >= 300) throw new Error(`HTTP ${status}`);
    } catch (e) {
      const err = e as Error;
      const msg = err.name === 'TimeoutError' ? `timed out after ${w.timeout} s` : err.message;
      // A target refused at connect time (DNS now answers a refused address) will not get better by retrying.
      if ((err as Error & { code?: unknown }).code === 'EFERRYREFUSED' ||
        /refused: /.test(msg)) { await log('failed', status, msg, Date.now() - t0); throw new UnrecoverableError(msg); }
      await log(attempt >= max ? 'failed' : 'retrying', status, msg, Date.now() - t0);
      throw new Error(msg, { cause: e });
    }
    await log('delivered', status, null, Date.now() - t0);
    return { status };
  };
}
