// Turns the daemon's job definitions (shape A export, shape B migration, or an operation template) into the
// JobSpec the 8000 API uses, so both APIs show the same jobs. Passwords are split off here and never enter
// the spec or the meta.
import { randomUUID } from 'node:crypto';
import { fieldError } from '../platform/errors';
import { validate } from '../platform/http';
import { exportJobSchema, migrationJobSchema, operationTemplateSchema } from './schemas/daemon';
import { jobSpecSchema, JobSpec } from './schemas/job';
import { managerDefaults } from './vsphere/job-credentials';
import type { WarmOptions } from './schemas/warm';
import { configuredInsecure, getsDefaultCredentials, managerAllowed } from './vsphere/credentials';

/** Options every daemon job definition may carry (exportJobSchema, migrationJobSchema), defaults filled in. */
interface JobOptions {
  parallel_downloads?: number; remove_cdrom: boolean; power_off: string; shutdown_timeout_seconds: number;
  show_individual_progress?: boolean; conversion_method?: string; warm?: WarmOptions; network_mapping?: Record<string, string>;
    virt_test?: Record<string, unknown>;
}
/** Shape A as validated (exportJobSchema). */
interface ExportJob {
  name?: string; vm_path: string; output_path: string; options: JobOptions; manager_url?: string; username?: string;
  password?: string; insecure?: boolean; priority?: number;
}
/** Shape B as validated (migrationJobSchema). */
interface MigrationJob {
  name?: string; vm_path: string; priority?: number; options: JobOptions;
  source: { type: string; manager_url?: string; username?: string; password?: string; datacenter?: string; insecure?: boolean };
  destination: { type: string; virt_uri?: string };
}
/** An operation template as validated (operationTemplateSchema). */
interface OperationTemplate {
  operation: string; image?: Record<string, unknown>; parameters: Record<string, unknown>;
  execution_policy?: Record<string, unknown>; requirements?: Record<string, unknown>;
}

export interface Built { spec: JobSpec; meta: Record<string, unknown>; password?: string; passwordField?: string; shape: 'A' | 'B' | 'operation' }

/** `o[key]` when `o` is an object, else undefined. */
const prop = (o: unknown, key: string): unknown => (typeof o === 'object' && o !== null ? (o as Record<string, unknown>)[key] : undefined);

const clean = <T extends Record<string, unknown>>(o: T): T => Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;

/** The environment's username and insecure flag, for the manager a job names (undefined: GOVC_URL's): the
 *  username only where the default credentials go, insecure only where the operator configured it. */
function defaultsFor(given: string | undefined, env: ReturnType<typeof managerDefaults>) {
  const own = given === undefined || getsDefaultCredentials(given);
  return { username: own ? env.username : undefined, insecure: configuredInsecure(given) };
}

/** The manager fields of a job the daemon builds from a request or a plan (managerRef in domain/operations.ts),
 *  as shape A fills them: the environment's defaults where they go; of the password only where it comes from
 *  (a given one is stored sealed beside the job, domain/vsphere/job-credentials.ts). */
export function managerJobFields(given: { manager_url?: string; username?: string; password?: string; insecure?: boolean }) {
  const env = managerDefaults();
  const d = defaultsFor(given.manager_url, env);
  return clean({
    manager_url: given.manager_url ?? env.manager_url, username: given.username ?? d.username, insecure: given.insecure ?? d.insecure,
    credentials: given.password ? 'job' : env.hasPassword ? 'environment' : 'none',
  });
}

export function shapeOf(def: unknown): 'A' | 'B' | 'operation' {
  if (def && typeof def === 'object' && 'operation' in def) return 'operation';
  return def && typeof def === 'object' && ('source' in def || 'destination' in def) ? 'B' : 'A';
}

type BuildOptions = { where: string; jobTimeoutSeconds: number; parallelDownloads: number; jobId?: string; warnings?: string[] };
/** A definition read in its shape: the spec to validate, the daemon's metadata, and the password it carries. */
type Shaped = { raw: Record<string, unknown>; meta: Record<string, unknown>; password?: string; passwordField?: string };

const policyOf = (opts: BuildOptions, priority?: number) => ({ timeout_seconds: opts.jobTimeoutSeconds, priority: priority ?? 50 });

