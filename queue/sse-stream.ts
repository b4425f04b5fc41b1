// The two halves of a server-sent event stream that a job's stream (sse.ts) and a plan's (plan-events.ts) share:
// taking the response over from Koa, and writing one frame without buffering without bound.
import type Koa from 'koa';
import type { ServerResponse } from 'node:http';

/** A client that does not read is cut off past this many unsent bytes; it reconnects with Last-Event-ID. */
export const MAX_BUFFERED = 8 * 1024 * 1024;

/** Takes the response over from Koa and sends the head and the reconnect delay. */
export function openEventStream(ctx: Koa.Context): ServerResponse {
  ctx.respond = false;
  ctx.req.socket.setTimeout(0);
  ctx.req.socket.setNoDelay(true);
  const res = ctx.res;
  // No chunked framing: the stream ends with the connection, so each event is one plain socket write.
  res.useChunkedEncodingByDefault = false;
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', 'X-Accel-Buffering': 'no' });
  res.write('retry: 2000\n\n');
  return res;
}

/** Writes one frame straight to the socket (the head is out and the body unframed), or cuts off a client that
 *  stopped reading. */
export function writeFrame(res: ServerResponse, frame: string | Buffer): void {
  const sock = res.socket;
  if ((sock?.writableLength ?? res.writableLength) > MAX_BUFFERED) { res.destroy(); return; }
  (sock && !sock.destroyed ? sock : res).write(frame);
}
