// A private redis-server on a free port, which a test can kill and restart.
import { spawn, ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => { const p = (s.address() as net.AddressInfo).port; s.close(() => resolve(p)); });
  });
}

export async function waitForPort(port: number, timeoutMs = 15000) {
  const until = Date.now() + timeoutMs;
  while (Date.now() < until) {
    const ok = await new Promise<boolean>((r) => {
      const c = net.connect(port, '127.0.0.1');
      c.once('connect', () => { c.destroy(); r(true); });
      c.once('error', () => r(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`port ${port} did not open`);
}

export class TestRedis {
  proc?: ChildProcess;
  dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-redis-'));
  constructor(public port = 0) {}
  get url() { return `redis://127.0.0.1:${this.port}`; }

  async start() {
    if (!this.port) this.port = await freePort();
    this.proc = spawn('redis-server', ['--port', String(this.port), '--bind', '127.0.0.1', '--dir', this.dir,
      '--appendonly', 'yes', '--appendfsync', 'always', '--save', '', '--maxmemory-policy', 'noeviction'], { stdio: 'ignore' });
    await waitForPort(this.port);
    return this;
  }

  /** SIGKILL: no chance to flush anything beyond what the append-only file already holds. */
  async kill() {
    const p = this.proc;
    if (!p || p.exitCode !== null) return;
    const gone = new Promise((r) => p.once('exit', r));
    p.kill('SIGKILL');
    await gone;
  }

  async stop() {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}
