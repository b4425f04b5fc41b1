// Operations a job may name: the capabilities each needs and the schema of its parameters. Workers implement
// them in services/worker/operations; this table is what the API validates against and routes by.
import path from 'node:path';
import Joi from 'joi';
import { absolutePath, jobId, OUTPUT_FORMATS, regexString } from './schemas/common';
import { manifestSchema } from './schemas/manifest';
import { domainName } from './libvirt/names';
import { virtUriSchema } from './libvirt/uri';
import { managerUrlSchema } from './schemas/vms';
import type { JobPath } from '../platform/roots';
import type { JobImage } from './image-confine';
import { POWER_OPTIONS } from './vsphere/options';
import { warmOptionsSchema } from './schemas/warm';
import { inspectionHintSchema } from './schemas/inspection';

/** virt_test: one boot of the outputs, its serial console judged (domain/converter/boot-judge.ts). */
export const virtTestSchema = Joi.object({
  expect: regexString.description(
    'a regular expression the serial console must show; without it, Linux boot milestones (no match by the timeout is then inconclusive, not failed)'),
  timeout_seconds: Joi.number().integer().min(5).max(3600).default(300),
  memory_mib: Joi.number().integer().min(64).max(1048576),
  vcpus: Joi.number().integer().min(1).max(64),
}).description(
  'boot the outputs once with qemu (snapshot=on, nothing written to them) after they are in place; a failed boot fails the job, the outputs stay for a look');

/** A job's parameters: the functions below get them validated by the operation's own `parameters` schema, and
 *  each reads them as the shape that schema gives (the interfaces below). */
type Parameters = Record<string, unknown>;

export interface OperationDef {
  capabilities: string[];
  needsImage: boolean;
  parameters: Joi.ObjectSchema;
  description: string;
  /** When present, the capabilities depend on the validated parameters (migrate: on its enabled stages). */
  capabilitiesFor?: (parameters: Parameters) => string[];
  /** Every file or directory the job names, checked against the storage roots (platform/roots.ts). */
  paths?: (spec: { job_id: string; image?: { path: string }; parameters: Parameters }) => JobPath[];
  /** The input images among them, whose headers and references are checked too (domain/image-confine.ts). */
  images?: (spec: { image?: { path: string; format: string }; parameters: Parameters }) => JobImage[];
  /** Who submits it, when no caller may (checkCaller refuses it from the job APIs, schedules and plans, 400 naming
   *  operation): `daemon`, its own routes, which check the role and caps the action needs (a plan's guest read, a
   *  power action); `plan`, the plan runner, for a side effect acting only on what the job it names (of_job)
   *  recorded. Either way it cannot be used to skip the rules of the action it does. */
  submittedBy?: 'daemon' | 'plan';
  /** The role the caller (for a plan: its starter) needs beyond submit, as the same direct action needs it. */
  role?: 'admin';
  /** `call`: work someone waits on that must not queue behind long jobs (the daemon's virsh_call and power
   *  actions, a plan's guest read, a rollback), queued on the call lane ("calls.*", platform/capabilities.ts) that
   *  every worker serves with slots of its own (FERRY_WORKER_CALL_SLOTS). Claims, leases, retries and audit are
   *  the same as on the job lane: only which slots take it differs. */
  lane?: 'call';
  /** The daemon's own plumbing (virsh_call): its record is kept minutes (FERRY_CALL_RETENTION) and left out of
   *  job lists, the WebSocket and bulk cancel; without it a job is an operator's, listed and kept as any other. */
  brief?: true;
}

/** What migrateCapabilities reads of a manifest's pipeline. */
interface PipelineFlags { fix?: { enabled?: boolean }; inspect?: { enabled?: boolean; collect_guest_info?: boolean } }
/** The parameters of migrate as the functions here read them. */
interface MigrateParameters {
  manifest?: {
    disks?: { local_path: string; source_format: string }[]; output?: { directory?: string };
    pipeline?: PipelineFlags & { fix?: { virtio_win?: string } };
    options?: { report?: { enabled?: boolean; path?: string } };
  };
  output_dir?: string;
}
/** The parameters of import_kvm as the functions here read them. */
interface ImportParameters { disks?: { path: string; format?: string }[] }
/** The parameters of convert: the schema's xor sets exactly one of the two. */
interface ConvertParameters { output_dir?: string; output_path?: string }

