// The daemon's Remote VMs endpoints (/vms/list, /vms/info, /vms/shutdown, /vms/poweroff, /vms/remove-cdrom,
// /vms/discover; also under /api/v1): thin wiring onto domain/vsphere. Credentials come from the request, else
// from GOVC_*; errors keep the daemon's shape and name the manager, never the password.
import Joi from 'joi';
import type Koa from 'koa';
import type { Api } from '../../platform/http';
import { ApiError, fieldError } from '../../platform/errors';
import { managerFor, managerName } from '../../domain/vsphere/client';
import { listResources } from '../../domain/vsphere/resources';
import { configuredManagers, resolveCredentials } from '../../domain/vsphere/credentials';
import { checkInsecure } from '../../domain/vsphere/job-credentials';
import type { ApiKey } from '../../platform/auth';
import { config } from '../../platform/config';
import { managerJobFields } from '../../domain/daemon-jobs';
import { checkPasswordStorable, storePassword } from '../../domain/vsphere/job-credentials';
import { refuseGuarded } from '../../orchestration/vm-guard';
import { internalSpec, runWorkerJob, VSPHERE_ERROR_FIELD, type WorkerJobDeps } from '../../orchestration/worker-jobs';
import { httpStatusOf, VsphereError, type VsphereErrorKind } from '../../domain/vsphere/errors';
import { listVms, pathByName, vmDetail, type VmDetail } from '../../domain/vsphere/inventory';
import { removeCdroms } from '../../domain/vsphere/actions';
import { daemonErrorSchema } from '../../domain/schemas/daemon';
import {
  CREDENTIAL_HEADERS, vmActionBody, vmDetailResponse, vmInfoQuery, vmListQuery, vmListResponse, vmManagersResponse, vmResourcesResponse,
  type ManagerInput,
} from '../../domain/schemas/vms';
import { callerOf } from './route-kit';

const err = (description: string) => ({ description, schema: daemonErrorSchema });
const message = Joi.object({ message: Joi.string() });

function manager(q: ManagerInput, caller: ApiKey | null | undefined) {
  const field = q.server !== undefined ? 'server' : 'manager_url';
  checkInsecure(caller, q.server ?? q.manager_url, q.insecure, 'insecure');
  try {
    return managerFor(resolveCredentials({ manager_url: q.server ?? q.manager_url, username: q.username, password: q.password, insecure: q.insecure }));
  } catch (e) {
    const msg = e instanceof VsphereError ? e.message : `manager_url is not a valid URL: ${(e as Error).message}`;
    const f = msg.startsWith('password:') ? 'password' : field;
    throw fieldError(400, f, msg, f === 'server' ? msg.replace(/^manager_url/, 'server') : msg);
  }
}

/** The query's manager with the credentials of the request's headers (CREDENTIAL_HEADERS; the query refuses them). */
function withHeaderCreds(ctx: Koa.Context, q: ManagerInput): ManagerInput {
  const username = ctx.get(CREDENTIAL_HEADERS.username) || undefined;
  const password = ctx.get(CREDENTIAL_HEADERS.password) || undefined;
  if (username && username.length > 256) {
    throw fieldError(400, 'X-VSphere-Username', 'longer than 256 characters', 'X-VSphere-Username: longer than 256 characters');
  }
  if (password && password.length > 1024) {
    throw fieldError(400, 'X-VSphere-Password', 'longer than 1024 characters', 'X-VSphere-Password: longer than 1024 characters');
  }
  return { ...q, username, password };
}

/** A client error as the daemon's: 401 wrong login, 404 unknown VM, 409 wrong power state, 502 manager away. */
async function vsphere<T>(f: () => Promise<T>): Promise<T> {
  try { return await f(); } catch (e) {
    if (e instanceof VsphereError) throw new ApiError(httpStatusOf(e), e.message);
    throw e;
  }
}

// The answer leaves out vSphere's internal references (the moref, device keys).
const detail = ({ moref: _m, ...d }: VmDetail) => ({
  ...d,
  disks: d.disks.map(({ key: _k, controller_key: _c, unit_number: _u, ...x }) => x),
  nics: d.nics.map(({ key: _k, ...x }) => x),
  cdroms: d.cdroms.map(({ key: _k, ...x }) => x),
});

type VmAction = Omit<ManagerInput, 'server'> & { vm_path: string };

