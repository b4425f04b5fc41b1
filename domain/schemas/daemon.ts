// The daemon API's (port 8080) resources as joi schemas: one source for validation and /openapi.yaml.
import Joi from 'joi';
import { virtName } from '../libvirt/names';
import { DAEMON_STATUSES } from '../states';
import { operationNames, virtTestSchema } from '../operations';
import { absolutePath, jobId } from './common';
import { internalJobsFlag } from './job';
import { POWER_OPTIONS } from '../vsphere/options';
import { virtUriSchema } from '../libvirt/uri';
import { managerUrlSchema } from './vms';
import { warmOptionsSchema } from './warm';

export const WEBHOOK_EVENTS = ['job.created', 'job.started', 'job.completed', 'job.failed', 'job.cancelled', 'schedule.triggered',
  'plan.started', 'plan.vm_completed', 'plan.vm_failed', 'plan.vm_cancelled', 'plan.vm_rolled_back', 'plan.completed'] as const;
/** An event name; the underscore spelling (job_completed) is accepted as an alias and stored dotted. */
const webhookEvent = Joi.string().max(64).replace(/^(job|schedule|plan)_/, '$1.').valid(...WEBHOOK_EVENTS)
  .messages({ 'any.only': `{{#label}} must be one of ${WEBHOOK_EVENTS.join(', ')} (or the same with "_" for ".")` });

const vmPath = Joi.string().pattern(/^\/[^/]+\/vm\/.+/).max(1024)
  .messages({ 'string.pattern.base': '{{#label}} must look like /<datacenter>/vm/<folder>/<vm-name>' });
const managerUrl = managerUrlSchema;
const name = Joi.string().min(1).max(256);
const secret = Joi.string().min(1).max(1024);
const powerOff = Joi.string().valid(...POWER_OPTIONS).default('none')
  .description('when the VM is running: none = refuse the export (default), shutdown = guest shutdown (VMware Tools) then wait, force = power off');
const shutdownTimeout = Joi.number().integer().min(1).max(3600).default(300).description('seconds to wait for a guest shutdown');
const priority = Joi.number().integer().min(0).max(100).description('0-100, higher is more urgent (default 50)');

export const exportJobSchema = Joi.object({
  name: name.description('job name; defaults to the VM name'),
  vm_path: vmPath.required(),
  output_path: absolutePath.required().description('directory for exported files'),
  options: Joi.object({
    parallel_downloads: Joi.number().integer().min(1).max(64).description('default: parallel_downloads of the daemon configuration'),
    remove_cdrom: Joi.boolean().default(false),
    show_individual_progress: Joi.boolean().default(false),
    power_off: powerOff,
    shutdown_timeout_seconds: shutdownTimeout,
  }).default({}),
  manager_url: managerUrl.description('per-job override of GOVC_URL'),
  username: Joi.string().max(256).description('per-job override of GOVC_USERNAME'),
  password: secret.description('per-job override of GOVC_PASSWORD; stored encrypted, never returned'),
  insecure: Joi.boolean().description('accept untrusted TLS certificates'),
  priority,
}).label('ExportJob');

export const migrationJobSchema = Joi.object({
  name,
  vm_path: vmPath.required(),
  source: Joi.object({
    type: Joi.string().max(64).default('vsphere').description('default vsphere'),
    manager_url: managerUrl,
    username: Joi.string().max(256),
    password: secret.description('stored encrypted, never returned'),
    datacenter: Joi.string().max(256),
    insecure: Joi.boolean(),
  }).required(),
  destination: Joi.object({
    type: Joi.string().max(64).default('kvm').description('default kvm'),
    virt_uri: virtUriSchema.description('connection URI of the target host: FERRY_LIBVIRT_URI (the default) or one of FERRY_LIBVIRT_URIS'),
  }).required(),
  options: Joi.object({
    // A warm migration powers the VM off at cutover: a guest shutdown unless the operator says force (never "refuse").
    power_off: powerOff.when('warm', { is: Joi.exist(), then: Joi.invalid('none').default('shutdown').messages(
      { 'any.invalid': '{{#label}} must be shutdown or force for a warm migration (the VM is powered off at cutover)' }) }),
    shutdown_timeout_seconds: shutdownTimeout,
    remove_cdrom: Joi.boolean().default(false),
    parallel_downloads: Joi.number().integer().min(1).max(64),
    warm: warmOptionsSchema,
    conversion_method: Joi.string().max(64),
    network_mapping: Joi.object().pattern(Joi.string().max(256), virtName).description(
      'source network -> target network (a libvirt name Ferry accepts: no spaces)'),
    virt_test: virtTestSchema.keys({ memory_mib: Joi.forbidden(), vcpus: Joi.forbidden() }).description(
      'extension: the imported domain\'s first start is watched on its serial console; the job completes only when `expect` (a regular expression; default: ' +
      'Linux boot milestones) shows within timeout_seconds'),
  }).default({}),
  priority,
}).label('MigrationJob');

