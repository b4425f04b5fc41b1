// The guest preflight's appliances capped per caller (429) and in all (503) (issue 33 item 5), through a submit
// key's validate on a real daemon against the simulator, with the plan's network and pool on a private libvirtd so
// nothing else blocks the guest read. The read is a worker's guest_preflight job, whose appliance slot the daemon
// takes at submission and holds until the job ends (orchestration/guest-read.ts). A worker that can read guests registers
// and is then stopped (SIGSTOP): it stays active, so key A's first validate submits its job, which waits in the
// queue holding the slot. Meanwhile A's second validate is 429 and key B's is 503, each naming its setting, with
// Retry-After, and making no job. Once A cancels the first job its validate answers and the slot is free: with the
// worker gone, B's validate is answered (no worker can read the guest), not refused by the cap; the job list holds
// only the first job and no nbdkit or qemu of the stack is left.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { managerFor } from '../../domain/vsphere/client';
import { awaitWorkers, startDaemonProc, startWorkerProc, type Proc } from '../helpers/procs';
import { useStack } from '../helpers/stack';
import { req, until } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import type { DaemonJob, DaemonJobList, Validation } from '../helpers/api-types';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { releaseLibvirt, TestLibvirt, useLibvirt } from '../helpers/libvirt';
import { createVm, upload } from '../vsphere/fixture';

const NET = 'ferry-appcaps';
const PREFIX = 'appcaps';
const A = { 'x-api-key': 'appcaps-key-a-0123456789' };
const B = { 'x-api-key': 'appcaps-key-b-0123456789' };
const GUEST_CAPS = ['vsphere_access', 'mount_operations', 'nbd_access'];

/** The nbdkit and qemu processes started by this file's services (they inherit its FERRY_PREFIX). */
function ourTools(): string[] {
  return readdirSync('/proc').filter((d) => /^\d+$/.test(d)).flatMap((d) => {
    try {
      const comm = readFileSync(`/proc/${d}/comm`, 'utf8').trim();
      if (!/^(nbdkit|qemu)/.test(comm)) return [];
      return readFileSync(`/proc/${d}/environ`, 'utf8').split('\0').includes(`FERRY_PREFIX=${PREFIX}`) ? [`${d} ${comm}`] : [];
    } catch { return []; } // ended while read, or another user's
  });
}

