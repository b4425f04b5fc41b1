// Migration plans (/plans on the daemon, docs/plans.md) as joi schemas: one source for validation, the types
// the store uses and /openapi.yaml.
import Joi from 'joi';
import { migrationJobSchema } from './daemon';
import { virtUriSchema } from '../libvirt/uri';
import { confusableName, virtName } from '../libvirt/names';
import { targetName as nameFor } from '../plans/names';
import type { PlanCreate } from '../plans/types';
import { PLAN_STATUSES, PLAN_VM_STATUSES } from '../plan-states';
import { ROLES } from '../../platform/auth';
import type { TargetNameRule } from '../plans/names';

const vmPath = Joi.string().pattern(/^\/[^/]+\/vm\/.+/).max(1024)
  .messages({ 'string.pattern.base': '{{#label}} must look like /<datacenter>/vm/<folder>/<vm-name>' });
const mapName = Joi.string().min(1).max(256);
const planId = Joi.string().pattern(/^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/)
  .messages({ 'string.pattern.base': '{{#label}} must be 1-64 letters, digits, "_" or "-"' });

export const SEVERITIES = ['blocker', 'warning', 'info'] as const;

// The plan's options (and each VM's overrides) are the shape B job's options (one definition), without what the
// plan decides itself, plus the plan's rollback policy.
const jobOptions = (migrationJobSchema.extract('options') as Joi.ObjectSchema).keys({ network_mapping: Joi.forbidden() });
export const POWER_STATES = ['poweredOn', 'poweredOff', 'suspended'] as const;
export const PLACEMENTS = ['round_robin', 'most_free_memory'] as const;

