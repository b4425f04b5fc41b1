// The VM console WebSocket (/virt/console?name=<domain>, both path forms): the daemon bridges the browser to the
// domain's serial console (shared/libvirt/console.ts: `virsh console` under a pty). Messages are JSON both ways:
// server -> client {type: 'status'|'data'|'error'|'closed', ...}; client -> server {type: 'input', data}.
// Authorization is the daemon's own (the WebSocket hub checks it before handing the upgrade over).
import type http from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer, WebSocket } from 'ws';
import { domainInfo, domainState, NAME_PATTERN, openConsole, Virsh } from '../../shared/libvirt';
import { ApiError } from '../../shared/errors';
import { spawnSlots } from '../../shared/limits';
import { refuseUpgrade } from './ws';

const send = (ws: WebSocket, m: Record<string, unknown>) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(m)); };

export function consoleEndpoints(v: Virsh) {
  const wss = new WebSocketServer({ noServer: true, maxPayload: 64 * 1024 });
  // Each session is a `virsh console` process: a slot per session (per caller and in all), held until the socket
  // closes, whatever ends it.
  const handle = (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    let release: () => void;
    try { release = spawnSlots.console.take(); } catch (e) {
      const err = e as ApiError;
      return refuseUpgrade(socket, err.status || 503, err.message, (err.details as any)?.retryAfter);
    }
    socket.once('close', release);
    wss.handleUpgrade(req, socket, head, (ws) => void bridge(ws, req));
  };
  async function bridge(ws: WebSocket, req: http.IncomingMessage) {
    const name = new URL(req.url || '/', 'http://x').searchParams.get('name') || '';
    if (!NAME_PATTERN.test(name)) { send(ws, { type: 'error', error: 'name: give a domain name (?name=...)' }); return ws.close(4400, 'bad name'); }
    try {
      const info = await domainInfo(v, name);
      if (!info.serials) { send(ws, { type: 'error', error: `domain ${name} has no serial device: there is no text console to show (add <serial type='pty'/> to its XML)` }); return ws.close(4404, 'no serial device'); }
      const state = await domainState(v, name);
      if (state !== 'running' && state !== 'paused') { send(ws, { type: 'error', error: `domain ${name} is ${state}: start it to use its console` }); return ws.close(4409, 'not running'); }
      const con = openConsole(v, name);
      con.on('ready', () => send(ws, { type: 'status', status: 'connected', domain: name, state }));
      con.on('data', (text: string) => send(ws, { type: 'data', data: text }));
      con.on('close', (_code: number, error: string) => { send(ws, { type: 'closed', error: error || undefined }); ws.close(1000, 'console ended'); });
      ws.on('message', (raw) => {
        let m: any;
        try { m = JSON.parse(String(raw)); } catch { return; }
        if (m?.type === 'input' && typeof m.data === 'string') con.write(Buffer.from(m.data, 'utf8'));
      });
      ws.on('close', () => con.close());
    } catch (e) {
      send(ws, { type: 'error', error: (e as Error).message });
      ws.close(4000, 'console unavailable');
    }
  }
  return { '/virt/console': handle, '/api/v1/virt/console': handle };
}
