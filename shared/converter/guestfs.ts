// One libguestfs appliance per job: a `guestfish --listen` server with every disk of the job attached, driven
// by `guestfish --remote=PID -- cmd args...` (argument arrays, never a shell). A launch costs ~15-30 s under
// TCG, so callers do all inspection and every edit through one session.
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { closeSync, fstatSync, mkdtempSync, openSync, readFileSync, readSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { OperationError } from '../errors';
import { ConverterError } from './errors';
import { guestfsEnv } from '../guestfs-env';
import { setting } from '../settings';

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
  constructor(seconds: number) { super(`the appliance gave no answer within ${seconds} s of its launch (a hung emulated boot); its server and appliance were killed`, 'appliance'); }
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

export class GuestSession {
  private constructor(readonly pid: number, private env: NodeJS.ProcessEnv, private onAbort?: () => void, private signal?: AbortSignal) {}
  closed = false;
  errFile?: string;
  /** While true (a launch with libguestfs's debug on), the server's stderr is a log: only its errors fail a command. */
  private verboseLaunch = false;
  private watchdog?: ChildProcess;
  /** Commands run so far (for the report's "appliance" note and for tests counting launches). */
  commands = 0;
  /** Seconds spent per kind of command (`run` is the appliance launch; the guest's own programs run by
   *  `command`/`sh` are keyed by the program's name), for the report's timings: where the appliance's time goes. */
  timings: Record<string, number> = {};

  /**
   * Starts the server with `disks` attached and launches the appliance (the expensive part, once). A launch that
   * gives no answer within launchSeconds() is a hung emulated boot (one was seen under CI's load: 20 min without a
   * word, then libguestfs's own limit): its server and appliance are killed and the launch is tried once more,
   * said through `log`.
   */
  static async open(disks: GuestDisk[], opts: { readonly?: boolean; signal?: AbortSignal; log?: (line: string) => void } = {}): Promise<GuestSession> {
    let debug = false;
    for (let attempt = 1; ; attempt++) {
      try {
        return await GuestSession.launch(disks, opts, debug);
      } catch (e) {
        const crashed = applianceCrashed(e);
        if (!(e instanceof LaunchTimeout || crashed) || attempt >= LAUNCH_TRIES) throw e;
        // A crash says nothing of the guest; the next launch keeps qemu's own words in case it crashes again.
        debug = crashed;
        opts.log?.(`${(e as Error).message.split('\n')[0]}: launching again (try ${attempt + 1} of ${LAUNCH_TRIES}${crashed ? ', with libguestfs\'s debug output kept' : ''})`);
      }
    }
  }

  private static async launch(disks: GuestDisk[], opts: { readonly?: boolean; signal?: AbortSignal }, debug = false): Promise<GuestSession> {
    const env = guestfsEnv();
    const args = ['--listen', ...(opts.readonly ? ['--ro'] : [])];
    for (const d of disks) args.push(`--format=${d.format}`, '-a', d.path);
    // The server forks and keeps the stderr it inherited: a pipe would never close, so stderr goes to a file.
    const errFile = path.join(os.tmpdir(), `ferry-guestfish-${process.pid}-${Date.now()}.log`);
    const errFd = openSync(errFile, 'w+');
    const pid = await new Promise<number>((resolve, reject) => {
      const child = spawn(GUESTFISH, args, { env, stdio: ['ignore', 'pipe', errFd] });
      let out = '';
      child.stdout!.setEncoding('utf8').on('data', (d: string) => { out += d; });
      child.on('error', (e: NodeJS.ErrnoException) => reject(e.code === 'ENOENT' ? new OperationError('guestfish is not installed (Debian package libguestfs-tools)', false) : e));
      child.on('close', (code) => {
        const m = /GUESTFISH_PID=(\d+)/.exec(out);
        if (code === 0 && m) return resolve(Number(m[1]));
        const said = readFileSync(errFile, 'utf8').trim();
        rmSync(errFile, { force: true });
        reject(new OperationError(`guestfish --listen failed: ${said || out || `exit ${code}`}`, false));
      });
    }).finally(() => { closeSync(errFd); });
    const s = new GuestSession(pid, env, undefined, opts.signal);
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
    let hung = false;
    // Killing the server ends the pending `run` (its client sees the socket close); libguestfs's recovery process
    // then kills the appliance.
    const deadline = setTimeout(() => { hung = true; s.onAbort!(); }, seconds * 1000);
    try {
      // Two vCPUs (multi-threaded TCG) where the host has two CPUs: the guest's generators run pipelines and
      // zstd -T0, and under load two vCPU threads get more of the host than one (update-initramfs in the
      // appliance on the Debian guest at load 11-19: 288 s wall with two, 305 s with one).
      if (os.cpus().length >= 2) await s.cmd('set-smp', '2');
      // Debug output goes to the server's stderr, where commands' errors are read: only for the launch, then off.
      s.verboseLaunch = debug;
      if (debug) await s.cmd('set-verbose', 'true');
      await s.cmd('run');
      if (hung) throw new LaunchTimeout(seconds);
      if (debug) await s.cmd('set-verbose', 'false');
      s.verboseLaunch = false;
    } catch (e) {
      await s.close();
      if (hung) throw new LaunchTimeout(seconds);
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
   * A failed command makes the server exit unless it is sent as `-cmd` (fish/rc.c: the client passes its
   * exit_on_error with every call), and with `-cmd` the client exits 0 and the error goes to the server's stderr.
   * So every command is sent as `-cmd` and failure is read from the server's stderr file, which also gives
   * GuestfsError the real message. Commands of one session must not run concurrently (they never do).
   */
  cmdBytes(...command: string[]): Promise<Buffer> {
    if (this.closed) return Promise.reject(new OperationError('guestfs session is closed', false));
    this.commands++;
    const from = this.errSize();
    const t0 = process.hrtime.bigint();
    // `env VAR=value prog ...` is keyed by prog.
    const kind = command[0] === 'command' || command[0] === 'sh' ? `${command[0]} ${(command[1] || '').trim().split(/\s+/).find((w) => w !== 'env' && !w.includes('=')) || ''}` : command[0];
    const count = () => { this.timings[kind] = (this.timings[kind] || 0) + Number(process.hrtime.bigint() - t0) / 1e9; };
    return new Promise<Buffer>((resolve, reject) => {
      const child = spawn(GUESTFISH, [`--remote=${this.pid}`, '--', `-${command[0]}`, ...command.slice(1)], { env: this.env, stdio: ['ignore', 'pipe', 'pipe'] });
      const out: Buffer[] = [];
      let err = '';
      child.stdout.on('data', (b: Buffer) => { out.push(b); });
      child.stderr.setEncoding('utf8').on('data', (s: string) => { err += s; });
      child.on('error', reject);
      child.on('close', (code) => {
        if (this.signal?.aborted) return reject(this.signal.reason instanceof Error ? this.signal.reason : new Error('aborted'));
        const serverErr = this.errorsSince(from) || (this.alive() ? '' : 'the guestfish server is gone (killed or crashed) before answering');
        if (code === 0 && !serverErr) resolve(Buffer.concat(out));
        else reject(new GuestfsError(command, serverErr || err));
      });
    }).finally(count);
  }

  /** A client whose server died exits 0 without a word (errors of `-cmd` go to the server's stderr), so an answer
   *  only counts while the server still runs. */
  private alive(): boolean {
    try { process.kill(this.pid, 0); return true; } catch { return false; }
  }

  private errSize(): number {
    try { return this.errFile ? statSync(this.errFile).size : 0; } catch { return 0; }
  }

  /** What the server wrote to stderr since `from`, warnings left out. */
  private errorsSince(from: number): string {
    if (!this.errFile) return '';
    let fd: number | undefined;
    try {
      fd = openSync(this.errFile, 'r');
      const size = fstatSync(fd).size;
      if (size <= from) return '';
      const b = Buffer.alloc(Math.min(size - from, 64 * 1024));
      readSync(fd, b, 0, b.length, from);
      const text = b.toString('utf8');
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

  /** Stops the server (and with it the appliance); safe to call twice. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.signal?.removeEventListener('abort', this.onAbort!);
    // Closed by its owner: the watchdog goes first, so it can never signal a pid the system has reused.
    this.watchdog?.kill('SIGKILL');
    if (this.errFile) rmSync(this.errFile, { force: true });
    await new Promise<void>((r) => execFile(GUESTFISH, [`--remote=${this.pid}`, '--', 'exit'], { env: this.env }, () => r()));
    // Wait for the server to go, so the disk files are no longer open when the caller renames or checks them.
    for (let i = 0; i < 100; i++) {
      try { process.kill(this.pid, 0); } catch { return; }
      await new Promise((r) => setTimeout(r, 100));
    }
    try { process.kill(this.pid, 'SIGKILL'); } catch { /* gone */ }
  }

}

/**
 * The server forks away from the process that started it (its parent is init), so a worker or ferry-convert
 * killed mid-job (SIGKILL, a crash, the OOM killer) would leave it and its appliance running for ever, holding the
 * job's disks open and an emulated CPU busy. A small shell in its own process group holds a pipe from this
 * process: the pipe closes however this process ends, the shell's `read` returns and it kills the server (and
 * libguestfs's recovery process then kills the appliance), then removes the server's stderr file, which the dead
 * owner can no longer remove.
 */
function watchOwner(serverPid: number, errFile: string): ChildProcess {
  const dog = spawn('sh', ['-c', 'read -r _; kill -9 "$1" 2>/dev/null; rm -f "$2"', 'ferry-guestfish-watchdog', String(serverPid), errFile],
    { detached: true, stdio: ['pipe', 'ignore', 'ignore'] });
  dog.on('error', (e) => process.emitWarning(`no watchdog for guestfish ${serverPid} (${e.message}): it outlives this process if it dies`));
  // Neither the watchdog nor its pipe keeps this process alive.
  dog.unref();
  (dog.stdin as unknown as { unref?: () => void }).unref?.();
  return dog;
}
