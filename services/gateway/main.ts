// Gateway process: the worker job protocol on GATEWAY_PORT (default 8000).
import '../../platform/check-settings'; // first: a bad setting stops the process before anything reads it
import { startGateway } from './app';
import { onShutdown } from '../../platform/process';
import { errorText } from '../../platform/errors';

startGateway().then((g) => onShutdown(() => g.close())).catch((e) => {
  process.stderr.write(`gateway failed to start: ${errorText(e)}\n`);
  process.exit(1);
});
