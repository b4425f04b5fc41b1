// Batch actions on a real libvirtd: 6 domains, one of them missing. Each batch answers the seed's batch result
// object (5 successes, 1 failure naming the missing domain) and virsh shows the other five changed state.
import { expect } from 'chai';
import { req } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import type { BatchResult } from '../../domain/libvirt/batch';
import { defineGuest, domState } from '../helpers/libvirt';
import { okData, startVirtStack, VirtStack } from './stack';

describe('batch actions (/virt/batch/*) @vm', function () {
  this.timeout(300_000);
  let s: VirtStack;
  let B: string;
  const names = ['b-1', 'b-2', 'b-3', 'b-4', 'b-5'];
  const domains = [...names.slice(0, 3), 'b-missing', ...names.slice(3)];
  const states = () => Promise.all(names.map((n) => domState(s.lv, n)));

  before(async () => {
    s = await startVirtStack({ FERRY_VIRT_BATCH_CONCURRENCY: '3' });
    B = s.daemon.url;
    for (const n of names) await defineGuest(s.lv, n, { withDisk: true });
  });
  after(async () => { await s?.stop(); });

  const check = (r: BatchResult, operation: string) => {
    expect(r).to.include({ operation, total: 6, successful: 5, failed: 1 });
    expect(r).to.have.keys('operation', 'total', 'successful', 'failed', 'results', 'start_time', 'end_time', 'duration');
    expect(r.results.map((x) => x.domain)).to.deep.equal(domains);
    const bad = r.results.filter((x) => !x.success);
    expect(bad).to.have.length(1);
    expect(bad[0].domain).to.equal('b-missing');
    expect(bad[0].error).to.match(/not found|no domain/i);
    expect(r.results.filter((x) => x.success).every((x) => !('error' in x))).to.equal(true);
    expect(r.duration).to.match(/^\d+\.\d{3}s$/);
  };

  it('starts paused, resumes, pauses, reboots, snapshots and stops five of six', async () => {
    check(await okData<BatchResult>(B, 'POST', '/virt/batch/start', { domains, paused: true }), 'start');
    expect(await states()).to.deep.equal(names.map(() => 'paused'));
    check(await okData<BatchResult>(B, 'POST', '/api/v1/virt/batch/resume', { domains }), 'resume');
    expect(await states()).to.deep.equal(names.map(() => 'running'));
    check(await okData<BatchResult>(B, 'POST', '/virt/batch/pause', { domains }), 'pause');
    expect(await states()).to.deep.equal(names.map(() => 'paused'));
    check(await okData<BatchResult>(B, 'POST', '/virt/batch/resume', { domains }), 'resume');
    check(await okData<BatchResult>(B, 'POST', '/virt/batch/reboot', { domains, force: true }), 'reboot');
    expect(await states()).to.deep.equal(names.map(() => 'running'));
    check(await okData<BatchResult>(B, 'POST', '/virt/batch/stop', { domains, force: true }), 'stop');
    expect(await states()).to.deep.equal(names.map(() => 'shut off'));
    check(await okData<BatchResult>(B, 'POST', '/virt/batch/snapshot', { domains, name_prefix: 'nightly', description: 'batch' }), 'snapshot');
    for (const n of names) expect(await s.lv.virsh(['snapshot-list', n, '--name'])).to.match(/^nightly-\d{8}T\d{6}Z/m);
  });

  it('a graceful stop the guest ignores fails after its timeout and leaves it running, or destroys it when asked', async () => {
    // The busybox guests have no ACPI handler: virsh shutdown is delivered and ignored.
    check(await okData<BatchResult>(B, 'POST', '/virt/batch/start', { domains }), 'start');
    const t0 = Date.now();
    const r = await okData<BatchResult>(B, 'POST', '/virt/batch/stop', { domains: ['b-1', 'b-missing'], timeout: 2 });
    expect(Date.now() - t0).to.be.at.least(2000);
    expect(r).to.include({ operation: 'stop', total: 2, successful: 0, failed: 2 });
    expect(r.results[0].error).to.match(/still running 2 s after the shutdown request .*left running/);
    expect(r.results[1].error).to.match(/not found|no domain/i);
    expect(await domState(s.lv, 'b-1')).to.equal('running');
    const f = await okData<BatchResult>(B, 'POST', '/virt/batch/stop', { domains, timeout: 1, force_after_timeout: true });
    check(f, 'stop');
    for (const x of f.results.filter((y) => y.success)) expect(x.detail).to.match(/still running 1 s after the shutdown request: destroyed/);
    expect(await states()).to.deep.equal(names.map(() => 'shut off'));
    const bad = await req<DaemonError>(B, 'POST', '/virt/batch/stop', { domains, timeout: -1 });
    expect(bad.status).to.equal(400);
    expect(bad.body.error).to.include('timeout');
  });

  it('deletes snapshots only, then the domains with their storage', async () => {
    check(await okData<BatchResult>(B, 'POST', '/virt/batch/delete', { domains, snapshots_only: true }), 'delete');
    for (const n of names) expect((await s.lv.virsh(['snapshot-list', n, '--name'])).trim()).to.equal('');
    expect(await states()).to.deep.equal(names.map(() => 'shut off'));
    check(await okData<BatchResult>(B, 'POST', '/virt/batch/delete', { domains, remove_storage: true }), 'delete');
    expect(await states()).to.deep.equal(names.map(() => 'absent'));
    const vols = await s.lv.virsh(['vol-list', s.lv.pool]);
    for (const n of names) expect(vols).not.to.include(`${n}.qcow2`);
  });

  it('rejects a bad body with 400 naming the field', async () => {
    const r = await req<DaemonError>(B, 'POST', '/virt/batch/start', { domains: [] });
    expect(r.status).to.equal(400);
    expect(r.body.error).to.include('domains');
  });
});
