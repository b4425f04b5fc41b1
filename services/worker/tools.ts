// What a worker checks before it registers: every program, file and device its declared capabilities need, so a
// worker that lacks one refuses to start naming it (and the capability that needs it), rather than taking jobs
// and failing each one. The programs come from scripts/programs.txt (platform/programs.ts), the list the set-up
// and the images install from; the rest are facts of this host the capabilities need where they apply.
import { accessSync, constants, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { programsFor } from '../../platform/programs';
import { setting } from '../../platform/settings';

export interface Missing { what: string; capability: string }

/** Programs whose path an operator may set (the code runs the variable's value instead of the name). */
const OVERRIDES: Record<string, string> = {
  guestfish: 'GUESTFISH', nbdkit: 'NBDKIT', 'qemu-img': 'QEMU_IMG', hivexregedit: 'HIVEXREGEDIT', '/usr/share/OVMF/OVMF_CODE_4M.fd': 'FERRY_OVMF_CODE',
};

/** An absolute path whose last part may hold `*` and `?` (as the list's entries do: /boot/vmlinuz-*). */
function globMatches(p: string): boolean {
  const re = new RegExp(`^${path.basename(p).replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*').replace(/\?/g, '.')}$`);
  try { return readdirSync(path.dirname(p)).some((f) => re.test(f)); } catch { return false; }
}

/** A program on PATH (plus /usr/sbin and /sbin, as scripts/setup.sh looks), or an absolute path / glob. */
function present(name: string, env: NodeJS.ProcessEnv): boolean {
  const given = OVERRIDES[name] && env[OVERRIDES[name]];
  if (given && path.isAbsolute(given)) return existsSync(given);
  const n = given || name;
  if (n.startsWith('/')) return /[*?]/.test(n) ? globMatches(n) : existsSync(n);
  const dirs = [...(env.PATH || '').split(':').filter(Boolean), '/usr/sbin', '/sbin'];
  return dirs.some((d) => { try { accessSync(path.join(d, n), constants.X_OK); return statSync(path.join(d, n)).isFile(); } catch { return false; } });
}

/** The socket a local libvirt URI connects to (`socket=`, or the system/session daemon's), null when remote. */
export function localLibvirtSockets(uri: string, env: NodeJS.ProcessEnv): string[] | null {
  let u: URL;
  try { u = new URL(uri); } catch { return null; }
  const transport = u.protocol.replace(/:$/, '').split('+')[1];
  if (u.hostname || (transport && transport !== 'unix')) return null;
  const given = u.searchParams.get('socket');
  if (given) return [given];
  const base = u.pathname === '/session' ? path.join(env.XDG_RUNTIME_DIR || path.join(os.homedir(), '.cache'), 'libvirt') : '/var/run/libvirt';
  return [path.join(base, 'libvirt-sock'), path.join(base, 'virtqemud-sock')];
}

function writable(dir: string): boolean {
  try { rmSync(mkdtempSync(path.join(dir, '.ferry-check-')), { recursive: true }); return true; } catch { return false; }
}

/** Host facts beside the programs, where they apply: libvirt_access with a local FERRY_LIBVIRT_URI needs that
 *  daemon's socket (and /dev/kvm when FERRY_LIBVIRT_DOMAIN_TYPE=kvm); vsphere_access writes exports into
 *  FERRY_EXPORT_DIR when set; mount_operations and nbd_access start libguestfs appliances, which need a writable
 *  scratch folder (LIBGUESTFS_TMPDIR and LIBGUESTFS_CACHEDIR, each TMPDIR unless set). */
function hostFacts(caps: string[], env: NodeJS.ProcessEnv): Missing[] {
  const out: Missing[] = [];
  const uri = setting('FERRY_LIBVIRT_URI', env);
  if (caps.includes('libvirt_access') && uri) out.push(...missingLibvirt(uri, env));
  const exportDir = setting('FERRY_EXPORT_DIR', env);
  if (caps.includes('vsphere_access') && exportDir) {
    const dir = path.resolve(exportDir);
    try { mkdirSync(dir, { recursive: true, mode: 0o700 }); } catch { /* judged by the write below */ }
    if (!writable(dir)) out.push({ what: `a writable export folder (FERRY_EXPORT_DIR ${dir})`, capability: 'vsphere_access' });
  }
  out.push(...missingScratch(caps, env));
  return out;
}

/** What a local libvirt at `uri` lacks on this host: its daemon's socket, and /dev/kvm when the domain type is kvm. */
function missingLibvirt(uri: string, env: NodeJS.ProcessEnv): Missing[] {
  const out: Missing[] = [];
  const socks = localLibvirtSockets(uri, env);
  if (socks && !socks.some((s) => existsSync(s))) out.push({ what: `libvirt's socket ${socks.join(' or ')} (FERRY_LIBVIRT_URI ${uri.replace(/\?.*$/, '')})`, capability: 'libvirt_access' });
  if (socks && setting('FERRY_LIBVIRT_DOMAIN_TYPE', env) === 'kvm' && !existsSync('/dev/kvm')) {
    out.push({ what: '/dev/kvm (FERRY_LIBVIRT_DOMAIN_TYPE=kvm on a local libvirt)', capability: 'libvirt_access' });
  }
  return out;
}

/** The libguestfs scratch folders that are not writable, once per capability that starts appliances. */
function missingScratch(caps: string[], env: NodeJS.ProcessEnv): Missing[] {
  const out: Missing[] = [];
  // libguestfs keeps its appliance in LIBGUESTFS_CACHEDIR and the disks' overlays in LIBGUESTFS_TMPDIR (each
  // TMPDIR unless set).
  const tmp = env.TMPDIR || os.tmpdir();
  const [lgTmp, lgCache] = [setting('LIBGUESTFS_TMPDIR', env), setting('LIBGUESTFS_CACHEDIR', env)];
  const scratch = new Map([[lgTmp || tmp, lgTmp ? 'LIBGUESTFS_TMPDIR' : 'TMPDIR'], [lgCache || tmp, lgCache ? 'LIBGUESTFS_CACHEDIR' : 'TMPDIR']]);
  for (const [dir, name] of scratch) {
    if (writable(dir)) continue;
    for (const c of ['mount_operations', 'nbd_access']) if (caps.includes(c)) out.push({ what: `a writable scratch folder (${name} ${dir})`, capability: c });
  }
  return out;
}

/** Everything the capabilities need that this host lacks, each with the capability that needs it. */
export function missingTools(caps: string[], env: NodeJS.ProcessEnv = process.env): Missing[] {
  const out: Missing[] = [];
  for (const e of programsFor(caps)) {
    const needs = e.capabilities.filter((c) => caps.includes(c)).join(', ');
    for (const name of e.names.length ? e.names : [e.check]) {
      if (!present(name, env)) out.push({ what: `${name} (Debian package ${e.package})`, capability: needs });
    }
  }
  return [...out, ...hostFacts(caps, env)];
}
