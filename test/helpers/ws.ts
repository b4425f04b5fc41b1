// A WebSocket client for tests: messages collected as they arrive; `opened` rejects with "HTTP <status>" when
// the upgrade is refused.
import WebSocket from 'ws';

/** `msgs`: each message's JSON, typed as the caller says the socket sends, with `at` (its arrival, ms). */
export function openWs<T extends object = Record<string, unknown>>(url: string, headers: Record<string, string> = {}) {
  const msgs: Array<T & { at: number }> = [];
  const ws = new WebSocket(url, { headers });
  ws.on('message', (d: Buffer) => msgs.push({ at: Date.now(), ...(JSON.parse(d.toString()) as T) }));
  const opened = new Promise<void>((resolve, reject) => { ws.once('open', () => resolve()); ws.once('unexpected-response', (_r, res) => reject(new Error(`HTTP ${res.statusCode}`))); ws.once('error', reject); });
  return { ws, msgs, opened };
}
