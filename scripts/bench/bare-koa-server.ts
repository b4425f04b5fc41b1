// The HTTP floor for scripts/bench/fleet.ts: a bare Koa app (no router, no validation, no Redis) answering
// GET /empty with {}. It prints its port on stdout once listening.
import http from 'node:http';
import Koa from 'koa';

const app = new Koa();
app.use((ctx) => { ctx.body = {}; });
// eslint-disable-next-line @typescript-eslint/no-misused-promises -- Koa's callback answers its own errors (500 through the app's error handler)
const server = http.createServer(app.callback());
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => { process.stdout.write(`${(server.address() as { port: number }).port}\n`); });
