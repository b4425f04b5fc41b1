// Separate hosts on one machine, for test/deploy/topology.test.ts. A host is a set of Linux namespaces (network,
// mount, UTS) held by a `sleep` that `unshare` started, with its own hostname; hosts meet on one switch (a bridge
// in a network namespace of its own) through veth pairs with addresses of a private /24, and the test's own
// process reaches them through one more veth pair. Only veth and loopback: no NAT, no default route, nothing
// forwarded beyond the /24, so no traffic leaves the machine. A host's processes run under `nsenter` into its
// namespaces, and its mount namespace is private: what the test mounts there (a hosts file, a tmpfs on /run, the
// declared volumes and secrets) is that host's alone, as a container's is. An existing namespace (the libvirtd of
// test/helpers/libvirt.ts) joins as a host too. Everything ends with the processes started here, by their pids;
// the veth pairs go with their namespaces.
import { execFileSync, spawn, ChildProcess } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { readFileSync, readlinkSync } from 'node:fs';
import { until } from './http';

export interface Host {
  name: string; ip: string; pid: number;
  /** Runs a shell script in the host's namespaces (mount, network, UTS) and answers its output. */
  sh(script: string, ...args: string[]): string;
  /** Starts `argv` in the host's namespaces, in `cwd`, with exactly `env`. */
  start(argv: string[], env: Record<string, string>, cwd: string): HostProc;
}

export interface HostProc { host: string; proc: ChildProcess; logs: string[]; stop(signal?: NodeJS.Signals): Promise<void> }

const run = (cmd: string, args: string[]) => execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const nsOf = (pid: number | 'self', ns: string) => readlinkSync(`/proc/${pid}/ns/${ns}`);

export class Lan {
  /** The /24 as its first three octets, and the test process's address on it. */
  readonly net: string;
  readonly rootIp: string;
  private readonly tag = randomInt(0x1000, 0xffff).toString(16);
  private links = 0;
  private readonly holders: ChildProcess[] = [];
  private readonly procs: HostProc[] = [];
  private switchPid = 0;

  constructor() {
    const routes = run('ip', ['-4', 'route']);
    const pick = () => `10.${randomInt(100, 250)}.${randomInt(0, 256)}`;
    let net = pick();
    while (routes.includes(`${net}.`)) net = pick();
    this.net = net;
    this.rootIp = `${net}.254`;
  }

  /** The switch and the test process's link to it. */
  async start(): Promise<this> {
    this.switchPid = await this.holder('switch');
    run('nsenter', ['-t', String(this.switchPid), '-n', 'sh', '-c', 'ip link add br0 type bridge && ip link set br0 up && ip link set lo up']);
    const hostEnd = this.link();
    run('ip', ['addr', 'add', `${this.rootIp}/24`, 'dev', hostEnd]);
    run('ip', ['link', 'set', hostEnd, 'up']);
    return this;
  }

  /** A new host with its own namespaces at `.last` of the /24. */
  async host(name: string, last: number): Promise<Host> {
    return this.join(name, await this.holder(name), last);
  }

  /** An existing namespace (held by `pid`) as a host at `.last`. */
  join(name: string, pid: number, last: number): Host {
    const ip = `${this.net}.${last}`;
    const end = this.link();
    run('ip', ['link', 'set', end, 'netns', String(pid)]);
    run('nsenter', ['-t', String(pid), '-n', 'sh', '-c', `ip link set "$0" name eth0 && ip addr add "$1/24" dev eth0 && ip link set eth0 up && ip link set lo up`, end, ip]);
    const enter = ['nsenter', '-t', String(pid), '-m', '-n', ...(this.holders.some((h) => h.pid === pid) ? ['-u'] : [])];
    return {
      name, ip, pid,
      sh: (script, ...args) => run(enter[0], [...enter.slice(1), '--', 'sh', '-ec', script, name, ...args]),
      start: (argv, env, cwd) => this.spawnIn(name, [...enter, `--wd=${cwd}`, '--', ...argv], env),
    };
  }

  /** Stops every process started in a host (SIGTERM, then SIGKILL), then the holders: the namespaces end. */
  async stop(): Promise<void> {
    await Promise.all(this.procs.map((p) => p.stop()));
    for (const h of this.holders) if (h.exitCode === null && !h.signalCode) { const gone = new Promise((r) => h.once('exit', r)); h.kill('SIGKILL'); await gone; }
  }

  /** A veth pair: one end on the switch's bridge, the other left here (its name answered) to be moved or used. */
  private link(): string {
    const n = this.links++;
    const sw = `ft${this.tag}${n}s`;
    const other = `ft${this.tag}${n}h`;
    run('ip', ['link', 'add', sw, 'type', 'veth', 'peer', 'name', other]);
    run('ip', ['link', 'set', sw, 'netns', String(this.switchPid)]);
    run('nsenter', ['-t', String(this.switchPid), '-n', 'sh', '-c', 'ip link set "$0" master br0 && ip link set "$0" up', sw]);
    return other;
  }

  /** A `sleep` in new network, mount (private propagation) and UTS namespaces, named `name`; answers its pid. */
  private async holder(name: string): Promise<number> {
    const h = spawn('unshare', ['-m', '-n', '-u', '--propagation', 'private', '--', 'sh', '-c', 'echo "$0" > /proc/sys/kernel/hostname && exec sleep infinity', name], { stdio: 'ignore' });
    this.holders.push(h);
    const pid = h.pid!;
    await until(() => {
      if (h.exitCode !== null) throw Object.assign(new Error(`unshare for host ${name} exited ${h.exitCode}`), { fatal: true });
      try { return nsOf(pid, 'uts') !== nsOf('self', 'uts') && readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'sleep'; } catch { return false; }
    }, 10_000, `host ${name}'s namespaces`);
    return pid;
  }

  private spawnIn(host: string, argv: string[], env: Record<string, string>): HostProc {
    const proc = spawn(argv[0], argv.slice(1), { env, stdio: ['ignore', 'pipe', 'pipe'] });
    const logs: string[] = [];
    const keep = (b: Buffer) => { logs.push(b.toString()); if (logs.length > 500) logs.shift(); if (process.env.FERRY_TEST_LOGS) process.stderr.write(`[${host}] ${b.toString()}`); };
    proc.stdout.on('data', keep);
    proc.stderr.on('data', keep);
    const exited = new Promise<void>((r) => proc.once('exit', () => r()));
    const p: HostProc = {
      host, proc, logs,
      async stop(signal: NodeJS.Signals = 'SIGTERM') {
        if (proc.exitCode !== null || proc.signalCode) return;
        proc.kill(signal);
        const t = setTimeout(() => proc.kill('SIGKILL'), 20_000);
        await exited;
        clearTimeout(t);
      },
    };
    this.procs.push(p);
    return p;
  }
}
