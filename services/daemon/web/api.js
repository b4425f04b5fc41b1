// Talking to the daemon: every call is relative to the API root (the dashboard lives at <root>/web/dashboard/,
// so the same page works under / and /api/v1). With auth on, the API key is asked for once and kept in
// sessionStorage; HTTP calls send it as X-API-Key. A browser cannot set a WebSocket's headers and a key never goes
// in a URL, so /ws is opened with a single-use ticket from POST /ws/ticket (valid 30 s).
const ROOT = location.pathname.replace(/\/web\/dashboard(\/.*)?$/, '');
const KEY = 'ferry.apiKey';

export const apiKey = {
  get: () => sessionStorage.getItem(KEY) || '',
  set: (k) => sessionStorage.setItem(KEY, k),
  clear: () => sessionStorage.removeItem(KEY),
};

/** Called when the daemon refuses the key (401/403); the page shows the key form. */
let onAuth = () => { /* until the page sets its key form */ };
export function onAuthNeeded(f) { onAuth = f; }

export class HttpError extends Error {
  constructor(status, body) { super(body?.error || `HTTP ${status}`); this.status = status; this.body = body; }
}

function headers(extra = {}) {
  const h = { ...extra };
  if (apiKey.get()) h['X-API-Key'] = apiKey.get();
  return h;
}

export async function api(method, path, body) {
  const res = await fetch(ROOT + path, {
    method,
    headers: headers(body !== undefined ? { 'Content-Type': 'application/json' } : {}),
    body: body !== undefined ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  let json;
  try { json = text ? JSON.parse(text) : undefined; } catch { json = { error: text }; }
  // A key that is accepted but lacks the role (a read key pressing Start) keeps the page: only a missing or
  // refused key asks for another one.
  if (res.status === 401 || (res.status === 403 && !/needs role/.test(json?.error || ''))) onAuth(res.status);
  if (!res.ok) throw new HttpError(res.status, json);
  return json;
}

/** The /ws update stream, reconnecting after a drop. Returns a function that closes it for good. */
export function updates(onMessage, onState) {
  let ws;
  let closed = false;
  let retry;
  const open = async () => {
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    let q = '';
    if (apiKey.get()) {
      try { q = `?ticket=${encodeURIComponent((await api('POST', '/ws/ticket')).ticket)}`; } catch { /* refused or offline: the open fails and is retried */ }
    }
    if (closed) return;
    ws = new WebSocket(`${proto}//${location.host}${ROOT}/ws${q}`);
    ws.onopen = () => onState(true);
    ws.onmessage = (e) => { try { onMessage(JSON.parse(e.data)); } catch { /* not JSON */ } };
    ws.onclose = () => { onState(false); if (!closed) retry = setTimeout(open, 2000); };
  };
  open();
  return () => { closed = true; clearTimeout(retry); ws?.close(); };
}

/** A job's progress events as Server-Sent Events, read with fetch so the API key travels as a header and
 *  not in the URL. Resumes after a drop with Last-Event-ID; ends at the `complete` event. */
export function jobEvents(id, onEvent, onComplete) {
  const ctl = new AbortController();
  let lastId = '';
  let done = false;
  const run = async () => {
    while (!done && !ctl.signal.aborted) {
      try {
        const res = await fetch(`${ROOT}/jobs/${encodeURIComponent(id)}/events/stream`, {
          headers: headers(lastId ? { 'Last-Event-ID': lastId, Accept: 'text/event-stream' } : { Accept: 'text/event-stream' }), signal: ctl.signal,
        });
        if (!res.ok) { if (res.status === 401 || res.status === 403) onAuth(res.status); return; }
        if (res.status === 204) return; // the stream had ended with `complete` already
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        for (;;) {
          const { value, done: end } = await reader.read();
          if (end) break;
          buf += value;
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const frame = buf.slice(0, i);
            buf = buf.slice(i + 2);
            const f = { event: 'message', data: '' };
            for (const line of frame.split('\n')) {
              const m = /^(\w+): ?(.*)$/.exec(line);
              if (!m) continue;
              if (m[1] === 'data') f.data += m[2];
              else f[m[1]] = m[2];
            }
            if (f.id) lastId = f.id;
            if (f.event === 'progress') onEvent(JSON.parse(f.data), f.id);
            if (f.event === 'complete') { done = true; onComplete(JSON.parse(f.data)); }
          }
        }
      } catch { if (ctl.signal.aborted) return; }
      if (!done) await new Promise((r) => setTimeout(r, 2000));
    }
  };
  run();
  return () => ctl.abort();
}
