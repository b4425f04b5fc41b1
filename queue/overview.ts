// What operators see of the cluster: registered workers and the queues by requirement set (counts per state,
// queued jobs by priority, matching active workers, why a queue waits). Shared by the gateway's GET /workers
// and GET /queue and the daemon's (dashboard) copies of them, so both answer the same.
import { canServe, parseQueueName } from '../platform/capabilities';
import { unservedReason, type Lifecycle } from './lifecycle';

export async function workersOverview(life: Lifecycle) {
  const ws = await life.registry.list();
  return { total: ws.length, active: ws.filter((w) => w.active).length, workers: ws.map(({ kind, ...w }) => w) };
}

export async function queueOverview(life: Lifecycle) {
  const { store, router, registry } = life;
  const [{ byPriority: byPrio }, names, active, queuedIds] = await Promise.all(
    [store.queued(), router.knownQueues(), registry.active(), store.redis.zrange(store.k.jobsInState('QUEUED'), 0, 199)]);
  // Jobs a worker handed back with a reason (a full per-manager export limit), per queue (the first 200 queued).
  const own = new Map<string, string[]>();
  for (const h of await store.many(queuedIds, ['state', 'queue', 'waiting_reason'])) {
    if (h?.state === 'QUEUED' && h.queue && h.waiting_reason) own.set(h.queue, [...(own.get(h.queue) || []), h.waiting_reason]);
  }
  const by_priority: Record<string, number> = {};
  let total = 0;
  for (const [p, n] of Object.entries(byPrio)) if (Number(n) > 0) { by_priority[p] = Number(n); total += Number(n); }
  const counts = await store.queueCounts(names);
  const queues = names.map((name) => {
    const c = counts[name];
    const req = parseQueueName(name)!;
    const serving = active.filter((w) => canServe(w, req)).length;
    const queued = Number(c.QUEUED || 0);
    return {
      name, capabilities: req.capabilities, execution_mode: req.execution_mode || null,
      queued, assigned: Number(c.ASSIGNED || 0), running: Number(c.RUNNING || 0), active_workers: serving,
      // The active workers read above, not read again per queue.
      waiting_reason: queued && !serving ? unservedReason(req, active)
        : own.get(name)?.length ? `${own.get(name)!.length} job(s) waiting: ${own.get(name)![0]}` : null,
    };
  });
  return { total_jobs: total, by_priority, queues };
}
