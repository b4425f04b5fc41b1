// How every Ferry process stops on SIGINT/SIGTERM: run its cleanup once, then exit. With Redis unreachable a
// cleanup that talks to it would wait forever, so the exit is bounded.
import { createLogger } from './log';

export function onShutdown(cleanup: () => Promise<unknown>, boundMs = 10_000) {
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    setTimeout(() => process.exit(1), boundMs).unref();
    try {
      await cleanup();
      process.exit(0);
    } catch (e) {
      createLogger('process').error('cleanup at shutdown failed', { error: (e as Error).message });
      process.exit(1);
    }
  };
  // stop catches its own failures (logged, exit 1)
  process.on('SIGINT', () => void stop());
  process.on('SIGTERM', () => void stop());
}
