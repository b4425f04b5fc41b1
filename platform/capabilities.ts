// Capabilities, execution modes and how a job's requirements become a queue name (docs/worker-protocol.md: requirements).
import { config } from './config';

/** Capabilities Ferry's operations use (vsphere_access: the worker reaches vSphere managers and the export storage).
 *  Each requirement set is a BullMQ queue (and a Worker with its own Redis connection in every gateway), so names
 *  come from this set plus FERRY_EXTRA_CAPABILITIES, never from callers. */
export const KNOWN_CAPABILITIES = ['img_tool', 'nbd_access', 'lvm_tools', 'mount_operations', 'vsphere_access', 'libvirt_access'] as const;
export const CAPABILITY_PATTERN = /^[a-z][a-z0-9_]{0,63}$/;

export function allowedCapabilities(): string[] {
  return [...KNOWN_CAPABILITIES, ...config.extraCapabilities];
}
/** PRIVILEGED_CONTAINER workers may run jobs that ask for any mode; other modes match only themselves. */
export const EXECUTION_MODES = ['PRIVILEGED_CONTAINER', 'CONTAINER', 'PROCESS'] as const;
export const PRIVILEGED = 'PRIVILEGED_CONTAINER';

export interface Requirements {
  capabilities: string[];
  execution_mode?: string;
  /** `call`: internal work someone waits on (virsh_call, vm_power, guest_preflight, rollback_kvm: domain/operations.ts `lane`), queued apart
   *  ("calls.*") and taken by a worker's call slots, which long jobs never occupy (services/worker/runner.ts). */
  lane?: 'call';
}

export function normalizeCaps(caps: Iterable<string>): string[] {
  return [...new Set(caps)].sort();
}

/** One BullMQ queue per requirement set: "jobs.img_tool+nbd_access" or "jobs.any", "@MODE" when a mode is
 *  required; the call lane's are "calls.libvirt_access". */
export function queueName(req: Requirements): string {
  const caps = normalizeCaps(req.capabilities);
  return `${req.lane === 'call' ? 'calls' : 'jobs'}.${caps.length ? caps.join('+') : 'any'}${req.execution_mode ? '@' + req.execution_mode : ''}`;
}

export function parseQueueName(name: string): Requirements | null {
  const m = /^(jobs|calls)\.([a-z0-9_+]+)(?:@([A-Z_]+))?$/.exec(name);
  if (!m) return null;
  return { capabilities: m[2] === 'any' ? [] : m[2].split('+'), execution_mode: m[3], ...(m[1] === 'calls' ? { lane: 'call' as const } : {}) };
}

/** True for a queue of the call lane (taken only by a worker's call slots). */
export const isCallQueue = (name: string): boolean => name.startsWith('calls.');

/** The capability match, the one rule every part uses (dequeue, GET /queue, metrics, the queue position): the
 *  worker has every required capability, and the required execution mode, if any, is its own or the worker is
 *  PRIVILEGED_CONTAINER. */
export function canServe(worker: { capabilities: string[]; execution_mode?: string }, req: Requirements): boolean {
  const have = new Set(worker.capabilities);
  if (!req.capabilities.every((c) => have.has(c))) return false;
  if (!req.execution_mode) return true;
  return worker.execution_mode === req.execution_mode || worker.execution_mode === PRIVILEGED;
}

type Parsed = { q: string; r: Requirements };
/** The order a worker takes its queues in: most capabilities first, then a required mode before none, then name. */
const takeOrder = (a: Parsed, b: Parsed) => b.r.capabilities.length - a.r.capabilities.length || Number(!!b.r.execution_mode) - Number(!!a.r.execution_mode) ||
  a.q.localeCompare(b.q);
const parsed = (q: string): Parsed | null => { const r = parseQueueName(q); return r && { q, r }; };

/** The queues a worker serves, most specific first so general workers do not starve specialised jobs. */
export function servedQueues(worker: { capabilities: string[]; execution_mode?: string }, queues: string[]): string[] {
  return queues
    .map(parsed)
    .filter((x): x is Parsed => !!x && canServe(worker, x.r))
    .sort(takeOrder)
    .map((x) => x.q);
}

/** The queues whose jobs are taken before `queue`'s by workers that serve both: every worker able to run their
 *  jobs can run `queue`'s (a worker with exactly their requirements, execution mode included, serves `queue`),
 *  and they come first in servedQueues' order; only queues of the same lane (a worker's call slots and its job
 *  slots take apart). The queue position counts their waiting jobs as ahead. */
export function queuesTakenBefore(queue: string, queues: string[]): string[] {
  const mine = parsed(queue);
  if (!mine) return [];
  return queues
    .map(parsed)
    .filter((x): x is Parsed => !!x && x.q !== queue && x.r.lane === mine.r.lane &&
      canServe({ capabilities: x.r.capabilities, execution_mode: x.r.execution_mode }, mine.r) && takeOrder(x, mine) < 0)
    .map((x) => x.q);
}
