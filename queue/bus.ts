// One Redis subscription per process, shared by every listener in it (SSE clients, WebSocket clients, workers).
import { createRedis, keys as makeKeys, RedisClient } from '../shared/redis';

type Handler = (msg: any, raw: string) => void;

export class Bus {
  private sub: RedisClient;
  private handlers = new Map<string, Set<Handler>>();
  readonly k = makeKeys();

  constructor(url?: string) {
    this.sub = createRedis({ url });
    this.sub.on('error', () => undefined);
    this.sub.on('message', (channel: string, raw: string) => {
      const hs = this.handlers.get(channel);
      if (!hs) return;
      let msg: unknown = raw;
      try { msg = JSON.parse(raw); } catch { /* plain string payloads */ }
      for (const h of hs) {
        try { h(msg, raw); } catch { /* one listener's fault is not the others' */ }
      }
    });
  }

  async on(channel: string, h: Handler): Promise<() => void> {
    let hs = this.handlers.get(channel);
    if (!hs) {
      hs = new Set();
      this.handlers.set(channel, hs);
      await this.sub.subscribe(channel);
    }
    hs.add(h);
    return () => { hs!.delete(h); };
  }

  async close() {
    this.handlers.clear();
    this.sub.disconnect();
  }
}
