// fetch-and-fix: copies the remote disk over SSH (scp, which speaks SFTP: the remote path never meets a remote
// shell) with a connect timeout, an overall timeout and retries. The host key is trusted on first use and kept
// in a known_hosts file beside the fetched copy.
import { spawn } from 'node:child_process';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { OperationError } from '../../platform/errors';

export interface FetchOptions {
  host: string; port?: number; user: string; identity?: string; remote: string; destDir: string;
  /** Local file name; default the remote's base name. Batch entries run side by side in one destDir, and
   *  remotes often share a base name (/vms/web1/disk.vmdk, /vms/web2/disk.vmdk), so the CLI names each copy. */
  destName?: string;
  timeoutSeconds: number; retries: number;
}

function scpOnce(o: FetchOptions, dest: string, onBytes: (n: number) => void): Promise<void> {
  let host = o.host;
  let port = o.port;
  const m = /^([^:]+):(\d+)$/.exec(host);
  if (m) { host = m[1]; port ??= Number(m[2]); }
  const args = ['-q', '-B', '-o', 'BatchMode=yes', '-o', 'StrictHostKeyChecking=accept-new',
    '-o', `UserKnownHostsFile=${path.join(o.destDir, 'known_hosts')}`, '-o', `ConnectTimeout=${Math.min(o.timeoutSeconds, 60)}`,
    '-o', 'ServerAliveInterval=15', ...(port ? ['-P', String(port)] : []), ...(o.identity ? ['-i', o.identity, '-o', 'IdentitiesOnly=yes'] : []),
    '--', `${o.user}@${host}:${o.remote}`, dest];
  return new Promise((resolve, reject) => {
    const child = spawn('scp', args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.setEncoding('utf8').on('data', (s: string) => { if (err.length < 8192) err += s; });
    // Before scp creates the file there is nothing to count (ENOENT); any other stat error ends the byte count.
    const poll = setInterval(() => {
      fs.stat(dest).then((s) => onBytes(s.size), (e: NodeJS.ErrnoException) => { if (e.code !== 'ENOENT') clearInterval(poll); });
    }, 500);
    const killer = setTimeout(() => child.kill('SIGKILL'), o.timeoutSeconds * 1000);
    child.on('error', (e: NodeJS.ErrnoException) => reject(e.code === 'ENOENT' ? new OperationError('scp is not installed (openssh-client)', false) : e));
    child.on('close', (code, sig) => {
      clearInterval(poll); clearTimeout(killer);
      if (code === 0) resolve();
      else reject(new Error(sig === 'SIGKILL' ? `timed out after ${o.timeoutSeconds} s` : err.trim() || `scp exit ${code}`));
    });
  });
}

/** Fetches with up to `retries` further attempts (1 s, 2 s, 4 s ... apart); returns the local copy. */
const noProgress = (_bytes: number) => { /* the caller does not follow the copy */ };

export async function fetchRemote(o: FetchOptions, onBytes: (n: number) => void = noProgress): Promise<{ path: string; bytes: number; attempts: number }> {
  await fs.mkdir(o.destDir, { recursive: true });
  const dest = path.join(o.destDir, o.destName || path.posix.basename(o.remote));
  const tmp = `${dest}.partial`;
  let last: Error | undefined;
  for (let attempt = 1; attempt <= o.retries + 1; attempt++) {
    try {
      await scpOnce(o, tmp, onBytes);
      await fs.rename(tmp, dest);
      return { path: dest, bytes: (await fs.stat(dest)).size, attempts: attempt };
    } catch (e) {
      last = e as Error;
      await fs.rm(tmp, { force: true });
      if (attempt <= o.retries) await new Promise((r) => setTimeout(r, Math.min(30_000, 1000 * 2 ** (attempt - 1))));
    }
  }
  throw new OperationError(`fetch of ${o.user}@${o.host}:${o.remote} failed after ${o.retries + 1} attempt(s): ${last?.message}`, true);
}
