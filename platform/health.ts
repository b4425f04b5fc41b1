// Readiness and liveness, the one rule every service's probes follow: ready (200) while its Redis answers within
// two seconds, 503 while it does not (a Redis that is gone leaves commands waiting for the reconnect, so the answer
// is bounded rather than awaited); alive while the process answers at all, so a Redis outage makes a pod unready
// and never restarts it.
export const READY_TIMEOUT_MS = 2000;

/** `p`'s value, or a rejection once `ms` pass first: a Redis command waits through an outage (ioredis queues it),
 *  so whatever must answer meanwhile bounds its wait with this. */
export async function within<T>(p: Promise<T>, ms: number): Promise<T> {
  let t: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_r, reject) => { t = setTimeout(() => reject(new Error(`Redis did not answer within ${ms / 1000} s`)), ms); });
  try { return await Promise.race([p, late]); } finally { clearTimeout(t); }
}

/** Whether `p` settles without error within `ms`. */
export const answersWithin = (p: Promise<unknown>, ms = READY_TIMEOUT_MS): Promise<boolean> => within(p, ms).then(() => true, () => false);
