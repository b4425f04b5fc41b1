// The `ferry` command: the daemon's inventory and migration plans for operators and scripts.
//   ferry vms list [--server URL] [--name PATTERN] [--power on|off]    ferry vms info VM_PATH
//   ferry plan create (--file plan.yaml | --name N --vm PATH... --virt-uri URI --network-map SRC=DST... --storage-map SRC=DST...)
//   ferry plan list | status ID | validate ID | start ID [--wait] | cancel ID [--vm PATH] | cutover ID [--vm PATH] | retry ID | rollback ID VM_PATH
//   ferry job cutover ID    (a warm migration job submitted on its own)
// Every command takes --json (the daemon's answer as JSON on stdout) and --url (else FERRY_URL); the key comes
// from FERRY_API_KEY only, so it never shows in a process list. Exit codes: 0 done, 1 error, 2 blockers found
// (validate), 3 the plan ended with VMs not migrated (start --wait).
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import yaml from 'js-yaml';
import { DaemonClient, DaemonError } from './client';
import { blockers, findingRows, planProgress, table, bytes, type Finding, type PlanView } from './render';
import type { VmSummary } from '../../domain/vsphere/inventory';
import { PLAN_FINAL } from '../../domain/plan-states';

export const EXIT = { ok: 0, error: 1, blockers: 2, notMigrated: 3 } as const;
const OPTIONS = {
  json: { type: 'boolean' }, url: { type: 'string' }, help: { type: 'boolean', short: 'h' },
  server: { type: 'string' }, name: { type: 'string' }, power: { type: 'string' },
  file: { type: 'string', short: 'f' }, vm: { type: 'string', multiple: true }, 'virt-uri': { type: 'string', multiple: true },
  'network-map': { type: 'string', multiple: true }, 'storage-map': { type: 'string', multiple: true }, option: { type: 'string', multiple: true },
  wait: { type: 'boolean' }, interval: { type: 'string' },
} as const;

type Values = ReturnType<typeof parse>['values'];
interface Io { out: NodeJS.WritableStream; err: NodeJS.WritableStream; isTTY: boolean }
type Command = (c: DaemonClient, args: string[], v: Values, io: Io) => Promise<number>;

const parse = (argv: string[]) => parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
const enc = encodeURIComponent;
const print = (io: Io, text: string) => io.out.write(`${text}\n`);
const json = (io: Io, v: unknown) => print(io, JSON.stringify(v, null, 2));
const need = (args: string[], n: number, usage: string) => { if (args.length < n) throw new UsageError(`usage: ferry ${usage}`); return args; };
class UsageError extends Error {}

/** What the CLI reads of GET /vms/info (domain/vsphere/inventory.ts's VmDetail), read defensively as the code
 *  always did: a NIC's MAC as mac_address or mac, a snapshot as a name or an object with one. */
interface VmInfo {
  path?: string; power_state?: string; hardware?: { num_cpu?: number; memory_mb?: number }; firmware?: string; uuid?: string;
  disks?: { label?: string; capacity_kb?: number; file_path?: string }[];
  nics?: { label?: string; mac_address?: string; mac?: string; network?: string }[];
  snapshots?: (string | { name: string })[];
}
/** A plan-validate answer: each VM's findings. */
interface Validation { vms?: { vm_path: string; findings?: Finding[] }[] }
/** The answer of a plan action (cancel, retry, rollback): its message, else the CLI says what it asked. */
interface ActionAnswer { message?: string }
/** A plan body as the file and the flags build it; the daemon validates it (domain/schemas/plans.ts). */
type PlanBody = Record<string, unknown> & {
  destination?: Record<string, unknown>; network_map?: Record<string, string>; storage_map?: Record<string, string>; options?: Record<string, unknown>;
};