describe('security: guest preflight appliances capped per caller (429) and in all (503), through validate', function () {
  this.timeout(600_000);
  const s = useStack({ name: 'sec-appcaps', prefix: PREFIX, gateway: false, daemon: false });
  let v: Vcsim;
  let lv: TestLibvirt;

  before(async () => {
    [v, lv] = await Promise.all([startVcsim(), useLibvirt()]);
    const m = managerFor({ url: v.url, username: v.username, password: v.password, ca: readFileSync(v.caFile, 'utf8') });
    const disk = path.join(s.dir, 'd.vmdk');
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', disk, '16M']);
    await createVm(m, { name: 'one', guestId: 'debian11_64Guest', cpus: 1, memoryMB: 512, mac: '00:50:56:aa:de:01', disks: [{ file: 'one/one.vmdk', bytes: 16 << 20 }] });
    await upload(v, disk, 'one/one.vmdk');
    const netXml = path.join(s.dir, 'net.xml');
    writeFileSync(netXml, `<network><name>${NET}</name><bridge name="virbrapc0"/></network>`);
    await lv.virsh(['net-define', netXml]);
    await lv.virsh(['net-start', NET]);
  });
  after(async () => {
    await v?.stop();
    if (lv) await releaseLibvirt();
  });

  it('while A\'s read waits holding the slot: A again is 429, B is 503, no job made; once it is cancelled the slot is free and nothing is left', async () => {
    const env = {
      ...s.env, FERRY_GUEST_PREFLIGHT: '1', FERRY_API_KEYS: `a:submit:${A['x-api-key']},b:submit:${B['x-api-key']}`,
      FERRY_GUEST_APPLIANCES_PER_CALLER: '1', FERRY_GUEST_APPLIANCES: '1',
      GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: v.password, FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1',
      FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_POOL: lv.pool,
    };
    const dm = await s.add(startDaemonProc(env, s.config));
    const w: Proc = await s.add(startWorkerProc(env, 'appcaps-guest', GUEST_CAPS));
    await awaitWorkers(dm.url, [w], A);
    // Active (its heartbeat is within FERRY_WORKER_STALE_SECONDS) but taking nothing.
    w.proc.kill('SIGSTOP');

    for (const [id, as] of [['a1', A], ['a2', A], ['b1', B]] as const) {
      const c = await req(dm.url, 'POST', '/plans', { id, name: id, vms: ['/DC0/vm/one'], network_map: { 'VM Network': NET }, storage_map: { LocalDS_0: lv.pool }, options: { power_off: 'none' } }, as);
      expect(c.status, c.text).to.equal(201);
    }
    // A refused validate answers at once; the bound makes one the cap let through (it waits for its read) fail.
    const validate = (id: string, as: Record<string, string>, boundMs?: number) => fetch(`${dm.url}/plans/${id}/validate`, { method: 'POST', headers: as, signal: boundMs ? AbortSignal.timeout(boundMs) : undefined });
    const reads = async () => (await req<DaemonJobList>(dm.url, 'GET', '/jobs?limit=100', undefined, A)).body.jobs.filter((j: DaemonJob) => j.definition.operation === 'guest_preflight');

    const first = validate('a1', A);
    await until(async () => (await reads()).length === 1, 60_000, 'the first read\'s job submitted');
    const [job] = await reads();
    expect(job.status).to.equal('pending');

    const refusals = [['a2', A, 429, 'FERRY_GUEST_APPLIANCES_PER_CALLER)'], ['b1', B, 503, 'FERRY_GUEST_APPLIANCES)']] as const;
    for (const [id, as, status, setting] of refusals) {
      const r = await validate(id, as, 60_000);
      const body = await r.json() as DaemonError;
      expect(r.status, JSON.stringify(body)).to.equal(status);
      expect(Number(r.headers.get('retry-after')), id).to.be.above(0);
      expect(body.error).to.include('guest preflight appliances').and.include(setting);
    }
    expect((await reads()).map((j) => [j.id, j.status]), 'still only the first read\'s job, waiting').to.deep.equal([[job.id, 'pending']]);

    // A stops its read: the job is cancelled, its validate answers with why, and the slot is released.
    const c = await req<{ cancelled: string[] }>(dm.url, 'POST', '/jobs/cancel', { job_ids: [job.id] }, A);
    expect(c.body.cancelled, c.text).to.deep.equal([job.id]);
    const r1 = await first;
    const v1 = await r1.json() as Validation;
    expect(r1.status, JSON.stringify(v1)).to.equal(200);
    expect(v1.vms[0].findings.map((f) => f.message).join('\n')).to.include(`its guest read job ${job.id} was cancelled`);

    // The worker goes (it deregisters on SIGTERM once resumed); B's validate now takes the free slot and is
    // answered that no worker can read the guest, with no job made.
    w.proc.kill('SIGCONT');
    await w.stop();
    await until(async () => (await req<{ active?: number }>(dm.url, 'GET', '/workers', undefined, A)).body.active === 0, 30_000, 'the worker deregistered');
    const r2 = await validate('b1', B);
    const v2 = await r2.json() as Validation;
    expect(r2.status, JSON.stringify(v2)).to.equal(200);
    expect(v2.vms[0].findings.map((f) => f.rule)).to.include('guest_preflight_no_worker');
    expect((await reads()).map((j) => [j.id, j.status])).to.deep.equal([[job.id, 'cancelled']]);
    expect(ourTools(), 'no nbdkit or qemu of this stack left').to.deep.equal([]);
  });
});
