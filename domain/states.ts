// Job states and the transition table: the law every service obeys (worker job protocol seed, plus the
// moves it leaves out, documented in docs/states.md).
export const STATES = ['CREATED', 'VALIDATED', 'QUEUED', 'ASSIGNED', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED'] as const;
export type JobState = (typeof STATES)[number];
export const TERMINAL: readonly JobState[] = ['COMPLETED', 'FAILED', 'CANCELLED'];
/** The state every record is created in. */
export const INITIAL: JobState = 'CREATED';
/** The states in which a worker holds the job under a lease: claimed, then started. */
export const HELD: readonly JobState[] = ['ASSIGNED', 'RUNNING'];
/** The state in which a job waits in its queue (counted per queue and priority). */
export const WAITING: JobState = 'QUEUED';
/** The state an attempt runs in: entering it starts the run-time clock (started_at). */
export const STARTED: JobState = 'RUNNING';
/** Terminal states whose run time is no outcome of the run-time histogram (the job is counted in `total:`). */
export const UNTIMED: readonly JobState[] = ['CANCELLED'];

export const TRANSITIONS: Record<JobState, readonly JobState[]> = {
  CREATED: ['VALIDATED', 'FAILED', 'CANCELLED'],
  VALIDATED: ['QUEUED', 'FAILED', 'CANCELLED'],
  // QUEUED -> FAILED: the job could not be placed in or was lost from the queue, or retries ran out.
  QUEUED: ['ASSIGNED', 'FAILED', 'CANCELLED'],
  // ASSIGNED -> QUEUED: the worker lost its lease or handed the job back before starting.
  ASSIGNED: ['RUNNING', 'QUEUED', 'FAILED', 'CANCELLED'],
  // RUNNING -> QUEUED: a failed or lost attempt while retry_count allows; RUNNING -> FAILED: operation error,
  // timeout, or a lost attempt with no retries left.
  RUNNING: ['COMPLETED', 'FAILED', 'QUEUED', 'CANCELLED'],
  COMPLETED: [],
  FAILED: [],
  CANCELLED: [],
};

export function isTerminal(s: string): boolean {
  return (TERMINAL as readonly string[]).includes(s);
}

export function isHeld(s: string | undefined): boolean {
  return (HELD as readonly string[]).includes(s ?? '');
}

/** The daemon API's lowercase view of a state (docs/states.md). */
export function daemonStatus(s: string): DaemonStatus {
  switch (s) {
    case 'RUNNING': return 'running';
    case 'COMPLETED': return 'completed';
    case 'FAILED': return 'failed';
    case 'CANCELLED': return 'cancelled';
    default: return 'pending';
  }
}
export const DAEMON_STATUSES = ['pending', 'running', 'completed', 'failed', 'cancelled'] as const;
export type DaemonStatus = (typeof DAEMON_STATUSES)[number];

/** Jobs per daemon status from jobs per state (the counts hash the transition script keeps; missing = 0). */
export function countByDaemonStatus(perState: Record<string, string | number | undefined>): Record<DaemonStatus, number> {
  const by = Object.fromEntries(DAEMON_STATUSES.map((s) => [s, 0])) as Record<DaemonStatus, number>;
  for (const s of STATES) by[daemonStatus(s)] += Number(perState[s] || 0);
  return by;
}
export function statesForDaemonStatus(status: string): JobState[] {
  return STATES.filter((s) => daemonStatus(s) === status);
}