/** SRC=DST pairs of a map flag; the source may itself hold '=' only before the last one. */
function pairs(list: string[] | undefined, flag: string): Record<string, string> | undefined {
  if (!list) return undefined;
  return Object.fromEntries(list.map((p) => {
    const i = p.lastIndexOf('=');
    if (i <= 0 || i === p.length - 1) throw new UsageError(`--${flag} takes SOURCE=TARGET, got "${p}"`);
    return [p.slice(0, i), p.slice(i + 1)];
  }));
}

/** --option key=value: true/false and numbers as such, the rest as strings; a dotted key (virt_test.expect=...)
 *  sets a nested option. */
function options(list: string[] | undefined): Record<string, unknown> | undefined {
  const raw = pairs(list, 'option');
  if (!raw) return undefined;
  const out: Record<string, unknown> = {};
  for (const [k, s] of Object.entries(raw)) {
    const keys = k.split('.');
    let at = out;
    for (const key of keys.slice(0, -1)) {
      // Only objects this loop made sit under a key, so an object found there is a Record.
      const next = typeof at[key] === 'object' ? at[key] as Record<string, unknown> : {};
      at = at[key] = next;
    }
    at[keys[keys.length - 1]] = s === 'true' ? true : s === 'false' ? false : /^-?\d+(\.\d+)?$/.test(s) ? Number(s) : s;
  }
  return out;
}

/** The plan body: the YAML (or JSON) file, then the flags over it. */
export function planBody(v: Values): PlanBody {
  // The file's shape is the daemon's to check; only "a mapping" is checked here.
  const body = (v.file ? yaml.load(readFileSync(v.file, 'utf8'), { schema: yaml.JSON_SCHEMA }) ?? {} : {}) as PlanBody;
  if (typeof body !== 'object' || Array.isArray(body)) {
    throw new UsageError(`${v.file}: a plan is a mapping (name, vms, destination, network_map, storage_map, options)`);
  }
  if (v.name) body.name = v.name;
  if (v.vm) body.vms = v.vm;
  const uris = v['virt-uri'];
  if (uris) {
    // One host is virt_uri, several are virt_uris (the plan takes one or the other, never both).
    const { virt_uri: _one, virt_uris: _many, ...rest } = body.destination || { type: 'kvm' };
    body.destination = { ...rest, ...(uris.length === 1 ? { virt_uri: uris[0] } : { virt_uris: uris }) };
  }
  const nets = pairs(v['network-map'], 'network-map'), stores = pairs(v['storage-map'], 'storage-map'), opts = options(v.option);
  if (nets) body.network_map = { ...body.network_map, ...nets };
  if (stores) body.storage_map = { ...body.storage_map, ...stores };
  if (opts) body.options = { ...body.options, ...opts };
  return body;
}

const vmsList: Command = async (c, _a, v, io) => {
  const q = new URLSearchParams(v.server ? { server: v.server } : {});
  const r = await c.call<{ vms: VmSummary[] }>('GET', `/vms/list${q.size ? `?${q.toString()}` : ''}`);
  const name = v.name ? new RegExp(`^${v.name.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*').replace(/\?/g, '.')}$`, 'i') : undefined;
  const power = v.power ? `powered${v.power[0].toUpperCase()}${v.power.slice(1).toLowerCase()}` : undefined;
  const vms = r.vms.filter((x) => (!name || name.test(x.name)) && (!power || x.power_state === power));
  if (v.json) { json(io, { ...r, vms, total: vms.length }); return EXIT.ok; }
  print(io, table(['PATH', 'POWER', 'CPU', 'MEMORY', 'STORAGE', 'GUEST OS'],
    vms.map((x) => [x.path, x.power_state, x.num_cpu, `${x.memory_mb} MiB`, bytes(x.storage), x.guest_os])));
  return EXIT.ok;
};

