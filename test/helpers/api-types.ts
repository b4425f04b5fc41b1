// The answers tests read, typed from the functions that build them (type-only imports: nothing here runs).
// A test names the type it reads (`req<JobStatus>(...)`); a shape used by one file only stays in that file.
import type { JobStatus } from '../../services/gateway/jobs';
import type { DaemonJob } from '../../orchestration/daemon-views';
import type { PlanView } from '../../orchestration/plan-view';
import type { queueOverview, workersOverview } from '../../queue/overview';
import type { Schedule, ScheduleStore } from '../../orchestration/schedules';
import type { Delivery, createdView, publicView } from '../../orchestration/webhooks';
import type { StoredEvent } from '../../queue/store';
import type { JobState } from '../../domain/states';
import type { JobSpec } from '../../domain/schemas/job';
import type { AuditRecord } from '../../platform/audit';
import type { issueTicket } from '../../platform/auth';
import type { VmResult } from '../../domain/plans/preflight';
import type { VmSummary } from '../../domain/vsphere/inventory';
import type { PipelineReport } from '../../domain/converter/stages/report';
import type { FixResult } from '../../domain/converter/types';

export type { JobStatus, DaemonJob, PlanView, Schedule, Delivery, StoredEvent, AuditRecord };

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

// The job API's worker protocol.
/** POST /queue/dequeue: the job claimed, with its lease (null when none waits). */
export type Claimed = JobSpec & { lease_token: string };
export type DequeueAnswer = Claimed | null;
/** POST /workers/:id/heartbeat. */
export interface Heartbeat { worker_id: string; message: string; timestamp: string; renewed: string[] }
/** POST /jobs/:id/fail. */
export interface FailAnswer { job_id: string; state: string; retry_in_ms?: number }

// The daemon (8080).
/** POST /jobs/submit, shape A (exports by the list). */
export interface BatchSubmitted { job_ids: string[]; accepted: number; rejected: number; errors: Array<{ index: number; error: string }>; timestamp: string; warnings?: string[] }
/** POST /jobs/submit, shape B (one migration). */
export interface MigrationSubmitted { job_id: string; message: string }
/** POST /jobs/cancel by ids: a result per id. */
export interface CancelEach { cancelled: string[]; failed: string[]; errors: Record<string, string>; timestamp: string }
/** GET /schedules/:id: a schedule with its run counts. */
export type ScheduleView = Awaited<ReturnType<ScheduleStore['view']>>;
export interface ScheduleCreated { message: string; schedule: ScheduleView }
export interface ScheduleList { schedules: ScheduleView[]; total: number; timestamp: string }
export interface ScheduleStats { total_schedules: number; enabled_schedules: number; disabled_schedules: number; total_runs: number; successful_runs: number; failed_runs: number; timestamp: string }
/** POST /schedules/:id/trigger. */
export interface Triggered { message: string; job_id: string | null }
export interface WebhookList { webhooks: WebhookView[]; total: number; timestamp: string }
/** POST /webhooks: the headers too, sensitive values redacted. */
export interface WebhookAdded { message: string; webhook: ReturnType<typeof createdView> }
/** POST /webhooks/:index/test. */
export interface WebhookTested { message: string; delivery_ids: string[] }
/** GET /webhooks/:index/deliveries. */
export interface DeliveryLog { webhook_id: string; deliveries: Delivery[] }
/** What a webhook's receiver is POSTed. */
export interface WebhookBody { delivery_id: string; event: string; timestamp: string; data: Record<string, unknown> }
/** A /ws message (`data` a DaemonJob for job_update, a PlanView for plan_update). */
export interface WsMessage<D = unknown> { type: string; timestamp: string; data: D }
/** POST /ws/ticket. */
export type WsTicket = Awaited<ReturnType<typeof issueTicket>>;
/** GET /audit. */
export interface AuditPage { records: AuditRecord[]; count: number; retention_seconds: number; refusals_unwritten: number }
/** GET /plans and POST /plans/:id/validate. */
export interface PlanList { plans: PlanView[]; total: number }
export interface Validation { plan_id: string; blockers: number; warnings: number; vms: VmResult[] }
/** GET /vms (moref and device keys are not shown). */
export interface VmList { vms: Array<Omit<VmSummary, 'moref'>>; total: number; manager: string }
/** The /virt routes' success envelope. */
export interface VirtOk<T> { status: string; message: string; data: T; timestamp: string }

/** report.json of a conversion, with the repair's result as the guest tests read it. */
export type FixedReport = PipelineReport & { stages: { fix: { result: FixResult } } };
