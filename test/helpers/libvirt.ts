// A private libvirtd for tests (with virtlogd and virtlockd), a dir storage pool in a temporary folder, and a
// guest that boots in seconds under TCG: the host's Debian kernel with a busybox initramfs that prints a marker
// on the serial console and runs a shell there. One libvirtd per test run, shared by every test file through
// useLibvirt()/releaseLibvirt(); it runs in its own mount, network and pid namespaces (libvirtd-ns.sh), so nothing
// of it (state folders, bridges, firewall rules, guests) is shared with another libvirtd on the machine, and it
// is stopped by the pid this helper started.
import { execFile, spawn, ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
export const GUEST_MARKER = 'FERRY-GUEST-READY';
export const POOL = 'ferry-test';

export interface TestLibvirt {
  dir: string; sockDir: string; uri: string; poolDir: string; pool: string;
  virsh(args: string[]): Promise<string>;
}

let shared: { lv: TestLibvirt; proc: ChildProcess; users: number } | undefined;
let starting: Promise<TestLibvirt> | undefined;

const LIBVIRTD_CONF = (d: string) => [
  `unix_sock_dir = "${d}/sock"`, 'unix_sock_rw_perms = "0700"', 'auth_unix_rw = "none"', 'auth_unix_ro = "none"',
  'log_outputs = "3:stderr"',
].join('\n') + '\n';
// No cgroups, no device namespace and no security driver: there is no systemd here, and guests run as root.
const QEMU_CONF = ['user = "root"', 'group = "root"', 'security_driver = "none"', 'namespaces = [ ]',
  'cgroup_controllers = [ ]', 'lock_manager = "lockd"', 'stdio_handler = "logd"'].join('\n') + '\n';

export async function virshAt(uri: string, args: string[]): Promise<string> {
  const { stdout } = await run('virsh', ['-q', '-c', uri, ...args], { maxBuffer: 64 * 1024 * 1024, timeout: 120_000 });
  return stdout;
}

async function start(): Promise<{ lv: TestLibvirt; proc: ChildProcess }> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-libvirt-'));
  for (const sub of ['sock', 'etc/qemu/networks/autostart', 'etc/storage', 'lib', 'log', 'cache', 'pool']) mkdirSync(path.join(dir, sub), { recursive: true });
  writeFileSync(path.join(dir, 'etc/libvirtd.conf'), LIBVIRTD_CONF(dir));
  writeFileSync(path.join(dir, 'etc/qemu.conf'), QEMU_CONF);
  writeFileSync(path.join(dir, 'etc/virtlogd.conf'), 'log_outputs = "3:stderr"\n');
  writeFileSync(path.join(dir, 'etc/virtlockd.conf'), 'log_outputs = "3:stderr"\n');
  const proc = spawn('unshare', ['-m', '-n', '-p', '-f', '--mount-proc', '--propagation', 'private', '--kill-child=SIGTERM',
    path.join(__dirname, 'libvirtd-ns.sh'), dir], { stdio: ['ignore', 'ignore', 'pipe'] });
  const logs: string[] = [];
  proc.stderr.on('data', (b: Buffer) => { logs.push(b.toString()); if (logs.length > 200) logs.shift(); });
  const uri = `qemu+unix:///system?socket=${dir}/sock/libvirt-sock`;
  const virsh = (args: string[]) => virshAt(uri, args);
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`libvirtd exited (${proc.exitCode}): ${logs.join('')}`);
    try { await virsh(['version']); break; } catch (e) {
      if (Date.now() > deadline) { proc.kill('SIGKILL'); throw new Error(`libvirtd did not answer at ${uri}: ${(e as Error).message}\n${logs.join('')}`, { cause: e }); }
      await new Promise((r) => setTimeout(r, 200));
    }
  }
  const poolDir = path.join(dir, 'pool');
  await virsh(['pool-define-as', POOL, 'dir', '--target', poolDir]);
  await virsh(['pool-start', POOL]);
  return { proc, lv: { dir, sockDir: path.join(dir, 'sock'), uri, poolDir, pool: POOL, virsh } };
}

/** The run's libvirtd, started on first use. Each user calls releaseLibvirt() once when done (an after hook). */
export async function useLibvirt(): Promise<TestLibvirt> {
  if (shared) { shared.users++; return shared.lv; }
  starting ||= start().then((s) => { shared = { ...s, users: 0 }; starting = undefined; return s.lv; });
  const lv = await starting;
  shared!.users++;
  return lv;
}

/** Stops libvirtd when the last user releases it: SIGTERM to the unshare process started here, which passes it
 *  to libvirtd; the namespace (virtlogd, virtlockd, guests) ends with it. */
export async function releaseLibvirt() {
  if (!shared || --shared.users > 0) return;
  const { proc, lv } = shared;
  shared = undefined;
  await stop(proc, lv);
}

/** A second libvirtd of the test's own (a second target host: plans with several destinations), not shared;
 *  `stop` ends it as releaseLibvirt ends the shared one. */
export async function startOwnLibvirt(): Promise<{ lv: TestLibvirt; stop: () => Promise<void> }> {
  const s = await start();
  return { lv: s.lv, stop: () => stop(s.proc, s.lv) };
}

