// The daemon's routes about itself, added at start-up once what they serve exists: /openapi.yaml (the whole
// table), POST /ws/ticket, /metrics (unless metrics.port serves it apart) and the audit log (admin keys only).
import Joi from 'joi';
import yaml from 'js-yaml';
import type { Api } from '../../platform/http';
import { config } from '../../platform/config';
import { issueTicket } from '../../platform/auth';
import { AuditLog, auditRoute } from '../../platform/audit';
import type { DaemonConfig } from '../../platform/daemon-config';
import { daemonErrorSchema } from '../../domain/schemas/daemon';
import type { QueueLayer } from '../../queue/connect';
import type { Registry } from './daemon-metrics';
import { callerOf } from './route-kit';

const DESCRIPTION = 'Export and migration jobs, schedules, webhooks, WebSocket updates (/ws, /api/v1/ws/metrics). '
  + 'Every path also answers under /api/v1. See docs/daemon.md.';

export function addOwnRoutes(api: Api, d: { cfg: DaemonConfig; q: QueueLayer; metrics: Registry; audit: AuditLog }) {
  api.add({
    method: 'get', role: 'public', path: '/openapi.yaml', summary: 'This API description (OpenAPI 3, generated from the joi schemas)', tags: ['docs'],
    responses: { 200: { description: 'OpenAPI YAML', type: 'application/yaml', schema: { type: 'string' } } },
    handler: (ctx) => {
      ctx.type = 'application/yaml';
      return yaml.dump(api.openapi({ title: 'Ferry daemon API', version: config.version, description: DESCRIPTION }, ['/', '/api/v1']));
    },
  });
  api.add({
    method: 'post', role: 'read', path: '/ws/ticket',
    summary: 'A single-use ticket (valid 30 s) for opening /ws or /ws/metrics as ?ticket=...: '
      + 'browsers cannot send a key header on a WebSocket, and keys never go in URLs',
    tags: ['status'],
    responses: { 200: { description: 'the ticket', schema: Joi.object({ ticket: Joi.string(), expires_in: Joi.number().integer() }) } },
    handler: (ctx) => issueTicket(d.q.redis, d.q.store.k.prefix, callerOf(ctx) ?? null),
  });
  if (d.cfg.metrics.enabled && d.cfg.metrics.port === undefined) {
    api.add({
      method: 'get', role: 'read', path: '/metrics', summary: 'Prometheus metrics (metrics.enabled)', tags: ['status'],
      responses: { 200: { description: 'text exposition format', type: 'text/plain', schema: { type: 'string' } } },
      handler: async (ctx) => { ctx.type = d.metrics.contentType; return d.metrics.metrics(); },
    });
  }
  // The audit log of both APIs (the gateway writes the same one); read here only, by admin keys.
  api.add(auditRoute(d.audit, daemonErrorSchema));
}
