// qemu-img, always with argument arrays (never a shell): info, convert with live progress, check, compare.
import { spawn, execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { open, readFile, stat } from 'node:fs/promises';
import { OperationError } from './errors';

export const QEMU_IMG = process.env.QEMU_IMG || 'qemu-img';

export interface ImageInfo {
  format: string;
  'virtual-size': number;
  'actual-size'?: number;
  'backing-filename'?: string;
  'full-backing-filename'?: string;
  snapshots?: unknown[];
  [k: string]: unknown;
}

export function run(cmd: string, args: string[], opts: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<{ stdout: string; stderr: string; code: number }> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { maxBuffer: 64 * 1024 * 1024, signal: opts.signal, timeout: opts.timeoutMs }, (err, stdout, stderr) => {
      if (err && (err as any).code === 'ENOENT') return reject(new OperationError(`${cmd} is not installed`, false));
      if (err && (err as any).name === 'AbortError') return reject(err);
      resolve({ stdout: String(stdout), stderr: String(stderr), code: err ? Number((err as any).code ?? 1) : 0 });
    });
  });
}

/** `qemu-img info --output=json`; with `format` the image is opened as that format (fails if it is not). */
export async function imageInfo(path: string, format?: string, backingChain = false): Promise<ImageInfo> {
  const args = ['info', '--output=json', ...(format ? ['-f', format] : []), ...(backingChain ? ['--backing-chain'] : []), path];
  const r = await run(QEMU_IMG, args);
  if (r.code !== 0) throw new OperationError(`qemu-img info ${path}: ${r.stderr.trim() || 'failed'}`, false);
  const parsed = JSON.parse(r.stdout);
  return Array.isArray(parsed) ? parsed[0] : parsed;
}

/** Bytes a process has read so far (`rchar` of /proc/<pid>/io: every read call of all its threads), or undefined
 *  when the file cannot be read (not Linux, the process gone). */
export async function bytesReadBy(pid: number): Promise<number | undefined> {
  try {
    const m = /^rchar:\s*(\d+)/m.exec(await readFile(`/proc/${pid}/io`, 'utf8'));
    return m ? Number(m[1]) : undefined;
  } catch { return undefined; }
}

/**
 * Runs `qemu-img convert`; `onProgress` gets 0-100. Progress is how much of the source qemu-img has read so far
 * (/proc/<pid>/io, polled twice a second, against the source's allocated bytes), not `-p`: drawing its progress
 * bar made qemu-img 15-25% slower (scripts/bench/convert.ts). 100 is reported when qemu-img exits 0. On abort
 * qemu-img is killed and the promise rejects.
 */
export function convert(args: { src: string; srcFormat: string; dest: string; destFormat: string; compress?: boolean; options?: string[]; extra?: string[] },
  onProgress: (pct: number) => void, signal?: AbortSignal): Promise<void> {
  const argv = ['convert', '-f', args.srcFormat, '-O', args.destFormat, ...(args.compress ? ['-c'] : []),
    ...(args.options?.length ? ['-o', args.options.join(',')] : []), ...(args.extra || []), args.src, args.dest];
  return new Promise((resolve, reject) => {
    const child = spawn(QEMU_IMG, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    let killTimer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      child.kill('SIGTERM');
      killTimer = setTimeout(() => child.kill('SIGKILL'), 2000);
    };
    if (signal?.aborted) onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    // What qemu-img will read: the source's allocated bytes (a sparse image's holes are skipped, not read).
    const total = stat(args.src).then((st) => Math.max(1, Math.min(st.size, st.blocks * 512 || st.size)), () => 0);
    let last = -1;
    const poll = setInterval(async () => {
      const [n, t] = [child.pid ? await bytesReadBy(child.pid) : undefined, await total];
      if (n === undefined || !t) return;
      const pct = Math.min(99, Math.floor((1000 * n) / t) / 10);
      if (pct > last && child.exitCode === null) { last = pct; onProgress(pct); }
    }, 500);
    child.stderr.setEncoding('utf8').on('data', (s: string) => { if (stderr.length < 65536) stderr += s; });
    child.on('error', (e: any) => { clearInterval(poll); reject(e.code === 'ENOENT' ? new OperationError('qemu-img is not installed', false) : e); });
    child.on('close', (code, sig) => {
      clearInterval(poll);
      signal?.removeEventListener('abort', onAbort);
      if (killTimer) clearTimeout(killTimer);
      if (signal?.aborted) return reject(signal.reason instanceof Error ? signal.reason : new Error(String(signal.reason || 'aborted')));
      if (code === 0) { onProgress(100); return resolve(); }
      reject(new OperationError(`qemu-img convert failed (${sig || `exit ${code}`}): ${stderr.trim()}`, false));
    });
  });
}

export async function check(path: string, format: string): Promise<{ ok: boolean; output: string; report?: any }> {
  const r = await run(QEMU_IMG, ['check', '--output=json', '-f', format, path]);
  let report: any;
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
