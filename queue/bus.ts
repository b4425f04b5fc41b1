// The Redis pub/sub bus: every message Ferry publishes, declared once (BusMessages, the way BullMQ and n8n
// declare their event maps), and one subscription per process shared by every listener in it (SSE clients,
// WebSocket clients, workers, the notifier and the scheduler). Publishers use publish() in TypeScript; the Lua
// commands (queue/commands/) publish `jobs` and `events` from the same fields, and test/queue/commands.test.ts
// checks what they send against this map.
import { createRedis, keys as makeKeys, Keys, RedisClient } from '../platform/redis';
import type { JobState } from '../domain/states';
import type { ProgressEvent } from '../domain/schemas/job';
import { createLogger } from '../platform/log';

const log = createLogger('bus');

/** A job changed state (createJob-14.lua, transitionJob-13.lua). A new job's message has no `prev`. */
export interface JobStateMessage { job_id: string; state: JobState; prev?: JobState; timestamp: string; reason: string }
/** A progress event was recorded (includes/addEvent.lua); `id` is its stream id (the SSE id). */
export interface JobEventMessage { job_id: string; id: string; event: ProgressEvent }
/** A schedule ran or its job finished (services/scheduler). */
export interface ScheduleMessage { schedule_id: string; event: 'triggered' | 'completed' | 'failed'; timestamp: string; job_id?: string;
  [extra: string]: unknown }

/** A migration plan was written (PlanStore: create, every mutate, remove): its id, its status (null: deleted) and
 *  the jobs of its running VMs, so a listener can tell which job changes belong to the plan without a read. */
export interface PlanMessage { plan_id: string; status: string | null; job_ids: string[] }

/** The fields of the JSON messages, for checking what the Lua commands publish (test/queue/commands.test.ts);
 *  `satisfies` keeps each list to its interface's keys. */
export const MESSAGE_FIELDS = {
  jobs: { required: ['job_id', 'state', 'timestamp', 'reason'], optional: ['prev'] },
  events: { required: ['job_id', 'id', 'event'], optional: [] },
} satisfies { jobs: { required: (keyof JobStateMessage)[]; optional: (keyof JobStateMessage)[] };
  events: { required: (keyof JobEventMessage)[]; optional: (keyof JobEventMessage)[] } };

/** Channel -> message. */
export interface BusMessages {
  jobs: JobStateMessage;
  events: JobEventMessage;
  /** A job was cancelled while a worker held it: the job id (Lifecycle.cancel); the worker stops it. */
  cancel: string;
  /** A job was queued: the queue name, a wake-up hint for idle worker slots (QueueRouter.enqueue). */
  enqueued: string;
  schedules: ScheduleMessage;
  plans: PlanMessage;
  /** The webhook list changed (orchestration/webhooks.ts WebhookStore): notifiers drop their cached list. */
  webhooks: 'added' | 'removed';
}
export type Channel = keyof BusMessages;

/** Each channel's Redis name and whether its payload is JSON or plain text. */
const CHANNELS: { [C in Channel]: { name: (k: Keys) => string; json: boolean } } = {
  jobs: { name: (k) => k.chanJobs, json: true },
  events: { name: (k) => k.chanEvents, json: true },
  cancel: { name: (k) => k.chanCancel, json: false },
  enqueued: { name: (k) => k.chanEnqueued, json: false },
  schedules: { name: (k) => k.chanSchedules, json: true },
  plans: { name: (k) => k.chanPlans, json: true },
  webhooks: { name: (k) => k.chanWebhooks, json: false },
};

/** The Redis channel name of a bus channel. */
export const channelName = (k: Keys, c: Channel) => CHANNELS[c].name(k);

/** Publishes one message; resolves to the number of subscribers that received it. */
export function publish<C extends Channel>(redis: RedisClient, k: Keys, channel: C, msg: BusMessages[C]): Promise<number> {
  return redis.publish(channelName(k, channel), CHANNELS[channel].json ? JSON.stringify(msg) : (msg as string)); // a non-JSON channel's message is its string
}

type Handler<C extends Channel> = (msg: BusMessages[C], raw: string) => void;
/** A handler as kept per Redis channel: it is only ever given its own channel's messages (parsed when JSON). */
type StoredHandler = (msg: unknown, raw: string) => void;
/** One Redis channel's listeners, and its one SUBSCRIBE (settled once Redis confirmed it). */
interface ChannelEntry { json: boolean; set: Set<StoredHandler>; idle: Map<StoredHandler, () => boolean>; subscribed: Promise<void> }

