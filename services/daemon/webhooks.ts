// The daemon's webhook routes, addressed by position: GET and POST /webhooks, POST /webhooks/test,
// GET /webhooks/:index/deliveries, DELETE /webhooks/:index. Store and deliveries: orchestration/webhooks.ts.
import Joi from 'joi';
import type Koa from 'koa';
import type { Api } from '../../platform/http';
import { fieldError, notFound } from '../../platform/errors';
import { webhookCreateSchema, webhookSchema, webhookTestSchema } from '../../domain/schemas/daemon';
import type { DaemonConfig } from '../../platform/daemon-config';
import { checkTarget } from '../../domain/targets';
import { createdView, publicView, WebhookStore } from '../../orchestration/webhooks';
import { redactUrl, redactUrlIn } from '../../platform/sensitive';
import { callerOf, err, now } from './route-kit';

/** Whether the caller sees webhook URLs whole: admins (and anyone when auth is off); others get redactUrl's form,
 *  as a URL's query or userinfo often carries the receiver's token (docs/security.md). */
const seesUrls = (ctx: Koa.Context) => { const k = callerOf(ctx); return !k || k.role === 'admin'; };

const indexParams = Joi.object<{ index: number }>({ index: Joi.number().integer().min(0).required() });
const added = Joi.object({
  message: Joi.string(),
  webhook: webhookSchema.keys({ headers: Joi.object().pattern(Joi.string(), Joi.string()).description('sensitive values shown as [redacted]') }),
});

export function addWebhookRoutes(api: Api, d: { webhooks: WebhookStore; cfg: DaemonConfig }) {
  addWebhookListRoutes(api, d);
  addWebhookActionRoutes(api, d);
}

/** Registers GET /webhooks (the list) and POST /webhooks (add one). */
function addWebhookListRoutes(api: Api, d: { webhooks: WebhookStore; cfg: DaemonConfig }) {
  const { webhooks, cfg } = d;
  api.add({
    method: 'get', role: 'read', path: '/webhooks',
    summary: 'Configured webhooks (secrets and sensitive headers never shown; the URL\'s query and userinfo redacted unless the key is admin)',
    tags: ['webhooks'],
    responses: {
      200: {
        description: 'webhooks',
        schema: Joi.object({ webhooks: Joi.array().items(webhookSchema), total: Joi.number().integer(), timestamp: Joi.string().isoDate() }),
      },
    },
    handler: async (ctx) => {
      const all = await webhooks.list();
      const whole = seesUrls(ctx);
      return {
        webhooks: all.map((w, i) => {
          const v = publicView(w, i);
          return whole ? v : { ...v, url: redactUrl(v.url) };
        }),
        total: all.length, timestamp: now(),
      };
    },
  });
  api.add({
    method: 'post', role: 'submit', path: '/webhooks', summary: 'Add a webhook (private and loopback targets refused unless configured)', tags: ['webhooks'],
    body: webhookCreateSchema,
    responses: { 201: { description: 'added', schema: added }, 400: err('invalid webhook or refused target') },
    handler: async (ctx, { body }) => {
      const refused = await checkTarget(body.url, cfg.webhooks);
      if (refused) throw fieldError(400, 'url', refused, `url refused: ${refused}`);
      const { webhook, index } = await webhooks.add(body);
      ctx.status = 201;
      return { message: `webhook ${webhook.id} added at index ${index}`, webhook: createdView(webhook, index) };
    },
  });
}

/** Registers POST /webhooks/test, GET /webhooks/:index/deliveries and DELETE /webhooks/:index. */
function addWebhookActionRoutes(api: Api, d: { webhooks: WebhookStore; cfg: DaemonConfig }) {
  const { webhooks, cfg } = d;
  const hookAt = async (index: number) => {
    const all = await webhooks.list();
    if (!all[index]) throw notFound(`no webhook at index ${index}`);
    return all[index];
  };
  api.add({
    method: 'post', role: 'submit', path: '/webhooks/test',
    summary: "Send a webhook.test delivery to every enabled webhook, to one index, or (the seed's {url, event: test}) to the webhooks with that url",
    tags: ['webhooks'], body: webhookTestSchema, bodyRequired: false,
    responses: {
      200: { description: 'queued deliveries', schema: Joi.object({ message: Joi.string(), delivery_ids: Joi.array().items(Joi.string()) }) },
      404: err('no webhook at index, or none with that url'),
    },
    handler: async (_ctx, { body }) => {
      let only = body.index !== undefined ? [await hookAt(body.index)] : (await webhooks.list()).filter((w) => w.enabled);
      if (body.url !== undefined) {
        only = (await webhooks.list()).filter((w) => w.url === body.url);
        if (!only.length) {
          throw fieldError(404, 'url', 'no webhook with this url', `url: no webhook is configured with url ${body.url} (add it with POST /webhooks first)`);
        }
      }
      const ids = await webhooks.enqueue('webhook.test', { message: 'test delivery from the Ferry daemon' }, `t${Date.now()}`,
        { backoffMs: cfg.webhooks.backoff_ms, only });
      return { message: `queued ${ids.length} test deliveries`, delivery_ids: ids };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/webhooks/:index/deliveries',
    summary: 'Delivery log of one webhook, newest first (the webhook\'s URL in an error redacted unless the key is admin)',
    tags: ['webhooks'], params: indexParams,
    responses: { 200: { description: 'deliveries', schema: Joi.object().unknown(true) }, 404: err('no webhook at index') },
    handler: async (ctx, { params }) => {
      const w = await hookAt(params.index);
      const deliveries = await webhooks.deliveries(w.id);
      const whole = seesUrls(ctx);
      return {
        webhook_id: w.id,
        deliveries: whole ? deliveries : deliveries.map((d) => ({ ...d, last_error: d.last_error && redactUrlIn(d.last_error, w.url) })),
      };
    },
  });
  api.add({
    method: 'delete', role: 'submit', path: '/webhooks/:index', summary: 'Delete the webhook at a zero-based index', tags: ['webhooks'], params: indexParams,
    responses: { 200: { description: 'deleted', schema: Joi.object({ message: Joi.string() }) }, 404: err('no webhook at index') },
    handler: async (_ctx, { params }) => {
      const w = await webhooks.removeAt(params.index);
      return { message: `webhook ${w.id} at index ${params.index} deleted` };
    },
  });
}
