// What every route file of the job protocol shares: path parameters and the error response's shape.
import Joi from 'joi';
import { jobId as jobIdSchema, workerId as workerIdSchema } from '../../shared/schemas/common';
import { errorSchema } from '../../shared/schemas/responses';

export const jobParams = Joi.object({ job_id: jobIdSchema.required() });
export const workerParams = Joi.object({ worker_id: workerIdSchema.required() });
export const err = (description: string) => ({ description, schema: errorSchema });