const vmsInfo: Command = async (c, a, v, io) => {
  const [path] = need(a, 1, 'vms info VM_PATH');
  const q = new URLSearchParams({ path, ...(v.server ? { server: v.server } : {}) });
  const d = await c.call<VmInfo>('GET', `/vms/info?${q.toString()}`);
  if (v.json) { json(io, d); return EXIT.ok; }
  print(io, `${d.path}  ${d.power_state}  ${d.hardware?.num_cpu} vCPU  ${d.hardware?.memory_mb} MiB  firmware ${d.firmware ?? 'bios'}  uuid ${d.uuid}`);
  print(io, table(['DISK', 'CAPACITY', 'FILE'], (d.disks || []).map((x) => [x.label, bytes((x.capacity_kb || 0) * 1024), x.file_path])));
  if (d.nics?.length) print(io, table(['NIC', 'MAC', 'NETWORK'], d.nics.map((x) => [x.label, x.mac_address ?? x.mac, x.network])));
  if (d.snapshots?.length) print(io, `snapshots: ${d.snapshots.map((s) => (typeof s === 'string' ? s : s.name)).join(', ')}`);
  return EXIT.ok;
};

const planCreate: Command = async (c, _a, v, io) => {
  const plan = await c.call<PlanView>('POST', '/plans', planBody(v));
  if (v.json) json(io, plan); else print(io, `plan ${plan.id} created (${(plan.vms || []).length} VMs): ferry plan validate ${plan.id}`);
  return EXIT.ok;
};

const planList: Command = async (c, _a, v, io) => {
  const r = await c.call<{ plans?: PlanView[] } | PlanView[]>('GET', '/plans');
  const plans = ('plans' in r ? r.plans : undefined) ?? (r as PlanView[]);
  if (v.json) { json(io, r); return EXIT.ok; }
  print(io, table(['ID', 'NAME', 'STATUS', 'VMS', 'CREATED'], plans.map((p) => [p.id, p.name, p.status, (p.vms || []).length || p.vm_count, p.created_at])));
  return EXIT.ok;
};

const planStatus: Command = async (c, a, v, io) => {
  const [id] = need(a, 1, 'plan status ID');
  const plan = await c.call<PlanView>('GET', `/plans/${enc(id)}`);
  if (v.json) json(io, plan); else print(io, planProgress(plan));
  return EXIT.ok;
};

const planValidate: Command = async (c, a, v, io) => {
  const [id] = need(a, 1, 'plan validate ID');
  const r = await c.call<Validation>('POST', `/plans/${enc(id)}/validate`);
  const n = blockers(r.vms || []);
  if (v.json) json(io, r);
  else {
    const rows = findingRows(r.vms || []);
    print(io, rows.length ? table(['SEVERITY', 'VM', 'RULE', 'MESSAGE', 'FIX'], rows) : 'no findings');
    print(io, n ? `${n} blocker(s): the VMs named stop unless each finding is fixed or overridden` : 'no blockers');
  }
  return n ? EXIT.blockers : EXIT.ok;
};

/** A plan's final statuses (domain/plan-states.ts): the runner ends it when every VM is final. */
export const PLAN_DONE = PLAN_FINAL as readonly string[];
const VM_MIGRATED = ['completed'];

const planStart: Command = async (c, a, v, io) => {
  const [id] = need(a, 1, 'plan start ID [--wait]');
  let plan = await c.call<PlanView>('POST', `/plans/${enc(id)}/start`);
  if (!v.wait) { if (v.json) json(io, plan); else print(io, `plan ${id} started: ferry plan status ${id}`); return EXIT.ok; }
  const every = Math.max(0.2, Number(v.interval ?? 2)) * 1000;
  let shown = 0, last = '';
  for (;;) {
    plan = await c.call<PlanView>('GET', `/plans/${enc(id)}`);
    if (!v.json) {
      const view = planProgress(plan);
      // A terminal redraws in place; a pipe or a log gets a new view only when something changed.
      if (io.isTTY) { if (shown) io.out.write(`\x1b[${shown}A\x1b[J`); print(io, view); shown = view.split('\n').length; }
      else if (view !== last) print(io, view);
      last = view;
    }
    if (PLAN_DONE.includes(plan.status ?? '')) break;
    await new Promise((r) => setTimeout(r, every));
  }
  if (v.json) json(io, plan);
  return (plan.vms || []).every((x) => VM_MIGRATED.includes(x.status ?? '')) ? EXIT.ok : EXIT.notMigrated;
};

