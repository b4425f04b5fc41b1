// The daemon's libvirt through workers (issue 38 item 2): with FERRY_LIBVIRT_VIA=worker (the shipped compose and
// Kubernetes), every `Virsh.run` of the daemon (its /virt routes, health probe, a plan's target inventory and
// recheck) is a job of the internal operation virsh_call, run by a worker with libvirt_access and virsh, so the
// daemon's image needs no libvirt client. The worker's answer is rebuilt into what virsh gave: stdout, or the
// LibvirtError with the same status and message (404, 400, 409, 503, 500). No worker able to take it: 503 saying
// why; no end within the bound: 504, the job cancelled. Commands that read or write a local file (vol-upload,
// vol-download) are refused (503) as single calls: their routes run whole on a worker, the clone and template
// routes as one virt_clone job, the import, template export and volume upload as one virt_files job
// (JobVirsh.onWorker), the console as a virt_console job (JobVirsh.console, orchestration/console-jobs.ts).
import { shownUri } from '../domain/libvirt/uri';
import { LibvirtError, setVirshFactory, Virsh, virshFor, type RunOptions } from '../domain/libvirt/virsh';
import { setting } from '../platform/settings';
import type { Logger } from '../platform/log';
import { internalSpec, runWorkerJob, type WorkerJobDeps, type WorkerJobEnd } from './worker-jobs';
import { Leader } from '../queue/leader';
import type { JobStore } from '../queue/store';
import { checkSubmittedPaths } from '../platform/roots';
import type { ConsoleSession } from '../domain/libvirt/console';
import { workerConsole } from './console-jobs';
import { virtFilesPaths } from '../domain/operations';

/** The routes a worker runs whole: virt_clone's actions and virt_files'. */
export type WorkerAction = 'clone' | 'clone_multiple' | 'template_create' | 'template_deploy' | 'import_kvm' | 'template_export' | 'volume_upload';

/** The record field a virsh_call's worker sets when libvirt refused: {status, message, libvirt} as JSON. */
export const LIBVIRT_ERROR_FIELD = 'libvirt_error';

/** virsh commands that are no single call: a file of the machine running virsh (vol-upload, vol-download) or a live stream (console). */
export const NOT_CALLS = new Set(['vol-upload', 'vol-download', 'console']);

/** How the daemon reaches libvirt: `direct` (virsh on its own PATH, `npm start` and most tests) or `worker`. */
export function libvirtVia(env: NodeJS.ProcessEnv = process.env): 'direct' | 'worker' {
  return setting('FERRY_LIBVIRT_VIA', env);
}

/** Time past a command's own timeout for the queue and the worker's start. */
const GRACE_MS = 30_000;

/** A Virsh whose commands run on a worker; every domain/libvirt function takes it unchanged. */
export class JobVirsh extends Virsh {
  constructor(uri: string, private d: WorkerJobDeps) { super(uri); }

  override async run(args: string[], opts: RunOptions = {}): Promise<string> {
    if (NOT_CALLS.has(args[0])) {
      throw new LibvirtError(503,
        `virsh ${args[0]} needs the machine running it (a local file or a live stream): with FERRY_LIBVIRT_VIA=worker this is not available yet (it must run ` +
        `whole on a worker; docs/virt.md)`, 'local file');
    }
    const timeout = opts.timeoutMs ?? 600_000;
    const spec = internalSpec('virsh_call', { uri: this.uri, args, ...(opts.input !== undefined ? { input: opts.input } : {}),
      timeout_ms: Math.max(1000, timeout) }, { timeoutSeconds: (timeout + GRACE_MS) / 1000 });
    const end = await runWorkerJob(this.d, spec, { caller: null, waitMs: timeout + GRACE_MS, meta: { virsh: args[0] } });
    const out = (answerOf(end, `virsh ${args[0]}`, this.uri, timeout + GRACE_MS) as { stdout?: unknown } | null)?.stdout;
    return typeof out === 'string' ? out : '';
  }

