// The one way Ferry talks to libvirt: `virsh` (Debian libvirt-clients) with an argument array, against one
// connection URI. libvirt's errors come back as LibvirtError with the HTTP status the daemon answers with:
// unknown domain, network, pool or volume 404; invalid input 400; an operation the object's state does not allow
// 409; libvirtd not answering 503 naming the URI; any other failed operation 500 with libvirt's own message.
import { execFile } from 'node:child_process';
import { ApiError } from '../../platform/errors';
import { SessionEnded, sessionSafe, virshSession } from './virsh-session';
import { spawnSlots } from '../../platform/limits';
import { setting } from '../../platform/settings';

export const DEFAULT_URI = 'qemu:///system';

/** The configured connection URI (FERRY_LIBVIRT_URI, default qemu:///system). */
export function configuredUri(): string {
  return setting('FERRY_LIBVIRT_URI') || DEFAULT_URI;
}

export class LibvirtError extends ApiError {
  constructor(status: number, message: string, public libvirtMessage: string) {
    super(status, message);
    this.name = 'LibvirtError';
  }
}

const NOT_FOUND = /(Domain|Network|Storage pool|Storage volume|Domain snapshot|Interface) not found|no (domain|network|storage pool|storage vol|domain snapshot) with matching|failed to get (domain|network|pool|vol)\b|Storage volume not found|cannot find storage volume/i;
const INVALID = /invalid argument|XML error|XML document failed to validate|unsupported configuration|Invalid value|expected syntax|malformed|unknown (option|command)|Unable to parse/i;
const STATE = /Requested operation is not valid|already (active|running|exists|in use)|is not running|domain is not running|not active|operation failed: (domain|network|pool) '.*' already exists/i;
const UNREACHABLE = /failed to connect to the hypervisor|no valid connection|Disconnected from|Failed to connect socket|Cannot recv data|End of file while reading data|no connection driver available|Connection refused|Could not resolve hostname|Host key verification failed|Permission denied \(publickey/i;

/** libvirt's text without virsh's "error: " prefixes, one line. */
export function libvirtText(stderr: string): string {
  return stderr.split('\n').map((l) => l.replace(/^error:\s*/, '').trim()).filter(Boolean).join('; ');
}

export function mapLibvirtError(stderr: string, uri: string): LibvirtError {
  const text = libvirtText(stderr) || 'virsh failed without a message';
  if (UNREACHABLE.test(text)) return new LibvirtError(503, `libvirt at ${uri} does not answer (retry when it does): ${text}`, text);
  if (NOT_FOUND.test(text)) {
    // virsh sometimes says only "failed to get domain 'x'": say what that means.
    const m = /failed to get (domain|network|pool|vol) '([^']*)'/.exec(text);
    const msg = m && !/not found|no .* with matching/i.test(text) ? `${m[1] === 'vol' ? 'volume' : m[1]} '${m[2]}' not found (${text})` : text;
    return new LibvirtError(404, msg, text);
  }
  if (INVALID.test(text)) return new LibvirtError(400, text, text);
  if (STATE.test(text)) return new LibvirtError(409, text, text);
  return new LibvirtError(500, `libvirt: ${text}`, text);
}

export interface RunOptions { input?: string; timeoutMs?: number }

/** Commands that answer at once, run on the URI's long-lived virsh (virsh-session.ts). The others (copies, wipes,
 *  starts, consoles, anything reading stdin) get a virsh of their own, so they never hold these up. */
const SESSION_COMMANDS = new Set([
  'uri', 'capabilities', 'list', 'dominfo', 'domstate', 'domuuid', 'dumpxml', 'domstats', 'domiflist', 'domblklist', 'define',
  'net-list', 'net-uuid', 'net-info', 'net-dumpxml', 'pool-list', 'pool-uuid', 'pool-info', 'pool-dumpxml', 'pool-refresh',
  'vol-list', 'vol-info', 'vol-dumpxml', 'vol-path', 'snapshot-list',
]);

export class Virsh {
  constructor(readonly uri: string = configuredUri()) {}

  /** Runs `virsh -q -c <uri> ...args` and returns stdout; libvirt's failure is a LibvirtError. Short commands go
   *  through the URI's long-lived virsh (FERRY_VIRSH_SESSION=0: a virsh per command, as before). */
  run(args: string[], opts: RunOptions = {}): Promise<string> {
    if (opts.input === undefined && SESSION_COMMANDS.has(args[0]) && sessionSafe(args) && setting('FERRY_VIRSH_SESSION')) return this.onSession(args, opts);
    return runTool('virsh', ['-q', '-c', this.uri, ...args], this.uri, opts);
  }

  private async onSession(args: string[], opts: RunOptions): Promise<string> {
    const session = virshSession(this.uri);
    let r;
    const release = spawnSlots.libvirt.take(); // a request's calls are capped even when no process is spawned
    try {
      r = await session.run(args, opts.timeoutMs ?? 600_000);
    } catch (e) {
      if (e instanceof SessionEnded) throw mapLibvirtError(e.message, this.uri);
      throw new LibvirtError(500, `virsh ${args[0]}: ${(e as Error).message}`, (e as Error).message);
    } finally { release(); }
    if (!r.failed) return r.stdout;
    const err = mapLibvirtError(r.stderr, this.uri);
    if (err.status === 503) session.close(); // the connection is gone: the next command connects anew
    throw err;
  }

  /** True when libvirtd answers at this URI. */
  async reachable(): Promise<boolean> {
    try { await this.run(['uri'], { timeoutMs: 15_000 }); return true; } catch { return false; }
  }
}

/** How the daemon's code gets a Virsh for a URI: virsh itself, unless the daemon chose otherwise at start
 *  (FERRY_LIBVIRT_VIA=worker: each command a worker's job, orchestration/virsh-jobs.ts). Workers never change it. */
let factory: ((uri: string) => Virsh) | undefined;
export function virshFor(uri: string = configuredUri()): Virsh { return factory ? factory(uri) : new Virsh(uri); }
export function setVirshFactory(f: ((uri: string) => Virsh) | undefined) { factory = f; }

/** Runs a libvirt-side tool (virsh, virt-clone, virt-sysprep, virt-customize) with an argument array. */
export function runTool(cmd: string, args: string[], uri: string, opts: RunOptions & { env?: NodeJS.ProcessEnv } = {}): Promise<string> {
  return spawnSlots.libvirt.run(() => new Promise((resolve, reject) => {
    const child = execFile(cmd, args, { maxBuffer: 256 * 1024 * 1024, timeout: opts.timeoutMs ?? 600_000, env: opts.env ?? process.env },
      (err, stdout, stderr) => {
      if (!err) return resolve(stdout);
      if (err.code === 'ENOENT') return reject(new LibvirtError(500, `${cmd} is not installed`, `${cmd}: not found`));
      if (err.killed) return reject(new LibvirtError(500, `${cmd} ${args.find((a) => !a.startsWith('-') && a !== uri) || ''} timed out`, 'timeout'));
      reject(mapLibvirtError(String(stderr || err.message), uri));
    });
    if (opts.input !== undefined) child.stdin!.end(opts.input); else child.stdin?.end();
  }));
}

