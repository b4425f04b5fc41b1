// Readiness and liveness, the one rule every service's probes follow: ready (200) while its Redis answers within
// two seconds, 503 while it does not (a Redis that is gone leaves commands waiting for the reconnect, so the answer
// is bounded rather than awaited); alive while the process answers at all, so a Redis outage makes a pod unready
// and never restarts it.
export const READY_TIMEOUT_MS = 2000;

/** Whether `p` settles without error within `ms`. */
export async function answersWithin(p: Promise<unknown>, ms = READY_TIMEOUT_MS): Promise<boolean> {
  let t: NodeJS.Timeout | undefined;
  const timeout = new Promise<boolean>((r) => { t = setTimeout(() => r(false), ms); });
  try { return await Promise.race([p.then(() => true, () => false), timeout]); } finally { clearTimeout(t); }
}
