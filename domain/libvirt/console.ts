// A domain's serial console as a byte stream both ways: `virsh console` under a pseudo-terminal (virsh
// wants a terminal; python3's pty module gives it one, with an argument array). Works for any URI, remote too:
// libvirt streams the console over its own connection.
import { spawn, ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { checkName } from './names';
import { Virsh } from './virsh';
import { setting } from '../../platform/settings';

const PYTHON = setting('FERRY_PYTHON');
const PTY = 'import pty, sys; sys.exit(pty.spawn(sys.argv[1:]) >> 8)';
/** virsh's own lines around the guest's text. */
export const CONSOLE_BANNER = /Connected to domain '.*'\r?\nEscape character is .*\r?\n/;

export interface ConsoleSession extends EventEmitter {
  /** 'ready' once virsh is attached; raw guest output (latin1 text) arrives as 'data'; 'close' when virsh ends
   *  (domain stopped, console taken). */
  write(data: string | Buffer): void;
  close(): void;
  readonly proc: ChildProcess;
}

/** `force`: take the console from whoever holds it (virsh console --force throws them out). Without it, a console
 *  held elsewhere ends at once with virsh's reason. */
export function openConsole(v: Virsh, name: string, force = true): ConsoleSession {
  checkName(name, 'name');
  const proc = spawn(PYTHON, ['-c', PTY, 'virsh', '-c', v.uri, 'console', ...(force ? ['--force'] : []), name], { stdio: ['pipe', 'pipe', 'pipe'] });
  const ev = new EventEmitter() as ConsoleSession;
  let banner = true;
  let head = '';
  proc.stdout.setEncoding('latin1').on('data', (s: string) => {
    if (banner) {
      head += s;
      const m = CONSOLE_BANNER.exec(head);
      if (!m && head.length < 512 && !/\n.*\n/.test(head)) return;
      banner = false;
      ev.emit('ready');
      s = m ? head.slice(m.index + m[0].length) : head;
      if (!s) return;
    }
    ev.emit('data', s);
  });
  let err = '';
  proc.stderr.setEncoding('utf8').on('data', (s: string) => { if (err.length < 4096) err += s; });
  // virsh's own errors come through the terminal too (before any banner).
  proc.on('close', (code) => ev.emit('close', code, (err + (banner ? head : '')).replace(/\r/g, '').trim()));
  proc.on('error', (e) => ev.emit('close', -1, e.message));
  Object.assign(ev, {
    proc,
    write: (d: string | Buffer) => { if (proc.stdin.writable) proc.stdin.write(d); },
    close: () => { if (proc.exitCode === null && !proc.signalCode) proc.kill('SIGTERM'); },
  });
  return ev;
}
