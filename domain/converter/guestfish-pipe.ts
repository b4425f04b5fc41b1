// The line protocol of one guestfish process read from its standard input (guestfish(1), "the command line"):
// each command is one line, every argument double-quoted with C escapes, prefixed with `-` so that a failing
// command does not end the process, and followed by `echo <marker>`; the answer is every byte guestfish printed
// before the marker. Errors go to the process's stderr (a file the session reads, see guestfs.ts): guestfish
// writes them before it runs the `echo`, so once the marker is read they are in the file.
import type { ChildProcess } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import { randomBytes } from 'node:crypto';

/** One argument as guestfish's parser reads it back exactly: quotes, backslashes and control characters escaped
 *  (`\xHH`), so a newline in a script or a file name cannot start another command. */
export function fishQuote(arg: string): string {
  // eslint-disable-next-line no-control-regex -- control characters are exactly what must be escaped
  return `"${arg.replace(/[\\"\x00-\x1f\x7f]/g, (c) => (c === '\\' ? '\\\\' : c === '"' ? '\\"' : `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`))}"`;
}

/** The answers of one guestfish process, one command at a time. */
export class FishPipe {
  /** Random per process: no file or program output of the guest can end an answer early. */
  private readonly marker = Buffer.from(`ferry-${randomBytes(16).toString('hex')}\n`);
  private chunks: Buffer[] = [];
  private size = 0;
  private pending?: { resolve: (b: Buffer) => void; reject: (e: Error) => void };
  private tail: Promise<unknown> = Promise.resolve();
  private gone?: string;
  /** Settles when the process has exited (its pipes closed). */
  readonly ended: Promise<void>;

  private readonly stdin: Writable;

  /** `proc` was spawned with its stdin and stdout as pipes. */
  constructor(proc: ChildProcess) {
    this.stdin = proc.stdin as Writable;
    (proc.stdout as Readable).on('data', (b: Buffer) => this.received(b));
    this.stdin.on('error', () => { /* the process is gone: its 'close' below answers what is pending */ });
    this.ended = new Promise((resolve) => proc.on('close', (code, sig) => {
      this.gone = `guestfish exited (${sig ?? `status ${code}`})`;
      this.pending?.reject(new Error(this.gone));
      this.pending = undefined;
      resolve();
    }));
  }

  get exited(): boolean { return this.gone !== undefined; }

  /** Sends one command; answers its output. Calls queue behind each other (guestfish runs one at a time);
   *  `sending` runs just before this one is written, when the ones before it have answered. */
  send(command: string[], sending?: () => void): Promise<Buffer> {
    const run = this.tail.then(() => new Promise<Buffer>((resolve, reject) => {
      if (this.gone) return reject(new Error(this.gone));
      sending?.();
      this.pending = { resolve, reject };
      this.stdin.write(`-${command[0]} ${command.slice(1).map(fishQuote).join(' ')}\necho ${this.marker.toString().trim()}\n`);
    }));
    this.tail = run.catch(() => undefined);
    return run;
  }

  /** Ends the process the way guestfish ends: `exit`, which shuts the appliance down. */
  end(): void {
    if (!this.gone) this.stdin.end('exit\n');
  }

  private received(b: Buffer) {
    // The marker can straddle chunks: search the new chunk with the marker's length of bytes before it, so a
    // large answer (a file read whole) is searched once, not again with every chunk.
    const before = this.size;
    this.chunks.push(b);
    this.size += b.length;
    const back = Math.min(before, this.marker.length - 1);
    const prev: Buffer[] = [];
    for (let i = this.chunks.length - 2, n = 0; i >= 0 && n < back; i--) { prev.unshift(this.chunks[i]); n += this.chunks[i].length; }
    const window = back ? Buffer.concat([Buffer.concat(prev).subarray(-back), b]) : b;
    const at = window.indexOf(this.marker);
    if (at < 0 || !this.pending) return;
    const all = Buffer.concat(this.chunks, this.size);
    const end = before - back + at;
    const p = this.pending;
    this.pending = undefined;
    const rest = all.subarray(end + this.marker.length);
    this.chunks = rest.length ? [rest] : [];
    this.size = rest.length;
    p.resolve(all.subarray(0, end));
  }
}
