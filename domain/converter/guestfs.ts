// One libguestfs appliance per job: one `guestfish` process with every disk of the job attached, driven through
// its standard input, one command per line with every argument quoted (never a shell), each answer ended by an
// `echo` of a marker only this session knows. A launch costs ~15-30 s under TCG, so callers do all inspection and
// every edit through one session. (Until issue 34 each command was a `guestfish --remote` client process of its
// own: ~100-150 ms of process start and library load per command, 40-60 s of a Debian repair's 130 s under load.)
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, fstatSync, mkdtempSync, openSync, readdirSync, readFileSync, readSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { OperationError } from '../../platform/errors';
import { ConverterError } from './errors';
import { FishPipe } from './guestfish-pipe';
import { createLogger } from '../../platform/log';
import { guestfsEnv } from '../guestfs-env';
import { setting } from '../../platform/settings';

/** Where the fix stage keeps originals: one tree at the guest's root that mirrors their paths
 *  (`/ferry-backup/etc/fstab`; on Windows `C:\ferry-backup\Windows\System32\config\SYSTEM`). Not beside the file:
 *  many directories are read whole (RHEL's network-scripts, NetworkManager's system-connections, ifupdown's
 *  interfaces.d), and a copy there, whatever its suffix, would be read as configuration too. */
export const BACKUP_ROOT = '/ferry-backup';
export const backupPath = (p: string): string => BACKUP_ROOT + p;
export const GUESTFISH = setting('GUESTFISH');

export { kvmUsable, guestfsEnv } from '../guestfs-env';

export interface GuestDisk { path: string; format: string; readonly?: boolean }

export class GuestfsError extends OperationError {
  constructor(public command: string[], public stderr: string) {
    super(`guestfish ${command[0]}: ${stderr.trim().replace(/^libguestfs: error: /m, '') || 'failed'}`, false);
  }
}

/** Seconds an appliance launch may take: ~15-30 s here, one or two minutes on a busy host. libguestfs's own limit
 *  (20 min) would hold a job that long on a hung boot. FERRY_GUESTFS_LAUNCH_SECONDS sets it. */
export function launchSeconds(env: NodeJS.ProcessEnv = process.env): number {
  return setting('FERRY_GUESTFS_LAUNCH_SECONDS', env);
}
/** Launches per session before a hung one fails the caller. */
export const LAUNCH_TRIES = 2;

export class LaunchTimeout extends ConverterError {
  constructor(seconds: number) {
    super(`the appliance gave no answer within ${seconds} s of its launch (a hung emulated boot); `
      + 'its server and appliance were killed', 'appliance');
  }
}

/** The emulated appliance died at launch (qemu exited, the appliance closed its connection): a fault of the host or
 *  its load, not of the guest; seen once under CI's load in a plan of eight (2026-11-29, qemu exit status 1). */
export function applianceCrashed(e: unknown): boolean {
  return e instanceof GuestfsError && e.command[0] === 'run' && !(e instanceof ApplianceCrash)
    && /appliance closed the connection unexpectedly|exited with error status|appliance crashed|guestfs_launch failed/.test(e.message);
}

/** A second crash, reported with what qemu and libguestfs said about it (from the launch's debug output), not the
 *  hundreds of lines of the appliance's console. */
export class ApplianceCrash extends GuestfsError {
  constructor(e: GuestfsError) {
    const said = e.stderr.split('\n').filter((l) => /qemu-system|qemu:|libguestfs: error:|Could not|Failed to|cannot /i.test(l) && !/^libguestfs: trace/.test(l));
    super(e.command, `the appliance crashed at launch twice; libguestfs and qemu said:\n${said.slice(-20).join('\n') || e.stderr.slice(-2000)}`);
    this.retryable = true; // the host's fault, not the guest's: the job's retry_count decides
  }
}

/** How an appliance is launched. `nice`: guestfish's CPU priority is lowered by this much before the launch, so
 *  the appliance's qemu (forked at `run`) inherits it: the repair beside the copy yields the CPU to the copy. */
export interface LaunchOptions { readonly?: boolean; signal?: AbortSignal; nice?: number; log?: (line: string) => void }

/** A lower priority for `pid`; where the host refuses it, the appliance runs at the worker's own priority. */
function lowerPriority(pid: number, nice: number, log?: (line: string) => void) {
  try {
    os.setPriority(pid, Math.min(19, os.getPriority(pid) + nice));
  } catch (e) {
    log?.(`the appliance keeps the worker's CPU priority (setpriority: ${(e as Error).message})`);
  }
}

