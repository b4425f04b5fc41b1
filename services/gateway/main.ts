// Gateway process: the worker job protocol on GATEWAY_PORT (default 8000).
import { startGateway } from './app';

startGateway().then((g) => {
  const stop = async () => { await g.close().catch(() => undefined); process.exit(0); };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}).catch((e) => {
  process.stderr.write(`gateway failed to start: ${e.message}\n`);
  process.exit(1);
});
