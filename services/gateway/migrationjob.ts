// POST /migrationjobs: the gateway accepts a Kubernetes `MigrationJob` document (YAML or JSON; the CRD is in
// deploy/k8s/crd-migrationjob.yaml) and turns it into a `convert` job, so a controller or a kubectl-driven
// pipeline (`kubectl get migrationjob x -o yaml | curl --data-binary @- ...`) can submit it.
//   spec.source.type/path   -> image.format/path
//   spec.output.format/path -> parameters.output_format/output_path; spec.options.compress -> parameters.compress
// The job id is "<namespace>.<name>", so submitting the same resource twice is refused (409) instead of run twice.
// Guest-repair options (fstabMode, regenInitramfs, updateGrub) and resources are kept in the job's metadata.
import Joi from 'joi';
import { Api, validate } from '../../platform/http';
import { absolutePath, DISK_FORMATS, OUTPUT_FORMATS } from '../../domain/schemas/common';
import { jobSpecSchema, JobSpec } from '../../domain/schemas/job';
import { configFstabMode } from '../../domain/schemas/fstab-modes';
import { errorSchema, submitResponse } from '../../domain/schemas/responses';
import type { Lifecycle } from '../../queue/lifecycle';
import { apiKeyOf } from './route-kit';

export const MIGRATIONJOB_GROUP = 'ferry.io';
const dnsLabel = Joi.string().max(63).pattern(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/)
  .messages({ 'string.pattern.base': '{{#label}} must be a DNS label: lowercase letters, digits and "-", starting and ending with a letter or digit' });
const quantity = Joi.alternatives(Joi.string().pattern(/^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$/), Joi.number().min(0))
  .messages({ 'alternatives.match': '{{#label}} must be a Kubernetes quantity such as 500m, 2, 4Gi' });
const resourceList = Joi.object({ memory: quantity, cpu: quantity });

type Quantity = string | number;
interface ResourceList { memory?: Quantity; cpu?: Quantity }
/** A MigrationJob as migrationJobSchema gives it (metadata.namespace and spec.options defaulted). */
export interface MigrationJob {
  apiVersion: string; kind: 'MigrationJob';
  metadata: { name: string; namespace: string; [field: string]: unknown };
  spec: {
    source: { type: string; path: string }; output: { format: string; path: string };
    options: { fstabMode?: string; regenInitramfs?: boolean; updateGrub?: boolean; compress?: boolean };
    resources?: { requests?: ResourceList; limits?: ResourceList };
  };
  status?: Record<string, unknown>;
}

/** The MigrationJob resource of the manifest seed; deploy/k8s/crd-migrationjob.yaml holds the same schema. */
export const migrationJobSchema = Joi.object<MigrationJob>({
  apiVersion: Joi.string().valid(`${MIGRATIONJOB_GROUP}/v1`).required(),
  kind: Joi.string().valid('MigrationJob').required(),
  metadata: Joi.object({
    name: dnsLabel.required(),
    namespace: dnsLabel.default('default'),
  }).unknown(true).required(),
  spec: Joi.object({
    source: Joi.object({
      type: Joi.string().valid(...DISK_FORMATS).required(),
      path: absolutePath.required(),
    }).required(),
    output: Joi.object({
      format: Joi.string().valid(...OUTPUT_FORMATS).required(),
      path: absolutePath.required(),
    }).required(),
    options: Joi.object({
      fstabMode: configFstabMode,
      regenInitramfs: Joi.boolean(),
      updateGrub: Joi.boolean(),
      compress: Joi.boolean(),
    }).default({}),
    resources: Joi.object({ requests: resourceList, limits: resourceList }),
  }).required(),
  status: Joi.object().unknown(true).description('ignored: written by the cluster'),
}).unknown(false).label('MigrationJob');

/** The convert JobSpec a MigrationJob stands for (before JobSpec defaults are applied). */
export function migrationJobToSpec(mj: MigrationJob): Record<string, unknown> {
  const { metadata, spec } = mj;
  const parameters: Record<string, unknown> = { output_format: spec.output.format, output_path: spec.output.path };
  if (spec.options?.compress !== undefined) parameters.compress = spec.options.compress;
  return {
    job_id: `${metadata.namespace}.${metadata.name}`,
    operation: 'convert',
    image: { path: spec.source.path, format: spec.source.type },
    parameters,
    audit_info: { requested_by: `MigrationJob ${metadata.namespace}/${metadata.name}`, tags: ['migrationjob'] },
  };
}

export function registerMigrationJobRoute(api: Api, life: Lifecycle) {
  api.add({
    method: 'post', role: 'submit', path: '/migrationjobs', summary: 'Submit a Kubernetes MigrationJob resource (YAML or JSON) as a convert job',
    tags: ['jobs'],
    body: migrationJobSchema, requestTypes: ['application/json', 'application/x-yaml', 'text/yaml'],
    responses: { 201: { description: 'registered and queued', schema: submitResponse }, 400: { description: 'invalid MigrationJob', schema: errorSchema },
      409: { description: 'this MigrationJob was already submitted', schema: errorSchema } },
    handler: async (ctx, { body }) => {
      const spec = validate<JobSpec>(jobSpecSchema, migrationJobToSpec(body), 'MigrationJob as a job');
      const { metadata, spec: s } = body;
      const r = await life.submit(spec, { enqueue: true, meta: { source: 'MigrationJob', namespace: metadata.namespace, name: metadata.name, options: s.options,
        resources: s.resources }, caller: apiKeyOf(ctx) ?? null });
      ctx.status = 201;
      ctx.set('Location', `/jobs/${r.job_id}`);
      return { ...r, message: `MigrationJob ${metadata.namespace}/${metadata.name} queued as convert job ${r.job_id}` };
    },
  });
}
