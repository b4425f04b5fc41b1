// Domain statistics from `virsh domstats --raw`. The CPU usage percent needs two samples of cpu.time: the
// previous sample of the same domain when it is at most 60 s old (a dashboard that polls pays one call), else a
// second call 500 ms after the first. Percent of the domain's vCPUs: 100 = every vCPU busy all the time. The time
// counted is the vCPU threads' (vcpu.N.time), not cpu.time, which also counts QEMU's emulator and I/O threads and so
// can exceed the vCPUs' capacity; a sample is timed at the middle of its virsh call, and what jitter remains is capped
// at 100 (virt-manager and virt-top cap the same way).
import { checkName } from './names';
import { DOMAIN_STATES, parseDomstats, RawStats } from './domains';
import { LibvirtError, Virsh } from './virsh';

const SAMPLE_GAP_MS = 500;
const SAMPLE_MAX_AGE_MS = 60_000;
const lastSample = new Map<string, { at: number; cpuNs: number }>();

const n = (s: Record<string, string>, k: string): number | null => (s[k] !== undefined ? Number(s[k]) : null);
/** The domain's vCPUs now (or its maximum when libvirt reports no current count); null when neither is reported. */
const vcpuCount = (s: Record<string, string>): number | null => n(s, 'vcpu.current') ?? n(s, 'vcpu.maximum');

export function cpuStats(s: Record<string, string>, pct: number | null) {
  return {
    vcpus: vcpuCount(s),
    time_ns: { total: n(s, 'cpu.time'), user: n(s, 'cpu.user'), system: n(s, 'cpu.system') },
    usage_percent: pct,
  };
}

/** Memory in KiB as the balloon reports it; `used`/`usage_percent` need the guest's balloon driver statistics
 *  (available and unused); without them they are null. */
export function memoryStats(s: Record<string, string>) {
  const total = n(s, 'balloon.current');
  const available = n(s, 'balloon.available');
  const unused = n(s, 'balloon.unused');
  const used = available !== null && unused !== null ? available - unused : null;
  return {
    unit: 'KiB', total: total, maximum: n(s, 'balloon.maximum'), available, unused, used,
    usage_percent: used !== null && available ? Math.round((used / available) * 10000) / 100 : null,
    rss: n(s, 'balloon.rss'), swap_in: n(s, 'balloon.swap_in'), swap_out: n(s, 'balloon.swap_out'),
  };
}

export function diskStats(s: Record<string, string>) {
  const out = [];
  for (let i = 0; i < (n(s, 'block.count') ?? 0); i++) {
    const p = `block.${i}.`;
    out.push({
      name: s[p + 'name'], path: s[p + 'path'] ?? null, read_bytes: n(s, p + 'rd.bytes'), write_bytes: n(s, p + 'wr.bytes'),
      read_requests: n(s, p + 'rd.reqs'), write_requests: n(s, p + 'wr.reqs'), errors: n(s, p + 'errors'),
      capacity: n(s, p + 'capacity'), allocation: n(s, p + 'allocation'),
    });
  }
  return out;
}

export function networkStats(s: Record<string, string>) {
  const out = [];
  for (let i = 0; i < (n(s, 'net.count') ?? 0); i++) {
    const p = `net.${i}.`;
    out.push({
      name: s[p + 'name'], rx_bytes: n(s, p + 'rx.bytes'), rx_packets: n(s, p + 'rx.pkts'), rx_errors: n(s, p + 'rx.errs'), rx_dropped: n(s, p + 'rx.drop'),
      tx_bytes: n(s, p + 'tx.bytes'), tx_packets: n(s, p + 'tx.pkts'), tx_errors: n(s, p + 'tx.errs'), tx_dropped: n(s, p + 'tx.drop'),
    });
  }
  return out;
}

const GROUPS = ['--state', '--cpu-total', '--balloon', '--vcpu', '--interface', '--block'];

async function sample(v: Virsh, names: string[] | 'running'): Promise<{ at: number; stats: RawStats }> {
  const args = ['domstats', '--raw', ...GROUPS, ...(names === 'running' ? ['--list-running'] : names)];
  const before = Date.now();
  const stats = parseDomstats(await v.run(args));
  return { at: (before + Date.now()) / 2, stats };
}

/** ns the domain's vCPU threads have run; cpu.time when libvirt reports no per-vCPU times. */
function vcpuNs(s: Record<string, string>): number {
  const count = vcpuCount(s) || 0;
  let sum = 0;
  for (let i = 0; i < count; i++) {
    const t = Number(s[`vcpu.${i}.time`]);
    if (!Number.isFinite(t) || s[`vcpu.${i}.time`] === undefined) return Number(s['cpu.time']);
    sum += t;
  }
  return count > 0 ? sum : Number(s['cpu.time']);
}

function percents(v: Virsh, first: { at: number; stats: RawStats } | undefined, now: { at: number; stats: RawStats }) {
  const out = new Map<string, number | null>();
  for (const [name, s] of now.stats) {
    const key = `${v.uri}\n${name}`;
    const prev = first?.stats.get(name) ? { at: first.at, cpuNs: vcpuNs(first.stats.get(name)!) } : lastSample.get(key);
    const cpuNs = vcpuNs(s);
    const vcpus = vcpuCount(s) || 1;
    const dt = now.at - (prev?.at ?? now.at);
    out.set(name, prev && dt > 0 && Number.isFinite(cpuNs) ? Math.min(100,
      Math.max(0, Math.round(((cpuNs - prev.cpuNs) / (dt * 1e6 * vcpus)) * 10000) / 100)) : null);
    if (Number.isFinite(cpuNs)) lastSample.set(key, { at: now.at, cpuNs });
  }
  return out;
}

/** Two samples unless every domain asked for has a recent previous one. */
async function twoSamples(v: Virsh, names: string[] | 'running') {
  const first = await sample(v, names);
  const fresh = [...first.stats.keys()].every((name) => {
    const p = lastSample.get(`${v.uri}\n${name}`);
    return p && first.at - p.at <= SAMPLE_MAX_AGE_MS && first.at - p.at >= 100;
  });
  if (fresh) return { now: first, pct: percents(v, undefined, first) };
  await new Promise((r) => setTimeout(r, SAMPLE_GAP_MS));
  const now = await sample(v, names);
  return { now, pct: percents(v, first, now) };
}

function view(name: string, s: Record<string, string>, pct: number | null) {
  return {
    name, state: DOMAIN_STATES[Number(s['state.state'])] || 'no state', cpu: cpuStats(s, pct), memory: memoryStats(s),
    disks: diskStats(s), interfaces: networkStats(s), timestamp: new Date().toISOString(),
  };
}

export async function domainStats(v: Virsh, name: string) {
  checkName(name, 'name');
  const { now, pct } = await twoSamples(v, [name]);
  const s = now.stats.get(name);
  if (!s) throw new LibvirtError(404, `no domain with matching name '${name}'`, 'not found');
  return view(name, s, pct.get(name) ?? null);
}

export async function allStats(v: Virsh) {
  const { now, pct } = await twoSamples(v, 'running');
  return [...now.stats].map(([name, s]) => view(name, s, pct.get(name) ?? null)).sort((a, b) => a.name.localeCompare(b.name));
}
