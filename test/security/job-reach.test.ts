// Jobs name only what their caller may (issue 33, item 3), as an attacker with a submit key tries it against the
// real gateway, daemon, scheduler and a native worker on the tests' libvirtd: a migrate job whose manifest names a
// virtio-win driver tree outside every input root (the repair would copy host files into the guest) is refused
// at submission, and a tree swapped for a link after submission is refused again on the worker before anything is
// opened; an import_kvm job onto a host bridge that is no libvirt network (br-mgmt) fails naming the field and
// leaves no domain, while a bridge the operator listed in FERRY_LIBVIRT_BRIDGES works; parameters.plan (a plan's
// slots) from a caller is a 400 on every submission route, so it never holds a lease.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import IORedis from 'ioredis';
import { keys } from '../../platform/redis';
import { Slots } from '../../queue/slots';
import { TestRedis } from '../helpers/redis';
import { awaitWorkers, Proc, startDaemonProc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DaemonError, JobApiError } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';
import { releaseLibvirt, TestLibvirt, useLibvirt, virshNames } from '../helpers/libvirt';
import { tolerate } from '../helpers/teardown';

const K = { submit: 'reach-submit-key-0123456789', admin: 'reach-admin-key-0123456789' };
const PREFIX = 'reach';
const ALLOWED_BRIDGE = 'br-reach-ok';

