// The VM console WebSocket (/virt/console?name=<domain>[&mode=read|write][&force=1], both path forms): the daemon
// bridges browsers to the domain's serial console (domain/libvirt/console.ts: `virsh console` under a pty).
// Messages are JSON both ways: server -> client {type: 'status'|'data'|'error'|'closed', ...}; client -> server
// {type: 'input', data}. The WebSocket hub authenticates the upgrade (role `view`) and hands over the caller.
//
// One virsh session per domain in this daemon, shared by every viewer; at most one of them, the writer, types
// into it. Typing needs `input`; taking the console from its writer here, or from whoever holds it outside
// (virsh console --force), needs `force` (docs/security.md: the console rule).
import type http from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer, WebSocket } from 'ws';
import { Caller, grantsRole, KeyRole } from '../../platform/auth';
import { domainInfo, domainState, NAME_PATTERN, openConsole, Virsh } from '../../domain/libvirt';
import type { ConsoleSession } from '../../domain/libvirt/console';
import { ApiError } from '../../platform/errors';
import { spawnSlots } from '../../platform/limits';
import { refuseUpgrade } from './ws';
import { JobVirsh } from '../../orchestration/virsh-jobs';

/** What each console action needs, declared once (listed in docs/security.md's role table). */
export const CONSOLE_ROLES: Record<'view' | 'input' | 'force', KeyRole> = { view: 'read', input: 'admin', force: 'admin' };

/** The caller of an upgrade: its key's name and role, or null when authentication is off (every right). */
export type ConsoleCaller = Caller | null;
const may = (c: ConsoleCaller, what: keyof typeof CONSOLE_ROLES) => !c || grantsRole(c.role, CONSOLE_ROLES[what]);
const who = (c: ConsoleCaller) => (c ? `key "${c.name}"` : 'a caller');

interface Viewer { ws: WebSocket; caller: ConsoleCaller }
interface Session { con: ConsoleSession; viewers: Set<Viewer>; writer?: Viewer; ready: boolean; state: string; exited: Promise<void> }

const send = (ws: WebSocket, m: Record<string, unknown>) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(m)); };
const refuse = (ws: WebSocket, code: number, error: string) => {
  send(ws, { type: 'error', error });
  ws.close(code, error.slice(0, 100)); // a close reason holds 123 bytes
};

/** What the caller asked for, or the reason it may not have it (4403). */
function wanted(req: http.IncomingMessage, caller: ConsoleCaller): { name: string; write: boolean; force: boolean } | { refused: string } {
  const q = new URL(req.url || '/', 'http://x').searchParams;
  const mode = q.get('mode');
  const force = ['1', 'true'].includes(q.get('force') || '');
  if (!may(caller, 'view')) return { refused: `viewing a console needs role ${CONSOLE_ROLES.view}` };
  if (mode !== null && mode !== 'read' && mode !== 'write') return { refused: 'mode: give read or write' };
  if (mode === 'write' && !may(caller, 'input')) {
    return { refused: `mode: typing into a console needs role ${CONSOLE_ROLES.input}; ${who(caller)} has role ${caller!.role} (open it with mode=read)` };
  }
  if (force && !may(caller, 'force')) {
    return { refused: `force: taking over a console needs role ${CONSOLE_ROLES.force}; ${who(caller)} has role ${caller!.role}` };
  }
  // Without a mode, whoever may type is the writer (the console page), everyone else a reader.
  return { name: q.get('name') || '', write: mode === null ? may(caller, 'input') : mode === 'write', force };
}

/** Told of every connection that becomes the writer (it may type into the guest): the audit log records it. */
export type OnWriter = (req: http.IncomingMessage, caller: ConsoleCaller, domain: string, force: boolean) => void;

