// How every Ferry process stops on SIGINT/SIGTERM: run its cleanup once, then exit. With Redis unreachable a
// cleanup that talks to it would wait forever, so the exit is bounded.
export function onShutdown(cleanup: () => Promise<unknown>, boundMs = 10_000) {
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    setTimeout(() => process.exit(1), boundMs).unref();
    await cleanup().catch(() => undefined);
    process.exit(0);
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}