  /** A console session whose `virsh console` runs on a worker with libvirt_access (orchestration/console-jobs.ts). */
  console(name: string, force: boolean): ConsoleSession {
    return workerConsole(this.d, this.uri, name, force);
  }

  /** A route run whole on a worker: clones and templates (operation virt_clone, services/worker/operations/virt-clone.ts),
   *  an import or a template export (virt_files, its paths checked here against this daemon's roots first: 400
   *  naming the field, nothing queued). The route's data, or the error it would have answered running the tools
   *  itself. Not on the call lane. */
  async onWorker(action: WorkerAction, body: unknown, timeoutMs: number): Promise<Record<string, unknown>> {
    const operation = action === 'import_kvm' || action === 'template_export' || action === 'volume_upload' ? 'virt_files' : 'virt_clone';
    const spec = internalSpec(operation, { uri: this.uri, action, body }, { timeoutSeconds: timeoutMs / 1000 });
    await checkSubmittedPaths(virtFilesPaths(spec.parameters));
    const end = await runWorkerJob(this.d, spec, { caller: null, waitMs: timeoutMs + GRACE_MS, meta: { virt: action } });
    return (answerOf(end, action.replace('_', ' '), this.uri, timeoutMs + GRACE_MS) ?? {}) as Record<string, unknown>;
  }
}

/** A worker job's end as the daemon answers it: its result, or the error the daemon would have given running the
 *  work itself (kept by the worker in `libvirt_error`), 503 when no worker could take it, 504 past the bound. */
function answerOf(end: WorkerJobEnd, what: string, uriText: string, boundMs: number): unknown {
  const uri = shownUri(uriText);
  if (end.outcome === 'unserved') throw new LibvirtError(503,
    `libvirt at ${uri} is reached through a worker with libvirt_access (FERRY_LIBVIRT_VIA=worker), and none can take ${what} now: ${end.reason}`, end.reason);
  if (end.outcome === 'timeout') throw new LibvirtError(504,
    `${what} at ${uri} did not end within ${Math.round(boundMs / 1000)} s on a worker (job ${end.job_id} ` +
    `cancelled${end.waiting_reason ? `; it was waiting: ${end.waiting_reason}` : ''})`, 'timeout');
  if (end.state === 'COMPLETED') return end.result;
  const kept = end.record[LIBVIRT_ERROR_FIELD];
  if (kept) {
    const e = JSON.parse(kept) as { status: number; message: string; libvirt: string; fields?: unknown };
    const err = new LibvirtError(e.status, e.message, e.libvirt);
    if (e.fields) err.details = { fields: e.fields }; // the field a refusal names, as the route itself names it
    throw err;
  }
  throw new LibvirtError(500,
    `${what} at ${uri}: its job ${end.job_id} ${end.state === 'CANCELLED' ? 'was cancelled' : `failed: ${end.error ?? 'no reason given'}`}`, end.error ?? '');
}

/** The daemon's Virsh for FERRY_LIBVIRT_URI, and every virshFor() of its code, as FERRY_LIBVIRT_VIA says. */
export function daemonVirsh(d: WorkerJobDeps, uri: string): Virsh {
  setVirshFactory(libvirtVia() === 'worker' ? (u) => new JobVirsh(u, d) : undefined);
  return virshFor(uri);
}

/** The call lane's own retention, on the one daemon holding the `calls` lease: a completed call leaves Redis
 *  FERRY_CALL_RETENTION after it ended, a failed or cancelled one FERRY_CALL_FAILED_RETENTION after (the records
 *  of thousands of /virt calls an hour would otherwise stay the FERRY_JOB_RETENTION of an operator's job). */
export function callRetention(store: JobStore, log: Logger): Leader {
  const done = setting('FERRY_CALL_RETENTION');
  const failed = setting('FERRY_CALL_FAILED_RETENTION');
  return new Leader(store.redis, store.k, 'calls', log).every('call-retention', Math.min(30_000, Math.max(500, Math.min(done, failed) / 4)), async (still) => {
    const n = await store.purgeCalls(done, failed, still);
    if (n) log.debug('calls past their retention removed', { count: n });
  }).start();
}
