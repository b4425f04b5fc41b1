// Response shapes of the worker job protocol, for the OpenAPI description.
import Joi from 'joi';
import { STATES } from '../states';
import { historyEntrySchema, jobSpecSchema, progressEventSchema, systemInfoSchema } from './job';
import { madeEntrySchema } from '../libvirt/ledger';

export const errorSchema = Joi.object({
  error: Joi.object({
    code: Joi.number().integer(),
    message: Joi.string(),
    path: Joi.string(),
    timestamp: Joi.string().isoDate(),
    fields: Joi.array().items(Joi.object({ field: Joi.string(), message: Joi.string() })).description('one entry per invalid field'),
  }),
}).label('Error');

export const submitResponse = Joi.object({
  job_id: Joi.string(), state: Joi.string().valid(...STATES), message: Joi.string(),
  queue_position: Joi.number().integer().description('1-based rank among the jobs the same workers take before it; 0 when not queued'),
});

export const jobStatusSchema = Joi.object({
  job_id: Joi.string(),
  spec: jobSpecSchema,
  state: Joi.string().valid(...STATES),
  state_history: Joi.array().items(historyEntrySchema),
  result: Joi.object().unknown(true).allow(null),
  latest_event: progressEventSchema.allow(null),
  created_at: Joi.string().isoDate(),
  updated_at: Joi.string().isoDate(),
  is_terminal: Joi.boolean(),
  attempts: Joi.number().integer(),
  max_attempts: Joi.number().integer(),
  worker_id: Joi.string().allow(null),
  error: Joi.string().allow(null),
  queue: Joi.object({
    name: Joi.string(), position: Joi.number().integer().allow(null), waiting_reason: Joi.string().allow(null),
  }),
  ledger: Joi.array().items(madeEntrySchema).description(
    'what the job made on a target, recorded as it made it: rollback, cancel clean-up and retries act on these alone'),
}).label('JobStatus');

export const jobSummarySchema = Joi.object({
  job_id: Joi.string(), state: Joi.string().valid(...STATES), created_at: Joi.string().isoDate(), is_terminal: Joi.boolean(),
}).label('JobSummary');

export const workerSchema = Joi.object({
  worker_id: Joi.string(), capabilities: Joi.array().items(Joi.string()), system_info: systemInfoSchema,
  execution_mode: Joi.string(), registered_at: Joi.string().isoDate(), last_heartbeat: Joi.string().isoDate(),
  active: Joi.boolean(), jobs: Joi.array().items(Joi.string()),
}).label('Worker');

export const queueStatusSchema = Joi.object({
  total_jobs: Joi.number().integer(),
  by_priority: Joi.object().pattern(Joi.string(), Joi.number().integer()),
  queues: Joi.array().items(Joi.object({
    name: Joi.string(), capabilities: Joi.array().items(Joi.string()), execution_mode: Joi.string().allow(null),
    queued: Joi.number().integer(), assigned: Joi.number().integer(), running: Joi.number().integer(),
    active_workers: Joi.number().integer(), waiting_reason: Joi.string().allow(null),
  })),
}).label('QueueStatus');
