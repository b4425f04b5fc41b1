// The VM console through a worker (FERRY_LIBVIRT_VIA=worker, issue 38 item 2): the daemon has no virsh, so a
// console session is a virt_console job on a worker with libvirt_access, which runs `virsh console` (openConsole)
// and relays the bytes over two Redis channels of the job: `out` (worker -> daemon: ready, data, closed) and `in`
// (daemon -> worker: input, close). The daemon subscribes before it submits, the worker before it attaches, so
// nothing the other sends after 'ready' is lost. Either side closing ends both: the worker's console ending ends
// the job (and the daemon's session, closing its viewers); the last viewer leaving sends `close` (and cancels the
// job when it never started). The WebSocket's rules (roles, one writer, force) stay the daemon's (services/daemon/console.ts).
import { EventEmitter } from 'node:events';
import type { ChildProcess } from 'node:child_process';
import type { ConsoleSession } from '../shared/libvirt/console';
import { createRedis } from '../shared/redis';
import { createLogger, ignoreError } from '../shared/log';
import { internalSpec, runWorkerJob, type WorkerJobDeps } from './worker-jobs';
import type { JobStore } from './store';

const log = createLogger('console-jobs');

/** How long one console session may last on a worker (its job's bound). */
const SESSION_MS = 12 * 3_600_000;

/** The two channels of a console job. */
export function consoleChannels(store: JobStore, jobId: string) {
  return { in: `${store.k.job(jobId)}:console-in`, out: `${store.k.job(jobId)}:console-out` };
}

/** A console message on either channel. */
export type ConsoleMessage = { type: 'ready' } | { type: 'data'; data: string } | { type: 'closed'; error?: string } | { type: 'input';
  data: string } | { type: 'close' };

/** A ConsoleSession (as openConsole's) whose `virsh console` runs on a worker: 'ready', 'data' and 'close' as there. */
export function workerConsole(d: WorkerJobDeps, uri: string, name: string, force: boolean): ConsoleSession {
  const ev = new EventEmitter() as ConsoleSession;
  const spec = internalSpec('virt_console', { uri, name, force }, { timeoutSeconds: SESSION_MS / 1000 });
  const ch = consoleChannels(d.life.store, spec.job_id);
  const sub = createRedis();
  let ready = false;
  let closed = false;
  const end = (error: string) => {
    if (closed) return;
    closed = true;
    sub.disconnect();
    ev.emit('close', 0, error);
  };
  sub.on('error', (e: Error) => log.warn('a console\'s subscription lost Redis; ioredis reconnects, output meanwhile is missed',
    { job_id: spec.job_id, error: e.message }));
  sub.on('message', (_c: string, raw: string) => {
    let m: ConsoleMessage;
    try { m = JSON.parse(raw) as ConsoleMessage; } catch { return; } // Ferry's worker writes JSON; anything else is not ours
    if (m.type === 'ready') { ready = true; ev.emit('ready'); } else if (m.type === 'data') ev.emit('data', m.data);
    else if (m.type === 'closed') end(m.error ?? '');
  });
  const say = (m: ConsoleMessage) => d.life.store.redis.publish(ch.in, JSON.stringify(m)).catch(
    ignoreError('a console message to the worker was lost; its job ends with the session all the same', { job_id: spec.job_id }));
  void sub.subscribe(ch.out)
    .then(() => runWorkerJob(d, spec, { caller: null, waitMs: SESSION_MS, meta: { virt: 'console', domain: name } }))
    .then(
      (r) => end(
      r.outcome === 'unserved' ? `the console of ${name} runs on a worker with libvirt_access (FERRY_LIBVIRT_VIA=worker), and none can take it now: ${r.reason}`
      : r.outcome === 'timeout' ? `the console session passed its bound of ${SESSION_MS / 3_600_000} ` +
                                  `h` : r.state === 'COMPLETED' ? '' : `its job ${r.job_id} ${r.state.toLowerCase()}: ${r.error ?? ''}`))
    .catch((e: Error) => end(`the console job could not run: ${e.message}`));
  Object.assign(ev, {
    proc: null as unknown as ChildProcess, // nothing runs here; the daemon's bridge never reads it
    write: (data: string | Buffer) => { if (!closed) void say({ type: 'input', data: Buffer.isBuffer(data) ? data.toString('latin1') : data }); },
    close: () => {
      if (closed) return;
      void say({ type: 'close' });
      // Not attached yet (still queued or starting): nothing reads `close`, so the job is cancelled.
      if (!ready) void d.life.cancel(spec.job_id, 'the console was closed before it was attached').catch(
        ignoreError('the console job had ended already', { job_id: spec.job_id }));
    },
  });
  return ev;
}
