// The daemon's Remote VMs resources (/vms/*) as joi schemas: validation and /openapi.yaml from one source.
import Joi from 'joi';
import { refuseManagerScheme } from '../vsphere/credentials';
import { declareHeaders } from '../../platform/openapi';

const vmPath = Joi.string().pattern(/^\/[^/]+\/vm\/.+/).max(1024)
  .messages({ 'string.pattern.base': '{{#label}} must look like /<datacenter>/vm/<folder>/<vm-name>' });
/** A vSphere manager a caller names: https:// or a bare host; http:// and other schemes are refused by name. */
export const managerUrlSchema = Joi.string().max(2048).custom((v: string, h) => {
  const r = refuseManagerScheme(v);
  return r ? h.message({ custom: `{{#label}} ${r}` }) : v;
});
const manager = managerUrlSchema.description('manager URL (https://host/sdk) or host; default GOVC_URL');
const creds = {
  username: Joi.string().max(256).description('default GOVC_USERNAME'),
  password: Joi.string().max(1024).description('default GOVC_PASSWORD; never logged or returned'),
  insecure: Joi.boolean().description('accept an untrusted TLS certificate (default GOVC_INSECURE)'),
};

/** The headers a GET of /vms/* takes its credentials from: a query string is kept in proxy logs, browser
 *  histories and Referer headers, so credentials there are refused (400 naming the field), never read. */
export const CREDENTIAL_HEADERS = { username: 'x-vsphere-username', password: 'x-vsphere-password' } as const;
/** Those headers as the routes taking vmListQuery or vmInfoQuery declare them (declareHeaders): validated by the
 *  HTTP layer and offered by Swagger UI as header parameters. */
const credentialHeaders = Joi.object({
  'X-VSphere-Username': creds.username.description('the vSphere user; default GOVC_USERNAME'),
  'X-VSphere-Password': creds.password.description('its password; default GOVC_PASSWORD; never logged or returned'),
}).label('VSphereCredentialHeaders');
const notInQuery = (h: string) => Joi.any().forbidden()
  .messages(
    { 'any.unknown': `{{#label}} is never accepted in the query string (it would be kept in logs and histories): send the ${h} header (or a body on POST)` });
const queryCreds = {
  username: notInQuery('X-VSphere-Username'), password: notInQuery('X-VSphere-Password'),
  insecure: creds.insecure,
};

/** A manager and its credentials as a request names them (each defaults to GOVC_*; on a GET the credentials come
 *  from CREDENTIAL_HEADERS). */
export interface ManagerInput { server?: string; manager_url?: string; username?: string; password?: string; insecure?: boolean }
export const vmListQuery = declareHeaders(Joi.object<ManagerInput>({ server: manager, manager_url: manager, ...queryCreds }).oxor('server',
  'manager_url').label('VmListQuery'), credentialHeaders);

/** xor() below: a path or a name. */
type VmInfoQuery = ManagerInput & ({ path: string; name?: undefined } | { path?: undefined; name: string });
export const vmInfoQuery = Joi.object<VmInfoQuery>({
  path: vmPath, name: Joi.string().max(256).description('a VM name, when only one VM has it'),
  server: manager, manager_url: manager, ...queryCreds,
}).xor('path', 'name').oxor('server', 'manager_url')
  .messages({ 'object.missing': '{{#label}} must contain path or name', 'object.xor': '{{#label}} must contain only one of path or name' })
  .label('VmInfoQuery');
declareHeaders(vmInfoQuery, credentialHeaders);

export const vmActionBody = Joi.object<Omit<ManagerInput, 'server'> & { vm_path: string }>(
  { vm_path: vmPath.required(), manager_url: manager, ...creds }).label('VmAction');

export const vmListItem = Joi.object({
  name: Joi.string(), path: Joi.string(), power_state: Joi.string(), num_cpu: Joi.number().integer(), memory_mb: Joi.number().integer(),
  storage: Joi.number().integer().description('bytes committed on datastores'), guest_os: Joi.string().allow(''), ip_address: Joi.string().allow(''),
  template: Joi.boolean(),
  datastores: Joi.array().items(Joi.string()).description('names of the datastores the VM uses'),
  networks: Joi.array().items(Joi.string()).description('names of the networks and port groups its NICs are on'),
}).label('RemoteVm');

export const vmListResponse = Joi.object({ vms: Joi.array().items(vmListItem), total: Joi.number().integer(), manager: Joi.string() }).label('RemoteVmList');

export const vmDetailResponse = Joi.object({
  name: Joi.string(), path: Joi.string(), uuid: Joi.string(), instance_uuid: Joi.string(), power_state: Joi.string(), tools_status: Joi.string(),
  guest_id: Joi.string().allow(''), guest_os: Joi.string().allow(''), ip_address: Joi.string().allow(''), firmware: Joi.string(),
  hardware: Joi.object({ num_cpu: Joi.number().integer(), memory_mb: Joi.number().integer(), num_virtual_disks: Joi.number().integer(),
    version: Joi.string().allow('') }),
  disks: Joi.array().items(Joi.object({ label: Joi.string(), capacity_kb: Joi.number().integer(), capacity_bytes: Joi.number().integer(),
    file_path: Joi.string(), chain: Joi.array().items(Joi.string()).description('backing files, top first (snapshot deltas down to the base)') })),
  nics: Joi.array().items(Joi.object({ label: Joi.string(), mac: Joi.string(), network: Joi.string().allow(''), adapter: Joi.string() })),
  cdroms: Joi.array().items(Joi.object({ label: Joi.string(), backing: Joi.string().allow('') })),
  snapshots: Joi.array().items(Joi.object().unknown(true)).description('the snapshot tree: name, description, created, children'),
  current_snapshot: Joi.string().allow(null), datacenter: Joi.string(),
}).label('RemoteVmDetail');

export const vmResourcesResponse = Joi.object({
  manager: Joi.string(),
  datastores: Joi.array().items(Joi.object({ name: Joi.string(), type: Joi.string().allow(''), capacity: Joi.number().integer().description('bytes'),
    free_space: Joi.number().integer().description('bytes') })),
  networks: Joi.array().items(Joi.object({ name: Joi.string(), type: Joi.string().valid('network', 'portgroup') })),
}).label('RemoteResources');

export const vmManagersResponse = Joi.object({
  managers: Joi.array().items(Joi.object({ url: Joi.string().description('pass as server= (no user information)'), name: Joi.string(),
    default: Joi.boolean().description("GOVC_URL's") })),
}).label('RemoteManagers');
