// What every route file of the job protocol shares: path parameters and the error response's shape.
import Joi from 'joi';
import type Koa from 'koa';
import type { ApiKey } from '../../platform/auth';
import { jobId as jobIdSchema, workerId as workerIdSchema } from '../../domain/schemas/common';
import { errorSchema } from '../../domain/schemas/responses';

export const jobParams = Joi.object<{ job_id: string }>({ job_id: jobIdSchema.required() });
export const workerParams = Joi.object<{ worker_id: string }>({ worker_id: workerIdSchema.required() });
export const err = (description: string) => ({ description, schema: errorSchema });
/** The caller's API key: platform/http.ts sets ctx.state.apiKey before any handler runs (null with auth off);
 *  Koa's state is untyped. */
export const apiKeyOf = (ctx: Koa.Context) => ctx.state.apiKey as ApiKey | null | undefined;
