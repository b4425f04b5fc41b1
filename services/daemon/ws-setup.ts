// The daemon's WebSocket side: the hub of /ws and /ws/metrics (ws.ts), the VM console beside it (console.ts), who
// may open them (a ticket from POST /ws/ticket, else the key headers; never a key in the URL) and their audit.
import type http from 'node:http';
import { authorize, redeemTicket } from '../../platform/auth';
import type { AuditLog } from '../../platform/audit';
import { browserRule } from '../../platform/browser';
import type { DaemonConfig } from '../../platform/daemon-config';
import type { Logger } from '../../platform/log';
import { errorText } from '../../platform/errors';
import type { Virsh } from '../../domain/libvirt/virsh';
import type { Bus } from '../../queue/bus';
import type { QueueLayer } from '../../queue/connect';
import { jobViews } from '../../orchestration/daemon-views';
import { consoleEndpoints } from './console';
import { WsDeps, WsHub } from './ws';

/** The caller of an upgrade: a browser's ?ticket= (from POST /ws/ticket), else the key headers. */
function upgradeCaller(cfg: DaemonConfig, q: QueueLayer): WsDeps['authorize'] {
  return async (req) => {
    const params = new URL(req.url || '/', 'http://x').searchParams;
    if (params.has('api_key')) {
      return { status: 401, message: 'API keys are not accepted in URLs; send X-API-Key or Authorization: Bearer, or get a ticket from POST /ws/ticket' };
    }
    const ticket = params.get('ticket');
    if (ticket !== null) {
      if (!cfg.keys.enabled) return { status: 0, message: '', caller: null };
      const t = await redeemTicket(q.redis, q.store.k.prefix, ticket);
      return t?.name && t.role
        ? { status: 0, message: '', caller: { name: t.name, role: t.role }, who: `key:${t.name}` }
        : { status: 401, message: 'the ticket is unknown, used or expired' };
    }
    const v = authorize(cfg.keys, req.headers, 'read');
    return v.status ? v : { status: 0, message: '', caller: v.key && { name: v.key.name, role: v.key.role }, who: v.key ? `key:${v.key.name}` : undefined };
  };
}

export interface WsSetup {
  cfg: DaemonConfig; q: QueueLayer; bus: Bus; audit: AuditLog; virsh: Virsh; host: string; log: Logger;
  status: WsDeps['status']; metrics: WsDeps['metrics'];
}

export function createWsHub(s: WsSetup): WsHub {
  const { cfg, q } = s;
  // WebSocket upgrades pass no koa middleware: their refusals, and console writers, go to the audit log here.
  const auditUpgrade = (req: http.IncomingMessage, u: Parameters<AuditLog['upgrade']>[2]) =>
    void s.audit.upgrade(req, cfg.keys, u).catch((e) => s.log.warn(
      'audit record of a WebSocket upgrade not stored in Redis; its log line stands', { error: errorText(e) },
    ));
  return new WsHub({
    bus: s.bus, store: q.store,
    statusIntervalMs: cfg.websocket.status_interval_seconds * 1000,
    pingIntervalMs: cfg.websocket.ping_interval_seconds * 1000,
    maxBufferedBytes: cfg.websocket.max_buffered_bytes,
    status: s.status,
    firstPage: async (internal) => {
      const { total, ids } = await q.store.list({ limit: 100, internal });
      return { jobs: await jobViews(q.store, ids), total, limit: 100 };
    },
    metrics: s.metrics,
    others: consoleEndpoints(s.virsh, (req, caller, domain, force) => auditUpgrade(req, {
      path: '/virt/console', status: 101, caller, targets: { domain, ...(force ? { mode: 'write, forced' } : { mode: 'write' }) },
    })),
    audit: auditUpgrade,
    browser: browserRule(s.host),
    authorize: upgradeCaller(cfg, q),
  });
}
