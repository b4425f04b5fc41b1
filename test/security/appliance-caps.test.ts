// The guest preflight's libguestfs appliances capped per caller (429) and in all (503) (issue 33 item 5), tested at
// the module that holds the cap (shared/plans/guest-preflight.ts: guestPreflight takes spawnSlots.appliance for
// the request it runs in), in this process, against real processes: the simulator serving a VM's disk, nbdkit
// reading it over HTTPS and the appliance launched on it. Not through a route: the only routes that take the slot
// are a plan's validate, start and retry, whose guest read is being moved into a worker job; what is checked here
// is the cap those callers get. While one caller's read runs (its nbdkit is up), a second read of the same caller
// is refused with 429 and a read of another caller with 503, each naming its setting and starting no process of
// its own; once the first read ends nothing of it is left running and the slot is free for the next caller.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { managerFor, type Manager } from '../../shared/vsphere/client';
import { vmFacts, type VmFacts } from '../../shared/plans/facts';
import { guestPreflight } from '../../shared/plans/guest-preflight';
import { runAs, spawnSlots } from '../../shared/limits';
import { ApiError } from '../../shared/errors';
import { until } from '../helpers/http';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { createVm, upload } from '../vsphere/fixture';

const CAPS = { FERRY_GUEST_APPLIANCES_PER_CALLER: '1', FERRY_GUEST_APPLIANCES: '1' };

/** The nbdkit processes this test process started. */
function ourNbdkits(): number[] {
  return readdirSync('/proc').filter((d) => /^\d+$/.test(d)).filter((d) => {
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === process.pid && stat.includes('(nbdkit)');
    } catch { return false; } // the process ended while it was read
  }).map(Number);
}

/** How a read that the cap refused ended: its status, Retry-After and message. */
async function refusal(p: Promise<unknown>): Promise<{ status: number; retryAfter?: number; message: string }> {
  try { await p; } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    return { status: e.status, retryAfter: (e.details as { retryAfter?: number } | undefined)?.retryAfter, message: e.message };
  }
  throw new Error('the read was not refused');
}

describe('security: guest preflight appliances capped per caller (429) and in all (503), at the module that holds the cap @vm', function () {
  this.timeout(600_000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-sec-appliances-'));
  const saved = Object.fromEntries(Object.keys(CAPS).map((k) => [k, process.env[k]]));
  let v: Vcsim;
  let m: Manager;
  let facts: VmFacts;
  const warnings: string[] = [];
  const log = { warn: (msg: string) => { warnings.push(msg); } };

  before(async () => {
    v = await startVcsim();
    m = managerFor({ url: v.url, username: v.username, password: v.password, ca: readFileSync(v.caFile, 'utf8') });
    const disk = path.join(dir, 'd.vmdk');
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', disk, '16M']);
    await createVm(m, { name: 'one', guestId: 'debian11_64Guest', cpus: 1, memoryMB: 512, mac: '00:50:56:aa:de:01', disks: [{ file: 'one/one.vmdk', bytes: 16 << 20 }] });
    await upload(v, disk, 'one/one.vmdk');
    facts = await vmFacts(m, '/DC0/vm/one');
    Object.assign(process.env, CAPS); // read by the cap at each take (config.guestAppliances)
  });
  after(async () => {
    for (const [k, x] of Object.entries(saved)) { if (x === undefined) delete process.env[k]; else process.env[k] = x; }
    await v?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('a second read of the same caller is 429, another caller\'s 503, while the first runs; then nothing is left and the slot is free', async () => {
    expect(spawnSlots.appliance.inUse).to.equal(0);
    const stop = new AbortController();
    const first = runAs('key:ci', () => guestPreflight(m, [facts], log, stop.signal));
    // The first read holds its slot and runs: its nbdkit serves the simulator's disk to the appliance.
    await until(() => ourNbdkits().length === 1, 120_000, 'the first read\'s nbdkit');
    expect(spawnSlots.appliance.inUse).to.equal(1);

    const same = await refusal(runAs('key:ci', () => guestPreflight(m, [facts], log)));
    expect(same.status, same.message).to.equal(429);
    expect(same.retryAfter).to.be.above(0);
    expect(same.message).to.include('guest preflight appliances').and.include('FERRY_GUEST_APPLIANCES_PER_CALLER');
    const other = await refusal(runAs('key:other', () => guestPreflight(m, [facts], log)));
    expect(other.status, other.message).to.equal(503);
    expect(other.retryAfter).to.be.above(0);
    expect(other.message).to.include('guest preflight appliances').and.include('FERRY_GUEST_APPLIANCES)');
    // Neither started a process: still the first read's one nbdkit, still one slot.
    expect(ourNbdkits()).to.have.length(1);
    expect(spawnSlots.appliance.inUse).to.equal(1);

    // The first read is stopped (its appliance launch under TCG takes minutes on a loaded host): it answers for
    // its VM all the same, and leaves nothing running.
    stop.abort(new Error('stopped by the test'));
    const found = await first;
    expect([...found.keys()]).to.deep.equal(['/DC0/vm/one']);
    await until(() => ourNbdkits().length === 0, 30_000, 'no nbdkit of the first read left');
    expect(spawnSlots.appliance.inUse).to.equal(0);
    // The slot is free again, for either caller.
    for (const who of ['key:other', 'key:ci']) {
      const release = runAs(who, () => spawnSlots.appliance.take());
      expect(spawnSlots.appliance.inUse, who).to.equal(1);
      release();
      expect(spawnSlots.appliance.inUse, who).to.equal(0);
    }
  });
});