export class Bus {
  private sub: RedisClient;
  private handlers = new Map<string, ChannelEntry>();
  readonly k: Keys;

  constructor(url?: string, prefix?: string) {
    this.k = makeKeys(prefix);
    this.sub = createRedis({ url });
    // Errors show on reconnect; ioredis resubscribes by itself.
    this.sub.on('error',
      (e: Error) => log.warn('the bus subscription lost Redis; ioredis reconnects and resubscribes, and messages published meanwhile are missed',
      { error: e.message }));
    this.sub.on('message', (channel: string, raw: string) => {
      const hs = this.handlers.get(channel);
      if (!hs) return;
      // Nobody wants this message right now (a gateway with no SSE client): not even parsed. Most channels have
      // no such listener, and then nothing is asked or allocated per message.
      let asleep: Set<StoredHandler> | undefined;
      for (const [h, wants] of hs.idle) if (!wants()) (asleep ??= new Set()).add(h);
      if (asleep?.size === hs.set.size) return;
      let msg: unknown = raw;
      if (hs.json) {
        try { msg = JSON.parse(raw); } catch { log.warn('dropped a bus message that is not JSON', { channel }); return; }
      }
      for (const h of hs.set) {
        if (asleep?.has(h)) continue;
        try { h(msg, raw); } catch (e) { log.warn('a bus listener failed; the others still get the message', { channel, error: (e as Error).message }); }
      }
    });
  }

  /** Listens to a channel; resolves once subscribed, to a function that stops this listener. `wants`: whether
   *  the listener has a use for messages at the moment (asked per message; when no listener of a channel has,
   *  the message is dropped before it is parsed). The listener is in place before SUBSCRIBE is sent: ioredis
   *  can hand over a message in the same read as SUBSCRIBE's reply, before the awaiting code resumes, and a
   *  listener added after the await missed it (a loaded test run lost a bus's first message that way). Every
   *  caller of a channel waits for its one subscription. */
  async on<C extends Channel>(channel: C, h: Handler<C>, opts: { wants?: () => boolean } = {}): Promise<() => void> {
    const name = channelName(this.k, channel);
    const stored = h as StoredHandler; // the map holds every channel's handlers; this one gets only `channel`'s
    let hs = this.handlers.get(name);
    if (!hs) {
      const entry: ChannelEntry = { json: CHANNELS[channel].json, set: new Set(), idle: new Map(), subscribed: Promise.resolve() };
      entry.subscribed = this.connected().then(() => this.sub.subscribe(name)).then(() => undefined);
      // A failed subscription is forgotten, so the next caller tries again; this caller gets the error below.
      entry.subscribed.catch(() => { if (this.handlers.get(name) === entry) this.handlers.delete(name); });
      this.handlers.set(name, hs = entry);
    }
    const entry = hs;
    entry.set.add(stored);
    if (opts.wants) entry.idle.set(stored, opts.wants);
    const off = () => { entry.set.delete(stored); entry.idle.delete(stored); };
    try { await entry.subscribed; } catch (e) { off(); throw e; }
    return off;
  }

  /** Resolves once the subscription connection is ready. A SUBSCRIBE sent while ioredis still runs its
   *  connection handshake (CLIENT SETINFO, the INFO ready check) puts the connection in subscriber mode before
   *  the handshake's own commands, which Redis then refuses ("Connection in subscriber mode, only subscriber
   *  commands may be used": ioredis issue #2037, 5.8.2 and later); a worker failed to start that way under a
   *  loaded test run. After a reconnect ioredis resubscribes by itself once ready. */
  private async connected(): Promise<void> {
    if (this.sub.status === 'ready') return;
    // Not events.once: it rejects on the first 'error', and a Redis that is still starting is waited for.
    await new Promise<void>((resolve, reject) => {
      const ready = () => { this.sub.off('end', ended); resolve(); };
      const ended = () => { this.sub.off('ready', ready); reject(new Error('the bus was closed before Redis was ready')); };
      this.sub.once('ready', ready);
      this.sub.once('end', ended);
    });
  }

  /** A promise, like every other closer the services await on shutdown; disconnecting is immediate. */
  close(): Promise<void> {
    this.handlers.clear();
    this.sub.disconnect();
    return Promise.resolve();
  }
}
