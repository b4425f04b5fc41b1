// The daemon's tool-needing work runs on workers (issue 33 item 4, issue 38 item 2), checked against the real
// daemon, the simulator and worker processes: a plan's guest read is a guest_preflight job and the power actions
// are vm_power jobs. With no worker able to take them, validate says so in a finding of its own (not a silent
// guest_unreadable) and a power-off is a 503 that powers nothing off and leaves no job; a caller cannot submit
// either operation directly. With a worker with vsphere_access, /vms/poweroff powers the simulator's VM off through
// a job the job list shows; with one that can read guests, validate reads a blank disk in place on that worker.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { keys } from '../../platform/redis';
import { vmDetail } from '../../domain/vsphere/inventory';
import { awaitWorkers, startWorkerProc, type Proc } from '../helpers/procs';
import { req } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import type { DaemonJob, DaemonJobList, Validation } from '../helpers/api-types';
import { powerOn } from '../vsphere/fixture';
import { startPlanStack, type PlanStack } from './fixture';

const PREFIX = 'gjob';
const GUEST_CAPS = ['vsphere_access', 'mount_operations', 'nbd_access'];

describe('plans and /vms: the guest read and the power actions run as worker jobs', function () {
  this.timeout(1_800_000);
  let s: PlanStack;
  const workers: Proc[] = [];
  let blank: string;
  let victim: string;
  const jobs = async () => (await req<DaemonJobList>(s.url, 'GET', '/jobs?limit=100')).body.jobs;
  /** The workers that ran a job: RUNNING entries of its state history, as stored in Redis ([state, time, reason, worker]). */
  const ranOn = async (id: string) => (JSON.parse((await s.rc.hget(keys(PREFIX).job(id), 'history'))!) as [string, string, string, string?][]).filter((e) => e[0] === 'RUNNING').map((e) => e[3]);
  const validate = async (id: string) => {
    const r = await req<Validation>(s.url, 'POST', `/plans/${id}/validate`);
    expect(r.status, r.text).to.equal(200);
    return r.body.vms[0].findings;
  };

  before(async function () {
    this.timeout(300_000);
    s = await startPlanStack({ prefix: PREFIX, workers: {}, env: { FERRY_GUEST_PREFLIGHT: '1', FERRY_GUEST_PREFLIGHT_SECONDS: '1200', FERRY_SECRET_KEY: 'gjob-secret-key-0123456789' } });
    const disk = path.join(s.dir, 'blank.vmdk');
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', disk, '16M']);
    blank = await s.addVm({ name: 'gj-blank', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:09:00:01' }, { path: disk, bytes: 16 << 20 });
    victim = await s.addVm({ name: 'gj-victim', host: 'DC0_H0', ds: 'LocalDS_0', mac: '00:50:56:09:00:02' }, { path: disk, bytes: 16 << 20 });
    await powerOn(s.m, victim);
    expect((await req(s.url, 'POST', '/plans', s.plan('gj', ['gj-blank']))).status).to.equal(201);
  });
  after(async () => {
    await Promise.all(workers.map((w) => w.kill()));
    await s?.stop();
  });

  it('with no worker able to take them: validate gives each VM guest_preflight_no_worker naming the capabilities, a power-off is 503 and the VM stays on; no job is made', async () => {
    const f = await validate('gj');
    const rule = f.find((x) => x.rule === 'guest_preflight_no_worker');
    expect(rule, JSON.stringify(f)).to.not.equal(undefined);
    expect(rule!.severity).to.equal('warning');
    expect(rule!.message).to.include('no active worker has the capabilities').and.include('mount_operations, nbd_access, vsphere_access');
    expect(f.map((x) => x.rule)).to.not.include('guest_unreadable');
    const off = await req<DaemonError>(s.url, 'POST', '/vms/poweroff', { vm_path: victim });
    expect(off.status, off.text).to.equal(503);
    expect(off.body.error).to.include('vsphere_access').and.include('was not done');
    expect((await vmDetail(s.m, victim)).power_state).to.equal('poweredOn');
    expect(await jobs()).to.deep.equal([]);
  });

  it('a caller cannot submit guest_preflight or vm_power itself: 400 naming operation, no job', async () => {
    for (const [operation, parameters] of [['vm_power', { vm_path: victim, action: 'poweroff' }], ['guest_preflight', { vm_paths: [blank], seconds: 60, deadline: Date.now() + 60_000 }]] as const) {
      const r = await req<DaemonError>(s.url, 'POST', '/jobs/operation', { operation, parameters });
      expect(r.status, r.text).to.equal(400);
      expect(r.body.error).to.include('operation').and.include('submitted only by the daemon');
    }
    expect(await jobs()).to.deep.equal([]);
    expect((await vmDetail(s.m, victim)).power_state).to.equal('poweredOn');
  });

  it('with a worker with vsphere_access: /vms/poweroff powers the simulator\'s VM off through a vm_power job; again, vSphere\'s 409 through a failed job', async () => {
    const w = await startWorkerProc(s.env, 'gj-power', ['vsphere_access']);
    workers.push(w);
    await awaitWorkers(s.url, workers);
    const off = await req<{ message: string }>(s.url, 'POST', '/vms/poweroff', { vm_path: victim });
    expect(off.status, off.text).to.equal(200);
    expect(off.body.message).to.equal(`${victim} powered off`);
    expect((await vmDetail(s.m, victim)).power_state).to.equal('poweredOff');
    const [job] = await jobs();
    expect(job.definition).to.include({ operation: 'vm_power', vm_path: victim });
    expect(job.status).to.equal('completed');
    expect(await ranOn(job.id)).to.deep.equal(['gj-power']);
    const again = await req<DaemonError>(s.url, 'POST', '/vms/poweroff', { vm_path: victim });
    expect(again.status, again.text).to.equal(409);
    expect(again.body.error).to.include('already powered off');
    const failed = (await jobs()).filter((j: DaemonJob) => j.definition.operation === 'vm_power' && j.status === 'failed');
    expect(failed.map((j) => j.error)).to.deep.equal([again.body.error]);
    // The guest read still needs a worker that can read guests: this one cannot.
    expect((await validate('gj')).map((x) => x.rule)).to.include('guest_preflight_no_worker');
  });

  it('with a worker that can read guests: validate reads the blank disk in place on that worker (guest_no_os) through a guest_preflight job @vm', async () => {
    const w = await startWorkerProc(s.env, 'gj-guest', GUEST_CAPS);
    workers.push(w);
    await awaitWorkers(s.url, workers);
    const f = await validate('gj');
    const rules = f.map((x) => `${x.rule}:${x.severity}`);
    expect(rules, JSON.stringify(f)).to.include('guest_no_os:blocker');
    expect(rules).to.not.include('guest_preflight_no_worker:warning').and.not.include('guest_unreadable:warning');
    const reads = (await jobs()).filter((j) => j.definition.operation === 'guest_preflight');
    expect(reads.map((j) => j.status)).to.deep.equal(['completed']);
    expect(await ranOn(reads[0].id)).to.deep.equal(['gj-guest']);
  });
});
