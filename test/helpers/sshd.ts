// A private sshd on 127.0.0.1 (a free port, its own host key, one client key allowed for root), stopped by its pid.
import { execFileSync, spawn, ChildProcess } from 'node:child_process';
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { freePort, waitForPort } from './redis';

export interface TestSshd { port: number; key: string; log(): string; stop(): Promise<void> }

export async function startSshd(dir: string): Promise<TestSshd> {
  mkdirSync(dir, { recursive: true });
  mkdirSync('/run/sshd', { recursive: true });
  const key = path.join(dir, 'client_key');
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', path.join(dir, 'host_key')]);
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', key]);
  copyFileSync(`${key}.pub`, path.join(dir, 'authorized_keys'));
  const port = await freePort();
  const conf = path.join(dir, 'sshd_config');
  writeFileSync(conf, [
    `Port ${port}`, 'ListenAddress 127.0.0.1', `HostKey ${path.join(dir, 'host_key')}`,
    `AuthorizedKeysFile ${path.join(dir, 'authorized_keys')}`, 'PasswordAuthentication no', 'KbdInteractiveAuthentication no',
    `PidFile ${path.join(dir, 'sshd.pid')}`, 'StrictModes no', 'UsePAM no', 'PermitRootLogin prohibit-password',
    'Subsystem sftp internal-sftp', 'LogLevel INFO', '',
  ].join('\n'));
  let log = '';
  const sshd: ChildProcess = spawn('/usr/sbin/sshd', ['-D', '-e', '-f', conf], { stdio: ['ignore', 'ignore', 'pipe'] });
  sshd.stderr!.setEncoding('utf8').on('data', (s: string) => { log += s; });
  await waitForPort(port, 15000).catch((e: Error) => { throw new Error(`${e.message}: ${log}`); });
  return {
    port, key, log: () => log,
    async stop() {
      if (sshd.exitCode !== null || sshd.signalCode) return;
      const gone = new Promise((r) => sshd.once('exit', r));
      sshd.kill('SIGTERM');
      await gone;
    },
  };
}