export class GuestSession {
  private constructor(readonly pid: number, private fish: FishPipe, private onAbort?: () => void, private signal?: AbortSignal) {}
  closed = false;
  errFile?: string;
  /** While true (a launch with libguestfs's debug on), guestfish's stderr is a log: only its errors fail a command. */
  private verboseLaunch = false;
  private watchdog?: ChildProcess;
  /** Commands run so far (for the report's "appliance" note and for tests counting launches). */
  commands = 0;
  /** Seconds spent per kind of command (`run` is the appliance launch; the guest's own programs run by
   *  `command`/`sh` are keyed by the program's name), for the report's timings: where the appliance's time goes. */
  timings: Record<string, number> = {};

  /**
   * Starts guestfish with `disks` attached and launches the appliance (the expensive part, once). A launch that
   * gives no answer within launchSeconds() is a hung emulated boot (one was seen under CI's load: 20 min without a
   * word, then libguestfs's own limit): guestfish and its appliance are killed and the launch is tried once more,
   * said through `log`.
   */
  static async open(disks: GuestDisk[], opts: LaunchOptions = {}): Promise<GuestSession> {
    let debug = false;
    for (let attempt = 1; ; attempt++) {
      try {
        return await GuestSession.launch(disks, opts, debug);
      } catch (e) {
        const crashed = applianceCrashed(e);
        if (!(e instanceof LaunchTimeout || crashed) || attempt >= LAUNCH_TRIES) throw e;
        // A crash says nothing of the guest; the next launch keeps qemu's own words in case it crashes again.
        debug = crashed;
        const kept = crashed ? ', with libguestfs\'s debug output kept' : '';
        opts.log?.(`${(e as Error).message.split('\n')[0]}: launching again (try ${attempt + 1} of ${LAUNCH_TRIES}${kept})`);
      }
    }
  }

  private static async launch(disks: GuestDisk[], opts: LaunchOptions, debug = false): Promise<GuestSession> {
    const args = opts.readonly ? ['--ro'] : [];
    for (const d of disks) args.push(`--format=${d.format}`, '-a', d.path);
    // stderr goes to a file: commands' errors are read from it once their answer is in (guestfish-pipe.ts).
    const errFile = path.join(os.tmpdir(), `ferry-guestfish-${process.pid}-${Date.now()}.log`);
    const errFd = openSync(errFile, 'w+');
    const child = (() => { try { return spawn(GUESTFISH, args, { env: guestfsEnv(), stdio: ['pipe', 'pipe', errFd] }); } finally { closeSync(errFd); } })();
    const spawned = await new Promise<string | undefined>((resolve) => {
      child.once('spawn', () => resolve(undefined));
      child.once('error', (e: NodeJS.ErrnoException) => resolve(
        e.code === 'ENOENT' ? 'guestfish is not installed (Debian package libguestfs-tools)' : e.message,
      ));
    });
    if (spawned || !child.pid) { rmSync(errFile, { force: true }); throw new OperationError(`guestfish failed to start: ${spawned}`, false); }
    const pid = child.pid;
    if (opts.nice) lowerPriority(pid, opts.nice, opts.log);
    const s = new GuestSession(pid, new FishPipe(child), undefined, opts.signal);
    s.errFile = errFile;
    s.watchdog = watchOwner(pid, errFile);
    s.onAbort = () => {
      s.watchdog?.kill('SIGKILL');
      try { process.kill(pid, 'SIGKILL'); } catch { /* already gone */ }
      rmSync(errFile, { force: true });
      s.closed = true;
    };
    opts.signal?.addEventListener('abort', s.onAbort, { once: true });
    const seconds = launchSeconds();
    let hung: number[] | undefined;
    // Killing guestfish ends the pending `run`; libguestfs's recovery process then kills the appliance.
    // The appliance's processes are noted first: the next try must wait for them to release the disks.
    const deadline = setTimeout(() => { hung = descendants(pid); s.onAbort!(); }, seconds * 1000);
    try {
      // Two vCPUs (multi-threaded TCG) where the host has two CPUs: the guest's generators run pipelines and
      // zstd -T0, and under load two vCPU threads get more of the host than one (update-initramfs in the
      // appliance on the Debian guest at load 11-19: 288 s wall with two, 305 s with one).
      if (os.cpus().length >= 2) await s.cmd('set-smp', '2');
      // Debug output goes to guestfish's stderr, where commands' errors are read: only for the launch, then off.
      s.verboseLaunch = debug;
      if (debug) await s.cmd('set-verbose', 'true');
      await s.cmd('run');
      if (hung) throw new LaunchTimeout(seconds);
      if (debug) await s.cmd('set-verbose', 'false');
      s.verboseLaunch = false;
    } catch (e) {
      await s.close();
      if (hung) { await allGone(hung); throw new LaunchTimeout(seconds); }
      throw debug && e instanceof GuestfsError ? new ApplianceCrash(e) : e;
    } finally {
      clearTimeout(deadline);
    }
    return s;
  }

