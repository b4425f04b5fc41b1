// The VM console through a worker (FERRY_LIBVIRT_VIA=worker, issue 38 item 2): the daemon has no virsh, so a
// console session is a virt_console job on a worker with libvirt_access, which runs `virsh console` (openConsole)
// and relays the bytes over two Redis channels of the job: `out` (worker -> daemon: ready, data, closed) and `in`
// (daemon -> worker: input, close). The daemon subscribes before it submits, the worker before it attaches, so
// nothing the other sends after 'ready' is lost. Either side closing ends both: the worker's console ending ends
// the job (and the daemon's session, closing its viewers); the last viewer leaving sends `close` (and cancels the
// job when it never started). The WebSocket's rules (roles, one writer, force) stay the daemon's (services/daemon/console.ts).
// Keystrokes are passwords at a login prompt, and the project keeps secrets out of Redis in clear: every message is
// sealed with FERRY_SECRET_KEY (platform/secretbox.ts, AES-256-GCM, as the stored secrets), bound to its channel and
// numbered, so one that does not open (forged without the key, another key, replayed) is logged and dropped. Without
// the key the console through a worker is refused, as a per-job password is (docs/security.md, "Secrets").
import { EventEmitter } from 'node:events';
import type { ChildProcess } from 'node:child_process';
import type { ConsoleSession } from '../domain/libvirt/console';
import { createRedis } from '../platform/redis';
import { createLogger, ignoreError } from '../platform/log';
import { canEncrypt, decryptSecret, encryptSecret } from '../platform/secretbox';
import { internalSpec, runWorkerJob, type WorkerJobDeps } from './worker-jobs';
import type { JobStore } from '../queue/store';

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

const TYPES = new Set(['ready', 'data', 'closed', 'input', 'close']);

/** Why the console through a worker cannot run in this process (no FERRY_SECRET_KEY to seal its bytes), or null. */
export function consoleUnsealable(): string | null {
  return canEncrypt() ? null : 'the console through a worker needs FERRY_SECRET_KEY (the same on the daemon and the workers): ' +
    'its keystrokes (passwords at a login prompt) cross Redis, and are never sent there in clear';
}

/** One side's sealing of a console job's messages: `seal` for the channel it sends on (numbered from 1), `open`
 *  for the one it reads; `open` gives null for a message that does not open, logged (no content) as dropped.
 *  One sender per channel (the job is never retried: retry_count 0) publishing on one connection, so the numbers
 *  arrive in order; a lost message skips a number, which is accepted. */
export function consoleSeal(jobId: string, send: string, receive: string) {
  let sent = 0;
  let seen = 0;
  const why = (raw: string): string | ConsoleMessage => {
    if (!raw.startsWith('v1:')) return 'it is not sealed';
    let body: { ch?: unknown; n?: unknown; m?: { type?: unknown; data?: unknown } };
    try { body = JSON.parse(decryptSecret(raw)) as typeof body; } catch (e) {
      return e instanceof SyntaxError ? 'it is not a console message once opened' : 'it does not open with this FERRY_SECRET_KEY (forged, or another key)';
    }
    if (typeof body !== 'object' || body === null) return 'it is not a console message once opened';
    if (body.ch !== receive) return 'it was sealed for another channel (replayed from another session)';
    if (typeof body.n !== 'number' || body.n <= seen) return 'it is out of sequence (replayed)';
    const m = body.m;
    if (typeof m !== 'object' || m === null || !TYPES.has(m.type as string) || (m.data !== undefined && typeof m.data !== 'string')) {
      return 'it is not a console message once opened';
    }
    seen = body.n;
    return m as ConsoleMessage;
  };
  return {
    seal: (m: ConsoleMessage) => encryptSecret(JSON.stringify({ ch: send, n: ++sent, m })),
    open: (raw: string): ConsoleMessage | null => {
      const r = why(raw);
      if (typeof r !== 'string') return r;
      log.warn(`a console message did not open: ${r}; it is dropped, the session goes on`, { job_id: jobId, channel: receive, bytes: raw.length });
      return null;
    },
  };
}

/** A ConsoleSession (as openConsole's) whose `virsh console` runs on a worker: 'ready', 'data' and 'close' as there. */
export function workerConsole(d: WorkerJobDeps, uri: string, name: string, force: boolean): ConsoleSession {
  const ev = new EventEmitter() as ConsoleSession;
  const spec = internalSpec('virt_console', { uri, name, force }, { timeoutSeconds: SESSION_MS / 1000 });
  const ch = consoleChannels(d.life.store, spec.job_id);
  const box = consoleSeal(spec.job_id, ch.in, ch.out);
  const unsealable = consoleUnsealable();
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
    const m = box.open(raw);
    if (!m) return;
    if (m.type === 'ready') { ready = true; ev.emit('ready'); } else if (m.type === 'data') ev.emit('data', m.data);
    else if (m.type === 'closed') end(m.error ?? '');
  });
  const say = (m: ConsoleMessage) => d.life.store.redis.publish(ch.in, box.seal(m)).catch(
    ignoreError('a console message to the worker was lost; its job ends with the session all the same', { job_id: spec.job_id }));
  // No job, no Redis: the session ends as it starts (after the daemon's bridge has taken its viewers in).
  if (unsealable) setImmediate(() => end(unsealable));
  else void sub.subscribe(ch.out)
    .then(() => runWorkerJob(d, spec, { caller: null, waitMs: SESSION_MS, meta: { virt: 'console', domain: name } }))
    .then(
      (r) => end(
      r.outcome === 'unserved' ? `the console of ${name} runs on a worker with libvirt_access (FERRY_LIBVIRT_VIA=worker), and none can take it now: ${r.reason}`
      : r.outcome === 'timeout' ? `the console session passed its bound of ${SESSION_MS / 3_600_000} ` +
                                  `h` : r.state === 'COMPLETED' ? '' : `its job ${r.job_id} ${r.state.toLowerCase()}: ${r.error ?? ''}`))
    .catch((e: Error) => end(`the console job could not run: ${e.message}`));
  Object.assign(ev, {
    proc: null as unknown as ChildProcess, // nothing runs here; the daemon's bridge never reads it
    write: (data: string | Buffer) => {
      if (!closed && !unsealable) void say({ type: 'input', data: Buffer.isBuffer(data) ? data.toString('latin1') : data });
    },
    close: () => {
      if (closed) return;
      if (unsealable) return end(unsealable); // nothing was sent, nothing runs
      void say({ type: 'close' });
      // Not attached yet (still queued or starting): nothing reads `close`, so the job is cancelled.
      if (!ready) void d.life.cancel(spec.job_id, 'the console was closed before it was attached').catch(
        ignoreError('the console job had ended already', { job_id: spec.job_id }));
    },
  });
  return ev;
}
