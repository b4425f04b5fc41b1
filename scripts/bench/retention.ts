// Retention benchmark: Redis memory per finished job with 100,000 finished jobs in the store, and again after
// FERRY_JOB_RETENTION has passed (shortened here) and the gateway's sweep has removed them. The jobs are made
// through the same Lua scripts every service uses (JobStore: create, assign, run with progress events, finish),
// so their keys, history, events and index entries are what a real job leaves. The bare baseline is the same
// redis-server before any job, measured in the same run.
//   npm run bench:retention [-- --jobs 100000 --events 5 --retention 5s]
import { parseArgs } from 'node:util';
import { TestRedis } from '../../test/helpers/redis';
import { startGatewayProc, testEnv } from '../../test/helpers/procs';
import { makeFinishedJob } from './common';
import type { JobSpec } from '../../domain/schemas/job';

const { values } = parseArgs({ options: { jobs: { type: 'string' }, events: { type: 'string' }, retention: { type: 'string' } } });
const JOBS = Number(values.jobs || 100_000);
const EVENTS = Number(values.events || 5);
const RETENTION = values.retention || '5s';
const PREFIX = 'bench';
/** Target: once retention has passed, what is left per job is below this (the index and counter hashes only). */
const TARGET_AFTER_BYTES = 16;

async function main() {
  const redis = await new TestRedis().start();
  process.env.REDIS_URL = redis.url;
  process.env.FERRY_PREFIX = PREFIX;
  const { createRedis } = await import('../../platform/redis');
  const { JobStore } = await import('../../queue/store');
  const { jobSpecSchema } = await import('../../domain/schemas/job');
  const rc = createRedis();
  const store = new JobStore(rc, PREFIX);
  const used = async () => {
    // MEMORY PURGE exists only with jemalloc; without it the figure is read unpurged
    await rc.call('MEMORY', 'PURGE').catch((e: Error) => console.warn(`[bench] MEMORY PURGE failed, used_memory is read without it: ${e.message}`));
    return Number(/^used_memory:(\d+)/m.exec(await rc.info('memory'))![1]);
  };
  const keys = async () => Number(await rc.dbsize());

  const bare = await used();
  const t0 = Date.now();
  const one = async (i: number) => {
    const id = `ret-${i}`;
    const spec = jobSpecSchema.validate({ job_id: id, operation: 'noop', parameters: { steps: EVENTS } }).value as JobSpec; // Joi's value is untyped
    await makeFinishedJob(store, id, EVENTS, JSON.stringify(spec));
  };
  const INFLIGHT = 256;
  let next = 0;
  await Promise.all(Array.from({ length: INFLIGHT }, async () => { while (next < JOBS) await one(next++); }));
  const made = (Date.now() - t0) / 1000;
  const full = await used();
  const fullKeys = await keys();
  const perJob = (full - bare) / JOBS;
  console.log(`made ${JOBS} finished jobs (${EVENTS + 2} progress events each) in ${made.toFixed(1)} s`);
  console.log(`bare redis-server: used_memory ${(bare / 1048576).toFixed(2)} MiB`);
  console.log(`with ${JOBS} finished jobs: used_memory ${(full / 1048576).toFixed(1)} MiB, ${fullKeys} keys: ${perJob.toFixed(0)} bytes per finished job`);

  // The real gateway process sweeps with a shortened retention.
  const gw = await startGatewayProc({ ...testEnv(redis.url, PREFIX), FERRY_HOST: '127.0.0.1', FERRY_JOB_RETENTION: RETENTION });
  const t1 = Date.now();
  while ((await store.total()) > 0) {
    if (Date.now() - t1 > 600_000) throw new Error(`retention sweep did not finish: ${await store.total()} jobs left`);
    await new Promise((r) => setTimeout(r, 250));
  }
  const swept = (Date.now() - t1) / 1000;
  await gw.stop();
  const after = await used();
  const afterKeys = await keys();
  const perAfter = (after - bare) / JOBS;
  console.log(`after retention (${RETENTION}) has passed: every job gone in ${swept.toFixed(1)} s (retention wait included); used_memory ${(after / 1048576).toFixed(2)} MiB, ${afterKeys} keys: ${perAfter.toFixed(1)} bytes per finished job over bare`);
  console.log(`target: under ${TARGET_AFTER_BYTES} bytes per job left after retention: ${perAfter < TARGET_AFTER_BYTES ? 'MET' : 'NOT MET'}`);
  rc.disconnect();
  await redis.stop();
  process.exit(perAfter < TARGET_AFTER_BYTES ? 0 : 1);
}

main().catch((e) => { console.error(e); process.exit(1); });
