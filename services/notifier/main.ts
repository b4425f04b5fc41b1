// Notifier process: turns job state changes and schedule events (Redis pub/sub) into webhook deliveries on a
// BullMQ queue, and delivers them. Deliveries never touch job processing, so a slow or dead webhook slows
// nothing but its own queue. Several notifiers may run: each change is queued once (deterministic job id).
import '../../platform/check-settings'; // first: a bad setting stops the process before anything reads it
import { Worker } from 'bullmq';
import { createRedis } from '../../platform/redis';
import { createLogger, expected } from '../../platform/log';
import { JobStore } from '../../queue/store';
import { Bus } from '../../queue/bus';
import { configPath, loadConfig } from '../../platform/daemon-config';
import { jobView, VIEW_FIELDS } from '../../orchestration/daemon-views';
import { WebhookStore, WEBHOOK_QUEUE } from '../../orchestration/webhooks';
import { makeDeliverer, type DeliveryJob } from './deliver';
import { errorText } from '../../platform/errors';
import { onShutdown } from '../../platform/process';

const EVENT_OF: Record<string, string> = { RUNNING: 'job.started', COMPLETED: 'job.completed', FAILED: 'job.failed', CANCELLED: 'job.cancelled' };

async function main() {
  const log = createLogger('notifier');
  const cfg = loadConfig(configPath());
  const redis = createRedis();
  redis.on('error', (e: Error) => log.warn('redis error', { error: e.message }));
  const store = new JobStore(redis);
  const hooks = new WebhookStore(redis, store.k);
  const bus = new Bus();
  const backoffMs = cfg.webhooks.backoff_ms;

  // Only look a job up when some webhook wants the event.
  let wanted: { at: number; events: Set<string> } = { at: 0, events: new Set() };
  const wants = async (ev: string) => {
    if (Date.now() - wanted.at > 1000) wanted = { at: Date.now(), events: new Set((await hooks.list()).filter((w) => w.enabled).flatMap((w) => w.events)) };
    return wanted.events.has(ev);
  };

  await bus.on('webhooks', () => { wanted = { at: 0, events: new Set() }; });
  await bus.on('jobs', (msg) => {
    const event = msg?.prev === undefined ? 'job.created' : EVENT_OF[msg.state];
    if (!event || !msg.job_id) return;
    void (async () => {
      if (!(await wants(event))) return;
      const h = await store.many([msg.job_id], VIEW_FIELDS);
      const job = h[0] ? jobView(msg.job_id, h[0]) : null;
      await hooks.enqueue(event, { job_id: msg.job_id, status: job?.status, state: msg.state, previous_state: msg.prev ?? null, reason: msg.reason, job },
        `${msg.job_id}.${msg.state}.${Date.parse(msg.timestamp) || Date.now()}`, { backoffMs });
    })().catch((e) => log.warn('could not queue a webhook delivery', { job_id: msg.job_id, error: (e as Error).message }));
  });
  await bus.on('schedules', (msg) => {
    if (msg?.event !== 'triggered') return;
    void (async () => {
      if (!(await wants('schedule.triggered'))) return;
      await hooks.enqueue('schedule.triggered', msg, `${msg.schedule_id}.${msg.job_id || 'none'}.${Date.parse(msg.timestamp) || Date.now()}`, { backoffMs });
    })().catch((e) => log.warn('could not queue a webhook delivery', { error: (e as Error).message }));
  });

  const worker = new Worker<DeliveryJob>(WEBHOOK_QUEUE, makeDeliverer(hooks, cfg.webhooks), {
    connection: createRedis(), prefix: store.k.bullPrefix, concurrency: cfg.webhooks.concurrency,
  });
  worker.on('error', (e) => log.warn('delivery worker error', { error: e.message }));
  worker.on('failed', (j, e) => log.info('delivery attempt failed', { delivery_id: j?.data?.delivery_id, attempt: j?.attemptsMade, error: e.message }));
  log.info('notifier running', { concurrency: cfg.webhooks.concurrency });

  onShutdown(async () => {
    await worker.close().catch(expected(log, 'shutting down: a worker connection already gone has nothing left to close'));
    await hooks.close();
    await bus.close();
    redis.disconnect();
  });
}

main().catch((e: unknown) => { process.stderr.write(`notifier failed to start: ${errorText(e)}\n`); process.exit(1); });