  /** Runs one guestfish command; rejects with GuestfsError on failure. */
  async cmd(...command: string[]): Promise<string> {
    return (await this.cmdBytes(...command)).toString('utf8');
  }

  /**
   * The same, with stdout as bytes (buffer results such as hivex-value-value are printed raw).
   *
   * Every command is sent as `-cmd` (guestfish-pipe.ts): a failing one does not end guestfish, and its error is
   * read from guestfish's stderr file, which also gives GuestfsError the real message.
   */
  cmdBytes(...command: string[]): Promise<Buffer> {
    if (this.closed) return Promise.reject(new OperationError('guestfs session is closed', false));
    this.commands++;
    let from = 0;
    let t0 = process.hrtime.bigint();
    // `env VAR=value prog ...` is keyed by prog.
    const kind = command[0] === 'command' || command[0] === 'sh' ? `${command[0]} ${(command[1] || '').trim().split(/\s+/).find((w) => w !== 'env' && !w.includes('=')) || ''}` : command[0];
    const count = () => { this.timings[kind] = (this.timings[kind] || 0) + Number(process.hrtime.bigint() - t0) / 1e9; };
    return this.fish.send(command, () => { from = this.errSize(); t0 = process.hrtime.bigint(); }).then((out) => {
      const serverErr = this.errorsSince(from);
      if (serverErr) throw new GuestfsError(command, serverErr);
      return out;
    }, (e: Error) => {
      if (this.signal?.aborted) throw this.signal.reason instanceof Error ? this.signal.reason : new Error('aborted');
      throw new GuestfsError(command, this.errorsSince(from) || `the guestfish process is gone (killed or crashed) before answering: ${e.message}`);
    }).finally(count);
  }

  private errSize(): number {
    try { return this.errFile ? statSync(this.errFile).size : 0; } catch { return 0; }
  }

  /** What guestfish wrote to stderr since `from`, warnings left out. */
  private errorsSince(from: number): string {
    if (!this.errFile) return '';
    let fd: number | undefined;
    try {
      fd = openSync(this.errFile, 'r');
      const size = fstatSync(fd).size;
      if (size <= from) return '';
      const b = Buffer.alloc(Math.min(size - from, 64 * 1024));
      readSync(fd, b, 0, b.length, from);
      // guestfish names the line of its input an error came from (`*stdin*:12: libguestfs: error: ...`): not ours.
      const text = b.toString('utf8').replace(/^\*stdin\*:\d+: /gm, '');
      if (this.verboseLaunch) return /^libguestfs: error:/m.test(text) ? text : '';
      return text.split('\n').filter((l) => l.trim() && !/^libguestfs: warning:/.test(l)).join('\n');
    } catch { return ''; } finally { if (fd !== undefined) closeSync(fd); }
  }

  /** A command whose failure is an answer (is-file on a missing dir, blkid on a bare disk). */
  async tryCmd(...command: string[]): Promise<string | undefined> {
    try { return await this.cmd(...command); } catch (e) { if (e instanceof GuestfsError) return undefined; throw e; }
  }

  lines(out: string | undefined): string[] {
    return (out || '').split('\n').map((l) => l.trim()).filter(Boolean);
  }

  /** File contents exactly: guestfish prints a newline after every string result, so one is taken off. */
  async read(p: string): Promise<string> {
    const out = await this.cmd('cat', p);
    return out.endsWith('\n') ? out.slice(0, -1) : out;
  }

  async isFile(p: string): Promise<boolean> { return (await this.tryCmd('is-file', p, 'followsymlinks:true'))?.trim() === 'true'; }
  async isDir(p: string): Promise<boolean> { return (await this.tryCmd('is-dir', p, 'followsymlinks:true'))?.trim() === 'true'; }
  async exists(p: string): Promise<boolean> { return (await this.tryCmd('exists', p))?.trim() === 'true'; }

  /** The first of `paths` that is a file in the guest. */
  async firstFile(paths: string[]): Promise<string | undefined> {
    for (const p of paths) if (await this.isFile(p)) return p;
    return undefined;
  }

  /** `blkid` as a key/value map. */
  async blkid(dev: string): Promise<Record<string, string>> {
    const out = await this.tryCmd('blkid', dev);
    const r: Record<string, string> = {};
    for (const l of this.lines(out)) { const i = l.indexOf(': '); if (i > 0) r[l.slice(0, i)] = l.slice(i + 2); }
    return r;
  }

