// A plain SSE reader over node http, so tests control disconnects and Last-Event-ID exactly.
import http from 'node:http';

/** One SSE frame; `data` is the parsed JSON, typed as the stream's caller says its frames are. */
export interface Frame<T = unknown> { event: string; id?: string; data: T }

/** What a frame's data says of its progress, for a timeout's message. */
function seen(data: unknown): string {
  const d = (data ?? {}) as { phase?: unknown; state?: unknown };
  return String(d.phase || d.state);
}

export function openSse<T = Record<string, unknown>>(url: string, lastEventId?: string) {
  const frames: Array<Frame<T>> = [];
  const comments: string[] = [];
  let req: http.ClientRequest;
  let status = 0;
  let onFrame: (() => void) | undefined;
  let headed: (status: number) => void = () => undefined;
  /** Resolves with the status once the answer's head is in (a stream's client is registered by then). */
  const opened = new Promise<number>((resolve) => { headed = resolve; });
  const closed = new Promise<void>((resolve, reject) => {
    req = http.get(url, { headers: { Accept: 'text/event-stream', ...(lastEventId ? { 'Last-Event-ID': lastEventId } : {}) } }, (res) => {
      status = res.statusCode || 0;
      headed(status);
      let buf = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        buf += d;
        let i: number;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          const f: Frame<T> = { event: 'message', data: '' as T };
          let hasData = false;
          for (const line of block.split('\n')) {
            if (line.startsWith(':')) comments.push(line);
            else if (line.startsWith('event: ')) f.event = line.slice(7);
            else if (line.startsWith('id: ')) f.id = line.slice(4);
            else if (line.startsWith('data: ')) { f.data = JSON.parse(line.slice(6)) as T; hasData = true; }
          }
          if (hasData) { frames.push(f); onFrame?.(); }
        }
      });
      res.on('end', () => resolve());
      res.on('close', () => resolve());
    });
    req.on('error', (e: NodeJS.ErrnoException) => { headed(0); if (e.code === 'ECONNRESET') resolve(); else reject(e); });
  });
  return {
    frames, comments, closed, opened,
    get status() { return status; },
    close() { req.destroy(); },
    /** Resolves when `pred` holds for the frames so far. */
    waitFor(pred: (f: Array<Frame<T>>) => boolean, ms = 20000) {
      return new Promise<void>((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`SSE: timed out; got ${frames.map((f) => f.event + ':' + seen(f.data)).join(',')}`)), ms);
        const check = () => { if (pred(frames)) { clearTimeout(t); onFrame = undefined; resolve(); } };
        onFrame = check;
        check();
      });
    },
  };
}