/** A job template may also name any operation of the 8000 API directly (for example noop for drills). */
export const operationTemplateSchema = Joi.object({
  operation: Joi.string().valid(...operationNames()).required(),
  image: Joi.object().unknown(true),
  parameters: Joi.object().unknown(true).default({}),
  execution_policy: Joi.object().unknown(true),
  requirements: Joi.object().unknown(true),
}).label('OperationTemplate');

const hasKey = (k: string) => Joi.object({ [k]: Joi.exist() }).unknown(true);

/** One job definition: shape B when it has `source` or `destination`, shape A otherwise. */
export const jobDefinitionSchema = Joi.alternatives().conditional(hasKey('source'), {
  then: migrationJobSchema,
  otherwise: Joi.alternatives().conditional(hasKey('destination'), { then: migrationJobSchema, otherwise: exportJobSchema }),
});

export const batchSchema = Joi.object({
  jobs: Joi.array().items(Joi.object().unknown(true).description('an export (shape A) or migration (shape B) job; each is validated on its own')).min(1).max(
    1000).required(),
}).label('JobBatch');

/** POST /jobs/submit's body: a batch's `jobs` (each validated on its own later) or one job definition. */
export type SubmitBody = { jobs?: unknown[] } & Record<string, unknown>;
export const submitBodySchema = Joi.alternatives().conditional<SubmitBody, SubmitBody>(hasKey('jobs'), { then: batchSchema, otherwise: jobDefinitionSchema })
  .description('shape A (export job), shape B (migration job) or a batch {jobs: [...]}; JSON or YAML');

export const templateSchema = Joi.alternatives().conditional(hasKey('operation'), { then: operationTemplateSchema, otherwise: jobDefinitionSchema });

const statusName = Joi.string().valid(...DAEMON_STATUSES);
export const jobQuerySchema = Joi.object<{ all: boolean; status?: string | string[]; job_ids?: string[]; limit: number; offset: number; internal: boolean }>({
  all: Joi.boolean().default(false),
  internal: internalJobsFlag,
  status: Joi.alternatives().try(statusName, Joi.array().items(statusName).min(1)),
  job_ids: Joi.array().items(jobId).max(1000),
  limit: Joi.number().integer().min(1).max(1000).default(100),
  offset: Joi.number().integer().min(0).default(0),
}).label('JobQuery');

export const jobListQuery = Joi.object<{ status?: string; limit: number; offset: number; internal: boolean }>({
  internal: internalJobsFlag,
  status: Joi.string().pattern(/^(pending|running|completed|failed|cancelled)(,(pending|running|completed|failed|cancelled))*$/)
    .messages({ 'string.pattern.base': `{{#label}} must be one or more (comma-separated) of ${DAEMON_STATUSES.join(', ')}` }),
  limit: Joi.number().integer().min(1).max(1000).default(100),
  offset: Joi.number().integer().min(0).default(0),
});

/** or() below: job_ids, or status alone. */
type CancelRequest = { job_ids: string[]; status?: 'pending' | 'running' } | { job_ids?: undefined; status: 'pending' | 'running' };
export const cancelSchema = Joi.object<CancelRequest>({
  job_ids: Joi.array().items(jobId).min(1).max(1000),
  status: Joi.string().valid('pending', 'running').description('without job_ids: cancel every job with this status'),
}).or('job_ids', 'status').label('CancelRequest');

