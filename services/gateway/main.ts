// Gateway process: the worker job protocol on GATEWAY_PORT (default 8000).
import { startGateway } from './app';
import { onShutdown } from '../../shared/process';

startGateway().then((g) => onShutdown(() => g.close())).catch((e) => {
  process.stderr.write(`gateway failed to start: ${e.message}\n`);
  process.exit(1);
});