/** The manifest's fields that name a host file the pipeline reads beside the disks (the repair copies the
 *  virtio-win drivers into the guest): each must lie in an input root like the disks. */
export const MANIFEST_HOST_PATHS = [{ field: 'pipeline.fix.virtio_win', kind: 'input_tree' as const,
  of: (m: NonNullable<MigrateParameters['manifest']>) => m.pipeline?.fix?.virtio_win }];

/** The paths of a migrate job: each disk's source, host files the repair reads, the output directory and the report. */
function migratePaths(spec: { parameters: Parameters }): JobPath[] {
  const p = (spec.parameters || {}) as MigrateParameters;
  const m: NonNullable<MigrateParameters['manifest']> = p.manifest || {};
  const out: JobPath[] = (m.disks || []).map((d, i) => ({ field: `parameters.manifest.disks[${i}].local_path`, path: d.local_path, kind: 'input' as const }));
  for (const h of MANIFEST_HOST_PATHS) {
    const v = h.of(m);
    if (v) out.push({ field: `parameters.manifest.${h.field}`, path: v, kind: h.kind });
  }
  const dir = m.output?.directory || p.output_dir;
  if (dir) {
    out.push({ field: m.output?.directory ? 'parameters.manifest.output.directory' : 'parameters.output_dir', path: dir, kind: 'output_dir' });
    const rp = m.options?.report?.path;
    if (m.options?.report?.enabled !== false) out.push({ field: 'parameters.manifest.options.report.path', path: path.resolve(dir, rp || 'report.json'),
      kind: 'output' });
  }
  return out;
}

const convertParameters = Joi.object({
  output_format: Joi.string().valid(...OUTPUT_FORMATS).default('qcow2'),
  compress: Joi.boolean().default(false).when('output_format', {
    not: 'qcow2',
    then: Joi.valid(false).messages({ 'any.only': '{{#label}} is only allowed with output_format qcow2' }),
  }),
  output_dir: absolutePath.description('directory; the file is named <job_id>.<format>'),
  output_path: absolutePath.description('exact output file'),
  overwrite: Joi.boolean().default(false).description('replace an existing output file'),
})
  .xor('output_dir', 'output_path')
  .messages({
    'object.missing': '{{#label}} must contain one of output_dir or output_path',
    'object.xor': '{{#label}} must contain only one of output_dir or output_path',
  });

// Jobs of the daemon API (8080). The password is never a parameter: it is kept encrypted beside the job
// (domain/vsphere/job-credentials.ts), so the spec stays free of secrets.
const managerParameters = {
  vm_path: Joi.string().max(1024).required(),
  manager_url: managerUrlSchema,
  username: Joi.string().max(256),
  insecure: Joi.boolean().default(false),
  credentials: Joi.string().valid('job', 'environment', 'none').default('none').description('where the manager password comes from'),
  power_off: Joi.string().valid(...POWER_OPTIONS).default('none').description(
    'a running VM: none = refuse, shutdown = guest shutdown and wait, force = power off'),
  shutdown_timeout_seconds: Joi.number().integer().min(1).max(3600).default(300),
  remove_cdrom: Joi.boolean().default(false),
  parallel_downloads: Joi.number().integer().min(1).max(64).default(4),
};

/** Which manager a daemon-side job talks to and where its password comes from (never the password itself). */
const managerRef = {
  manager_url: managerUrlSchema, username: Joi.string().max(256), insecure: Joi.boolean().default(false),
  credentials: managerParameters.credentials,
};

/** migrate: every stage runs qemu-img (inspect: info; fix: the overlay) so img_tool always; fix (or inspect with
 *  collect_guest_info) also needs mount_operations. */
export function migrateCapabilities(p: { manifest?: { pipeline?: PipelineFlags } }): string[] {
  const st = p?.manifest?.pipeline;
  const caps = new Set<string>(['img_tool']);
  if (!st) return [...caps];
  if (st.fix?.enabled || (st.inspect?.enabled && st.inspect?.collect_guest_info)) caps.add('mount_operations');
  return [...caps];
}

