// Server-Sent Events for job progress (the gateway's and the daemon's streams). One Redis subscription per process fans out to every client; a client
// reconnecting with Last-Event-ID is replayed from the job's event log, then switched to live events, so it
// receives every event exactly once.
import type Koa from 'koa';
import type Joi from 'joi';
import type { RouteDef } from '../platform/http';
import type { Need } from '../platform/auth';
import type { ServerResponse } from 'node:http';
import type { Bus, JobEventMessage } from './bus';
import type { JobStore } from './store';
import { isTerminal } from '../domain/states';
import { fieldError, notFound } from '../platform/errors';
import { isStreamId } from '../domain/schemas/common';
import { createLogger } from '../platform/log';
import { openEventStream, writeFrame } from './sse-stream';

const log = createLogger('events');

/** `last` is the last event id sent, as [ms, seq] numbers: compared once per client per event, so parsed once. */
interface Client { res: ServerResponse; last: [number, number]; buffering: boolean; buffer: (() => void)[]; closed: boolean }

/** The raw JSON of the event inside a bus message ({"job_id":..,"id":..,"event":<json>}), without re-encoding it. */
function rawEvent(raw: string, msg: JobEventMessage): string {
  const i = raw.indexOf('"event":');
  return i >= 0 ? raw.slice(i + 8, -1) : JSON.stringify(msg.event);
}

/** A Redis stream id ("ms-seq") as numbers; "" (nothing sent yet) is before every id. */
export function parseId(id: string): [number, number] {
  if (!id) return [-1, -1];
  const i = id.indexOf('-');
  return [Number(id.slice(0, i)), Number(id.slice(i + 1))];
}
const after = (a: [number, number], b: [number, number]) => a[0] > b[0] || (a[0] === b[0] && a[1] > b[1]);

/** The id `complete` carries: one past the job's last event, so a client that reconnects with it (EventSource
 *  does, every `retry` ms, forever) is told the stream is over (204), while one that missed `complete` gets it. */
export function completeId(lastEventId: [number, number]): string {
  return lastEventId[0] < 0 ? '0-1' : `${lastEventId[0]}-${lastEventId[1] + 1}`;
}

export class EventHub {
  private clients = new Map<string, Set<Client>>();
  private timer?: NodeJS.Timeout;
  constructor(private bus: Bus, private store: JobStore, private heartbeatSeconds: number) {}

  get size() { let n = 0; for (const s of this.clients.values()) n += s.size; return n; }

  async start() {
    // With no client connected the hub has no use for a message: the bus then does not even parse it.
    const wants = () => this.clients.size > 0;
    await this.bus.on('events', (msg, raw) => {
      const set = this.clients.get(msg.job_id);
      if (!set) return;
      // Encoded once for every client: a fan-out to many clients costs one socket write each, nothing more.
      const frame = Buffer.from(`event: progress\nid: ${msg.id}\ndata: ${rawEvent(raw, msg)}\n\n`);
      const id = parseId(msg.id);
      for (const c of set) {
        if (c.buffering) c.buffer.push(() => this.deliver(c, id, frame));
        else this.deliver(c, id, frame);
      }
    }, { wants });
    await this.bus.on('jobs', (msg) => {
      if (!isTerminal(msg.state)) return;
      const set = this.clients.get(msg.job_id);
      if (!set) return;
      for (const c of set) {
        const send = () => this.finish(msg.job_id, c, msg.state);
        if (c.buffering) c.buffer.push(send);
        else send();
      }
    }, { wants });
    this.timer = setInterval(() => {
      for (const set of this.clients.values()) for (const c of set) this.write(c, ': heartbeat\n\n');
    }, this.heartbeatSeconds * 1000);
    this.timer.unref();
  }

  stop() {
    if (this.timer) clearInterval(this.timer);
    for (const [id, set] of this.clients) for (const c of set) this.drop(id, c);
  }

  private deliver(c: Client, id: [number, number], frame: Buffer) {
    if (after(id, c.last)) { c.last = id; this.write(c, frame); }
  }

  private write(c: Client, s: string | Buffer) {
    if (!c.closed) writeFrame(c.res, s);
  }