/** A power action as the job of the internal operation vm_power, run by a worker with vsphere_access (the daemon
 *  stays Node only, issue 38 item 2), awaited up to FERRY_VM_ACTION_WAIT_SECONDS: the answer comes once it is done,
 *  as when the daemon acted itself. A password given is stored sealed beside the job, never in clear in Redis. */
async function powerJob(d: WorkerJobDeps, body: VmAction, action: 'shutdown' | 'poweroff', caller: ApiKey | null): Promise<string> {
  checkPasswordStorable('password', body.password);
  const wait = config.vmActionWaitSeconds;
  const spec = internalSpec('vm_power', { ...managerJobFields(body), vm_path: body.vm_path, action }, { timeoutSeconds: wait });
  const { redis, k } = d.life.store;
  const what = `${action === 'poweroff' ? 'the power-off' : 'the guest shutdown'} of ${body.vm_path}`;
  const end = await runWorkerJob(d, spec, {
    caller, waitMs: wait * 1000, meta: { vm_path: body.vm_path },
    beforeSubmit: async () => { if (body.password) await storePassword(redis, k, spec.job_id, body.password, wait + 600); },
  });
  if (end.outcome === 'unserved') {
    throw new ApiError(503, `${what} was not done: it runs as a job for a worker with vsphere_access, and ${end.reason}`, { retryAfter: 30 });
  }
  if (end.outcome === 'timeout') {
    throw new ApiError(504, `${what} did not finish within ${wait} s (FERRY_VM_ACTION_WAIT_SECONDS); its job ${end.job_id} was cancelled`
      + `${end.waiting_reason ? ` (it was waiting: ${end.waiting_reason})` : ''}`);
  }
  if (end.state === 'COMPLETED') return String((end.result as { message?: string } | null)?.message ?? `${what} is done`);
  if (end.state === 'CANCELLED') throw new ApiError(409, `${what} was not done: its job ${end.job_id} was cancelled`);
  // vSphere's refusal, as the daemon answered it when it acted itself (401, 404, 409, 502).
  const kind = end.record[VSPHERE_ERROR_FIELD] as VsphereErrorKind | undefined;
  throw new ApiError(kind ? httpStatusOf(new VsphereError(kind, '')) : 502, end.error ?? `${what} failed (job ${end.job_id})`);
}

/** The errors every vms route documents: invalid input, refused login, unknown VM, manager out of reach. */
function vmErrors() {
  return {
    400: err('invalid input (names the field)'),
    401: err('the manager refused the login (the password is never echoed)'),
    404: err('no VM at that path'),
    502: err('the manager cannot be reached or its certificate is not trusted (names the manager)'),
  };
}

type VmErrors = ReturnType<typeof vmErrors>;