async function stop(proc: ChildProcess, lv: TestLibvirt) {
  if (proc.exitCode === null && !proc.signalCode) {
    const gone = new Promise((r) => proc.once('exit', r));
    // unshare ignores SIGTERM while it waits; its one child is the namespace's init (libvirtd-ns.sh), which passes
    // SIGTERM on to libvirtd. SIGKILL to unshare is the fallback: --kill-child then signals the init itself.
    const child = Number(readFileSync(`/proc/${proc.pid}/task/${proc.pid}/children`, 'utf8').trim().split(/\s+/)[0]);
    if (child) process.kill(child, 'SIGTERM'); else proc.kill('SIGKILL');
    const t = setTimeout(() => proc.kill('SIGKILL'), 15_000);
    await gone;
    clearTimeout(t);
  }
  rmSync(lv.dir, { recursive: true, force: true });
}

// ---- The test guest ---------------------------------------------------------------------------------------

/** The newest Debian kernel in /boot. */
export function hostKernel(): string {
  const k = readdirSync('/boot').filter((f) => /^vmlinuz-/.test(f)).sort().pop();
  if (!k) throw new Error('no /boot/vmlinuz-* on this host: the test guest boots the host kernel');
  return path.join('/boot', k);
}

/** One cpio "newc" entry (the format the kernel unpacks as an initramfs). */
function cpioEntry(name: string, mode: number, data: Buffer, ino: number): Buffer {
  const hex = (n: number) => n.toString(16).padStart(8, '0');
  const nameBuf = Buffer.from(name + '\0');
  const head = '070701' + [ino, mode, 0, 0, 1, 0, data.length, 0, 0, 0, 0, nameBuf.length, 0].map(hex).join('');
  const pad = (n: number) => Buffer.alloc((4 - (n % 4)) % 4);
  return Buffer.concat([Buffer.from(head), nameBuf, pad(110 + nameBuf.length), data, pad(data.length)]);
}

// /init: mount /proc, print the marker, then an interactive shell on the serial console, forever.
const INIT = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev 2>/dev/null
/bin/busybox --install -s /bin
echo ${GUEST_MARKER}
while true; do setsid cttyhack sh -i; done
`;

/** A small initramfs with busybox (static, Debian busybox-static) and the init above, cached outside the clone
 *  under FERRY_CACHE_DIR by a hash of its inputs. */
export function guestInitramfs(): string {
  const busybox = readFileSync('/bin/busybox');
  const hash = createHash('sha256').update(busybox).update(INIT).digest('hex').slice(0, 16);
  const cache = process.env.FERRY_CACHE_DIR || path.join(os.homedir(), '.cache', 'ferry');
  const out = path.join(cache, `virt-initramfs-${hash}`, 'initramfs.cpio');
  if (existsSync(out)) return out;
  mkdirSync(path.dirname(out), { recursive: true });
  const parts = [
    cpioEntry('bin', 0o40755, Buffer.alloc(0), 1),
    cpioEntry('bin/busybox', 0o100755, busybox, 2),
    cpioEntry('init', 0o100755, Buffer.from(INIT), 3),
    cpioEntry('TRAILER!!!', 0, Buffer.alloc(0), 0),
  ];
  const tmp = `${out}.${process.pid}.tmp`;
  writeFileSync(tmp, Buffer.concat(parts));
  renameSync(tmp, out);
  return out;
}

/** Domain XML of a test guest booting the host kernel and the busybox initramfs, with a serial console. A disk
 *  (a volume path) and a network are optional. */
export function guestXml(name: string, opts: { disk?: string; diskFormat?: string; network?: string; memoryMiB?: number; serial?: boolean } = {}): string {
  const disk = opts.disk ? `<disk type='file' device='disk'><driver name='qemu' type='${opts.diskFormat || 'qcow2'}'/><source file='${opts.disk}'/><target dev='vda' bus='virtio'/></disk>` : '';
  const nic = opts.network ? `<interface type='network'><source network='${opts.network}'/><model type='virtio'/></interface>` : '';
  const serial = opts.serial === false ? '' : "<serial type='pty'><target port='0'/></serial><console type='pty'><target type='serial' port='0'/></console>";
  return `<domain type='qemu'><name>${name}</name><memory unit='MiB'>${opts.memoryMiB || 96}</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type><kernel>${hostKernel()}</kernel><initrd>${guestInitramfs()}</initrd>
<cmdline>console=ttyS0 quiet panic=-1</cmdline></os><on_reboot>restart</on_reboot>
<devices>${disk}${nic}${serial}<memballoon model='none'/></devices></domain>`;
}

/** Defines a test guest (persistent), optionally with a fresh 16 MiB qcow2 volume in the test pool. */
export async function defineGuest(lv: TestLibvirt, name: string, opts: { withDisk?: boolean; network?: string; serial?: boolean } = {}) {
  let disk: string | undefined;
  if (opts.withDisk) {
    await lv.virsh(['vol-create-as', lv.pool, `${name}.qcow2`, '16M', '--format', 'qcow2']);
    disk = path.join(lv.poolDir, `${name}.qcow2`);
  }
  const file = path.join(lv.dir, `${name}.xml`);
  writeFileSync(file, guestXml(name, { disk, network: opts.network, serial: opts.serial }));
  await lv.virsh(['define', file]);
}

/** The names a virsh listing gives: `--name` output, or a table's first column (vol-list) without its header. */
export async function virshNames(lv: TestLibvirt, args: string[]): Promise<string[]> {
  const rows = (await lv.virsh(args)).split('\n').map((l) => l.trim()).filter(Boolean);
  const table = rows.length > 1 && /^-+$/.test(rows[1]);
  return (table ? rows.slice(2) : rows).map((l) => l.split(/\s+/)[0]);
}

/** `virsh domstate` of a domain, or 'absent'. */
export async function domState(lv: TestLibvirt, name: string): Promise<string> {
  try { return (await lv.virsh(['domstate', name])).trim(); } catch { return 'absent'; }
}