  /** `lastId`: the job's last event id; defaults to the last one this client was sent (the job's events are
   *  published before its terminal state change, on the same subscription, so it has seen them all). */
  private finish(jobId: string, c: Client, state: string, lastId: [number, number] = c.last) {
    this.write(c, `event: complete\nid: ${completeId(lastId)}\ndata: ${JSON.stringify({ state })}\n\n`);
    this.drop(jobId, c);
  }

  private drop(jobId: string, c: Client) {
    if (!c.closed) { c.closed = true; c.res.end(); }
    const set = this.clients.get(jobId);
    set?.delete(c);
    if (set && !set.size) this.clients.delete(jobId);
  }

  /** The route of a job's event stream on an API (`param`: the path parameter that names the job). */
  route(o: { role: Need; path: string; param: string; params: Joi.ObjectSchema; summary: string; tags: string[];
    notFound: { description: string; schema: Joi.Schema } }): RouteDef {
    return {
      method: 'get', role: o.role, path: o.path, summary: o.summary, tags: o.tags, params: o.params,
      responses: { 200: { description: 'event stream: progress events, then complete {state}', type: 'text/event-stream', schema: { type: 'string' } },
        404: o.notFound },
      handler: async (ctx, { params }) => { await this.serve(ctx, params[o.param]); return undefined; },
    };
  }

  /** The whole GET .../events/stream: 404 for an unknown job, 400 for a malformed Last-Event-ID (header or
   *  ?last_event_id=), 204 for a client that already had `complete`, then the stream. Both APIs serve it. */
  async serve(ctx: Koa.Context, jobId: string) {
    const h = await this.store.raw(jobId);
    if (!h) throw notFound(`job ${jobId} not found`);
    const q = ctx.query.last_event_id;
    const last = String(ctx.get('Last-Event-ID') || (typeof q === 'string' ? q : '') || '');
    if (Array.isArray(q)) throw fieldError(400, 'last_event_id', 'given more than once', 'last_event_id must be given once');
    if (last && !isStreamId(last)) {
      const field = ctx.get('Last-Event-ID') ? 'Last-Event-ID' : 'last_event_id';
      throw fieldError(400, field, 'not an event id',
        `${field} "${last.slice(0, 64)}" is not an event id (two unsigned 64-bit integers, such as 1700000000000-0)`);
    }
    if (last && isTerminal(h.state) && !after(parseId(completeId(parseId(h.latest_event_id || ''))), parseId(last))) {
      ctx.status = 204; // had `complete` already: EventSource stops reconnecting on 204
      return;
    }
    await this.attach(ctx, jobId, last);
  }

  /** Takes over the response: replay after `lastEventId`, then live events, then `complete`. */
  async attach(ctx: Koa.Context, jobId: string, lastEventId: string) {
    const res = openEventStream(ctx);
    const c: Client = { res, last: parseId(lastEventId), buffering: true, buffer: [], closed: false };
    let set = this.clients.get(jobId);
    if (!set) this.clients.set(jobId, (set = new Set()));
    set.add(c);
    ctx.req.on('close', () => this.drop(jobId, c));
    try {
      for (const e of await this.store.events(jobId, { afterId: lastEventId || undefined })) {
        const { id, ...ev } = e;
        const n = parseId(id);
        if (after(n, c.last)) {
          c.last = n;
          this.write(c, `event: progress\nid: ${id}\ndata: ${JSON.stringify(ev)}\n\n`);
        }
      }
      const h = await this.store.raw(jobId);
      c.buffering = false;
      for (const f of c.buffer.splice(0)) f();
      if (h && isTerminal(h.state) && !c.closed) this.finish(jobId, c, h.state, parseId(h.latest_event_id || ''));
    } catch (err) {
      // Redis's own text stays in the log; the client is told to reconnect, which replays from its last id.
      log.warn('event stream replay failed; the stream is closed, the client reconnects', { job_id: jobId, error: (err as Error).message });
      this.write(c, `event: error\ndata: ${JSON.stringify({ message: 'the event log could not be read; retry (reconnect with Last-Event-ID)' })}\n\n`);
      this.drop(jobId, c);
    }
  }
}
