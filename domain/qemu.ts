// qemu-img, always with argument arrays (never a shell): info, convert with live progress, check, compare.
import { spawn, execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { open, readFile, stat } from 'node:fs/promises';
import { OperationError } from '../platform/errors';
import { expectedError, ignoreError } from '../platform/log';
import { spawnSlots } from '../platform/limits';
import { setting } from '../platform/settings';

export const QEMU_IMG = setting('QEMU_IMG');

export interface ImageInfo {
  format: string;
  'virtual-size': number;
  'actual-size'?: number;
  'backing-filename'?: string;
  'full-backing-filename'?: string;
  snapshots?: unknown[];
  [k: string]: unknown;
}

export function run(cmd: string, args: string[], opts: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<{ stdout: string; stderr: string;
  code: number }> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { maxBuffer: 64 * 1024 * 1024, signal: opts.signal, timeout: opts.timeoutMs }, (err, stdout, stderr) => {
      if (err && err.code === 'ENOENT') return reject(new OperationError(`${cmd} is not installed`, false));
      // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors -- err is execFile's AbortError, an Error its typings hide
      if (err?.name === 'AbortError') return reject(err);
      resolve({ stdout: String(stdout), stderr: String(stderr), code: err ? Number(err.code ?? 1) : 0 });
    });
  });
}

/** `qemu-img info --output=json`, the image opened as `format` (fails if it is not): always given, from the
 *  request or the header Ferry read (domain/image-format.ts), so qemu-img never probes. */
export async function imageInfo(path: string, format: string, backingChain = false): Promise<ImageInfo> {
  const args = ['info', '--output=json', '-f', format, ...(backingChain ? ['--backing-chain'] : []), path];
  const r = await spawnSlots.probe.run(() => run(QEMU_IMG, args)); // capped per caller when a request asks
  if (r.code !== 0) throw new OperationError(`qemu-img info ${path}: ${r.stderr.trim() || 'failed'}`, false);
  const parsed = JSON.parse(r.stdout) as ImageInfo | ImageInfo[]; // qemu-img's own JSON: a list with --backing-chain
  return Array.isArray(parsed) ? parsed[0] : parsed;
}

/** One extent of `qemu-img map --output=json`: `depth` 0 is the image itself, deeper its backing files. */
export interface MapExtent { start: number; length: number; depth: number; data: boolean; zero: boolean }

/** `qemu-img map --output=json` of an image opened as `format`: where it holds data, a hole or its backing file's. */
export async function imageMap(path: string, format: string, signal?: AbortSignal): Promise<MapExtent[]> {
  const r = await run(QEMU_IMG, ['map', '--output=json', '-f', format, path], { signal });
  if (r.code !== 0) throw new OperationError(`qemu-img map of ${path}: ${r.stderr.trim() || 'failed'}`, false);
  return JSON.parse(r.stdout) as MapExtent[];
}

/** Bytes a process has read so far: `rchar` in /proc/<pid>/io counts every read(2)/pread(2), page-cache hits
 *  included (`read_bytes` counts only what came from the disk, which is nothing for a cached source). Undefined
 *  where /proc does not say (not Linux, or hidepid). */
async function bytesReadBy(pid: number): Promise<number | undefined> {
  try {
    const m = /^rchar: (\d+)$/m.exec(await readFile(`/proc/${pid}/io`, 'utf8'));
    return m ? Number(m[1]) : undefined;
  } catch { return undefined; }
}

/** What a file takes on its device (sparse holes excluded); undefined if it cannot be read. */
async function allocatedBytes(file: string): Promise<number | undefined> {
  // Missing (the output before qemu-img creates it) or unreadable: only this progress estimate goes without.
  const st = await stat(file).catch(expectedError('the output does not exist yet (qemu-img creates it): no allocation figure for this progress estimate',
    { file }));
  return st && (st.blocks * 512 || st.size || undefined);
}

export interface ConvertArgs {
  src: string; srcFormat: string; dest: string; destFormat: string; compress?: boolean; options?: string[]; extra?: string[];
  /** What qemu-img will read, for progress; default the source file's allocated size (what a copy of its data reads). */
  readSize?: number;
}

/** Runs `qemu-img convert`; `onProgress` gets 0-100, at most every `intervalMs`, rising, 100 only once qemu-img
 *  has exited 0. No `-p` (measured at +15-25% on the stage in issue 12): progress is what qemu-img has read so far
 *  against what the source holds, from the kernel's accounting in /proc, which costs qemu-img nothing (where /proc
 *  does not say, the output's growth). On abort qemu-img is killed and the promise rejects; the caller removes the
 *  partial output. docs/performance.md has the figures. */
