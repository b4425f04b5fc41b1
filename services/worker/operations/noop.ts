// Does no work: for drills and for benchmarking the queue itself.
import { OperationError } from '../../../platform/errors';
import type { Operation } from './types';

export const noop: Operation = async (ctx) => {
  const p = ctx.spec.parameters as { sleep_ms?: number; fail?: string; steps?: number };
  const steps = p.steps || 0;
  for (let i = 1; i <= steps; i++) {
    await ctx.progress('work', Math.round((i / steps) * 100), `step ${i} of ${steps}`);
    if (p.sleep_ms) await sleep(p.sleep_ms / steps, ctx.signal);
  }
  if (!steps && p.sleep_ms) await sleep(p.sleep_ms, ctx.signal);
  if (p.fail) throw new OperationError(p.fail, true);
  return { ok: true };
};

function sleep(ms: number, signal: AbortSignal) {
  return new Promise<void>((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => {
      clearTimeout(t);
      reject(signal.reason as Error); /* an AbortError, or the Error the runner aborts with */
    }, { once: true });
  });
}