export function consoleEndpoints(v: Virsh, onWriter?: OnWriter) {
  const wss = new WebSocketServer({ noServer: true, maxPayload: 64 * 1024 });
  const sessions = new Map<string, Session>();
  /** Sessions ending: a new one for the domain waits until virsh let go of the console. */
  const ending = new Map<string, Promise<void>>();

  function open(name: string, state: string, force: boolean): Session {
    // Through workers (v a JobVirsh) `virsh console` runs on one with libvirt_access (orchestration/console-jobs.ts).
    const con = v instanceof JobVirsh ? v.console(name, force) : openConsole(v, name, force);
    const exited = new Promise<void>((r) => con.on('close', () => r()));
    const s: Session = { con, viewers: new Set(), ready: false, state, exited };
    con.on('ready', () => { s.ready = true; for (const x of s.viewers) status(s, x, name); });
    con.on('data', (text: string) => { for (const x of s.viewers) send(x.ws, { type: 'data', data: text }); });
    con.on('close', (_code: number, error: string) => {
      if (sessions.get(name) === s) sessions.delete(name);
      for (const x of s.viewers) { send(x.ws, { type: 'closed', error: error || undefined }); x.ws.close(1000, 'console ended'); }
    });
    sessions.set(name, s);
    return s;
  }

  const status = (s: Session, x: Viewer, name: string) => send(x.ws, {
    type: 'status', status: 'connected', domain: name, state: s.state, mode: s.writer === x ? 'write' : 'read',
  });

  function leave(name: string, s: Session, x: Viewer) {
    s.viewers.delete(x);
    if (s.writer === x) s.writer = undefined;
    if (s.viewers.size || sessions.get(name) !== s) return;
    sessions.delete(name);
    const gone = s.exited.then(() => { if (ending.get(name) === gone) ending.delete(name); });
    ending.set(name, gone);
    s.con.close();
  }

  /** Makes `x` the writer: refused while another holds it, unless `force` (the other is then told and closed). */
  function takeWriter(s: Session, x: Viewer, force: boolean): string | null {
    const cur = s.writer;
    if (cur && !force) {
      return `the console already has a writer (${who(cur.caller)}); one at a time: `
        + `open it with mode=read${may(x.caller, 'force') ? ', or take it with force=1' : ''}`;
    }
    if (cur) {
      send(cur.ws, { type: 'closed', error: `the console was taken over by ${who(x.caller)}` });
      cur.ws.close(4409, 'taken over');
      s.viewers.delete(cur);
    }
    s.writer = x;
    return null;
  }

  async function bridge(ws: WebSocket, req: http.IncomingMessage, caller: ConsoleCaller) {
    const w = wanted(req, caller);
    if ('refused' in w) return refuse(ws, 4403, w.refused);
    const { name } = w;
    if (!NAME_PATTERN.test(name)) return refuse(ws, 4400, 'name: give a domain name (?name=...)');
    try {
      const info = await domainInfo(v, name);
      if (!info.serials) return refuse(ws, 4404, `domain ${name} has no serial device: there is no text console to show (add <serial type='pty'/> to its XML)`);
      const state = await domainState(v, name);
      if (state !== 'running' && state !== 'paused') return refuse(ws, 4409, `domain ${name} is ${state}: start it to use its console`);
      if (ws.readyState !== WebSocket.OPEN) return;
      let s = sessions.get(name);
      if (!s) { await ending.get(name); s = sessions.get(name) || open(name, state, w.force); }
      s.state = state;
      const x: Viewer = { ws, caller };
      if (w.write) { const no = takeWriter(s, x, w.force); if (no) return refuse(ws, 4409, no); onWriter?.(req, caller, name, w.force); }
      s.viewers.add(x);
      ws.on('close', () => leave(name, s, x));
      if (ws.readyState !== WebSocket.OPEN) return leave(name, s, x); // gone while the session was starting
      if (s.ready) status(s, x, name);
      ws.on('message', inputOf(s, x));
    } catch (e) {
      refuse(ws, 4000, (e as Error).message);
    }
  }
  const handle = upgradeWith((req, socket, head, caller) => wss.handleUpgrade(req, socket, head, (ws) => void bridge(ws, req, caller)));
  return { '/virt/console': handle, '/api/v1/virt/console': handle };
}

type Upgrade = (req: http.IncomingMessage, socket: Duplex, head: Buffer, caller: ConsoleCaller) => void;

/** Each connection may start a `virsh console` process: a slot per connection (per caller and in all), held until
 *  the socket closes, whatever ends it; none free: the upgrade is refused (503 or 429 with Retry-After). */
function upgradeWith(upgrade: Upgrade): Upgrade {
  return (req, socket, head, caller) => {
    let release: () => void;
    try { release = spawnSlots.console.take(); } catch (e) {
      const err = e as ApiError;
      return refuseUpgrade(socket, err.status || 503, err.message,
        (err.details as { retryAfter?: number } | undefined)?.retryAfter); // a 429's details (platform/limits.ts)
    }
    socket.once('close', release);
    upgrade(req, socket, head, caller);
  };
}

/** A viewer's messages: the writer's input goes to the guest; a reader's is dropped, and told so once, so a
 *  reader's keys never reach the guest. */
function inputOf(s: Session, x: Viewer) {
  let told = false;
  return (raw: unknown) => {
    let m: unknown;
    try { m = JSON.parse(String(raw)); } catch { return; } // not JSON: not input, nothing to answer
    // The browser's message: only {type: 'input', data: string} is input.
    if (typeof m !== 'object' || m === null || !('type' in m) || m.type !== 'input' || !('data' in m) || typeof m.data !== 'string') return;
    if (s.writer === x) return s.con.write(Buffer.from(m.data, 'utf8'));
    if (!told) {
      told = true;
      const why = may(x.caller, 'input') ? 'another viewer is the writer' : `typing needs role ${CONSOLE_ROLES.input}`;
      send(x.ws, { type: 'error', error: `read-only: ${why}; input ignored` });
    }
  };
}
