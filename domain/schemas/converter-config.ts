// The converter's YAML configuration file and JSON batch file (seed: manifest-and-converter-options.md).
// `${NAME}` values are replaced from the environment before validation; an unset NAME is an error naming it.
import Joi from 'joi';
import { OUTPUT_FORMATS, regexString } from './common';
import { configFstabMode } from './fstab-modes';

const path = Joi.string().min(1).max(4096);

/** Keys a batch entry may override, and that the config file may set for every entry. */
const perMigration = {
  vmdk: path,
  to_output: Joi.string().pattern(/^[^/\0]+$/).messages({ 'string.pattern.base': '{{#label}} must be a file name without "/"' }),
  out_format: Joi.string().valid(...OUTPUT_FORMATS),
  compress: Joi.boolean(),
  compression_level: Joi.number().integer().min(1).max(9),
  fstab_mode: configFstabMode,
  regen_initramfs: Joi.boolean(),
  update_grub: Joi.boolean(),
  xfs_regenerate_uuid: Joi.boolean(),
  remove_source_hv_tools: Joi.boolean().description('remove the source hypervisor\'s guest tools (open-vm-tools...) '
    + 'with the guest\'s package tool and disable their units (default false)'),
  inject_virtio_drivers: Joi.boolean(),
  virtio_win: path.description('extension: virtio-win driver tree (directory) for inject_virtio_drivers; else FERRY_VIRTIO_WIN, else /usr/share/virtio-win'),
  windows_version: Joi.alternatives(Joi.string().valid('2012', '2016', '2019', '2022', '10', '11'), Joi.number().valid(2012, 2016, 2019, 2022, 10, 11)),
  virt_test: Joi.boolean(),
  vm_name: Joi.string().max(64),
  memory: Joi.number().integer().min(64).max(1048576).description('MiB'),
  vcpus: Joi.number().integer().min(1).max(64),
  virt_test_expect: regexString.description('extension: a regular expression the serial console must show (default: Linux boot milestones)'),
  virt_test_timeout: Joi.number().integer().min(5).max(3600).description('extension: seconds to wait for virt_test_expect (default 300)'),
  keep_original: Joi.boolean(),
  remote: path,
  output_dir: path,
  // fetch-and-fix: a batch may bring VMs from several hosts
  host: Joi.string().max(255),
  port: Joi.number().integer().min(1).max(65535).description('ssh port (extension; "host:port" also works)'),
  user: Joi.string().max(64),
  identity: path,
  timeout: Joi.number().integer().min(1),
  network_retry: Joi.number().integer().min(0).max(20),
};

export const converterConfigSchema = Joi.object({
  command: Joi.string().valid('local', 'fetch-and-fix', 'manager_export').required(),
  ...perMigration,
  log_level: Joi.string().valid('DEBUG', 'INFO', 'WARNING', 'ERROR').default('INFO'),
  log_file: path,
  conversion_dir: path,
  parallel_streams: Joi.number().integer().min(1).max(16),
  timeout: perMigration.timeout.default(3600),
  network_retry: perMigration.network_retry.default(2),
  manager_host: Joi.string().description('mode manager_export: the vSphere manager (host, or https://host/sdk); default GOVC_URL'),
  manager_user: Joi.string().description('default GOVC_USERNAME'),
  manager_password: Joi.string().description('use ${ENV}; default GOVC_PASSWORD'),
  manager_insecure: Joi.boolean().description('extension: accept an untrusted TLS certificate (default GOVC_INSECURE)'),
  vm_path: Joi.string().pattern(/^\/[^/]+\/vm\/.+/).description('extension: the VM by inventory path instead of vm_name'),
  power_off: Joi.string().valid('none', 'shutdown', 'force').description('extension: a running VM: none refuses (default), shutdown, force'),
  remove_cdrom: Joi.boolean().description('extension: remove CD-ROM devices before the export'),
  batch_manifest: path,
  batch_parallel: Joi.number().integer().min(1).max(64).default(1),
  batch_continue_on_error: Joi.boolean().default(false),
  dry_run: Joi.boolean().default(false).description('extension: run the pipeline without writing anything'),
})
  .when(Joi.object({ command: 'local', batch_manifest: Joi.forbidden() }).unknown(), {
    then: Joi.object({ vmdk: Joi.required(), output_dir: Joi.required(), to_output: Joi.required() }),
  })
  .when(Joi.object({ command: 'fetch-and-fix', batch_manifest: Joi.forbidden() }).unknown(), {
    then: Joi.object({ host: Joi.required(), user: Joi.required(), remote: Joi.required(), output_dir: Joi.required(), to_output: Joi.required() }),
  })
  .when(Joi.object({ command: 'manager_export' }).unknown(), { then: Joi.object({ manager_host: Joi.required(), vm_name: Joi.required() }) })
  .unknown(false)
  .label('ConverterConfig');