const cron = Joi.string().min(9).max(256).description('cron: minute hour day month weekday (an optional leading seconds field)');
const timezone = Joi.string().max(64).description('IANA time zone, for example Europe/Paris (default UTC)');

/** A schedule's fields as a create or change request gives them (templates validated by templateSchema). */
interface ScheduleFields {
  name: string; description: string; schedule?: string; cron?: string; timezone?: string; enabled: boolean; job_template?: Record<string, unknown>;
}
export interface ScheduleCreate extends ScheduleFields { id?: string; cron_expr?: string; job_definition?: Record<string, unknown> }
export const scheduleCreateSchema = Joi.object<ScheduleCreate>({
  id: Joi.string().pattern(/^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/).messages({ 'string.pattern.base': '{{#label}} must be 1-64 letters, digits, "_" or "-"' }),
  name: name.required(),
  description: Joi.string().allow('').max(4096).default(''),
  schedule: cron, cron, cron_expr: cron,
  timezone,
  enabled: Joi.boolean().default(true),
  job_template: templateSchema,
  job_definition: templateSchema,
}).xor('schedule', 'cron', 'cron_expr').oxor('job_template', 'job_definition')
  .messages({ 'object.missing': '{{#label}} must contain one of schedule, cron or cron_expr',
    'object.xor': '{{#label}} must contain only one of schedule, cron or cron_expr' })
  .label('ScheduleCreate');

export const scheduleUpdateSchema = Joi.object<Partial<ScheduleFields>>({
  name, description: Joi.string().allow('').max(4096), schedule: cron, cron, timezone, enabled: Joi.boolean(), job_template: templateSchema,
}).min(1).oxor('schedule', 'cron').label('ScheduleUpdate');

export const scheduleSchema = Joi.object({
  id: Joi.string(), name: Joi.string(), description: Joi.string().allow(''), schedule: Joi.string(), timezone: Joi.string(),
  enabled: Joi.boolean(), job_template: Joi.object().unknown(true).allow(null), last_run: Joi.string().isoDate().allow(null),
  next_run: Joi.string().isoDate().allow(null), run_count: Joi.number().integer(), successful_runs: Joi.number().integer(),
  failed_runs: Joi.number().integer(), last_job_id: Joi.string().allow(null), created_at: Joi.string().isoDate(),
  last_error: Joi.string().allow(null).description('why the last run that created no job did not'),
  owner: Joi.object({ key: Joi.string().allow(null), role: Joi.string() }).description(
    'the key name and role the runs act as: the creator, or whoever last changed job_template'),
}).label('Schedule');

export interface WebhookCreate {
  url: string; events: string[]; enabled: boolean; timeout: number; retry_count: number; headers: Record<string, string>; secret?: string;
}
export const webhookCreateSchema = Joi.object<WebhookCreate>({
  url: Joi.string().uri({ scheme: ['http', 'https'] }).max(2048).required(),
  events: Joi.array().items(webhookEvent).min(1).unique().default(['job.completed', 'job.failed']),
  enabled: Joi.boolean().default(true),
  timeout: Joi.number().integer().min(1).max(300).default(30).description('seconds per attempt'),
  retry_count: Joi.number().integer().min(0).max(10).default(3).description('further attempts after a failed one'),
  headers: Joi.object().pattern(Joi.string().pattern(/^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$/), Joi.string().max(4096).pattern(/^[^\r\n]*$/)).default({}),
  secret: Joi.string().min(8).max(256).description('HMAC-SHA256 key: deliveries carry X-Ferry-Signature: sha256=<hex> over the body; never returned'),
}).label('WebhookCreate');

/** A webhook as listed (GET /webhooks: without headers, as the seed has it). */
export const webhookSchema = Joi.object({
  id: Joi.string(), index: Joi.number().integer(), url: Joi.string(), events: Joi.array().items(Joi.string()), enabled: Joi.boolean(),
  timeout: Joi.number().integer(), retry_count: Joi.number().integer(), has_secret: Joi.boolean(),
  header_names: Joi.array().items(Joi.string()).description('names of the configured headers (values never shown)'),
  created_at: Joi.string().isoDate(),
}).label('Webhook');