const planCancel: Command = async (c, a, v, io) => {
  const [id] = need(a, 1, 'plan cancel ID [--vm VM_PATH]');
  const r = await c.call<ActionAnswer>('POST', `/plans/${enc(id)}/cancel`, v.vm ? { vm_path: v.vm[0] } : undefined);
  if (v.json) json(io, r); else print(io, r.message ?? `plan ${id}: cancel asked`);
  return EXIT.ok;
};

const planCutover: Command = async (c, a, v, io) => {
  const [id] = need(a, 1, 'plan cutover ID [--vm VM_PATH]');
  const plan = await c.call<PlanView>('POST', `/plans/${enc(id)}/cutover`, v.vm ? { vm_path: v.vm[0] } : undefined);
  if (v.json) json(io, plan); else print(io, `plan ${id}: cutover asked${v.vm ? ` for ${v.vm[0]}` : ''}\n${planProgress(plan)}`);
  return EXIT.ok;
};

const jobCutover: Command = async (c, a, v, io) => {
  const [id] = need(a, 1, 'job cutover JOB_ID');
  const r = await c.call<ActionAnswer>('POST', `/jobs/${enc(id)}/cutover`);
  if (v.json) json(io, r); else print(io, r.message ?? `job ${id}: cutover asked`);
  return EXIT.ok;
};

const planRetry: Command = async (c, a, v, io) => {
  const [id] = need(a, 1, 'plan retry ID');
  const r = await c.call<ActionAnswer>('POST', `/plans/${enc(id)}/retry`);
  if (v.json) json(io, r); else print(io, r.message ?? `plan ${id}: failed VMs queued again`);
  return EXIT.ok;
};

const planRollback: Command = async (c, a, v, io) => {
  const [id, vm] = need(a, 2, 'plan rollback ID VM_PATH');
  const r = await c.call<ActionAnswer>('POST', `/plans/${enc(id)}/vms/${enc(vm)}/rollback`);
  if (v.json) json(io, r); else print(io, r.message ?? `${vm}: rolled back`);
  return EXIT.ok;
};

const COMMANDS: Record<string, Command> = {
  'vms list': vmsList, 'vms info': vmsInfo,
  'plan create': planCreate, 'plan list': planList, 'plan status': planStatus, 'plan validate': planValidate,
  'plan start': planStart, 'plan cancel': planCancel, 'plan cutover': planCutover, 'plan retry': planRetry, 'plan rollback': planRollback,
  'job cutover': jobCutover,
};
const HELP = 'usage: ferry <command> [--json] [--url URL]   (FERRY_URL, FERRY_API_KEY from the environment)\n'
  + `${Object.keys(COMMANDS).map((k) => `  ferry ${k}`).join('\n')}\n`;

export async function main(argv: string[], io: Io = { out: process.stdout, err: process.stderr, isTTY: !!process.stdout.isTTY }): Promise<number> {
  let parsed: ReturnType<typeof parse>;
  try { parsed = parse(argv); } catch (e) { io.err.write(`ferry: ${(e as Error).message}\n${HELP}`); return EXIT.error; }
  const [group, verb, ...rest] = parsed.positionals;
  const command = COMMANDS[`${group} ${verb}`];
  if (parsed.values.help || !command) { (parsed.values.help ? io.out : io.err).write(HELP); return parsed.values.help ? EXIT.ok : EXIT.error; }
  try {
    return await command(new DaemonClient({ url: parsed.values.url }), rest, parsed.values, io);
  } catch (e) {
    if (parsed.values.json && e instanceof DaemonError) io.out.write(`${JSON.stringify({ error: e.message, status: e.status, body: e.body }, null, 2)}\n`);
    io.err.write(`ferry: ${(e as Error).message}\n`);
    return EXIT.error;
  }
}