export const batchSchema = Joi.object({
  migrations: Joi.array().min(1).items(Joi.object({ ...perMigration, to_output: perMigration.to_output.required() })
    .or('vmdk', 'remote').unknown(false)).required(),
}).label('BatchFile');

/** A batch entry as validated (batchSchema): the keys of perMigration. */
export interface MigrationEntry {
  vmdk?: string; to_output?: string; out_format?: string; compress?: boolean; compression_level?: number; fstab_mode?: string;
  regen_initramfs?: boolean; update_grub?: boolean; xfs_regenerate_uuid?: boolean; remove_source_hv_tools?: boolean;
  inject_virtio_drivers?: boolean; virtio_win?: string; windows_version?: string | number; virt_test?: boolean; vm_name?: string;
  memory?: number; vcpus?: number; virt_test_expect?: string; virt_test_timeout?: number; keep_original?: boolean; remote?: string;
  output_dir?: string; host?: string; port?: number; user?: string; identity?: string; timeout?: number; network_retry?: number;
}

/** The configuration file as validated (converterConfigSchema, its defaults filled in). */
export interface ConverterConfig extends MigrationEntry {
  command: 'local' | 'fetch-and-fix' | 'manager_export';
  log_level: 'DEBUG' | 'INFO' | 'WARNING' | 'ERROR'; log_file?: string; conversion_dir?: string; parallel_streams?: number;
  timeout: number; network_retry: number;
  manager_host?: string; manager_user?: string; manager_password?: string; manager_insecure?: boolean; vm_path?: string;
  power_off?: 'none' | 'shutdown' | 'force'; remove_cdrom?: boolean;
  batch_manifest?: string; batch_parallel: number; batch_continue_on_error: boolean; dry_run: boolean;
}

/** One migration's settings: the configuration's keys less the batch's own, a batch entry's over them, and (in a
 *  batch) the entry's own report file. Keys a mode requires (vmdk, output_dir, host...) are checked by the
 *  configuration schema or the command-line tool's batchSettings before a run (services/converter/cli.ts), hence
 *  the non-null assertions where they are read. */
export type MigrationSettings = Omit<ConverterConfig, 'batch_manifest' | 'batch_parallel' | 'batch_continue_on_error'> & { report_path?: string };

export class ConfigError extends Error {
  constructor(message: string, public problems: { path: string; message: string }[] = []) { super(message); this.name = 'ConfigError'; }
}

/** Replaces `${NAME}` in every string value; an unset NAME is an error naming the key and NAME (never the value). */
export function substituteEnv(doc: unknown, env: NodeJS.ProcessEnv = process.env, at = ''): unknown {
  if (typeof doc === 'string') {
    return doc.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)\}/g, (_, name: string) => {
      const v = env[name];
      if (v === undefined || v === '') {
        throw new ConfigError(`${at || 'value'}: environment variable ${name} is not set`, [{ path: at, message: `environment variable ${name} is not set` }]);
      }
      return v;
    });
  }
  if (Array.isArray(doc)) return doc.map((x, i) => substituteEnv(x, env, `${at}[${i}]`));
  if (doc && typeof doc === 'object') return Object.fromEntries(Object.entries(doc).map(([k, v]) => [k, substituteEnv(v, env, at ? `${at}.${k}` : k)]));
  return doc;
}

function check<T>(schema: Joi.Schema, doc: unknown, what: string): T {
  const { value, error } = schema.validate(doc, { abortEarly: false }) as { value: unknown; error?: Joi.ValidationError };
  if (error) {
    const problems = error.details.map((d) => ({ path: d.path.map((p) => (typeof p === 'number' ? `[${p}]` : p)).join('.').replace(/\.\[/g, '['), message: d.message }));
    throw new ConfigError(`invalid ${what}: ${problems.map((p) => p.message).join('; ')}`, problems);
  }
  return value as T;
}

export function validateConfig(doc: unknown, env: NodeJS.ProcessEnv = process.env): ConverterConfig {
  if (!doc || typeof doc !== 'object' || Array.isArray(doc)) throw new ConfigError('invalid configuration file: the top level must be a mapping of keys');
  return check<ConverterConfig>(converterConfigSchema, substituteEnv(doc, env), 'configuration file');
}

export function validateBatch(doc: unknown, env: NodeJS.ProcessEnv = process.env): { migrations: MigrationEntry[] } {
  return check(batchSchema, substituteEnv(doc, env), 'batch file');
}
