// A WebSocket client for tests: messages collected as they arrive; `opened` rejects with "HTTP <status>" when
// the upgrade is refused.
import WebSocket from 'ws';

export function openWs(url: string, headers: Record<string, string> = {}) {
  const msgs: any[] = [];
  const ws = new WebSocket(url, { headers });
  ws.on('message', (d: Buffer) => msgs.push({ at: Date.now(), ...JSON.parse(d.toString()) }));
  const opened = new Promise<void>((resolve, reject) => { ws.once('open', () => resolve()); ws.once('unexpected-response', (_r, res) => reject(new Error(`HTTP ${res.statusCode}`))); ws.once('error', reject); });
  return { ws, msgs, opened };
}