/** Registers the read routes /vms/list, /vms/managers, /vms/resources and /vms/info, in that order. */
function addVmReadRoutes(api: Api, errors: VmErrors) {
  api.add({
    method: 'get', role: 'read', path: '/vms/list',
    summary: 'VMs of a vSphere manager (query server, insecure; headers X-VSphere-Username, X-VSphere-Password; defaults GOVC_*; '
      + 'credentials in the query are refused, 400)',
    tags: ['vms'], query: vmListQuery,
    responses: { 200: { description: 'VMs', schema: vmListResponse }, ...errors },
    handler: async (ctx, { query }) => {
      const m = manager(withHeaderCreds(ctx, query), callerOf(ctx));
      const vms = await vsphere(() => listVms(m));
      return { vms: vms.map(({ moref: _m, ...v }) => v), total: vms.length, manager: m.name };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/vms/managers',
    summary: 'The vSphere managers this daemon is configured for (GOVC_URL and the FERRY_VSPHERE_MANAGERS entries that name one endpoint), '
      + 'without credentials',
    tags: ['vms'],
    responses: { 200: { description: 'managers', schema: vmManagersResponse } },
    handler: () => Promise.resolve({ managers: configuredManagers().map((x) => ({ ...x, name: managerName(x.url) })) }),
  });
  api.add({
    method: 'get', role: 'read', path: '/vms/resources',
    summary: "A manager's datastores (capacity, free space) and networks (port groups too): the left side of a plan's storage_map and network_map",
    tags: ['vms'], query: vmListQuery,
    responses: { 200: { description: 'datastores and networks', schema: vmResourcesResponse }, ...errors },
    handler: async (ctx, { query }) => {
      const m = manager(withHeaderCreds(ctx, query), callerOf(ctx));
      return { manager: m.name, ...await vsphere(() => listResources(m)) };
    },
  });
  api.add({
    method: 'get', role: 'read', path: '/vms/info', summary: 'One VM in detail (by path, or by name when unique): hardware, disks, NICs, firmware, snapshots',
    tags: ['vms'], query: vmInfoQuery,
    responses: { 200: { description: 'the VM', schema: vmDetailResponse }, ...errors, 409: err('several VMs have that name') },
    handler: async (ctx, { query }) => {
      const m = manager(withHeaderCreds(ctx, query), callerOf(ctx));
      return detail(await vsphere(async () => vmDetail(m, query.path !== undefined ? query.path : await pathByName(m, query.name))));
    },
  });
}

/** Registers the admin actions /vms/shutdown, /vms/poweroff and /vms/remove-cdrom, in that order. */
function addVmActionRoutes(api: Api, d: WorkerJobDeps, errors: VmErrors) {
  const store = d.life.store;
  // Powering off or reconfiguring a source VM directly (not as a job's recorded step) changes the source
  // environment, with the daemon's default credentials when none are given: admin (docs/security.md).
  // A VM a job is exporting is refused with a 409 naming that job (orchestration/vm-guard.ts).
  type Run = (m: ReturnType<typeof manager>, body: VmAction, caller: ApiKey | null) => Promise<string>;
  const action = (path: string, summary: string, run: Run, more: Record<number, ReturnType<typeof err>> = {}) => api.add({
    method: 'post', role: 'admin', path, summary, tags: ['vms'], body: vmActionBody,
    responses: {
      200: { description: 'done', schema: message },
      ...errors,
      409: err('the VM is in the wrong state for this (already off, tools not running), or a job is exporting it (names the job)'),
      ...more,
    },
    handler: async (ctx, { body }) => {
      const m = manager(body, callerOf(ctx));
      await refuseGuarded(store.redis, store.k, m.name, body.vm_path, `${path.slice(1)} of ${body.vm_path}`);
      return { message: await vsphere(() => run(m, body, callerOf(ctx) ?? null)) };
    },
  });
  const powerErrors = {
    503: err('no active worker has vsphere_access: nothing was done'),
    504: err('not done within FERRY_VM_ACTION_WAIT_SECONDS: its job was cancelled'),
  };
  const power = (path: string, summary: string, act: 'shutdown' | 'poweroff') => action(
    path, summary, (_m, body, caller) => powerJob(d, body, act, caller), powerErrors,
  );
  power('/vms/shutdown', 'Graceful guest shutdown (needs VMware Tools running); returns once the guest is asked. '
    + 'Runs as a vm_power job on a worker with vsphere_access', 'shutdown');
  power('/vms/poweroff', 'Forced power-off (a task, waited on). Runs as a vm_power job on a worker with vsphere_access', 'poweroff');
  action('/vms/remove-cdrom', 'Remove every CD-ROM device (one reconfigure task)', async (m, { vm_path: p }) => {
    const removed = await removeCdroms(m, p);
    return removed.length ? `removed ${removed.length} CD-ROM device(s) from ${p}: ${removed.join(', ')}` : `${p} has no CD-ROM devices`;
  });
}

/** Registers /vms/discover: the default manager's whole inventory with counts by power state. */
function addVmDiscoverRoute(api: Api, errors: VmErrors) {
  api.add({
    method: 'get', role: 'read', path: '/vms/discover',
    summary: 'The whole VM inventory of the default manager (GOVC_URL), with counts by power state', tags: ['vms'],
    responses: {
      200: {
        description: 'inventory',
        schema: vmListResponse.keys({
          by_power_state: Joi.object().pattern(Joi.string(), Joi.number().integer()), datacenters: Joi.array().items(Joi.string()), timestamp: Joi.string(),
        }),
      },
      ...errors,
    },
    handler: async () => {
      const m = manager({}, null);
      const vms = await vsphere(() => listVms(m));
      const by: Record<string, number> = {};
      for (const v of vms) by[v.power_state] = (by[v.power_state] || 0) + 1;
      return {
        vms: vms.map(({ moref: _m, ...v }) => v), total: vms.length, manager: m.name, by_power_state: by,
        datacenters: [...new Set(vms.map((v) => v.path.split('/vm/')[0].slice(1)))], timestamp: new Date().toISOString(),
      };
    },
  });
}

export function addVmRoutes(api: Api, d: WorkerJobDeps) {
  const errors = vmErrors();
  addVmReadRoutes(api, errors);
  addVmActionRoutes(api, d, errors);
  addVmDiscoverRoute(api, errors);
}
