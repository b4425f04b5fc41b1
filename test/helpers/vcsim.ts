// The vSphere API simulator (vcsim, built by scripts/vcsim.sh from Debian's govmomi) as a child process on a
// free loopback port with TLS and its own certificate, stopped by its pid. Used by test/vsphere and the export
// benchmark.
import { execFile, spawn, ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { freePort } from './redis';

const ROOT = path.resolve(__dirname, '..', '..');

/** Builds vcsim once (cached outside the clone) and returns the binary's path. */
export async function vcsimBinary(): Promise<string> {
  const { stdout } = await promisify(execFile)('bash', [path.join(ROOT, 'scripts', 'vcsim.sh')], { maxBuffer: 1 << 20 });
  return stdout.trim().split('\n').pop()!;
}

export interface Vcsim {
  /** https://127.0.0.1:PORT/sdk */
  url: string;
  host: string;
  port: number;
  username: string;
  password: string;
  /** PEM file of the simulator's self-signed certificate (use it as the CA). */
  caFile: string;
  /** Local directory behind each datastore. */
  datastores: Record<string, string>;
  proc: ChildProcess;
  logs: string[];
  stop(): Promise<void>;
}

export async function startVcsim(opts: { port?: number; username?: string; password?: string; args?: string[] } = {}): Promise<Vcsim> {
  const bin = await vcsimBinary();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-vcsim-'));
  const username = opts.username ?? 'ferry';
  const password = opts.password ?? 'vcsim-pass-1';
  for (let attempt = 0; ; attempt++) {
    const port = opts.port ?? await freePort();
    const caFile = path.join(dir, 'vcsim.pem');
    const proc = spawn(bin, ['-l', `127.0.0.1:${port}`, '-cert-out', caFile, '-username', username, '-password', password, ...(opts.args || [])], { stdio: ['ignore', 'pipe', 'pipe'] });
    const logs: string[] = [];
    proc.stderr.on('data', (b: Buffer) => { logs.push(b.toString()); if (logs.length > 300) logs.shift(); if (process.env.FERRY_TEST_LOGS) process.stderr.write(b); });
    const exited = new Promise<void>((r) => proc.once('exit', () => r()));
    let out = '';
    const ready = await new Promise<{ url: string; datastores: Record<string, string> } | null>((resolve) => {
      const t = setTimeout(() => resolve(null), 30000);
      proc.stdout.on('data', (b: Buffer) => {
        out += b.toString();
        const nl = out.indexOf('\n');
        if (nl >= 0) { clearTimeout(t); try { resolve(JSON.parse(out.slice(0, nl)) as { url: string; datastores: Record<string, string> }); } catch { resolve(null); } }
      });
      proc.once('exit', () => { clearTimeout(t); resolve(null); });
    });
    if (!ready) {
      proc.kill('SIGKILL');
      await exited;
      // The free port may have been taken between freePort() and vcsim's bind: try another one.
      if (attempt < 2 && opts.port === undefined) continue;
      throw new Error(`vcsim did not start: ${logs.join('')}`);
    }
    const stop = async () => {
      if (proc.exitCode === null && !proc.signalCode) {
        proc.kill('SIGTERM');
        await Promise.race([exited, new Promise((r) => setTimeout(r, 10000))]);
        if (proc.exitCode === null && !proc.signalCode) { proc.kill('SIGKILL'); await exited; }
      }
      // SIGTERM removes the datastore directories; after a SIGKILL they are removed here.
      for (const d of Object.values(ready.datastores)) rmSync(d, { recursive: true, force: true });
      rmSync(dir, { recursive: true, force: true });
    };
    return { url: ready.url, host: '127.0.0.1', port, username, password, caFile, datastores: ready.datastores, proc, logs, stop };
  }
}
