// The fan-out baseline for scripts/bench/queue.ts: a bare Node HTTP server with no Redis, no koa and no job
// store. GET /stream keeps the response open; POST /fire writes one SSE frame (encoded once) to every open
// stream. The same raw clients measure it and the gateway, so the difference is what Ferry adds.
import http from 'node:http';
import type { Socket } from 'node:net';

const streams = new Set<Socket>();
const server = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/stream') {
    req.socket.setNoDelay(true);
    res.useChunkedEncodingByDefault = false;
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    res.write('retry: 2000\n\n');
    streams.add(req.socket);
    req.on('close', () => streams.delete(req.socket));
    return;
  }
  if (req.method === 'POST' && req.url === '/fire') {
    let body = '';
    req.setEncoding('utf8').on('data', (s: string) => { body += s; }).on('end', () => {
      const ev = JSON.parse(body) as { round?: number }; // the progress event queue.ts's bareTarget posts
      const frame = Buffer.from(`event: progress\nid: ${Date.now()}-${ev.round}\ndata: ${JSON.stringify(ev)}\n\n`);
      res.writeHead(201, { 'Content-Type': 'application/json' }).end('{}');
      for (const s of streams) s.write(frame);
    });
    return;
  }
  if (req.method === 'POST' && req.url === '/end') {
    for (const s of streams) s.end('event: complete\ndata: {"state":"COMPLETED"}\n\n');
    res.writeHead(204).end();
    return;
  }
  res.writeHead(404).end();
});
server.listen(Number(process.argv[2] || 0), '127.0.0.1', () => {
  process.stdout.write(`${(server.address() as { port: number }).port}\n`);
});
process.on('SIGTERM', () => process.exit(0));
