// A mocha root hook (loaded by .mocharc.json) that keeps the fast tier true to its name: in `npm run test:fast`
// (FERRY_TEST_TIER=fast, set by scripts/test.ts) a file that starts a virtual machine fails, naming it. A VM is any
// qemu-system process this mocha worker started, directly or not (an emulated guest, paused or running, started by
// qemu or by the tests' libvirtd, or libguestfs's appliance), seen by reading /proc four times a second while the
// file runs (about 5 ms of CPU each); libvirtd's capability probes (`-machine none`, no guest) do not count. So a
// test that starts one and lacks the `@vm` tag (scripts/test-order.ts) cannot stay in the fast tier unnoticed. In
// parallel mode root hooks run once per file, in the worker that runs it, one file at a time.
import { readFileSync, readdirSync } from 'node:fs';

const POLL_MS = 250;

/** What marks this worker's processes in their environment: a guestfish server forks away from the worker that
 *  started it (its appliance's qemu then descends from pid 1), but it keeps the environment it was given. */
export const GUARD_ENV = 'FERRY_TIER_GUARD';

interface Proc { ppid: number; comm: string; state: string }

function processes(): Map<number, Proc> {
  const all = new Map<number, Proc>();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    let stat: string;
    try { stat = readFileSync(`/proc/${d}/stat`, 'utf8'); } catch { continue; } // ended since the listing
    const close = stat.lastIndexOf(')'); // the name may hold spaces and parentheses
    const [state, ppid] = stat.slice(close + 2).split(' ');
    all.set(Number(d), { comm: stat.slice(stat.indexOf('(') + 1, close), state, ppid: Number(ppid) });
  }
  return all;
}

function descends(all: Map<number, Proc>, pid: number, root: number): boolean {
  for (let p = all.get(pid)?.ppid, hops = 0; p && hops < 64; p = all.get(p)?.ppid, hops++) if (p === root) return true;
  return false;
}

/** Whether a process was started, at any remove, by `root`: below it in the process tree, or marked by its
 *  environment. */
function startedBy(all: Map<number, Proc>, pid: number, root: number): boolean {
  if (descends(all, pid, root)) return true;
  try { return readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').includes(`${GUARD_ENV}=${root}`); } catch { return false; } // ended
}

/** The command lines of the VMs now running that `root` started. */
export function vmsUnder(root: number): string[] {
  const all = processes();
  const found: string[] = [];
  for (const [pid, p] of all) {
    // A zombie (state Z) has ended: seen before while it ran, if it ran a guest.
    if (!p.comm.startsWith('qemu-system') || p.state === 'Z' || !startedBy(all, pid, root)) continue;
    let argv: string[];
    try { argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean); } catch { continue; } // ended
    if (!argv.length) continue; // exiting: its memory, the command line with it, is gone
    const machine = argv.indexOf('-machine');
    if (machine >= 0 && /^none(,|$)/.test(argv[machine + 1] ?? '')) continue; // a capability probe
    found.push(`${pid}: ${argv.join(' ').slice(0, 300)}`);
  }
  return found;
}

const seen = new Set<string>();
let timer: NodeJS.Timeout | undefined;

const fast = process.env.FERRY_TEST_TIER === 'fast';
if (fast) process.env[GUARD_ENV] = String(process.pid); // inherited by every process this worker starts

export const mochaHooks = fast ? {
  beforeAll() {
    seen.clear();
    const look = () => { for (const vm of vmsUnder(process.pid)) seen.add(vm); };
    look();
    timer = setInterval(look, POLL_MS).unref();
  },
  afterAll(this: Mocha.Context) {
    clearInterval(timer);
    for (const vm of vmsUnder(process.pid)) seen.add(vm);
    if (!seen.size) return;
    const files = (this.test?.parent?.suites ?? []).map((s) => s.file).filter(Boolean).join(', ');
    throw new Error(`the fast tier starts no virtual machine, but ${files || 'this file'} started ${seen.size}: ${[...seen].join('; ')}. Tag the describe or it that starts it with @vm (docs/testing.md, "Tiers and order")`);
  },
} : {};