export const webhookTestSchema = Joi.object<{ index?: number; url?: string; event: string }>({
  index: Joi.number().integer().min(0).description('only this webhook'),
  url: Joi.string().uri({ scheme: ['http', 'https'] }).max(2048).description("the seed's form: the configured webhook(s) with this url"),
  event: Joi.string().valid('test', 'webhook.test').default('test').description('the seed sends test; deliveries carry event webhook.test'),
}).oxor('index', 'url').label('WebhookTest');

export const daemonErrorSchema = Joi.object({
  error: Joi.string(), status: Joi.number().integer(), timestamp: Joi.string().isoDate(),
  fields: Joi.array().items(Joi.object({ field: Joi.string(), message: Joi.string() })).description('one entry per invalid field'),
}).label('DaemonError');

/** Every key of a daemon job record is present (a field that does not apply to the job is null), so a client
 *  that indexes one does not break on a job of another operation. */
const present = (o: Record<string, Joi.Schema>) => Object.fromEntries(Object.entries(o).map(([k, s]) => [k, s.required()]));

export const jobRecordSchema = Joi.object(present({
  id: Joi.string(),
  definition: Joi.object(present({
    id: Joi.string(), name: Joi.string(), kind: Joi.string().valid('export', 'migration', 'operation'),
    vm_path: Joi.string().allow(null).description('null for a job that names no VM (an operation of the job API)'),
    output_path: Joi.string().allow(null).description('null for a job without an output path'),
    operation: Joi.string(), created_at: Joi.string().isoDate(),
  })),
  status: Joi.string().valid(...DAEMON_STATUSES),
  state: Joi.string().description('the 8000 API state'),
  progress: Joi.object(present({
    phase: Joi.string(), stage: Joi.string(), current_file: Joi.string().allow(null), files_downloaded: Joi.number().integer().allow(null),
    total_files: Joi.number().integer().allow(null),
    bytes_downloaded: Joi.number().integer().allow(null), current_bytes: Joi.number().integer().allow(null), total_bytes: Joi.number().integer().allow(null),
    percent_complete: Joi.number(),
    rate_bytes_per_second: Joi.number().allow(null).description('export: download rate, smoothed (exponential moving average)'),
    eta_seconds: Joi.number().allow(null).description('export: remaining bytes / smoothed rate'),
    files: Joi.array().items(Joi.object({ name: Joi.string(), bytes_downloaded: Joi.number().integer(), total_bytes: Joi.number().integer(),
      percent_complete: Joi.number(), done: Joi.boolean() }))
      .allow(null).description('export with options.show_individual_progress: one entry per file'),
  })).description('fields a job does not report are null'),
  waiting_reason: Joi.string().allow(null).description('why a pending job waits (for example the per-manager export limit); null otherwise'),
  created_at: Joi.string().isoDate(), started_at: Joi.string().isoDate().allow(null), updated_at: Joi.string().isoDate(),
  completed_at: Joi.string().isoDate().allow(null), error: Joi.string().allow(null), schedule_id: Joi.string().allow(null),
})).label('DaemonJob');

export const progressSchema = Joi.object({
  job_id: Joi.string(), status: Joi.string(), phase: Joi.string(), percent_complete: Joi.number(),
  bytes_done: Joi.number().integer().allow(null), total_bytes: Joi.number().integer().allow(null),
  rate_bytes_per_second: Joi.number().allow(null).description('smoothed over rate_window_seconds; null without byte counts'),
  rate_percent_per_second: Joi.number().allow(null), rate_window_seconds: Joi.number(),
  eta_seconds: Joi.number().allow(null).description('null when the rate is zero or unknown'), eta: Joi.string().isoDate().allow(null),
  samples: Joi.number().integer(), updated_at: Joi.string().isoDate(),
}).label('JobProgress');

export const statusSchema = Joi.object({
  version: Joi.string(), uptime: Joi.string(), uptime_seconds: Joi.number(), total_jobs: Joi.number().integer(), pending_jobs: Joi.number().integer(),
  running_jobs: Joi.number().integer(), completed_jobs: Joi.number().integer(), failed_jobs: Joi.number().integer(), cancelled_jobs: Joi.number().integer(),
  worker_count: Joi.number().integer(), active_workers: Joi.number().integer(), websocket_clients: Joi.number().integer(), timestamp: Joi.string().isoDate(),
}).label('DaemonStatus');
