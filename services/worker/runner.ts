// A worker process: registers with its capabilities, claims only jobs it can run (most specific queue first),
// runs them with a lease it keeps renewing, reports progress, and obeys cancel, timeout and shutdown. Its job slots
// (concurrency) take the "jobs.*" queues; its call slots (callSlots) take only the call lane ("calls.*": the
// daemon's virsh_call and power actions, a plan's guest read and rollbacks), so work someone waits on starts at once even while long migrations hold every
// job slot. One attempt of a job: execute.ts; the worker's metrics: worker-metrics.ts.
import os from 'node:os';
import type { AddressInfo } from 'node:net';
import { config } from '../../platform/config';
import { createLogger, dropped, Logger } from '../../platform/log';
import { isCallQueue, servedQueues } from '../../platform/capabilities';
import type { Lease } from '../../queue/lifecycle';
import { Bus } from '../../queue/bus';
import { connectQueue, QueueLayer } from '../../queue/connect';
import { execute, ExecDeps, Running } from './execute';
import { serveWorkerMetrics, workerMetrics } from './worker-metrics';
import { AuditLog } from '../../platform/audit';
import { RateLimiter } from '../../platform/limits';

export interface WorkerOptions {
  workerId: string;
  capabilities: string[];
  executionMode: string;
  concurrency: number;
  /** Slots for the call lane only (FERRY_WORKER_CALL_SLOTS), beside the `concurrency` job slots. */
  callSlots: number;
  metricsPort?: number;
}

type Me = { worker_id: string; capabilities: string[]; execution_mode: string };

/** Registration with this machine's facts; again whenever a heartbeat finds the registration gone. */
const registerAs = (q: QueueLayer, me: Me) => () => q.registry.register({
  ...me,
  system_info: {
    hostname: os.hostname(), os: `${os.type()} ${os.release()}`, kernel: os.release(), architecture: os.arch(),
    memory_mb: Math.round(os.totalmem() / 1048576), disk_space_mb: 0, pid: process.pid,
  },
}, 'native');

/** The heartbeat and the renewal of every running job's lock (a third of the lease), until the returned stop. */
function keepAlive(q: QueueLayer, me: Me, running: Map<string, Running>, log: Logger) {
  const register = registerAs(q, me);
  const beat = async () => { if (!(await q.registry.heartbeat(me.worker_id))) await register(); };
  const heartbeat = setInterval(() => {
    beat().catch((e: Error) => log.warn(
      'heartbeat failed; the next beat tries again, and a worker silent for FERRY_WORKER_STALE_SECONDS loses its HTTP-claimed jobs',
      { error: e.message },
    ));
  }, config.heartbeatSeconds * 1000);
  // One lock after the other; each failure is handled where it happens, so renewAll never rejects.
  const renewAll = async () => {
    for (const r of running.values()) {
      await q.router.extendLocks(r.lease.queue, [r.lease.job_id], [r.lease.token], config.leaseSeconds).catch(dropped(
        log, 'the lease is renewed again within a third of its time; a lock that lapses hands the job back', { job_id: r.lease.job_id },
      ));
    }
  };
  const renew = setInterval(() => void renewAll(), Math.max(500, (config.leaseSeconds * 1000) / 3));
  return () => { clearInterval(heartbeat); clearInterval(renew); };
}

/** Idle slots wait here (they also poll every second). Each `enqueued` message (one per job) wakes the slot that
 *  has slept longest: every slot gets its turn, and one job does not send every idle slot to Redis for nothing.
 *  Shutdown wakes them all. */
function sleepers() {
  const waiting = new Set<() => void>();
  return {
    wakeOne: () => { const w = waiting.values().next().value; w?.(); },
    wakeAll: () => { for (const w of [...waiting]) w(); },
    sleep: () => new Promise<void>((resolve) => {
      const done = () => { clearTimeout(t); waiting.delete(done); resolve(); };
      const t = setTimeout(done, 1000);
      waiting.add(done);
    }),
  };
}

/** The queues this worker serves, from the known ones, refreshed at most once a second: `jobs` for its job
 *  slots, `calls` (the call lane) for its call slots. */