const targetName = Joi.object({
  template: Joi.string().min(1).max(200).pattern(/^([^{}]|\{(name|datacenter|folder)\})*$/).default('{name}')
    .messages({ 'string.pattern.base': '{{#label}} may use only the placeholders {name}, {datacenter} and {folder}' })
    .description('the domain name; placeholders {name} (the VM\'s), {datacenter}, {folder} (the VM\'s folder below vm/, "" at the top)'),
  prefix: Joi.string().max(100).allow('').default(''),
  suffix: Joi.string().max(100).allow('').default(''),
  lowercase: Joi.boolean().default(false),
}).custom((rule: TargetNameRule, h) => {
  // A rule without placeholders names every VM the same: judged here; the others per VM at validate (preflight.ts).
  if (/\{/.test(rule.template ?? '{name}')) return rule;
  const name = nameFor(rule, { name: '', vm_path: '/-/vm/-' });
  const why = confusableName(name);
  return why ? h.error('string.confusable', { name, why }) : rule;
}).messages({
  'string.confusable': 'gives every VM the domain name "{{#name}}", which virsh could take for another domain: it {{#why}}; give a name with a letter',
})
  .label('PlanTargetName').description('the target domain name: prefix + template + suffix, lowercased when asked; characters libvirt refuses become "-"');

// Options that only the plan understands (the runner takes them out before a VM's job is built).
export const PLAN_ONLY_OPTIONS = ['rollback', 'remove_source', 'target_name', 'guest_preflight'] as const;
const planOptions = jobOptions.keys({
  rollback: Joi.boolean().default(true)
    .description('on failure after the source was powered off: remove what Ferry created on the target, power the source back on'),
  remove_source: Joi.boolean().default(false)
    .description('after the VM\'s job completed (its boot check passed): delete the source VM on vSphere; default false (keep)'),
  target_name: targetName,
  guest_preflight: Joi.boolean().description('read the guest on its datastore before the copy (guest_* findings; default FERRY_GUEST_PREFLIGHT, on)'),
});

const limit = Joi.number().integer().min(1).max(1000);
export const planLimitsSchema = Joi.object({
  per_plan: limit.default(4).description('VMs of this plan in flight at once'),
  per_esxi_host: limit.default(2).description('exports at once from one ESXi host (all plans)'),
  per_datastore: limit.default(3).description('exports at once reading one datastore (all plans)'),
  per_target_host: limit.default(4).description('migrations at once onto one virt_uri (all plans)'),
}).default().label('PlanLimits');

const window = Joi.object({ start: Joi.date().iso().required(), end: Joi.date().iso().greater(Joi.ref('start')).required() }).label('PlanWindow');

const planVmEntry = Joi.alternatives().try(vmPath, Joi.object({
  vm_path: vmPath.required(),
  options: planOptions.prefs({ noDefaults: true }).description('per-VM overrides of the plan options (only what is given overrides)'),
}))
  .description('a VM path, or {vm_path, options} with per-VM overrides');

const selector = Joi.object({
  folder: Joi.string().pattern(/^\/[^/]+\/vm(\/.*)?$/).max(1024).messages({ 'string.pattern.base': '{{#label}} must look like /<datacenter>/vm or /<datacenter>/vm/<folder>' })
    .description('VMs in this inventory folder or below it'),
  name: Joi.string().min(1).max(256).description('a glob on the VM\'s name: * any characters, ? one character (case-sensitive)'),
  power_state: Joi.string().valid(...POWER_STATES),
}).min(1).label('PlanSelector').description('every given field must match; resolved on validate and start while the plan has not started');

const planFields = {
  name: Joi.string().min(1).max(256),
  description: Joi.string().allow('').max(4096),
  source: Joi.object({
    manager_url: Joi.string().uri({ scheme: ['http', 'https'] }).max(2048).description('default GOVC_URL; one of FERRY_VSPHERE_MANAGERS'),
    insecure: Joi.boolean(),
  }).description('the vSphere manager; its credentials come from the environment (plans are stored in Redis, so never carry a password)'),
  vms: Joi.array().items(planVmEntry).max(10_000)
    .description('at most FERRY_PLAN_MAX_VMS (default 1000) with the selected ones; 10,000 is the body\'s own bound'),
  selectors: Joi.array().items(selector).min(1).max(20)
    .description('VMs chosen by folder, name glob and power state (a VM matching any selector is in the plan)'),
  destination: Joi.object({
    type: Joi.string().valid('kvm').default('kvm'),
    virt_uri: virtUriSchema.description('target host (default FERRY_LIBVIRT_URI); one of FERRY_LIBVIRT_URIS'),
    virt_uris: Joi.array().items(virtUriSchema).min(1).max(64).unique()
      .description('several target hosts, each one of FERRY_LIBVIRT_URIS; VMs are spread over them by placement'),
    placement: Joi.string().valid(...PLACEMENTS).default('round_robin')
      .description('round_robin: in turn, in the order of virt_uris; most_free_memory: the host with the most free memory '
        + '(libvirt\'s nodememstats) after the plan\'s VMs already placed there'),
  }).oxor('virt_uri', 'virt_uris'),
  network_map: Joi.object().pattern(mapName, virtName)
    .description('source network or port group -> target network (a name libvirt and Ferry accept: no spaces)'),
  storage_map: Joi.object().pattern(mapName, virtName)
    .description('source datastore -> target storage pool (a name libvirt and Ferry accept: no spaces)'),
  options: planOptions,
  limits: planLimitsSchema,
  start_at: Joi.date().iso().description('no VM starts before this time'),
  windows: Joi.array().items(window).max(100).description('VMs start only inside one of these; what runs at a window end finishes'),
};

// source defaults to {} here, so a validated body always has it.
export const planCreateSchema = Joi.object<PlanCreate & Required<Pick<PlanCreate, 'source'>>>({
  ...planFields,
  id: planId,
  name: planFields.name.required(),
  destination: planFields.destination.default({ type: 'kvm' }),
  network_map: planFields.network_map.required(),
  storage_map: planFields.storage_map.required(),
  options: planOptions.default({}),
  source: planFields.source.default({}),
}).or('vms', 'selectors').label('PlanCreate');

export const planUpdateSchema = Joi.object<Partial<PlanCreate>>(planFields).min(1).label('PlanUpdate');

export const findingSchema = Joi.object({
  rule: Joi.string(), severity: Joi.string().valid(...SEVERITIES), message: Joi.string(), fix: Joi.string(),
  overridable: Joi.boolean().description('whether POST /plans/{id}/overrides accepts this rule'),
  overridden: Joi.object({ by: Joi.string(), at: Joi.string().isoDate(), reason: Joi.string().allow('') }).description('a blocker an operator accepted'),
  guest: Joi.object().unknown(true)
    .description('guest_inspected only: OS, boot loader, file systems, free bytes, files_changed and packages_removed by the repair, '
      + 'network files it rewrites'),
}).label('PlanFinding');

export const overrideSchema = Joi.object<{ vm_path: string; rule: string; reason: string }>({
  vm_path: vmPath.required(), rule: Joi.string().max(64).required(), reason: Joi.string().allow('').max(1024).default(''),
}).label('PlanOverride');

export const planCutoverSchema = Joi.object<{ vm_path?: string }>({
  vm_path: vmPath.description('only this VM; without it, every warm VM of the plan that is copying'),
}).label('PlanCutover');
export const planVmCancelSchema = Joi.object<{ vm_path?: string }>({
  vm_path: vmPath.description('only this VM; without it, the whole plan'),
}).label('PlanCancel');

const placementSchema = Joi.object({
  esxi_host: Joi.string(), datastores: Joi.array().items(Joi.string()), virt_uri: Joi.string(), pool: Joi.string(),
  domain: Joi.string().description('the target domain name (options.target_name)'),
}).unknown(true).description('where the VM runs on the target: its host (by the plan\'s placement rule), pool and domain name').label('PlanPlacement');

export const planVmSchema = Joi.object({
  vm_path: Joi.string(), status: Joi.string().valid(...PLAN_VM_STATUSES), job_id: Joi.string().allow(null),
  findings: Joi.array().items(findingSchema), waiting_reason: Joi.string().allow(null), error: Joi.string().allow(null),
  stage: Joi.string().allow(null), bytes_done: Joi.number().integer(), total_bytes: Joi.number().integer(),
  rate_bytes_per_second: Joi.number().integer().allow(null).description('its job\'s transfer rate while it runs'),
  eta_seconds: Joi.number().integer().allow(null),
  placement: placementSchema,
  warm: Joi.object({
    status: Joi.string(),
    rounds: Joi.array().items(Joi.object().unknown(true))
      .description('each copy round: snapshot_at, changed_bytes, bytes_copied, copy_seconds, overhead_seconds'),
    prediction: Joi.object().unknown(true).allow(null).description('predicted downtime of a cutover now (seconds, parts, change and copy rates, basis)'),
    cutover: Joi.object().unknown(true).description('why and when the cutover began, the last delta'),
    cutover_requested: Joi.object().unknown(true).description('a manual cutover request (at, by)'),
    downtime: Joi.object().unknown(true).description('measured: power-off to the boot milestone, split into power_off, last_delta, repair, import, boot'),
  }).unknown(true).description('a warm VM (options.warm): its rounds, prediction and cutover (docs/plans.md, Warm migration)'),
  selected_by: Joi.array().items(Joi.number().integer()).description('the selectors (their index) that chose this VM; absent for a listed VM'),
  source: Joi.object({ action: Joi.string().valid('removed', 'kept', 'remove_failed'), at: Joi.string().isoDate(), detail: Joi.string() })
    .description('what happened to the source VM after success (options.remove_source)'),
  jobs: Joi.array().items(Joi.string()).description('every job this VM ran, oldest first'),
  actions: Joi.array().items(Joi.object({
    action: Joi.string().valid('submit', 'rollback', 'remove_source'),
    key: Joi.string().description('the job it is for (api-<time>-<random>: a rollback through the API)'),
    claimed_by: Joi.string(), fence: Joi.number().integer().allow(null).description('the plan leader lease\'s token (null: through the API)'),
    at: Joi.string().isoDate(), done_at: Joi.string().isoDate().allow(null), result: Joi.any(),
    resumed: Joi.number().integer().description('times a later leader took the claim over'),
  }).label('PlanVmAction')).description('each side effect done for this VM, claimed before it was done (docs/plans.md, Claims)'),
}).unknown(true).label('PlanVm');

const planCallerSchema = Joi.object({
  name: Joi.string().description('the API key\'s name; "anonymous" with authentication off'),
  role: Joi.string().valid(...ROLES).allow(null).description('the key\'s role; null with authentication off'),
}).label('PlanCaller');

export const planSchema = Joi.object({
  id: Joi.string(), name: Joi.string(), status: Joi.string().valid(...PLAN_STATUSES), archived: Joi.boolean(),
  created_at: Joi.string().isoDate(), updated_at: Joi.string().isoDate(), started_at: Joi.string().isoDate().allow(null),
  finished_at: Joi.string().isoDate().allow(null), created_by: planCallerSchema.description('who created the plan'),
  started_by: planCallerSchema.allow(null)
    .description('who started the plan (or last retried it): every job the plan submits carries this caller, and is checked as its direct request would be '
      + '(docs/plans.md, "What each role may do through a plan")'),
  counts: Joi.object().pattern(Joi.string(), Joi.number().integer()).description('VMs per status'),
  vms: Joi.array().items(planVmSchema),
}).unknown(true).label('Plan');

export const validateResponseSchema = Joi.object({
  plan_id: Joi.string(), blockers: Joi.number().integer(), warnings: Joi.number().integer(),
  vms: Joi.array().items(Joi.object({ vm_path: Joi.string(), findings: Joi.array().items(findingSchema), placement: placementSchema })),
}).label('PlanValidation');

export const planIdParams = Joi.object<{ id: string }>({ id: planId.required() });
export const planListQuery = Joi.object<{ archived: boolean }>({ archived: Joi.boolean().default(false).description('list archived plans instead') });
