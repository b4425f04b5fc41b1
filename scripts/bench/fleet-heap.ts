// A service's live memory for the fleet soak (fleet-soak.ts): through the process's own inspector (started with
// `--inspect=127.0.0.1:0`, loopback only, by the bench alone), a full garbage collection and then
// `process.memoryUsage()`. What is left after a full collection is what the process keeps, so a leak shows as a
// rising series; RSS cannot tell a leak from garbage not collected yet or from pages the allocator keeps (the
// daemon's RSS went 231.6 -> 257.4 -> 175.8 MiB in one 2-minute soak, docs/performance.md).
import WebSocket from 'ws';
import type { Proc } from '../../test/helpers/procs';

/** The node flag that opens a service's inspector on a free loopback port; Node prints its address on stderr. */
export const INSPECT_FLAG = '--inspect=127.0.0.1:0';

export interface LiveMemory { heapUsed: number; external: number }

export class Inspector {
  private next = 0;
  private constructor(private readonly ws: WebSocket, readonly name: string) {}

  /** Connects to the inspector `proc` announced in its output ("Debugger listening on ws://..."). */
  static async attach(name: string, proc: Proc): Promise<Inspector> {
    const url = /Debugger listening on (ws:\/\/\S+)/.exec(proc.logs.join(''))?.[1];
    if (!url) throw new Error(`${name}: no inspector address in its output (was it started with ${INSPECT_FLAG}?)`);
    const ws = new WebSocket(url);
    await new Promise<void>((resolve, reject) => { ws.once('open', () => resolve()); ws.once('error', reject); });
    return new Inspector(ws, name);
  }

  private call<T>(method: string, params: Record<string, unknown> = {}): Promise<T> {
    const id = ++this.next;
    return new Promise((resolve, reject) => {
      const onMessage = (data: Buffer) => { // text frames arrive as one Buffer (ws defaults)
        const m = JSON.parse(data.toString('utf8')) as { id?: number; result?: T; error?: { message: string } };
        if (m.id !== id) return;
        this.ws.off('message', onMessage);
        if (m.error) reject(new Error(`${this.name}: ${method}: ${m.error.message}`));
        else resolve(m.result as T);
      };
      this.ws.on('message', onMessage);
      this.ws.send(JSON.stringify({ id, method, params }));
    });
  }

  /** A full collection, then what the process holds: the JS heap in use and memory outside it that JS objects
   *  own (Buffers). */
  async liveMemory(): Promise<LiveMemory> {
    await this.call('HeapProfiler.collectGarbage');
    const r = await this.call<{ result: { value: string } }>('Runtime.evaluate', { expression: 'JSON.stringify(process.memoryUsage())', returnByValue: true });
    const m = JSON.parse(r.result.value) as LiveMemory;
    return { heapUsed: m.heapUsed, external: m.external };
  }

  close() { this.ws.close(); }
}