/** Whether a virt_clone job seals (template_create with seal) or customizes (template_deploy with customize). */
export function virtCloneUsesGuestfs(p: { action?: string; body?: { seal?: unknown; customize?: unknown } }): boolean {
  return (p.action === 'template_create' && !!p.body?.seal) || (p.action === 'template_deploy' && !!p.body?.customize);
}

/** The host paths a virt_files job's route body names (its import's image, its export's folder), under the
 *  route's own field names: the daemon checks them against its roots before it queues the job (400 naming the
 *  field), the worker again against its own right before it opens them. */
export function virtFilesPaths(p: { action?: string; body?: { image_path?: unknown; export_path?: unknown; source_path?: unknown } }): JobPath[] {
  const b = p.body || {};
  if (p.action === 'import_kvm' && typeof b.image_path === 'string') return [{ field: 'image_path', path: b.image_path, kind: 'input' }];
  if (p.action === 'template_export' && typeof b.export_path === 'string') return [{ field: 'export_path', path: b.export_path, kind: 'output_dir' }];
  if (p.action === 'volume_upload' && typeof b.source_path === 'string') return [{ field: 'source_path', path: b.source_path, kind: 'input' }];
  return [];
}

/** The job a plan side effect acts on: what it recorded (its ledger, its source), never a name given here. */
const ofJob = jobId.required().description('the plan VM\'s shape B job whose record (ledger, source VM) this acts on');

