// The disk-artifact manifest (seed: manifest-and-converter-options.md), version 1.0, as one joi schema.
// Unknown properties are accepted everywhere except inside `pipeline`, which takes only its four stage keys.
// validateManifest() reports every problem at once, each with its JSON path.
import Joi from 'joi';
import { absolutePath, DISK_FORMATS, OUTPUT_FORMATS } from './common';
import { manifestFstabMode } from './fstab-modes';
import { ROOT_CHOICES } from '../converter/root-choice';

const open = (keys: Record<string, Joi.Schema>) => Joi.object(keys).unknown(true);
const dateTime = Joi.string().isoDate();

const diskSchema = open({
  id: Joi.string().pattern(/^[a-zA-Z0-9_-]+$/).required()
    .messages({ 'string.pattern.base': '{{#label}} must match ^[a-zA-Z0-9_-]+$' }),
  source_format: Joi.string().valid(...DISK_FORMATS).required(),
  bytes: Joi.number().integer().min(0).required(),
  local_path: absolutePath.required(),
  checksum: Joi.string().pattern(/^sha256:[a-f0-9]{64}$/)
    .messages({ 'string.pattern.base': '{{#label}} must be "sha256:" followed by 64 lowercase hex digits' }),
  boot_order_hint: Joi.number().integer().min(0).default(999),
  label: Joi.string().allow(''),
  disk_type: Joi.string().valid('boot', 'data', 'unknown').default('unknown'),
}).label('Disk');

const nicSchema = open({
  id: Joi.string(),
  mac: Joi.string().pattern(/^([0-9A-Fa-f]{2}[:-]){5}([0-9A-Fa-f]{2})$/)
    .messages({ 'string.pattern.base': '{{#label}} must be a MAC address such as 00:50:56:aa:bb:cc' }),
  network: Joi.string().allow(''),
});

const warningSchema = open({
  stage: Joi.string().required(),
  message: Joi.string().allow('').required(),
  timestamp: dateTime,
});

// Stage objects themselves accept unknown keys (rule 1 restricts only pipeline's own keys).
const stage = (keys: Record<string, Joi.Schema>) => open({ enabled: Joi.boolean().required(), ...keys });

export const pipelineSchema = Joi.object({
  inspect: stage({ collect_guest_info: Joi.boolean().default(false) }),
  fix: stage({
    backup: Joi.boolean().default(true),
    print_fstab: Joi.boolean().default(false),
    update_grub: Joi.boolean().default(true),
    regen_initramfs: Joi.boolean().default(true),
    fstab_mode: manifestFstabMode.default('stabilize-all'),
    remove_source_hv_tools: Joi.boolean().default(false),
    // An extension (the converter config's virtio_win): a host path, so a job's must lie in an input root (domain/operations.ts).
    virtio_win: absolutePath.description('virtio-win driver tree (a directory, or an ISO image) for inject_virtio_drivers'),
    // An extension: which system to repair when the disks hold several (domain/converter/root-choice.ts).
    root: Joi.string().pattern(new RegExp(`^(${ROOT_CHOICES.join('|')}|(btrfsvol:)?/dev/[\\w/.@-]+)$`))
      .messages({ 'string.pattern.base': '{{#label}} must be auto, first, single, or a device such as /dev/sda2' })
      .description('the system to repair when the disks hold several: auto (the first on the boot disk), first, single (refuse), or its device'),
  }),
  convert: stage({
    compress: Joi.boolean().default(false),
    compress_level: Joi.number().integer().min(1).max(9),
  }),
  validate: stage({ check_image_integrity: Joi.boolean().default(true) }),
}).unknown(false).messages({ 'object.unknown': '{{#label}} is not a pipeline stage (allowed: inspect, fix, convert, validate)' });

