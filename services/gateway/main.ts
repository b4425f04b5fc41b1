// Gateway process: the worker job protocol on GATEWAY_PORT (default 8000).
import { startGateway } from './app';

startGateway().then((g) => {
  const stop = async () => {
    setTimeout(() => process.exit(1), 10_000).unref(); // Redis unreachable: do not hang on the way out
    await g.close().catch(() => undefined);
    process.exit(0);
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}).catch((e) => {
  process.stderr.write(`gateway failed to start: ${e.message}\n`);
  process.exit(1);
});