/** Shape A: an export job. */
function exportShape(def: unknown, job_id: string, opts: BuildOptions): Shaped {
  const d = validate<ExportJob>(exportJobSchema, def, 'body', opts.where, opts.warnings);
  const name = d.name || d.vm_path.split('/').pop();
  const raw = {
    job_id, operation: 'export', execution_policy: policyOf(opts, d.priority),
    parameters: clean({
      vm_path: d.vm_path, output_path: d.output_path, name,
      parallel_downloads: d.options.parallel_downloads ?? opts.parallelDownloads,
      remove_cdrom: d.options.remove_cdrom, show_individual_progress: d.options.show_individual_progress,
      power_off: d.options.power_off, shutdown_timeout_seconds: d.options.shutdown_timeout_seconds,
      ...managerJobFields(d),
    }),
  };
  const meta = { kind: 'export', name, vm_path: d.vm_path, output_path: d.output_path };
  return { raw, meta, password: d.password, passwordField: [opts.where, 'password'].filter(Boolean).join('.') };
}

/** Shape B: a migration job. */
function migrationShape(def: unknown, job_id: string, opts: BuildOptions): Shaped {
  const d = validate<MigrationJob>(migrationJobSchema, def, 'body', opts.where, opts.warnings);
  const name = d.name || d.vm_path.split('/').pop();
  const raw = {
    job_id, operation: 'migrate_vm', execution_policy: policyOf(opts, d.priority),
    parameters: clean({
      vm_path: d.vm_path, name, source_type: d.source.type, datacenter: d.source.datacenter,
      ...managerJobFields(d.source),
      destination: clean({ type: d.destination.type, virt_uri: d.destination.virt_uri }),
      conversion_method: d.options.conversion_method, network_mapping: d.options.network_mapping, virt_test: d.options.virt_test,
      power_off: d.options.power_off, shutdown_timeout_seconds: d.options.shutdown_timeout_seconds, remove_cdrom: d.options.remove_cdrom,
      parallel_downloads: d.options.parallel_downloads ?? opts.parallelDownloads, warm: d.options.warm,
    }),
  };
  const meta = { kind: 'migration', name, vm_path: d.vm_path, destination: d.destination };
  return { raw, meta, password: d.source.password, passwordField: [opts.where, 'source.password'].filter(Boolean).join('.') };
}

/** An operation template: the job API's own spec. */
function operationShape(def: unknown, job_id: string, opts: BuildOptions): Shaped {
  const d = validate<OperationTemplate>(operationTemplateSchema, def, 'body', opts.where, opts.warnings);
  const raw = clean({ job_id, operation: d.operation, image: d.image, parameters: d.parameters, requirements: d.requirements,
    execution_policy: { timeout_seconds: opts.jobTimeoutSeconds, ...(d.execution_policy || {}) } });
  return { raw, meta: { kind: 'operation', name: d.operation } };
}

export function buildSpec(def: unknown, opts: BuildOptions): Built {
  const shape = shapeOf(def);
  const job_id = opts.jobId || randomUUID();
  const read = shape === 'A' ? exportShape : shape === 'B' ? migrationShape : operationShape;
  const { raw, meta, password, passwordField } = read(def, job_id, opts);
  // A job may only name a manager this deployment allows (GOVC_URL, FERRY_VSPHERE_MANAGERS): 400 at submission.
  // Read from the definition as given (not yet validated where the check below must still refuse it).
  const given = shape === 'A' ? prop(def, 'manager_url') : shape === 'B' ? prop(prop(def, 'source'), 'manager_url') : undefined;
  if (typeof given === 'string' && !managerAllowed(given)) {
    const field = [opts.where, shape === 'A' ? 'manager_url' : 'source.manager_url'].filter(Boolean).join('.');
    throw fieldError(400, field, 'not an allowed vSphere manager',
      `${field}: ${given.replace(/\/\/[^@/]*@/, '//')} is not a vSphere manager this daemon may contact (GOVC_URL or FERRY_VSPHERE_MANAGERS)`);
  }
  if (typeof given === 'string' && password === undefined && !getsDefaultCredentials(given)) {
    throw fieldError(400, passwordField!, 'the default credentials do not go to this manager',
      `${passwordField}: ${given.replace(/\/\/[^@/]*@/, '//')} does not receive the default credentials (GOVC_*, only for GOVC_URL's manager and ` +
      `FERRY_VSPHERE_MANAGERS entries of the same scheme, host and port): give its own username and password`);
  }
  const spec = validate<JobSpec>(jobSpecSchema, raw, 'body', opts.where, opts.warnings);
  return { spec, meta, password, passwordField, shape };
}