  /** Keeps the original of a file the fix stage is about to change, at `backupPath(p)` (mode, owner and times
   *  kept), the one backup convention of the fix stage. The first copy wins: a file edited twice (or a disk repaired
   *  twice) keeps what Ferry first found, not its own earlier edit. */
  async backup(p: string): Promise<string> {
    const to = backupPath(p);
    if (await this.exists(to)) return to;
    // The tree is root-only, like the most private file it may hold (/etc/shadow).
    if (!(await this.isDir(BACKUP_ROOT))) await this.cmd('mkdir-mode', BACKUP_ROOT, '0700');
    await this.cmd('mkdir-p', path.posix.dirname(to));
    await this.cmd('cp-a', p, to);
    return to;
  }

  /** Mode, owner and group of a path (statns). */
  async stat(p: string): Promise<{ mode: number; uid: number; gid: number }> {
    const r: Record<string, number> = {};
    for (const l of this.lines(await this.cmd('statns', p))) { const [k, v] = l.split(': '); r[k] = Number(v); }
    return { mode: r.st_mode, uid: r.st_uid, gid: r.st_gid };
  }

  /** Writes `text` to the guest file `remote` through a private local file (mode 0600) and `upload`, never as a
   *  command argument: nothing shows in a process listing (/etc/shadow), and no argument size limit applies (a
   *  long grub.cfg or passwd). */
  async writeFile(remote: string, text: string | Uint8Array): Promise<void> {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-upload-'));
    const local = path.join(dir, 'f');
    try {
      writeFileSync(local, text, { mode: 0o600 });
      await this.cmd('upload', local, remote);
    } finally { rmSync(dir, { recursive: true, force: true }); }
  }

  /** Stops guestfish (and with it the appliance); safe to call twice. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.signal?.removeEventListener('abort', this.onAbort!);
    // Closed by its owner: the watchdog goes first, so it can never signal a pid the system has reused.
    this.watchdog?.kill('SIGKILL');
    if (this.errFile) rmSync(this.errFile, { force: true });
    this.fish.end();
    // Wait for guestfish to go, so the disk files are no longer open when the caller renames or checks them; one
    // that has not gone after 10 s (a hung appliance shutdown) is killed and waited for as long again.
    const within = (ms: number) => {
      let t: NodeJS.Timeout | undefined;
      const late = new Promise<boolean>((r) => { t = setTimeout(() => r(false), ms); });
      return Promise.race([this.fish.ended.then(() => true), late]).finally(() => clearTimeout(t));
    };
    if (await within(10_000)) return;
    try { process.kill(this.pid, 'SIGKILL'); } catch { /* gone */ }
    if (!(await within(10_000))) {
      createLogger('converter').warn('guestfish did not exit 10 s after SIGKILL; its disk files may still be open', { pid: this.pid });
    }
  }

}

/**
 * guestfish reads its commands from this process: when this process dies (SIGKILL, a crash, the OOM killer)
 * mid-command, guestfish sees the end of its input only after that command, which under TCG can be minutes (a
 * guest's own initramfs generator), holding the job's disks open and an emulated CPU busy. A small shell in its
 * own process group holds a pipe from this process: the pipe closes however this process ends, the shell's `read`
 * returns and it kills guestfish at once (and libguestfs's recovery process then kills the appliance), then
 * removes guestfish's stderr file, which the dead owner can no longer remove.
 */
/** Every process below `pid` (guestfish's appliance and libguestfs's helpers), read from /proc. */
function descendants(pid: number): number[] {
  let kids: number[] = [];
  try {
    for (const t of readdirSync(`/proc/${pid}/task`)) kids.push(...readFileSync(`/proc/${pid}/task/${t}/children`, 'utf8').split(/\s+/).filter(Boolean).map(Number));
  } catch { return []; } // gone already: nothing below it to wait for
  for (const k of [...kids]) kids = kids.concat(descendants(k));
  return kids;
}

/** Waits (at most 30 s) until none of `pids` runs: a killed appliance's qemu holds its disks' locks until it exits,
 *  and a launch tried again at once fails on them ("Failed to get write lock"). */
async function allGone(pids: number[]): Promise<void> {
  const runs = (p: number) => { try { process.kill(p, 0); return true; } catch { return false; } };
  for (let i = 0; i < 300 && pids.some(runs); i++) await new Promise((r) => setTimeout(r, 100));
}

function watchOwner(serverPid: number, errFile: string): ChildProcess {
  const dog = spawn('sh', ['-c', 'read -r _; kill -9 "$1" 2>/dev/null; rm -f "$2"', 'ferry-guestfish-watchdog', String(serverPid), errFile],
    { detached: true, stdio: ['pipe', 'ignore', 'ignore'] });
  dog.on('error', (e) => process.emitWarning(`no watchdog for guestfish ${serverPid} (${e.message}): it outlives this process if it dies`));
  // Neither the watchdog nor its pipe keeps this process alive.
  dog.unref();
  (dog.stdin as unknown as { unref?: () => void }).unref?.();
  return dog;
}
