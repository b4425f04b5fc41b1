// Scheduler process: runs the cron schedules. Each iteration is a BullMQ job produced by the schedule's job
// scheduler; whichever scheduler process takes it creates the run's job. Any number may run.
import '../../platform/check-settings'; // first: a bad setting stops the process before anything reads it
import { Worker } from 'bullmq';
import { createRedis } from '../../platform/redis';
import { createLogger, dropped, expected } from '../../platform/log';
import { Bus } from '../../queue/bus';
import { configPath, loadConfig } from '../../platform/daemon-config';
import { ScheduleStore, SCHEDULE_QUEUE } from '../../orchestration/schedules';
import { recordOutcome, runSchedule, sweepOutcomes, RunDeps } from '../../orchestration/schedule-runs';
import { onShutdown } from '../../platform/process';
import { errorText } from '../../platform/errors';
import { connectQueue } from '../../queue/connect';
import { Leader } from '../../queue/leader';

async function main() {
  const log = createLogger('scheduler');
  const cfg = loadConfig(configPath());
  const { redis, store, router, life } = connectQueue(log, { stalledCheck: false });
  const schedules = new ScheduleStore(redis, store.k);
  const deps: RunDeps = { life, schedules, jobTimeoutSeconds: cfg.jobTimeoutSeconds, parallelDownloads: cfg.daemon.parallel_downloads, log };
  await schedules.reconcile();

  const bus = new Bus();
  await bus.on('jobs', (msg) => { if (msg?.job_id) void recordOutcome(deps, msg.job_id, msg.state,
    msg.reason).catch(dropped(log, 'could not record a scheduled job\'s outcome; the outcome sweep (every 5 s) counts what this missed',
    { job_id: msg.job_id })); });
  // One scheduler at a time counts the outcomes the bus message above missed (queue/leader.ts).
  const leader = new Leader(redis, store.k, 'scheduler', log).every('schedule-outcomes', 5000, () => sweepOutcomes(deps)).start();

  // A run's data, as ScheduleStore (orchestration/schedules.ts) gives its job scheduler.
  const worker = new Worker<{ schedule_id: string }>(SCHEDULE_QUEUE, async (job) => {
    // Iteration ids look like repeat:<scheduler id>:<millis>; the millis name the run.
    const iteration = /(\d{10,})$/.exec(String(job.id))?.[1] || String(job.timestamp);
    return runSchedule(deps, job.data.schedule_id, { manual: false, iteration });
  }, { connection: createRedis(), prefix: store.k.bullPrefix, concurrency: 4 });
  worker.on('error', (e) => log.warn('scheduler worker error', { error: e.message }));
  worker.on('failed', (j, e) => log.warn('schedule run failed', { schedule_id: j?.data?.schedule_id, error: e.message }));
  log.info('scheduler running', { schedules: (await schedules.all()).length });

  onShutdown(async () => {
    await leader.stop();
    await worker.close().catch(expected(log, 'shutting down: a worker connection already gone has nothing left to close'));
    await schedules.close();
    await router.close();
    await bus.close();
    redis.disconnect();
  });
}

main().catch((e: unknown) => { process.stderr.write(`scheduler failed to start: ${errorText(e)}\n`); process.exit(1); });