export const manifestSchema = open({
  manifest_version: Joi.string().valid('1.0').required().messages({ 'any.only': '{{#label}} must be "1.0" (the only manifest version)' }),
  source: open({
    provider: Joi.string(), vm_id: Joi.string(), vm_name: Joi.string(), datacenter: Joi.string(),
    export_timestamp: dateTime, export_method: Joi.string(),
  }),
  vm: open({
    cpu: Joi.number().integer().min(1),
    mem_gb: Joi.number().integer().min(1),
    firmware: Joi.string().valid('bios', 'uefi', 'unknown').default('bios'),
    secureboot: Joi.boolean().default(false),
    os_hint: Joi.string(),
    os_version: Joi.string(),
  }),
  disks: Joi.array().items(diskSchema).min(1).unique('id').required()
    .messages({ 'array.unique': '{{#label}} duplicates disk id "{{#value.id}}" (disk ids must be unique)' }),
  nics: Joi.array().items(nicSchema),
  notes: Joi.array().items(Joi.string().allow('')),
  warnings: Joi.array().items(warningSchema),
  metadata: open({
    sdk_version: Joi.string(), job_id: Joi.string(), created_at: dateTime,
    tags: Joi.object().pattern(Joi.string(), Joi.string().allow('')),
  }),
  pipeline: pipelineSchema,
  configuration: open({ users: open({}), services: open({}), hostname: open({}), network: open({}) }),
  output: open({
    directory: absolutePath,
    format: Joi.string().valid(...OUTPUT_FORMATS).default('qcow2'),
    filename: Joi.string().pattern(/^[^/\0]+$/).messages({ 'string.pattern.base': '{{#label}} must be a file name without "/"' }),
  }).default(),
  options: open({
    dry_run: Joi.boolean().default(false),
    verbose: Joi.number().integer().min(0).max(3).default(1),
    report: open({
      enabled: Joi.boolean().default(true),
      path: Joi.string().default('report.json'),
    }).default(),
  }).default(),
}).label('Manifest');

export interface ManifestDisk {
  id: string; source_format: string; bytes: number; local_path: string; checksum?: string;
  boot_order_hint: number; label?: string; disk_type: string; [k: string]: unknown;
}
export interface FixStage {
  enabled: boolean; backup: boolean; print_fstab: boolean; update_grub: boolean; regen_initramfs: boolean;
  fstab_mode: string; remove_source_hv_tools: boolean;
  /** Which system to repair when the disks hold several (root-choice.ts); default auto. */
  root?: string;
  // Converter-config extensions (the CLI maps its keys onto these; see docs/pipeline.md).
  xfs_regenerate_uuid?: boolean; inject_virtio_drivers?: boolean; windows_version?: string; virtio_win?: string;
}
export interface Manifest {
  manifest_version: '1.0';
  source?: Record<string, unknown>;
  vm?: { cpu?: number; mem_gb?: number; firmware: string; secureboot: boolean; os_hint?: string; os_version?: string };
  disks: ManifestDisk[];
  nics?: { id?: string; mac?: string; network?: string }[];
  notes?: string[];
  warnings?: { stage: string; message: string; timestamp?: string }[];
  metadata?: Record<string, unknown>;
  pipeline?: {
    inspect?: { enabled: boolean; collect_guest_info: boolean };
    fix?: FixStage;
    convert?: { enabled: boolean; compress: boolean; compress_level?: number };
    validate?: { enabled: boolean; check_image_integrity: boolean };
  };
  configuration?: { users?: Record<string, unknown>; services?: Record<string, unknown>; hostname?: Record<string, unknown>;
    network?: Record<string, unknown> };
  output: { directory?: string; format: 'qcow2' | 'raw' | 'vdi'; filename?: string };
  options: { dry_run: boolean; verbose: number; report: { enabled: boolean; path: string } };
  [k: string]: unknown;
}

export interface ManifestProblem { path: string; message: string; type: string }

/** JSON path in the "$.disks[0].id" form. */
export function jsonPath(p: (string | number)[]): string {
  return '$' + p.map((k) => (typeof k === 'number' ? `[${k}]` : /^[A-Za-z_][A-Za-z0-9_]*$/.test(k) ? `.${k}` : `[${JSON.stringify(k)}]`)).join('');
}

export class ManifestError extends Error {
  constructor(public problems: ManifestProblem[]) {
    super(`invalid manifest: ${problems.map((p) => `${p.path}: ${p.message}`).join('; ')}`);
    this.name = 'ManifestError';
  }
}

/** Validates and fills defaults; throws ManifestError listing every problem with its JSON path. */
export function validateManifest(doc: unknown): Manifest {
  const { value, error } = manifestSchema.validate(doc, { abortEarly: false, convert: false }) as { value: unknown; error?: Joi.ValidationError };
  if (error) {
    throw new ManifestError(error.details.map((d) => {
      // array.unique reports the duplicate item's path; point at its id.
      const p = d.type === 'array.unique' ? [...d.path, 'id'] : d.path;
      return { path: jsonPath(p), message: d.message.replace(/^"[^"]*" /, ''), type: d.type };
    }));
  }
  return value as Manifest;
}
