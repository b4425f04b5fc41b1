// A private sshd on 127.0.0.1 (a free port, its own host key, one client key allowed for root), stopped by its pid.
// With `wrap` (a command prefix such as `nsenter -t <pid> -n -m --`) it runs inside another host's namespaces on
// `listen`:`port` (test/deploy/topology.test.ts: the libvirt host's sshd), and is ready when it says it listens.
import { execFileSync, spawn, ChildProcess } from 'node:child_process';
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { freePort, waitForPort } from './redis';

export interface TestSshd { port: number; key: string; hostKey: string; log(): string; stop(): Promise<void> }
export interface SshdOptions { wrap?: string[]; listen?: string; port?: number }

export async function startSshd(dir: string, o: SshdOptions = {}): Promise<TestSshd> {
  mkdirSync(dir, { recursive: true });
  if (!o.wrap) mkdirSync('/run/sshd', { recursive: true });
  const key = path.join(dir, 'client_key');
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', path.join(dir, 'host_key')]);
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', key]);
  copyFileSync(`${key}.pub`, path.join(dir, 'authorized_keys'));
  const port = o.port ?? await freePort();
  const conf = path.join(dir, 'sshd_config');
  writeFileSync(conf, [
    `Port ${port}`, `ListenAddress ${o.listen ?? '127.0.0.1'}`, `HostKey ${path.join(dir, 'host_key')}`,
    `AuthorizedKeysFile ${path.join(dir, 'authorized_keys')}`, 'PasswordAuthentication no', 'KbdInteractiveAuthentication no',
    `PidFile ${path.join(dir, 'sshd.pid')}`, 'StrictModes no', 'UsePAM no', 'PermitRootLogin prohibit-password',
    'Subsystem sftp internal-sftp', 'LogLevel INFO', '',
  ].join('\n'));
  let log = '';
  // Inside another mount namespace sshd's privilege-separation folder is made there (its /run is its own).
  const argv = o.wrap ? [...o.wrap, 'sh', '-c', 'mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e -f "$0"', conf] : ['/usr/sbin/sshd', '-D', '-e', '-f', conf];
  const sshd: ChildProcess = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'ignore', 'pipe'] });
  sshd.stderr!.setEncoding('utf8').on('data', (s: string) => { log += s; });
  if (o.wrap) await listening(sshd, () => log);
  else await waitForPort(port, 15000).catch((e: Error) => { throw new Error(`${e.message}: ${log}`); });
  return {
    port, key, hostKey: path.join(dir, 'host_key.pub'), log: () => log,
    async stop() {
      if (sshd.exitCode !== null || sshd.signalCode) return;
      const gone = new Promise((r) => sshd.once('exit', r));
      sshd.kill('SIGTERM');
      await gone;
    },
  };
}

/** Resolves once sshd logs that it listens (its port is in another network namespace, not connectable from here). */
function listening(sshd: ChildProcess, log: () => string): Promise<void> {
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`sshd did not listen within 15 s: ${log()}`)), 15000);
    const check = () => { if (/Server listening on/.test(log())) { clearTimeout(t); resolve(); } };
    sshd.stderr!.on('data', check);
    sshd.once('exit', (code) => { clearTimeout(t); reject(new Error(`sshd exited (${code}): ${log()}`)); });
    check();
  });
}
