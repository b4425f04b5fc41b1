// What the one-pass tests share (one-pass.test.ts, one-pass-remote.test.ts): the flat boot disk they migrate, the
// job driver against their plan stack behind the throttling proxy, and the checks a user runs on the result.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { createHash, randomFillSync } from 'node:crypto';
import { closeSync, copyFileSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, writeSync } from 'node:fs';
import path from 'node:path';
import { req, until } from '../helpers/http';
import { awaitWorkers, type Proc, startWorkerProc } from '../helpers/procs';
import type { ProxyControl } from '../helpers/tcp-proxy';
import { ensureTinyGuest, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import { PLAN_CAPS, type PlanStack } from '../plans/fixture';

export const MIB = 1024 * 1024;
export const BOOT_BYTES = 48 * MIB;

export const qemuImg = (args: string[]) => execFileSync('qemu-img', args, { encoding: 'utf8' });
/** qemu-img compare's verdict: exit 0 identical, 1 different. */
export const identical = (args: string[]) => { try { qemuImg(['compare', '-U', ...args]); return true; } catch (e) { if ((e as { status?: number }).status === 1) return false; throw e; } };
export const sha256 = (f: string) => createHash('sha256').update(readFileSync(f)).digest('hex');
/** The block hash list a user recomputes over a raw disk (`dd bs=1M skip=i count=1 | sha256sum` for each i). */
export const blockList = (f: string) => { const b = readFileSync(f); return Array.from({ length: Math.ceil(b.length / MIB) }, (_, i) => createHash('sha256').update(b.subarray(i * MIB, (i + 1) * MIB)).digest('hex')); };
export const walk = (d: string): string[] => (existsSync(d) ? readdirSync(d, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? walk(path.join(d, e.name)) : [path.join(d, e.name)])) : []);

/** The tiny guest grown to 48 MiB with random data after its partition (bytes a real disk has beyond the zeros),
 *  as a monolithicFlat pair <dir>/<name>/<name>.vmdk + <name>-flat.vmdk. Returns the raw source too. */
export async function flatBootDisk(dir: string, name: string) {
  const raw = path.join(dir, `${name}.raw`);
  qemuImg(['convert', '-f', 'vmdk', '-O', 'raw', await ensureTinyGuest(), raw]);
  qemuImg(['resize', '-q', '-f', 'raw', raw, String(BOOT_BYTES)]);
  const fd = openSync(raw, 'r+');
  try { const b = Buffer.alloc(16 * MIB); randomFillSync(b); writeSync(fd, b, 0, b.length, 24 * MIB); } finally { closeSync(fd); }
  const flatDir = path.join(dir, name);
  mkdirSync(flatDir, { recursive: true });
  const desc = path.join(flatDir, `${name}.vmdk`);
  qemuImg(['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=monolithicFlat', raw, desc]);
  return { raw, desc, extent: path.join(flatDir, `${name}-flat.vmdk`) };
}

/** The volume equals the source with exactly the repair's writes: the repair's own overlay, put over the source
 *  instead of the volume it was merged into, reads the same as the volume. */
export function repairedExactly(dir: string, source: string, volume: string, overlay: string) {
  const copy = path.join(dir, `check-${path.basename(overlay)}`);
  copyFileSync(overlay, copy);
  qemuImg(['rebase', '-u', '-f', 'qcow2', '-b', source, '-F', 'raw', copy]);
  return identical(['-f', 'qcow2', '-F', 'raw', copy, volume]);
}

/** Jobs on the stack: a job's record, its end, and a worker that reaches the simulator through the proxy. */
export function jobDriver<R extends { status: string }>(s: () => PlanStack, proxy: () => ProxyControl, workers: Proc[]) {
  const record = async (id: string) => (await req<R>(s().url, 'GET', `/jobs/${id}/record`)).body;
  return {
    record,
    finished: (id: string, ms = 1_500_000) => until(async () => { const r = await record(id); return ['completed', 'failed', 'cancelled'].includes(r.status) && r; }, ms, `job ${id} to end`),
    /** `env`: this worker's own settings over the stack's (a worker host set up differently). */
    worker: async (id: string, env: Record<string, string> = {}) => {
      const port = proxy().port;
      const w = await startWorkerProc({ ...s().env, GOVC_URL: `https://127.0.0.1:${port}/sdk`, FERRY_VSPHERE_MANAGERS: `127.0.0.1,https://127.0.0.1:${port}`, ...env },
        id, PLAN_CAPS);
      workers.push(w);
      await awaitWorkers(s().url, [w]);
      return w;
    },
    /** A migrate_vm job of `vm` to `uri`, answered 201 with its id. */
    submit: async (vm: string, uri: string) => {
      const parameters = { vm_path: s().vm(vm), source_type: 'vsphere', destination: { type: 'kvm', virt_uri: uri }, network_mapping: { 'VM Network': s().net },
        pool: s().lv.pool, power_off: 'force', parallel_downloads: 4, virt_test: { expect: TINY_GUEST_MARKER, timeout_seconds: 300 } };
      const r = await req<{ job_id: string }>(s().url, 'POST', '/jobs/operation', { operation: 'migrate_vm', parameters });
      expect(r.status, r.text).to.equal(201);
      return r.body.job_id;
    },
  };
}
