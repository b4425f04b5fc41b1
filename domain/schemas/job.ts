// The worker job protocol's resources as joi schemas: one source for validation, types and OpenAPI.
import Joi from 'joi';
import { allowedCapabilities, CAPABILITY_PATTERN, EXECUTION_MODES, KNOWN_CAPABILITIES } from '../../platform/capabilities';

import { STATES } from '../states';
import { OPERATIONS, operationNames } from '../operations';
import { absolutePath, DISK_FORMATS, isoTimestamp, jobId, streamId, workerId } from './common';
const KNOWN_CAPABILITIES_TEXT = KNOWN_CAPABILITIES.join(', ');
const capability = Joi.string().pattern(CAPABILITY_PATTERN)
  .custom((v: string, h) => (allowedCapabilities().includes(v) ? v : h.error('capability.unknown', { known: allowedCapabilities().join(', ') })))
  .messages({
    'string.pattern.base': '{{#label}} must be a capability name such as img_tool or nbd_access',
    'capability.unknown': '{{#label}} is not a known capability ({{#known}}; others can be allowed with FERRY_EXTRA_CAPABILITIES)',
  })
  .description(`one of ${KNOWN_CAPABILITIES_TEXT}, or a name listed in FERRY_EXTRA_CAPABILITIES`);

export const executionPolicySchema = Joi.object({
  timeout_seconds: Joi.number().integer().min(1).max(7 * 24 * 3600).default(86400)
    .description('the attempt fails (and may be retried) after this long'),
  retry_count: Joi.number().integer().min(0).max(20).default(3)
    .description('further attempts after a failed or lost one'),
  priority: Joi.number().integer().min(0).max(100).default(50).description('0-100, higher is more urgent'),
  idempotent: Joi.boolean().default(true)
    .description('false: a failed or lost attempt is not retried; the job fails with the reason'),
}).default();

export const imageSchema = Joi.object({
  path: absolutePath.required(),
  format: Joi.string().valid(...DISK_FORMATS).required(),
});

export const jobSpecSchema = Joi.object({
  job_id: jobId.description('client-chosen identifier; generated when absent'),
  operation: Joi.string().valid(...operationNames()).required(),
  image: imageSchema.when('operation', {
    is: Joi.valid(...operationNames().filter((n) => OPERATIONS[n].needsImage)),
    then: Joi.required(),
  }),
  parameters: Joi.when('operation', {
    switch: operationNames().map((n) => ({ is: n, then: OPERATIONS[n].parameters })),
    otherwise: Joi.object().unknown(true),
  }).default({}),
  execution_policy: executionPolicySchema,
  audit_info: Joi.object({
    requested_by: Joi.string().max(256),
    ticket_id: Joi.string().max(256),
    tags: Joi.array().items(Joi.string().max(128)).max(64),
  }),
  requirements: Joi.object({
    capabilities: Joi.array().items(capability).max(16).default([]),
    execution_mode: Joi.string().valid(...EXECUTION_MODES),
  }).description('extra requirements on top of those the operation needs'),
}).label('JobSpec');

export interface JobSpec {
  job_id: string;
  operation: string;
  image?: { path: string; format: string };
  /** Validated by the operation's own schema (OPERATIONS[operation].parameters); each reader names its shape. */
  parameters: Record<string, unknown>;
  execution_policy: { timeout_seconds: number; retry_count: number; priority: number; idempotent: boolean };
  audit_info?: { requested_by?: string; ticket_id?: string; tags?: string[] };
  requirements?: { capabilities: string[]; execution_mode?: string };
}

export const progressEventSchema = Joi.object<ProgressEvent>({
  job_id: Joi.string(),
  timestamp: isoTimestamp,
  phase: Joi.string().max(64).required(),
  percentage: Joi.number().integer().min(0).max(100).required(),
  message: Joi.string().allow('').max(4096).default(''),
  details: Joi.object().pattern(Joi.string(), Joi.string().allow('')).default({}),
}).label('ProgressEvent');

export interface ProgressEvent {
  job_id: string;
  timestamp: string;
  phase: string;
  percentage: number;
  message: string;
  details: Record<string, string>;
}

export const historyEntrySchema = Joi.object({
  state: Joi.string().valid(...STATES),
  timestamp: isoTimestamp,
  reason: Joi.string(),
  worker_id: Joi.string(),
}).label('StateHistoryEntry');

