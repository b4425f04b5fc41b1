// One long-lived `virsh` per connection URI for short commands. A `virsh` process costs a spawn and a new
// connection to libvirtd (p50 78-154 ms on this machine under load, docs/performance.md) where a command on an
// open connection costs a few milliseconds; an import makes about ten such calls around its copy.
// virsh reads commands on stdin (its shell) and keeps going after a failed one, with no exit status per command:
// each command is followed by two `echo` markers, one on stderr and one on stdout, which end its errors and its
// output, and a command failed when its stderr has an `error:` line. Commands run one at a time per URI. The
// process ends after IDLE_MS unused (it never keeps a Node process alive), and a new one starts on the next
// command after it exited, timed out or lost its connection.
import { spawn, ChildProcessWithoutNullStreams } from 'node:child_process';
import { randomBytes } from 'node:crypto';

const IDLE_MS = 30_000;

export interface SessionReply { stdout: string; stderr: string; failed: boolean }

/** The shell ended on its own; the message is what it said on stderr (libvirt's error, when it could not connect). */
export class SessionEnded extends Error {}

interface Pending { marker: string; line: string; resolve: (r: SessionReply) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }

/** An argument as virsh's shell reads it: single-quoted, a quote inside as '\''. */
export function shellQuote(arg: string): string {
  return `'${arg.replace(/'/g, `'\\''`)}'`;
}

/** Whether `args` can go through the shell: one line each (a newline would end the command). */
export function sessionSafe(args: string[]): boolean {
  return args.every((a) => !/[\r\n]/.test(a));
}

class VirshSession {
  private proc?: ChildProcessWithoutNullStreams;
  private out = '';
  private err = '';
  private queue: Pending[] = [];
  private current?: Pending;
  private idle?: NodeJS.Timeout;
  private seq = 0;
  private readonly tag = randomBytes(4).toString('hex');

  constructor(readonly uri: string, private onGone: () => void) {}

  /** The virsh process serving this URI now, if one is running. */
  get pid(): number | undefined { return this.proc?.pid; }

  run(args: string[], timeoutMs: number): Promise<SessionReply> {
    return new Promise((resolve, reject) => {
      const marker = `FERRY-${this.tag}-${++this.seq}`;
      const line = args.map(shellQuote).join(' ');
      const p: Pending = { marker, line, resolve, reject, timer: setTimeout(
        () => this.fail(new Error(`virsh ${args[0]} timed out after ${timeoutMs / 1000} s`)), timeoutMs) };
      p.timer.unref();
      this.queue.push(p);
      this.next();
    });
  }

  private start() {
    const proc = spawn('virsh', ['-q', '-c', this.uri], { stdio: ['pipe', 'pipe', 'pipe'] });
    proc.stdout.setEncoding('utf8');
    proc.stderr.setEncoding('utf8');
    proc.stdout.on('data', (d: string) => { this.out += d; this.settle(); });
    proc.stderr.on('data', (d: string) => { this.err += d; this.settle(); });
    proc.stdin.on('error', () => { /* the exit handler below reports the end */ });
    proc.on('error', (e) => this.fail(e));
    // After its output is read: what virsh said before it ended (it cannot connect) is the error.
    proc.on('close', (code) => { if (this.proc === proc) this.fail(new SessionEnded(this.err.trim() || `virsh for ${this.uri} exited (${code})`)); });
    this.proc = proc;
  }

  private next() {
    if (this.current || !this.queue.length) return;
    if (this.idle) { clearTimeout(this.idle); this.idle = undefined; }
    if (!this.proc) this.start();
    this.current = this.queue.shift()!;
    this.hold(true);
    this.proc!.stdin.write(`${this.current.line}\necho --err ${this.current.marker}\necho ${this.current.marker}\n`);
  }

  /** Ends the current command when both markers have arrived. virsh's shell may echo its prompt and each
   *  line it read to stdout (`virsh # <line>`): those lines are not output. */
  private settle() {
    const p = this.current;
    if (!p) return;
    const outAt = new RegExp(`(?<!echo )(?<!--err )${p.marker}`).exec(this.out); // not the echoed lines
    const errAt = this.err.indexOf(p.marker);
    if (!outAt || errAt < 0) return;
    let stdout = this.out.slice(0, outAt.index);
    for (const echoed of [p.line, `echo --err ${p.marker}`, `echo ${p.marker}`]) stdout = stdout.replace(`virsh # ${echoed}\n`, '');
    const errEnd = this.err.indexOf('\n', errAt);
    // virsh prefixes the echo on stderr with "error: ": that line is the marker's, not the command's.
    const stderr = this.err.slice(0, errAt).replace(/error: $/, '');
    this.out = this.out.slice(outAt.index + p.marker.length).replace(/^\n/, '');
    this.err = errEnd < 0 ? '' : this.err.slice(errEnd + 1);
    clearTimeout(p.timer);
    this.current = undefined;
    p.resolve({ stdout, stderr, failed: /^error:/m.test(stderr) });
    if (this.queue.length) this.next();
    else { this.hold(false); this.idle = setTimeout(() => this.close(), IDLE_MS); this.idle.unref(); }
  }

  /** An idle session must not keep Node running (a CLI would wait for it to time out); one with a command in
   *  flight must, or Node could exit before the answer. */
  private hold(on: boolean) {
    const p = this.proc;
    if (!p) return;
    for (const h of [p, p.stdin, p.stdout, p.stderr] as { ref(): void; unref(): void }[]) { if (on) h.ref(); else h.unref(); }
  }

  /** Rejects the current and queued commands and ends the process (the next command starts a new one). */
  fail(e: Error) {
    const all = [...(this.current ? [this.current] : []), ...this.queue];
    this.current = undefined;
    this.queue = [];
    for (const p of all) { clearTimeout(p.timer); p.reject(e); }
    this.close();
  }

  close() {
    const proc = this.proc;
    this.proc = undefined;
    this.out = '';
    this.err = '';
    if (this.idle) { clearTimeout(this.idle); this.idle = undefined; }
    if (proc) { proc.stdin.end(); proc.kill(); }
    this.onGone();
  }
}

const sessions = new Map<string, VirshSession>();

/** The session for `uri`, started on first use. */
export function virshSession(uri: string): VirshSession {
  let s = sessions.get(uri);
  if (!s) {
    const made: VirshSession = new VirshSession(uri, () => { if (sessions.get(uri) === made) sessions.delete(uri); });
    sessions.set(uri, made);
    s = made;
  }
  return s;
}

/** A session of the caller's own for `uri`, not shared with other callers (a volume stream's lane runs long
 *  commands that must not queue behind, or hold up, the shared session); the caller closes it. */
export function ownVirshSession(uri: string): VirshSession {
  return new VirshSession(uri, () => { /* not in the shared map */ });
}

export type { VirshSession };