describe('security: jobs name only what their caller may (host files, bridges, plan slots)', function () {
  this.timeout(180_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-sec-reach-'));
  const root = path.join(dir, 'root'); // the only input and output root
  const disk = path.join(root, 'disk.qcow2');
  const procs: Proc[] = [];
  let lv: TestLibvirt;
  let gw: Proc & { url: string };
  let dm: Proc & { url: string };
  let rc: IORedis;
  const k = keys(PREFIX);
  const as = (key: string) => ({ 'x-api-key': key });
  const jobExists = async (id: string) => (await rc.exists(k.job(id))) === 1;
  const final = (id: string) => until(async () => { const j = await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`, undefined, as(K.admin)); return ['COMPLETED', 'FAILED', 'CANCELLED'].includes(j.body?.state) && j.body; }, 90_000, `job ${id} to end`);
  const migrate = (id: string, virtioWin: string) => ({
    job_id: id, operation: 'migrate', parameters: {
      manifest: {
        manifest_version: '1.0', disks: [{ id: 'd0', source_format: 'qcow2', bytes: 1 << 20, local_path: disk }],
        pipeline: { fix: { enabled: true, inject_virtio_drivers: true, virtio_win: virtioWin }, convert: { enabled: true } },
        output: { directory: path.join(root, `out-${id}`) },
      },
    },
  });
  const importKvm = (id: string, network: string) => ({ job_id: id, operation: 'import_kvm', parameters: { disks: [{ path: disk, format: 'qcow2' }], name: id, networks: [network], pool: lv.pool, memory: 64 } });

  before(async () => {
    mkdirSync(root);
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', disk, '1M']);
    [lv] = await Promise.all([useLibvirt(), redis.start()]);
    const env = {
      ...testEnv(redis.url, PREFIX), FERRY_API_KEYS: `ci:submit:${K.submit},ops:admin:${K.admin}`,
      FERRY_INPUT_ROOTS: root, FERRY_OUTPUT_ROOTS: root, FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_POOL: lv.pool, FERRY_LIBVIRT_POOL_DIR: lv.poolDir,
      FERRY_LIBVIRT_BRIDGES: ALLOWED_BRIDGE,
    };
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 1h\n');
    [gw, dm] = await Promise.all([startGatewayProc(env), startDaemonProc(env, cfg)]);
    procs.push(gw, dm);
    const w = await startWorkerProc(env, 'reach-w', ['img_tool', 'mount_operations', 'libvirt_access']);
    procs.push(w);
    await awaitWorkers(gw.url, [w], as(K.admin));
    rc = new IORedis(redis.url);
  });
  after(async () => {
    rc?.disconnect();
    await Promise.all(procs.map((p) => p.kill()));
    if (lv) {
      const left = await virshNames(lv, ['list', '--all', '--name']);
      for (const d of left.filter((x) => x.startsWith('reach-'))) await lv.virsh(['undefine', d, '--remove-all-storage']).catch(tolerate(`undefine ${d}`));
      await releaseLibvirt();
    }
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('the reported attack: pipeline.fix.virtio_win outside every input root is a 400 naming it on both APIs, through a link too; no job', async () => {
    const link = path.join(root, 'drivers-link');
    symlinkSync('/etc', link);
    for (const [i, tree] of ['/etc', link].entries()) {
      const id = `reach-vw-${i}`;
      const r = await req<JobApiError>(gw.url, 'POST', '/jobs?queue=true', migrate(id, tree), as(K.submit));
      expect(r.status, r.text).to.equal(400);
      expect(r.body.error.fields!.map((f) => f.field)).to.include('parameters.manifest.pipeline.fix.virtio_win');
      expect(r.body.error.message).to.include('outside every input root');
      expect(await jobExists(id), 'job record').to.equal(false);
    }
    const { job_id: _id, ...template } = migrate('x', '/etc');
    const viaDaemon = await req<DaemonError>(dm.url, 'POST', '/jobs/operation', template, as(K.submit));
    expect(viaDaemon.status, viaDaemon.text).to.equal(400);
    expect(viaDaemon.body.error).to.include('parameters.manifest.pipeline.fix.virtio_win');
    // Not a path at all: refused by the schema, naming it too.
    const rel = await req<JobApiError>(gw.url, 'POST', '/jobs', migrate('reach-vw-rel', 'etc'), as(K.submit));
    expect(rel.status, rel.text).to.equal(400);
    expect(rel.body.error.message).to.include('virtio_win');
  });

  it('a driver tree swapped for a link to /etc after submission is refused on the worker before anything is opened; no output', async () => {
    const tree = path.join(root, 'drivers');
    mkdirSync(tree);
    const id = 'reach-vw-swap';
    const ok = await req(gw.url, 'POST', '/jobs', migrate(id, tree), as(K.submit));
    expect(ok.status, ok.text).to.equal(201);
    rmSync(tree, { recursive: true });
    symlinkSync('/etc', tree);
    expect((await req(gw.url, 'POST', `/jobs/${id}/queue`, undefined, as(K.submit))).status).to.equal(200);
    const j = await final(id);
    expect(j.state, JSON.stringify(j)).to.equal('FAILED');
    expect(j.error).to.include('parameters.manifest.pipeline.fix.virtio_win').and.include('outside every input root');
    expect(j.attempts, 'not retried').to.equal(1);
    const out = path.join(root, `out-${id}`);
    expect(readdirSync(root), 'nothing written').to.not.include(path.basename(out));
  });

  it('the reported attack: import_kvm onto br-mgmt (no libvirt network, not listed) fails naming parameters.networks[0]; no domain, no volume', async () => {
    const id = 'reach-mgmt';
    const r = await req(gw.url, 'POST', '/jobs?queue=true', importKvm(id, 'br-mgmt'), as(K.submit));
    expect(r.status, r.text).to.equal(201);
    const j = await final(id);
    expect(j.state, JSON.stringify(j)).to.equal('FAILED');
    expect(j.error).to.include('parameters.networks[0]').and.include('FERRY_LIBVIRT_BRIDGES');
    expect(await virshNames(lv, ['list', '--all', '--name'])).to.not.include(id);
    await lv.virsh(['pool-refresh', lv.pool]);
    expect((await virshNames(lv, ['vol-list', lv.pool])).filter((v) => v.startsWith(id))).to.deep.equal([]);
    // The daemon's own import (admin) obeys the same rule: 400 naming network, no domain.
    const direct = await req<DaemonError>(dm.url, 'POST', '/import/kvm', { image_path: disk, vm_name: 'reach-mgmt-direct', network: 'br-mgmt', memory: 64 }, as(K.admin));
    expect(direct.status, direct.text).to.equal(400);
    expect(direct.body.error).to.include('network').and.include('br-mgmt');
    expect(await virshNames(lv, ['list', '--all', '--name'])).to.not.include('reach-mgmt-direct');
  });

  it('a bridge the operator listed in FERRY_LIBVIRT_BRIDGES is accepted: the domain\'s NIC is on it', async () => {
    const id = 'reach-listed';
    expect((await req(gw.url, 'POST', '/jobs?queue=true', importKvm(id, ALLOWED_BRIDGE), as(K.submit))).status).to.equal(201);
    const j = await final(id);
    expect(j.state, JSON.stringify(j)).to.equal('COMPLETED');
    const nics = await lv.virsh(['domiflist', id]);
    expect(nics).to.match(new RegExp(`bridge\\s+${ALLOWED_BRIDGE}\\s+virtio`));
  });

  it('the reported attack: parameters.plan from a caller is a 400 naming it on the gateway, the daemon and a schedule; no job, no slot held', async () => {
    const guard = 'vm:127.0.0.1:443:/DC0/vm/victim';
    const params = (slot: string) => ({ vm_path: '/DC0/vm/app', source_type: 'vsphere', destination: { type: 'kvm' }, plan: { id: 'p', slots: [{ name: slot, limit: 1 }] } });
    for (const [i, slot] of ['plan:p', guard].entries()) {
      const id = `reach-plan-${i}`;
      const r = await req<JobApiError>(gw.url, 'POST', '/jobs?queue=true', { job_id: id, operation: 'migrate_vm', parameters: params(slot) }, as(K.submit));
      expect(r.status, r.text).to.equal(400);
      expect(r.body.error.message).to.include('parameters.plan');
      expect(await jobExists(id)).to.equal(false);
    }
    for (const key of [K.submit, K.admin]) {
      const d = await req<DaemonError>(dm.url, 'POST', '/jobs/operation', { operation: 'migrate_vm', parameters: params('plan:p') }, as(key));
      expect(d.status, d.text).to.equal(400);
      expect(d.body.fields!.map((f) => f.field)).to.include('parameters.plan');
    }
    const s = await req<DaemonError>(dm.url, 'POST', '/schedules', { id: 'reach-sched', name: 'x', schedule: '0 3 * * *', job_template: { operation: 'migrate_vm', parameters: params('plan:p') } }, as(K.submit));
    expect(s.status, s.text).to.equal(400);
    expect(s.body.error).to.include('job_template.parameters.plan');
    expect(await rc.hexists(k.schedules, 'reach-sched')).to.equal(0);
    const slots = new Slots(rc, k);
    expect(await slots.holders(guard), 'the VM\'s source guard').to.deep.equal([]);
    expect(await slots.holders('plan:p')).to.deep.equal([]);
  });
});