export const systemInfoSchema = Joi.object({
  hostname: Joi.string().max(256),
  os: Joi.string().max(256),
  kernel: Joi.string().max(256),
  architecture: Joi.string().max(64),
  memory_mb: Joi.number().integer().min(0),
  disk_space_mb: Joi.number().integer().min(0),
}).unknown(true);

/** A worker's registration (workerRegistrationSchema, defaults filled in); dequeue (dequeueSchema) says the same
 *  without system_info. */
export interface WorkerRegistration { worker_id: string; capabilities: string[]; system_info: Record<string, unknown>; execution_mode: string }
export type DequeueRequest = Omit<WorkerRegistration, 'system_info'>;

export const workerRegistrationSchema = Joi.object<WorkerRegistration>({
  worker_id: workerId.required(),
  capabilities: Joi.array().items(capability).max(32).required(),
  system_info: systemInfoSchema.default({}),
  execution_mode: Joi.string().valid(...EXECUTION_MODES).default('PROCESS'),
}).label('WorkerRegistration');

export const dequeueSchema = Joi.object<DequeueRequest>({
  worker_id: workerId.required(),
  capabilities: Joi.array().items(capability).max(32).required(),
  execution_mode: Joi.string().valid(...EXECUTION_MODES).default('PROCESS'),
}).label('DequeueRequest');

/** `internal`: job lists on both APIs leave out the call lane's jobs (the daemon's virsh_call, kept minutes:
 *  FERRY_CALL_RETENTION) unless an admin asks for them. */
export const internalJobsFlag = Joi.boolean().truthy('1').falsy('0').default(false)
  .description(
    'true: include the daemon\'s internal calls (virsh_call with FERRY_LIBVIRT_VIA=worker, kept FERRY_CALL_RETENTION, failed ones ' +
    'FERRY_CALL_FAILED_RETENTION); admin only');
/** Why `internal` needs an admin key (adminOnly's 403). */
export const INTERNAL_JOBS_WHY = 'the daemon\'s internal calls carry the libvirt commands it ran for every caller';

export interface ListJobsQuery { state?: string; limit: number; offset: number; internal: boolean }
export const listJobsQuery = Joi.object<ListJobsQuery>({
  state: Joi.string().valid(...STATES),
  limit: Joi.number().integer().min(1).max(1000).default(100),
  offset: Joi.number().integer().min(0).default(0),
  internal: internalJobsFlag,
});

export interface EventsQuery { since?: string; after_id?: string }
export const eventsQuery = Joi.object<EventsQuery>({
  since: isoTimestamp.description('only events with a later timestamp'),
  after_id: streamId.description('only events after this event id'),
});

export const submitQuery = Joi.object<{ queue: boolean }>({
  queue: Joi.boolean().truthy('1').falsy('0').default(false),
});

export const leaseToken = Joi.string().max(256).description('the lease token POST /queue/dequeue handed out with the job');
/** Who reports on a job and the lease it holds: every worker report carries both. */
export interface WorkerReport { worker_id: string; lease_token: string }
/** A progress event as a worker reports it: job_id and timestamp may be left out (the gateway fills them in). */
export type WorkerEvent = WorkerReport & Omit<ProgressEvent, 'job_id' | 'timestamp'> & { job_id?: string; timestamp?: string };
export interface WorkerComplete extends WorkerReport { result: Record<string, unknown> }
export interface WorkerFail extends WorkerReport { error: string; retryable: boolean }

export const workerReportSchema = Joi.object<WorkerReport>({ worker_id: workerId.required(), lease_token: leaseToken.required() }).label('WorkerReport');
// append (keys by another name) is the form that names the extended type.
export const workerEventSchema = progressEventSchema.append<WorkerEvent>({ worker_id: workerId.required(), lease_token: leaseToken.required() }).label(
  'WorkerProgressEvent');
export const workerCompleteSchema = Joi.object<WorkerComplete>({ worker_id: workerId.required(), lease_token: leaseToken.required(),
  result: Joi.object().unknown(true).default({}) }).label('WorkerComplete');
export const workerFailSchema = Joi.object<WorkerFail>({
  worker_id: workerId.required(),
  lease_token: leaseToken.required(),
  error: Joi.string().max(8192).required(),
  retryable: Joi.boolean().default(true),
}).label('WorkerFail');
export const heartbeatSchema = Joi.object<{ lease_tokens: string[] }>({
  lease_tokens: Joi.array().items(leaseToken).max(64).default([]).description('renew the leases of these jobs (the worker\'s own)'),
}).label('WorkerHeartbeat');
