// The gateway's periodic work, run by the one gateway that holds the 'gateway' lease (queue/leader.ts). Each
// sweep checks the lease again (`still`) before each step that writes.
import { config } from '../../platform/config';
import type { Logger } from '../../platform/log';
import type { Leader } from '../../queue/leader';
import type { Lifecycle } from '../../queue/lifecycle';
import type { Registry } from '../../queue/registry';
import type { QueueRouter } from '../../queue/router';
import type { JobStore } from '../../queue/store';

interface Deps { router: QueueRouter; registry: Registry; life: Lifecycle; store: JobStore; log: Logger }

export function gatewaySweeps(leader: Leader, { router, registry, life, store, log }: Deps): Leader {
  // Stale workers give their jobs back; queues created since the last run are watched for stalled jobs.
  leader.every('stale-workers', Math.min(30_000, Math.max(1000, (config.workerStaleSeconds * 1000) / 4)), async (still) => {
    await router.watchAll();
    for (const id of await registry.stale()) {
      if (!(await still())) return;
      if ((await registry.heldJobs(id)).length) await life.releaseWorker(id, `no heartbeat for ${config.workerStaleSeconds} s`);
    }
  });
  // Redis stays bounded: finished jobs leave after FERRY_JOB_RETENTION, silent workers after FERRY_WORKER_PRUNE_AFTER.
  const retentionMs = config.jobRetentionMs;
  const pruneMs = config.workerPruneMs;
  leader.every('retention', Math.min(60_000, Math.max(500, Math.min(retentionMs, pruneMs) / 4)), async (still) => {
    const purged = await store.purgeFinished(retentionMs, still);
    if (purged) log.info('finished jobs past retention removed', { count: purged });
    if (!(await still())) return;
    const pruned = await registry.prune(pruneMs);
    if (pruned.length) log.info('silent workers removed', { worker_ids: pruned.slice(0, 50), count: pruned.length });
  });
  leader.every('reconcile', config.reconcileSeconds * 1000, async (still) => {
    const restored = await life.reconcileQueued(config.reconcileSeconds * 1000, still);
    if (restored.length) log.warn('queued jobs were missing from their queue; put back', { job_ids: restored.slice(0, 50), count: restored.length });
  });
  // Pull workers run the operation out of our reach; their attempts end here when timeout_seconds runs out.
  leader.every('timeouts', config.timeoutSweepSeconds * 1000, async (still) => {
    const ended = await life.reapTimedOut(Date.now(), still);
    if (ended.length) log.warn('attempts past their timeout_seconds ended', { job_ids: ended.slice(0, 50), count: ended.length });
  });
  return leader;
}
