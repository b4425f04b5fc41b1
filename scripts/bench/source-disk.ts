// The source disk bench:datapath and bench:warm migrate: one VM in the simulator whose monolithicFlat disk holds the
// tiny real guest at offset 0 and random data over [dataAt, dataAt + data), holes elsewhere.
import { execFileSync } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import { closeSync, ftruncateSync, mkdirSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs';
import path from 'node:path';
import { ensureTinyGuest } from '../../test/fixtures/tiny-guest';
import { createPlanVm, type PlanStack } from '../../test/plans/fixture';
import { upload } from '../../test/vsphere/fixture';

const MIB = 2 ** 20;

export interface SourceDisk { name: string; mac: string; bytes: number; dataAt: number; data: number }

/** Creates the VM `d.name` on LocalDS_0 with the disk above; returns its flat extent's path on the datastore. */
export async function makeSourceDisk(s: PlanStack, d: SourceDisk): Promise<string> {
  const local = path.join(s.dir, `src-${d.name}`);
  mkdirSync(local, { recursive: true });
  try {
    const raw = path.join(local, 'guest.raw');
    execFileSync('qemu-img', ['convert', '-f', 'vmdk', '-O', 'raw', await ensureTinyGuest(), raw]);
    const desc = path.join(local, `${d.name}.vmdk`);
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', '-o', 'subformat=monolithicFlat', desc, String(d.bytes)]);
    const file = `${d.name}/${d.name}.vmdk`;
    await createPlanVm(s.m, { name: d.name, mac: d.mac, disks: [{ ds: 'LocalDS_0', file, bytes: d.bytes }] });
    await upload(s.v, desc, file);
    const extent = path.join(s.v.datastores.LocalDS_0, d.name, `${d.name}-flat.vmdk`);
    const fd = openSync(extent, 'w');
    try {
      ftruncateSync(fd, d.bytes);
      writeSync(fd, readFileSync(raw), 0, undefined, 0);
      const b = Buffer.alloc(8 * MIB);
      for (let at = d.dataAt; at < d.dataAt + d.data; at += b.length) {
        randomFillSync(b);
        writeSync(fd, b, 0, Math.min(b.length, d.dataAt + d.data - at), at);
        await new Promise<void>((r) => setImmediate(r)); // a turn of the event loop per 8 MiB: Ctrl-C is heard meanwhile
      }
    } finally { closeSync(fd); }
    return extent;
  } finally {
    rmSync(local, { recursive: true, force: true });
  }
}