export const OPERATIONS: Record<string, OperationDef> = {
  import_kvm: {
    capabilities: ['libvirt_access'],
    needsImage: false,
    parameters: Joi.object({
      disks: Joi.array().items(Joi.object({ path: absolutePath.required(), format: Joi.string().max(16) })).min(1).max(26).required().description(
        'boot disk first'),
      name: domainName.required(),
      memory: Joi.number().integer().min(16).default(1024).description('MiB'),
      cpus: Joi.number().integer().min(1).max(512).default(1),
      networks: Joi.array().items(Joi.string().max(200)).max(16).default([]).description('one virtio NIC per libvirt network or bridge'),
      pool: Joi.string().max(200), firmware: Joi.string().valid('bios', 'uefi').default('bios'),
      virt_uri: virtUriSchema.description('target libvirt URI (default FERRY_LIBVIRT_URI); one of FERRY_LIBVIRT_URIS'),
    }),
    paths: (spec) => ((spec.parameters as ImportParameters).disks || []).map(
      (d, i) => ({ field: `parameters.disks[${i}].path`, path: d.path, kind: 'input' as const })),
    // Copied into a pool, a reference would resolve against the pool's folder: imported disks reference nothing.
    images: (spec) => ((spec.parameters as ImportParameters).disks || []).map(
      (d, i) => ({ field: `parameters.disks[${i}].path`, path: d.path, format: d.format, selfContained: true })),
    description: 'imports disk images into a libvirt storage pool and defines a domain around them (domain/libvirt/import.ts)',
  },
  migrate: {
    capabilities: ['img_tool'],
    capabilitiesFor: migrateCapabilities,
    needsImage: false,
    parameters: Joi.object({
      // A job's spec is stored and served back (GET /jobs/{id}): a plaintext password would leak through it.
      manifest: manifestSchema.keys({
        configuration: Joi.object({
          // Only the plaintext password is refused here; the rest stays free-form (the fix stage warns about it).
          users: Joi.any().when(Joi.object(), { then: Joi.object().pattern(/./, Joi.any().when(Joi.object(), { then: Joi.object({
            password: Joi.any().forbidden().messages(
              {
              'any.unknown': '{{#label}} is not accepted in a job (the spec is stored and returned by the API); give password_hash, a crypt(3) hash such as ' +
                             '`openssl passwd -6` prints' }),
          }).unknown(true) })) }),
        }).unknown(true),
      }).required(),
      output_dir: absolutePath.description('used when manifest.output.directory is absent'),
      virt_test: virtTestSchema,
      overwrite: Joi.boolean().default(false).description('replace existing output files (and report)'),
    }),
    paths: migratePaths,
    images: (spec) => ((spec.parameters as MigrateParameters).manifest?.disks ||
      []).map((d, i) => ({ field: `parameters.manifest.disks[${i}].local_path`, path: d.local_path, format: d.source_format })),
    description: 'runs a disk-artifact manifest through inspect, convert, fix and validate; the result is report.json',
  },
  convert: {
    capabilities: ['img_tool'],
    needsImage: true,
    parameters: convertParameters,
    paths: (spec) => {
      const p = spec.parameters as ConvertParameters;
      return [
        { field: 'image.path', path: spec.image!.path, kind: 'input' },
        p.output_path
          ? { field: 'parameters.output_path', path: p.output_path, kind: 'output' }
          : { field: 'parameters.output_dir', path: p.output_dir!, kind: 'output_dir' },
      ];
    },
    images: (spec) => [{ field: 'image.path', path: spec.image!.path, format: spec.image!.format }],
    description: 'qemu-img convert of image.path into parameters.output_format',
  },
  noop: {
    capabilities: [],
    needsImage: false,
    parameters: Joi.object({
      sleep_ms: Joi.number().integer().min(0).max(3600_000).default(0),
      fail: Joi.string().max(1024).description('fail every attempt with this message (for drills)'),
      steps: Joi.number().integer().min(0).max(1000).default(0).description('progress events to emit'),
    }),
    description: 'does no work: for drills, smoke tests and benchmarks of the queue itself',
  },
  export: {
    capabilities: ['vsphere_access'],
    needsImage: false,
    parameters: Joi.object({
      ...managerParameters,
      name: Joi.string().max(256),
      output_path: absolutePath.required(),
      show_individual_progress: Joi.boolean().default(false),
    }),
    paths: (spec) => [{ field: 'output_path', path: (spec.parameters as { output_path: string }).output_path, kind: 'output_dir' }],
    description: 'export a VM from a remote virtualization manager into output_path (daemon API shape A)',
  },
  migrate_vm: {
    // Every stage on one worker, one progress stream: export, guest repair and conversion, import and first boot
    // (services/worker/operations/migrate-vm.ts, migration-stages.ts).
    capabilities: ['vsphere_access', 'img_tool', 'mount_operations', 'libvirt_access'],
    needsImage: false,
    parameters: Joi.object({
      ...managerParameters,
      power_off: managerParameters.power_off.when('warm', { is: Joi.exist(),
        then: Joi.invalid('none').default('shutdown').messages(
        { 'any.invalid': '{{#label}} must be shutdown or force for a warm migration (the VM is powered off at cutover)' }) }),
      name: Joi.string().max(256),
      source_type: Joi.string().max(64).required(),
      datacenter: Joi.string().max(256),
      destination: Joi.object({ type: Joi.string().max(64).required(), virt_uri: virtUriSchema }).required(),
      conversion_method: Joi.string().max(64),
      network_mapping: Joi.object().pattern(Joi.string(), Joi.string()).default({}),
      virt_test: virtTestSchema,
      warm: warmOptionsSchema,
      // Set by a plan (orchestration/plan-runner.ts): the target pool from its storage_map, and the limits' slots.
      pool: Joi.string().max(200),
      domain_name: domainName.description('the target domain name (a plan\'s options.target_name); default the VM\'s name'),
      plan: Joi.object({
        // Set only by the plan runner (checkCaller refuses it from callers: 400 naming parameters.plan).
        id: Joi.string().max(64).required(), not_after: Joi.number().integer(),
        // Only the limits' own names (orchestration/plan-slots.ts): never a VM's source guard (vm:...) or another lease.
        slots: Joi.array().items(Joi.object({ name: Joi.string().max(2048).pattern(/^(plan|esxi|datastore|target):/).required().messages(
          { 'string.pattern.base': '{{#label}} must be a plan limit\'s slot (plan:, esxi:, datastore:, target:)' }),
          limit: Joi.number().integer().min(1).required(), what: Joi.string().max(2048) })).max(64).default([]),
        inspection: inspectionHintSchema,
      }),
    }),
    description: 'migrate a VM from a remote virtualization manager onto a KVM host (daemon API shape B)',
  },
  guest_preflight: {
    // nbdkit serves each disk from the datastore over NBD (nbd_access), a read-only libguestfs appliance reads it
    // (mount_operations, as the repair), both reaching the manager (vsphere_access): docs/plans.md.
    capabilities: ['vsphere_access', 'mount_operations', 'nbd_access'],
    submittedBy: 'daemon',
    // The daemon waits on it within FERRY_GUEST_PREFLIGHT_SECONDS: behind a long export it would find every guest
    // unreadable. It holds one call slot for at most that bound (docs/deploy.md, "What the daemon runs", its call lane table).
    lane: 'call',
    needsImage: false,
    parameters: Joi.object({
      ...managerRef,
      vm_paths: Joi.array().items(Joi.string().max(1024)).min(1).max(10_000).unique().required().description(
        'the VMs whose guests are read; their disks are looked up on the manager by the worker'),
      seconds: Joi.number().integer().min(1).max(86_400).required().description(
        'the bound the daemon waits (FERRY_GUEST_PREFLIGHT_SECONDS), named in the findings'),
      deadline: Joi.number().integer().min(0).required().description('epoch ms: VMs not read by then get a guest_unreadable finding'),
    }),
    description: 'a plan preflight\'s guest read: each VM\'s disks read in place on its datastore, inspected and the repair run dry; the result is the guest ' +
                 'findings per VM (submitted by the daemon only)',
  },
  vm_power: {
    capabilities: ['vsphere_access'],
    submittedBy: 'daemon',
    lane: 'call', // the admin's request waits on it: a power action is a few vSphere calls, never behind an export
    needsImage: false,
    parameters: Joi.object({
      ...managerRef,
      vm_path: Joi.string().max(1024).required(),
      action: Joi.string().valid('shutdown', 'poweroff').required().description('shutdown: ask the guest (VMware Tools); poweroff: forced, the task waited on'),
    }),
    description: 'POST /vms/shutdown and /vms/poweroff as a job (submitted by the daemon only, for an admin)',
  },
  virsh_call: {
    // The daemon's libvirt calls when FERRY_LIBVIRT_VIA=worker (orchestration/virsh-jobs.ts): the daemon builds the argv from
    // a request it validated and authorized, a worker with virsh runs it (services/worker/operations/virsh-call.ts).
    capabilities: ['libvirt_access'],
    submittedBy: 'daemon',
    lane: 'call',
    brief: true,
    needsImage: false,
    parameters: Joi.object({
      uri: virtUriSchema.required().description('one of FERRY_LIBVIRT_URI(S), checked again on the worker'),
      args: Joi.array().items(Joi.string().max(65_536)).min(1).max(512).required().description('virsh\'s arguments after -q -c <uri>'),
      input: Joi.string().max(16 << 20).allow('').description('what virsh reads on stdin (define and create with XML on "/dev/stdin")'),
      timeout_ms: Joi.number().integer().min(1000).max(6 * 3_600_000).default(600_000),
    }),
    description: 'one virsh command for the daemon\'s /virt routes, its health probe and a plan\'s target checks, run by a worker with libvirt_access ' +
                 '(submitted by the daemon only)',
  },
  virt_clone: {
    // POST /virt/clone, /virt/clone/multiple, /virt/template/create and /deploy when FERRY_LIBVIRT_VIA=worker: virt-clone
    // runs whole on a worker with libvirt_access (services/worker/operations/virt-clone.ts), its virsh there too.
    // Not on the call lane: a clone copies disks. Sealing and customizing run virt-sysprep and virt-customize
    // (libguestfs, its appliance as for the repair): a worker with mount_operations too.
    capabilities: ['libvirt_access'],
    capabilitiesFor: (p) => (virtCloneUsesGuestfs(p) ? ['libvirt_access', 'mount_operations'] : ['libvirt_access']),
    submittedBy: 'daemon',
    needsImage: false,
    parameters: Joi.object({
      uri: virtUriSchema.required().description('one of FERRY_LIBVIRT_URI(S), checked again on the worker'),
      action: Joi.string().valid('clone', 'clone_multiple', 'template_create', 'template_deploy').required(),
      body: Joi.object().unknown(true).required().description(
        'the route\'s request body; the worker validates it again with the route\'s own schema (domain/schemas/virt.ts)'),
    }),
    description: 'a clone or template route of the daemon run whole on a worker with libvirt_access and virt-clone, with mount_operations too when it seals ' +
                 'or customizes (virt-sysprep, virt-customize) (submitted by the daemon only, for an admin)',
  },
  virt_files: {
    // POST /import/kvm, /virt/template/export and /virt/volume/upload when FERRY_LIBVIRT_VIA=worker: routes that read
    // or write host files (the image, the export folder, the upload's source) and run qemu-img beside virsh, run whole on a worker with libvirt_access and
    // img_tool (services/worker/operations/virt-files.ts). Not on the call lane: they copy disks.
    capabilities: ['libvirt_access', 'img_tool'],
    submittedBy: 'daemon',
    needsImage: false,
    parameters: Joi.object({
      uri: virtUriSchema.required().description('one of FERRY_LIBVIRT_URI(S), checked again on the worker'),
      action: Joi.string().valid('import_kvm', 'template_export', 'volume_upload').required(),
      body: Joi.object().unknown(true).required().description(
        'the route\'s request body; the worker validates it again with the route\'s own schema (domain/schemas/virt.ts)'),
    }),
    paths: (spec) => virtFilesPaths(spec.parameters),
    description: 'POST /import/kvm, /virt/template/export or /virt/volume/upload of the daemon run whole on a worker with libvirt_access and qemu-img ' +
                 '(img_tool), its files confined to that worker\'s roots (submitted by the daemon only, for an admin)',
  },
  virt_console: {
    // The /virt/console WebSocket when FERRY_LIBVIRT_VIA=worker: `virsh console` runs on a worker with libvirt_access
    // for the session's life, its bytes relayed over Redis (orchestration/console-jobs.ts). On the job lane: a session holds
    // its slot as long as someone watches, which must not starve the call lane.
    capabilities: ['libvirt_access'],
    submittedBy: 'daemon',
    needsImage: false,
    parameters: Joi.object({
      uri: virtUriSchema.required().description('one of FERRY_LIBVIRT_URI(S), checked again on the worker'),
      name: domainName.required(),
      force: Joi.boolean().default(false).description('take the console from whoever holds it (virsh console --force)'),
    }),
    description: 'a VM console session of the daemon\'s /virt/console WebSocket, `virsh console` run on a worker with libvirt_access, bytes both ways over ' +
                 'Redis (submitted by the daemon only; the WebSocket\'s roles apply)',
  },
  // The plan runner's side effects on a target host and on the source (orchestration/plan-runner.ts), run on workers with
  // the tools they need (services/worker/operations/plan-effects.ts), never on the daemon.
  rollback_kvm: {
    capabilities: ['libvirt_access'],
    capabilitiesFor: (p) => ((p as { power_on_source?: boolean }).power_on_source ? ['libvirt_access', 'vsphere_access'] : ['libvirt_access']),
    needsImage: false,
    submittedBy: 'plan',
    // A rollback goes before the plan's next migrations and an admin's rollback call waits on it: a few virsh
    // calls by UUID and key, on the call lane. Still claimed once, by the ledger only, and audited (plan-effects).
    lane: 'call',
    parameters: Joi.object({
      of_job: ofJob,
      power_on_source: Joi.boolean().default(false).description('power the named job\'s source VM back on (it was on before the plan powered it off)'),
    }),
    description: 'a plan VM\'s rollback: removes what the named job\'s ledger lists (domains by UUID, volumes by key) and powers its source back on; only ' +
                 'the plan runner submits it',
  },
  remove_source: {
    capabilities: ['vsphere_access'],
    needsImage: false,
    submittedBy: 'plan',
    role: 'admin',
    parameters: Joi.object({ of_job: ofJob }),
    description: 'a plan VM\'s options.remove_source: deletes the source VM of the named completed migrate_vm job on its manager; only the plan runner ' +
                 'submits it, as a starter with the admin role',
  },
};

export function operationNames(): string[] {
  return Object.keys(OPERATIONS);
}