function queuesOf(q: QueueLayer, me: Me) {
  let queues: string[] = [];
  let at = 0;
  const served = async () => {
    if (Date.now() - at > 1000) { queues = servedQueues(me, await q.router.knownQueues()); at = Date.now(); }
    return queues;
  };
  return {
    jobs: async () => (await served()).filter((n) => !isCallQueue(n)),
    calls: async () => (await served()).filter(isCallQueue),
  };
}

/** One slot: claims a job, runs it, and again, sleeping while there is none, until `stopping()`. */
async function slot(d: ExecDeps, me: Me, myQueues: () => Promise<string[]>, idle: ReturnType<typeof sleepers>, stopping: () => boolean) {
  while (!stopping()) {
    let lease: Lease | null = null;
    try {
      lease = await d.life.claim(me, await myQueues());
    } catch (e) {
      d.log.debug('claim failed', { error: (e as Error).message });
    }
    if (lease) {
      const id = lease.job_id;
      // Reporting the outcome can fail if Redis is gone longer than the client's retry budget; the lease then
      // expires and the job is requeued, so the worker carries on rather than exiting.
      await execute(d, lease).catch((e) => d.log.warn(
        'could not report a job outcome; its lease will expire and it will be requeued', { job_id: id, error: (e as Error).message },
      ));
      continue;
    }
    if (stopping()) break;
    await idle.sleep();
  }
}

export async function startWorker(o: WorkerOptions) {
  const log = createLogger(`worker:${o.workerId}`);
  const q = connectQueue(log, { lockSeconds: config.leaseSeconds }, 'debug');
  const bus = new Bus();
  const me: Me = { worker_id: o.workerId, capabilities: o.capabilities, execution_mode: o.executionMode };
  const running = new Map<string, Running>();
  let stopping = false;
  const idle = sleepers();
  const idleCalls = sleepers(); // the call slots sleep apart: a job's wake-up never lands on them, nor a call's on a job slot
  const metrics = workerMetrics(o, () => running.size);
  // The metrics port first: a worker that cannot open it stops before it registers or takes a job.
  const metricsServer = o.metricsPort !== undefined && o.metricsPort >= 0
    ? await serveWorkerMetrics(o, o.metricsPort, metrics.metrics, () => running.size, {
      log, audit: new AuditLog(q.redis, q.store.k.prefix, log, 'worker'), refusals: new RateLimiter(q.redis, q.store.k.prefix, 'refusals'),
    }, () => q.redis.ping()).catch((e: Error) => { q.redis.disconnect(); throw e; })
    : undefined;
  await registerAs(q, me)();
  const stopKeepAlive = keepAlive(q, me, running, log);
  await bus.on('cancel', (id) => {
    const r = running.get(String(id));
    if (r) { r.why = 'cancel'; r.abort.abort(new Error('cancelled')); }
  });
  await bus.on('enqueued', (queue) => (isCallQueue(String(queue)) ? idleCalls : idle).wakeOne());

  const d: ExecDeps = { workerId: o.workerId, log, life: q.life, store: q.store, running, metrics };
  const myQueues = queuesOf(q, me);
  const slots = [
    ...Array.from({ length: o.concurrency }, () => slot(d, me, myQueues.jobs, idle, () => stopping)),
    ...Array.from({ length: o.callSlots }, () => slot(d, me, myQueues.calls, idleCalls, () => stopping)),
  ];
  const metricsPort = metricsServer ? (metricsServer.address() as AddressInfo).port : undefined;
  log.info('worker started', {
    capabilities: o.capabilities, execution_mode: o.executionMode, concurrency: o.concurrency, call_slots: o.callSlots, metrics_port: metricsPort ?? null,
  });

  return {
    metricsPort,
    get active() { return running.size; },
    /** Stops taking jobs, lets running ones finish within the grace period, hands the rest back. */
    async stop(graceSeconds = config.shutdownGraceSeconds) {
      stopping = true;
      idle.wakeAll();
      idleCalls.wakeAll();
      const deadline = Date.now() + graceSeconds * 1000;
      while (running.size && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      for (const r of running.values()) { r.why = 'shutdown'; r.abort.abort(new Error('shutdown')); }
      await Promise.all(slots);
      stopKeepAlive();
      await q.registry.remove(o.workerId).catch((e) => log.warn(
        'shutting down: the registration stays until it is pruned as stale', { error: (e as Error).message },
      ));
      metricsServer?.close();
      await q.router.close();
      await bus.close();
      q.redis.disconnect();
      log.info('worker stopped');
    },
  };
}