/** For a convert whose caller shows no progress. */
export const noProgress = (_pct: number) => { /* not followed */ };

export function convert(args: ConvertArgs, onProgress: (pct: number) => void, signal?: AbortSignal, intervalMs = 250): Promise<void> {
  const argv = ['convert', '-f', args.srcFormat, '-O', args.destFormat, ...(args.compress ? ['-c'] : []),
    ...(args.options?.length ? ['-o', args.options.join(',')] : []), ...(args.extra || []), args.src, args.dest];
  return new Promise((resolve, reject) => {
    const child = spawn(QEMU_IMG, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    let killTimer: NodeJS.Timeout | undefined;
    let pollTimer: NodeJS.Timeout | undefined;
    let exited = false;
    let last = 0;
    const total = args.readSize ? Promise.resolve(args.readSize) : allocatedBytes(args.src);
    const poll = async () => {
      const n = (child.pid && await bytesReadBy(child.pid)) ?? await allocatedBytes(args.dest);
      const of = await total;
      if (exited) return;
      const pct = n && of ? Math.min(99, Math.floor((n / of) * 10000) / 100) : 0;
      if (pct > last) { last = pct; onProgress(pct); }
      schedule();
    };
    const schedule = () => {
      pollTimer = setTimeout(() => void poll().catch(ignoreError('could not read the conversion\'s progress; it goes on without further progress figures')),
        intervalMs);
    };
    schedule();
    const onAbort = () => {
      child.kill('SIGTERM');
      killTimer = setTimeout(() => child.kill('SIGKILL'), 2000);
    };
    if (signal?.aborted) onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    child.stderr.setEncoding('utf8').on('data', (s: string) => { if (stderr.length < 65536) stderr += s; });
    child.on('error', (e: NodeJS.ErrnoException) => reject(e.code === 'ENOENT' ? new OperationError('qemu-img is not installed', false) : e));
    child.on('close', (code, sig) => {
      exited = true;
      clearTimeout(pollTimer);
      signal?.removeEventListener('abort', onAbort);
      if (killTimer) clearTimeout(killTimer);
      if (signal?.aborted) return reject(signal.reason instanceof Error ? signal.reason : new Error(String(signal.reason || 'aborted')));
      if (code !== 0) return reject(new OperationError(`qemu-img convert failed (${sig || `exit ${code}`}): ${stderr.trim()}`, false));
      onProgress(100);
      resolve();
    });
  });
}

export async function check(path: string, format: string): Promise<{ ok: boolean; output: string; report?: unknown }> {
  const r = await run(QEMU_IMG, ['check', '--output=json', '-f', format, path]);
  let report: unknown;
  try { report = JSON.parse(r.stdout); } catch { /* raw and vdi may print no JSON */ }
  // exit 0 clean; 1 check not completed; 2 corruptions; 3 leaks only; 63 format does not support checks
  return { ok: r.code === 0 || r.code === 3 || r.code === 63, output: (r.stdout + r.stderr).trim(), report };
}

export async function compare(a: string, aFormat: string, b: string, bFormat: string): Promise<{ identical: boolean; output: string }> {
  const r = await run(QEMU_IMG, ['compare', '-f', aFormat, '-F', bFormat, a, b]);
  if (r.code > 1) throw new OperationError(`qemu-img compare failed: ${r.stderr.trim()}`, false);
  return { identical: r.code === 0, output: (r.stdout + r.stderr).trim() };
}

/** sha256 of a file in one sequential read; `onBytes` sees progress. One 4 MiB buffer is reused for every read:
 *  a read stream allocates a fresh buffer per chunk, and faulting in those pages cost about a quarter of the
 *  hash's time (0.80 s vs 1.0 s per GiB here), time taken from qemu-img when both run at once. */
export async function sha256File(path: string, onBytes?: (n: number) => void, signal?: AbortSignal): Promise<string> {
  const h = createHash('sha256');
  const fh = await open(path, 'r');
  try {
    const buf = Buffer.allocUnsafe(4 * 1024 * 1024);
    let n = 0;
    for (;;) {
      signal?.throwIfAborted();
      const { bytesRead } = await fh.read(buf, 0, buf.length, n);
      if (!bytesRead) break;
      h.update(bytesRead === buf.length ? buf : buf.subarray(0, bytesRead));
      n += bytesRead;
      onBytes?.(n);
    }
  } finally { await fh.close(); }
  return h.digest('hex');
}
