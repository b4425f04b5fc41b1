// Daemon process: the daemon API on port 8080. Options:
//   -addr HOST:PORT | :PORT   listen address (also daemon.addr in the config file, or DAEMON_PORT)
//   --config FILE             YAML configuration (also FERRY_CONFIG); validated at start
import '../../platform/check-settings'; // first: a bad setting stops the process before anything reads it
import { startDaemon } from './app';
import { ConfigError, configPath, loadConfig } from '../../platform/daemon-config';
import { onShutdown } from '../../platform/process';
import { errorText } from '../../platform/errors';
import { logoutAll } from '../../domain/vsphere/client';

function addrOption(argv: string[]): string | undefined {
  const i = argv.findIndex((a) => a === '-addr' || a === '--addr');
  if (i >= 0) return argv[i + 1];
  return argv.find((a) => /^--?addr=/.test(a))?.split('=')[1];
}

function parseAddr(addr: string): { host?: string; port: number } {
  const m = /^(.*):(\d{1,5})$/.exec(addr);
  if (!m || Number(m[2]) > 65535) throw new ConfigError(`-addr must be host:port or :port, got "${addr}"`);
  return { host: m[1] || undefined, port: Number(m[2]) };
}

try {
  const cfg = loadConfig(configPath());
  const addr = addrOption(process.argv.slice(2)) ?? cfg.daemon.addr;
  const listen = addr ? { ...parseAddr(addr), hostSetting: addrOption(process.argv.slice(2)) ? '-addr' : 'daemon.addr' } : {};
  // The vSphere sessions this process opened (its /vms calls, plan preflights) are logged out last, once nothing
  // uses them, rather than left to expire on the manager.
  startDaemon(cfg, listen).then((d) => onShutdown(async () => { try { await d.close(); } finally { await logoutAll(); } })).catch((e) => {
    process.stderr.write(`daemon failed to start: ${errorText(e)}\n`);
    process.exit(1);
  });
} catch (e) {
  process.stderr.write(`daemon: ${(e as Error).message}\n`);
  process.exit(2);
}
