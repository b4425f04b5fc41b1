// A source VM's disk served in place, read-only, as an NBD socket for the preflight's libguestfs appliance:
// nbdkit's curl plugin reads the datastore file over the manager's HTTPS (/folder/<path>?dcPath=&dsName=, the
// URL the export downloads from, domain/vsphere/download.ts) with the session cookie handed over a pipe (never in
// argv, a file or a log), under the same TLS rule as the SOAP client (system CAs plus FERRY_VSPHERE_CA, or
// `insecure`). The cache filter keeps what was read, bounded (FERRY_GUEST_PREFLIGHT_CACHE_MB), in a private
// directory on /dev/shm (memory), so nothing of the guest's disk is written to a disk of this host.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import type { Manager } from '../vsphere/client';
import { folderUrl, remoteHead, remoteSize } from '../vsphere/download';
import { VsphereError } from '../vsphere/errors';
import { parseDatastorePath, resolveSibling, SNIFF_BYTES, sniffVmdk } from '../vsphere/vmdk';
import { setting } from '../../platform/settings';

export const NBDKIT = setting('NBDKIT');
const cacheMiB = () => setting('FERRY_GUEST_PREFLIGHT_CACHE_MB');

/** The file that holds a disk's blocks and how qemu reads it. */
export interface DiskData { datastore: string; path: string; dcPath: string; format: 'raw' | 'vmdk'; size: number; notes: string[] }

type Ref = { datastore: string; path: string; dcPath: string };

/** Follows a VMDK from the VM's current file to the data: a snapshot chain down to its base (the deltas are not
 *  read: a note says so), a text descriptor to its one extent (flat: raw; sparse: vmdk), a hosted sparse or
 *  streamOptimized file as it is. A disk split over several extents is refused with the reason. */
export async function diskData(m: Manager, file: string, dcPath: string, signal?: AbortSignal): Promise<DiskData> {
  let ref: Ref = { ...parseDatastorePath(file), dcPath };
  const notes: string[] = [];
  for (let depth = 0; depth < 64; depth++) {
    const size = await remoteSize(m, ref, signal);
    const info = sniffVmdk(await remoteHead(m, ref, Math.min(SNIFF_BYTES, Math.max(1, size)), signal));
    if (info.parentHint) {
      if (!depth) notes.push('read from the base disk of its snapshot chain: what the snapshots changed since is not seen');
      ref = { ...resolveSibling(ref, info.parentHint), dcPath };
      continue;
    }
    if (info.kind === 'sparse') return { ...ref, format: 'vmdk', size, notes };
    if (info.kind === 'other') return { ...ref, format: 'raw', size, notes };
    if (info.extents.length !== 1) {
      throw new VsphereError('state', `[${ref.datastore}] ${ref.path} has ${info.extents.length} extents; the preflight reads single-extent disks only`);
    }
    const x = info.extents[0];
    const ext = { ...resolveSibling(ref, x.file), dcPath };
    return { ...ext, format: /SPARSE/i.test(x.type) ? 'vmdk' : 'raw', size: await remoteSize(m, ext, signal), notes };
  }
  throw new VsphereError('state', `${file}: a snapshot chain deeper than 64`);
}

/** A private directory in memory when the host has /dev/shm (the cache's file lives there), else in TMPDIR. */
function privateDir(): string {
  const base = existsSync('/dev/shm') ? '/dev/shm' : os.tmpdir();
  return mkdtempSync(path.join(base, 'ferry-guest-preflight-'));
}

const connectable = (sock: string) => new Promise<boolean>((resolve) => {
  const c = net.connect(sock, () => { c.destroy(); resolve(true); });
  c.on('error', () => resolve(false));
});

/** `uri` for libguestfs, `qemuUri` for qemu's own block layer (an overlay's backing file). */
export interface NbdSource { uri: string; qemuUri: string; format: string; stop: () => Promise<void> }

/** Starts nbdkit for one disk; resolves once its socket accepts connections (or rejects with nbdkit's words).
 *  `retry`: the retry filter under the cache, as virt-v2v reads its sources, so a dropped connection or a
 *  failed read is tried again on a fresh connection instead of failing the reader (the repair beside the copy,
 *  which reads for minutes while the copy loads the same manager). */
export async function serveDisk(m: Manager, d: DiskData, signal?: AbortSignal, o: { retry?: boolean } = {}): Promise<NbdSource> {
  const dir = privateDir();
  const sock = path.join(dir, 'nbd.sock');
  const args = ['--readonly', '--foreground', '--exit-with-parent', '--unix', sock, '--filter=cache', ...(o.retry ? ['--filter=retry'] : []),
    'curl', `url=${folderUrl(m, d).href}`,
    'cookie=-3', 'protocols=https,http', 'followlocation=false', 'timeout=60', 'cache-on-read=true', `cache-max-size=${cacheMiB()}M`];
  if (m.creds.insecure) args.push('sslverify=false');
  else if (m.creds.ca) {
    // curl's cainfo replaces its default store: the bundle is the system's CAs plus the extra one, as the client's.
    writeFileSync(path.join(dir, 'ca.pem'), [...tls.rootCertificates, m.creds.ca].join('\n'), { mode: 0o600 });
    args.push(`cainfo=${path.join(dir, 'ca.pem')}`);
  }
  let cookie: string;
  try { cookie = await m.sessionCookie(); } catch (e) { rmSync(dir, { recursive: true, force: true }); throw e; }
  const child: ChildProcess = spawn(NBDKIT, args, { env: { ...process.env, TMPDIR: dir }, stdio: ['ignore', 'ignore', 'pipe', 'pipe'] });
  let err = '';
  child.stderr!.setEncoding('utf8').on('data', (s: string) => { err = (err + s).slice(-4000); });
  const pipe = child.stdio[3] as NodeJS.WritableStream;
  // A pipe nbdkit closed early (it failed to start) is reported by the readiness check below, with its stderr.
  pipe.on('error', (e: Error) => { err += `\n(cookie pipe: ${e.message})`; });
  pipe.end(cookie);
  let exited = false;
  let spawnErr: string | undefined;
  const gone = new Promise<void>((resolve) => child.on('close', () => { exited = true; resolve(); }));
  const stop = async () => {
    if (!exited && !spawnErr) { child.kill('SIGTERM'); await gone; }
    rmSync(dir, { recursive: true, force: true });
  };
  child.on('error', (e: NodeJS.ErrnoException) => { spawnErr = e.code === 'ENOENT' ? 'nbdkit is not installed (Debian package nbdkit)' : e.message; });
  try {
    // nbdkit has no readiness signal but its socket: it is tried every 50 ms, for at most 20 s.
    for (let i = 0; ; i++) {
      if (signal?.aborted) throw signal.reason;
      if (spawnErr) throw new Error(spawnErr);
      if (exited) throw new Error(`nbdkit exited: ${err.trim() || 'no message'}`);
      if (existsSync(sock) && await connectable(sock)) break;
      if (i >= 400) throw new Error(`nbdkit did not listen within 20 s: ${err.trim()}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  } catch (e) { await stop(); throw e; }
  return { uri: `nbd://?socket=${sock}`, qemuUri: `nbd+unix:///?socket=${sock}`, format: d.format, stop };
}
