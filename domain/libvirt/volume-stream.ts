// Bytes into and out of a volume on any libvirt host at an offset, with no scratch file (issue 36: one pass onto
// another host): `virsh vol-upload` / `vol-download` with `--offset` and `--length` through a named pipe in a
// private folder, through a long-lived virsh of its own (a new process per piece would cost a new connection, an
// ssh login on qemu+ssh://, each time). libvirt lets one stream at a time use a volume ("volume ... is still in
// use"), so the pieces of one volume go one after the other, and a piece refused because an earlier stream (a
// killed worker's) still holds the volume is tried again for a while.
// An upload's pipe is opened for writing once virsh has opened it for reading, and closing it is the end of the data;
// a download's is opened read-write by Ferry (so opening never blocks and no end of file comes early) and ends by the
// byte count.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fs, constants, open as openCb } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { promisify } from 'node:util';
import { mapLibvirtError } from './virsh';
import { ownVirshSession, type VirshSession } from './virsh-session';

const mkfifo = promisify(execFile);
const openFd = promisify(openCb);

/** A volume Ferry writes on a host it reaches only through libvirt. */
export interface VolumeRef { uri: string; pool: string; name: string }

/** The pipe opened for writing, without blocking: it opens once a reader has it open (virsh, for its upload);
 *  until then each try fails with ENXIO, and `gaveUp` says when virsh will never open it. */
async function openWriter(fifo: string, gaveUp: () => Error | undefined): Promise<number> {
  for (let wait = 1; ; wait = Math.min(wait * 2, 20)) {
    try { return await openFd(fifo, constants.O_WRONLY | constants.O_NONBLOCK); } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENXIO') throw e;
    }
    const why = gaveUp();
    if (why) throw why;
    await new Promise((r) => setTimeout(r, wait));
  }
}

/** A promise whose failure is awaited further down (or no longer matters once the other side failed). */
const settledBelow = () => { /* awaited below */ };

/** libvirt's refusal while another stream holds the volume, and how long Ferry waits for that one to end (a killed
 *  worker's virsh ends its piece when it reads the end of its pipe, within a second). */
const IN_USE = /is still in use/;
const IN_USE_WAIT_MS = 60_000;
const IN_USE_RETRY_MS = 500;

/** How long one piece may take (a piece is at most a few MiB, or one block of the check). */
const PIECE_MS = 15 * 60_000;

interface Lane { session: VirshSession; fifo: string }

/** Uploads and downloads of one volume, one piece at a time (`dir`: a private folder of the job for the pipe). */
export class VolumeStreams {
  /** the end of the last piece asked for: the next one starts after it */
  private last: Promise<unknown> = Promise.resolve();

  private constructor(readonly ref: VolumeRef, private readonly lane: Lane) {}

  static async open(ref: VolumeRef, dir: string): Promise<VolumeStreams> {
    await fs.mkdir(dir, { recursive: true, mode: 0o700 });
    // Pipes of earlier streams go first. Each pipe's name is new: a virsh of a killed worker that has not yet
    // opened its pipe must never open this one (it would read these bytes into its own piece's offset).
    for (const old of await fs.readdir(dir)) if (old.endsWith('.fifo')) await fs.rm(path.join(dir, old), { force: true });
    const fifo = path.join(dir, `lane-${randomBytes(4).toString('hex')}.fifo`);
    await mkfifo('mkfifo', ['-m', '0600', fifo]);
    return new VolumeStreams(ref, { session: ownVirshSession(ref.uri), fifo });
  }

  /** `bufs` written into the volume from byte `at`, in one upload; resolves once libvirt has them. */
  async write(at: number, bufs: Buffer[]): Promise<void> {
    const len = bufs.reduce((a, b) => a + b.length, 0);
    if (!len) return;
    await this.withLane(async (l) => {
      const cmd = this.command(l, ['vol-upload', '--pool', this.ref.pool, this.ref.name, l.fifo, '--offset', String(at), '--length', String(len)]);
      let ended: Error | undefined;
      cmd.then(() => { ended = new Error(`virsh vol-upload of ${this.ref.name} ended before it read its data`); }, (e: Error) => { ended = e; });
      // Opened for writing once virsh has it open for reading: closing it then is the end of the data virsh reads.
      const sock = new net.Socket({ fd: await openWriter(l.fifo, () => ended), readable: false, writable: true });
      // Every byte handed to the pipe: closed, which virsh reads as the end of the data.
      sock.once('finish', () => sock.destroy());
      const sent = new Promise<void>((resolve, reject) => { sock.once('error', reject); sock.once('close', () => resolve()); });
      sent.catch(settledBelow);
      for (const b of bufs) sock.write(b);
      sock.end();
      try {
        await sent;
        await cmd;
      } finally { sock.destroy(); }
    });
  }

  /** `len` bytes of the volume from byte `at`, handed to `each` as they arrive, in one download. */
  async read(at: number, len: number, each: (b: Buffer) => void): Promise<void> {
    if (!len) return;
    await this.withLane(async (l) => {
      const sock = new net.Socket({ fd: await openFd(l.fifo, constants.O_RDWR | constants.O_NONBLOCK), readable: true, writable: false });
      let got = 0;
      const received = new Promise<void>((resolve, reject) => {
        sock.once('error', reject);
        sock.on('data', (b: Buffer) => {
          const part = b.subarray(0, Math.max(0, len - got));
          got += part.length;
          if (part.length) each(part);
          if (got >= len) resolve();
        });
      });
      const cmd = this.command(l, ['vol-download', '--pool', this.ref.pool, this.ref.name, l.fifo, '--offset', String(at), '--length', String(len)]);
      cmd.catch(settledBelow);
      received.catch(settledBelow);
      try {
        // The download may fail before it sends a byte: whichever settles first with an error ends the wait.
        await Promise.race([received, cmd.then(() => received)]);
        await cmd;
      } finally { sock.destroy(); }
    });
  }

  /** Ends the virsh and removes the pipe. */
  async close(): Promise<void> {
    this.lane.session.close();
    await fs.rm(this.lane.fifo, { force: true });
  }

  private async command(l: Lane, args: string[]): Promise<void> {
    for (let waited = 0; ; waited += IN_USE_RETRY_MS) {
      const r = await l.session.run(args, PIECE_MS);
      if (!r.failed) return;
      if (!IN_USE.test(r.stderr) || waited >= IN_USE_WAIT_MS) throw mapLibvirtError(r.stderr, this.ref.uri);
      await new Promise((resolve) => setTimeout(resolve, IN_USE_RETRY_MS));
    }
  }

  /** `fn` once every piece asked for before it has ended (whatever its outcome). */
  private withLane<T>(fn: (l: Lane) => Promise<T>): Promise<T> {
    const mine = this.last.then(() => fn(this.lane));
    this.last = mine.catch(settledBelow);
    return mine;
  }
}
