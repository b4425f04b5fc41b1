// The answers tests read, typed from the functions that build them (type-only imports: nothing here runs).
// A test names the type it reads (`req<JobStatus>(...)`); a shape used by one file only stays in that file.
import type { JobStatus } from '../../services/gateway/jobs';
import type { DaemonJob } from '../../queue/daemon-views';
import type { PlanView } from '../../queue/plan-view';
import type { queueOverview, workersOverview } from '../../queue/overview';
import type { Schedule } from '../../queue/schedules';
import type { Delivery, publicView } from '../../queue/webhooks';
import type { StoredEvent } from '../../queue/store';
import type { JobState } from '../../shared/states';

export type { JobStatus, DaemonJob, PlanView, Schedule, Delivery, StoredEvent };

/** Job API (8000): POST /jobs and POST /jobs/:id/queue. */
export interface Submitted { job_id: string; state: JobState; message: string; queue_position: number }
/** Job API: GET /jobs. */
export interface JobList { total: number; jobs: Array<{ job_id: string; state: JobState; created_at: string; is_terminal: boolean }> }
/** Job API and daemon: GET /workers. */
export type WorkerList = Awaited<ReturnType<typeof workersOverview>>;
/** Job API and daemon: GET /queue. */
export type QueueStatus = Awaited<ReturnType<typeof queueOverview>>;
/** Daemon (8080): GET /jobs and POST /jobs/query. */
export interface DaemonJobList { jobs: DaemonJob[]; total: number; limit: number; offset: number; not_found?: string[] }
/** Daemon: a webhook as GET /webhooks lists it. */
export type WebhookView = ReturnType<typeof publicView>;
