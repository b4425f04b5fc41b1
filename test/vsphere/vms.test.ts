// The daemon's Remote VMs endpoints against the vSphere simulator, as an operator calls them: both path forms,
// the default manager (GOVC_* with the simulator's certificate as CA) and per-request credentials (a second
// simulator whose certificate is not trusted: refused, then accepted with insecure), a wrong password, an
// unknown path, an unreachable manager; power actions and CD-ROM removal checked on the simulator afterwards. The
// power actions run as vm_power jobs on a worker with vsphere_access (the daemon stays Node only): the job list
// shows them, and a password given for one is kept sealed (FERRY_SECRET_KEY), never in a log.
import { expect } from 'chai';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis, freePort } from '../helpers/redis';
import { createRedis, keys } from '../../platform/redis';
import { awaitWorkers, Proc, startDaemonProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req } from '../helpers/http';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { managerFor } from '../../domain/vsphere/client';
import { listVms, vmDetail } from '../../domain/vsphere/inventory';
import type { VmCdrom, VmDetail, VmDisk, VmNic } from '../../domain/vsphere/inventory';
import type { DaemonError } from '../helpers/http';
import { createVm, makeDisks, otherSessions, powerOn, upload } from './fixture';
import type { DaemonJobList, VmList } from '../helpers/api-types';

const PASSWORD = 'vcsim-default-pw-31';
const OTHER_PASSWORD = 'vcsim-other-pw-62';
const PREFIXES = ['', '/api/v1'];

/** GET /vms/discover: the list with counts by power state and the datacenters. */
interface VmDiscovery extends VmList { by_power_state: Record<string, number>; datacenters: string[]; timestamp: string }
/** GET /vms/info: the VM's detail without the moref and device keys. */
type VmInfo = Omit<VmDetail, 'moref' | 'disks' | 'nics' | 'cdroms'> & {
  disks: Array<Omit<VmDisk, 'key' | 'controller_key' | 'unit_number'>>; nics: Array<Omit<VmNic, 'key'>>; cdroms: Array<Omit<VmCdrom, 'key'>>;
};
/** The Redis keys whose value (string, hash, list, set, sorted set, stream) holds `text`. */
async function redisKeysHolding(url: string, text: string): Promise<string[]> {
  const r = createRedis({ url });
  try {
    const found: string[] = [];
    for (const key of await r.keys('*')) {
      const t = await r.type(key);
      const v = t === 'string' ? await r.get(key) : t === 'hash' ? await r.hgetall(key) : t === 'list' ? await r.lrange(key, 0, -1)
        : t === 'set' ? await r.smembers(key) : t === 'zset' ? await r.zrange(key, 0, -1) : t === 'stream' ? await r.xrange(key, '-', '+') : null;
      if (JSON.stringify(v ?? '').includes(text)) found.push(key);
    }
    return found;
  } finally { r.disconnect(); }
}
/** POST /vms/shutdown, /vms/poweroff, /vms/remove-cdrom. */
interface VmMessage { message: string }

describe('remote VMs endpoints (/vms/*) against vcsim', function () {
  this.timeout(60_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-vsphere-vms-'));
  let v: Vcsim;
  let v2: Vcsim;
  let daemon: Proc & { url: string };
  let worker: Proc;
  let B: string;
  let m: ReturnType<typeof managerFor>;
  const q = (o: Record<string, string | boolean>) => '?' + new URLSearchParams(Object.entries(o).map(([k, x]): [string, string] => [k, String(x)])).toString();
  /** Credentials travel in headers on a GET (the query refuses them). */
  const creds = (username: string, password: string) => ({ 'x-vsphere-username': username, 'x-vsphere-password': password });

  before(async function () {
    this.timeout(180_000);
    [v, v2] = await Promise.all([startVcsim({ password: PASSWORD }), startVcsim({ password: OTHER_PASSWORD, args: ['-vm', '1', '-cluster', '0'] })]);
    await redis.start();
    m = managerFor({ url: v.url, username: v.username, password: PASSWORD, ca: readFileSync(v.caFile, 'utf8') });
    const d = makeDisks(dir, 2);
    await createVm(m, { name: 'app1', cdrom: true, firmware: 'efi', guestId: 'windows9Server64Guest', cpus: 4, memoryMB: 4096, mac: '00:50:56:aa:bb:07', disks: [{ file: 'app1/app1.vmdk', bytes: d.bytes }] });
    await upload(v, d.sparse, 'app1/app1.vmdk');
    await createVm(m, { name: 'notools', disks: [{ file: 'notools/notools.vmdk', bytes: d.bytes }] });
    await powerOn(m, '/DC0/vm/notools');
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 1h\n');
    const env = { ...testEnv(redis.url), FERRY_HOST: '127.0.0.1', FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1', GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: PASSWORD, FERRY_SECRET_KEY: 'vms-test-secret-key-0123456789' };
    daemon = await startDaemonProc(env, cfg);
    B = daemon.url;
    worker = await startWorkerProc(env, 'vms-power', ['vsphere_access']);
    await awaitWorkers(B, [worker]);
  });
  after(async () => {
    await worker?.stop();
    await daemon?.stop();
    await Promise.all([v?.stop(), v2?.stop()]);
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('GET /vms/list with the default manager (GOVC_*, TLS verified against the simulator certificate as CA), both path forms', async () => {
    const direct = await listVms(m);
    for (const p of PREFIXES) {
      const r = await req<VmList>(B, 'GET', `${p}/vms/list`);
      expect(r.status, r.text).to.equal(200);
      expect(r.body.total).to.equal(direct.length).and.equal(r.body.vms.length);
      const app = r.body.vms.find((x) => x.name === 'app1');
      expect(app).to.include({ path: '/DC0/vm/app1', power_state: 'poweredOff', num_cpu: 4, memory_mb: 4096 });
      expect(app).to.have.keys('name', 'path', 'power_state', 'num_cpu', 'memory_mb', 'storage', 'guest_os', 'ip_address', 'template', 'datastores', 'networks');
      expect(app).to.deep.include({ datastores: ['LocalDS_0'], networks: ['VM Network'] });
      expect(r.body.vms.map((x) => x.path)).to.include.members(['/DC0/vm/DC0_H0_VM0', '/DC0/vm/DC0_C0_RP0_VM1', '/DC0/vm/notools']);
    }
  });

  it('per-request credentials: another manager, refused while its certificate is untrusted, listed with insecure=true', async () => {
    const untrusted = await req<DaemonError>(B, 'GET', `/vms/list${q({ server: v2.url })}`, undefined, creds(v2.username, OTHER_PASSWORD));
    expect(untrusted.status).to.equal(502);
    expect(untrusted.body.error).to.match(/TLS certificate of vSphere manager https:\/\/127\.0\.0\.1:\d+ is not trusted/);
    expect(untrusted.text).to.not.include(OTHER_PASSWORD);
    for (const p of PREFIXES) {
      const r = await req<VmList>(B, 'GET', `${p}/vms/list${q({ server: v2.url, insecure: true })}`, undefined, creds(v2.username, OTHER_PASSWORD));
      expect(r.status, r.text).to.equal(200);
      expect(r.body.vms.map((x) => x.name).sort()).to.deep.equal(['DC0_H0_VM0']);
      expect(r.body.manager).to.equal(new URL(v2.url).origin);
    }
  });

  it('a wrong password is a 401 naming the manager and user, never echoing the password; an unreachable manager is a 502 naming it', async () => {
    for (const p of PREFIXES) {
      const r = await req<DaemonError>(B, 'GET', `${p}/vms/list`, undefined, creds(v.username, 'not-the-password-55'));
      expect(r.status).to.equal(401);
      expect(r.body).to.include.keys('error', 'status', 'timestamp');
      expect(r.body.error).to.match(/login to vSphere manager https:\/\/127\.0\.0\.1:\d+ as ferry failed: the user name or password is wrong/);
      expect(r.text).to.not.include('not-the-password-55');
    }
    const port = await freePort();
    const away = await req<DaemonError>(B, 'POST', '/vms/poweroff', { manager_url: `https://127.0.0.1:${port}/sdk`, username: 'u', password: 'secret-away-pw', vm_path: '/DC0/vm/app1' });
    expect(away.status).to.equal(502);
    expect(away.body.error).to.include(`vSphere manager https://127.0.0.1:${port} cannot be reached`);
    expect(away.text).to.not.include('secret-away-pw');
    // The password travelled to the worker sealed beside its job: in Redis only encrypted.
    const awayJob = (await req<DaemonJobList>(B, 'GET', '/jobs?limit=100')).body.jobs.find((j) => j.definition.operation === 'vm_power' && j.status === 'failed')!;
    expect(awayJob.error).to.include('cannot be reached');
    expect(await redisKeysHolding(redis.url, 'secret-away-pw')).to.deep.equal([]);
    const rc = createRedis({ url: redis.url });
    try { expect(await rc.get(keys('ferry').credentials(awayJob.id))).to.match(/^v1:/); } finally { rc.disconnect(); }
    // Only managers the deployment names (GOVC_URL, FERRY_VSPHERE_MANAGERS) are contacted: no arbitrary hosts.
    const elsewhere = await req<DaemonError>(B, 'GET', `/vms/list${q({ server: 'https://10.9.8.7/sdk' })}`, undefined, creds('u', 'secret-elsewhere-pw'));
    expect(elsewhere.status).to.equal(400);
    expect(elsewhere.body.error).to.match(/^server 10\.9\.8\.7:443 is not a vSphere manager this service may contact/);
    expect(elsewhere.text).to.not.include('secret-elsewhere-pw');
    expect(daemon.logs.join('') + worker.logs.join('')).to.not.include('not-the-password-55').and.not.include('secret-away-pw').and.not.include(PASSWORD);
  });

  it('GET /vms/info by path and by name: hardware, disks, NICs, firmware, CD-ROMs, snapshots; 404 for an unknown path; 400 naming the field', async () => {
    for (const p of PREFIXES) {
      const r = await req<VmInfo>(B, 'GET', `${p}/vms/info${q({ path: '/DC0/vm/app1' })}`);
      expect(r.status, r.text).to.equal(200);
      expect(r.body).to.include({ name: 'app1', path: '/DC0/vm/app1', power_state: 'poweredOff', firmware: 'efi', guest_id: 'windows9Server64Guest' });
      expect(r.body.uuid).to.match(/^[0-9a-f-]{36}$/);
      expect(r.body.hardware).to.include({ num_cpu: 4, memory_mb: 4096, num_virtual_disks: 1 });
      expect(r.body.disks).to.deep.equal([{ label: r.body.disks[0].label, capacity_kb: 2048, capacity_bytes: 2 * 1024 * 1024, file_path: '[LocalDS_0] app1/app1.vmdk', chain: ['[LocalDS_0] app1/app1.vmdk'] }]);
      expect(r.body.nics).to.deep.equal([{ label: r.body.nics[0].label, mac: '00:50:56:aa:bb:07', network: 'VM Network', adapter: 'vmxnet3' }]);
      expect(r.body.cdroms).to.have.length(1);
      expect(r.body.snapshots).to.deep.equal([]);
    }
    const byName = await req<VmInfo>(B, 'GET', `/vms/info${q({ name: 'app1' })}`);
    expect(byName.body.path).to.equal('/DC0/vm/app1');
    const missing = await req<DaemonError>(B, 'GET', `/api/v1/vms/info${q({ path: '/DC0/vm/nope' })}`);
    expect(missing.status).to.equal(404);
    expect(missing.body.error).to.include('no VM at /DC0/vm/nope');
    expect((await req(B, 'GET', `/vms/info${q({ name: 'nope' })}`)).status).to.equal(404);
    const bad = await req<DaemonError>(B, 'GET', `/vms/info${q({ path: 'not-a-path' })}`);
    expect(bad.status).to.equal(400);
    expect(bad.body.error).to.include('path');
    expect((await req(B, 'GET', '/vms/info')).status).to.equal(400);
  });

  it('POST /vms/remove-cdrom removes every CD-ROM (seen on the simulator afterwards)', async () => {
    const r = await req<VmMessage>(B, 'POST', '/api/v1/vms/remove-cdrom', { vm_path: '/DC0/vm/app1' });
    expect(r.status, r.text).to.equal(200);
    expect(r.body.message).to.match(/removed 1 CD-ROM device/);
    expect((await vmDetail(m, '/DC0/vm/app1')).cdroms).to.deep.equal([]);
    expect((await req<VmMessage>(B, 'POST', '/vms/remove-cdrom', { vm_path: '/DC0/vm/app1' })).body.message).to.match(/has no CD-ROM/);
    expect((await req(B, 'POST', '/vms/remove-cdrom', { vm_path: '/DC0/vm/ghost' })).status).to.equal(404);
  });

  it('POST /vms/shutdown asks the guest (tools running) and refuses clearly without tools; /vms/poweroff forces, then 409 when already off', async () => {
    const s = await req<VmMessage>(B, 'POST', '/vms/shutdown', { vm_path: '/DC0/vm/DC0_H0_VM0' });
    expect(s.status, s.text).to.equal(200);
    expect(s.body.message).to.include('guest shutdown of /DC0/vm/DC0_H0_VM0 initiated');
    expect((await vmDetail(m, '/DC0/vm/DC0_H0_VM0')).power_state).to.equal('poweredOff');
    const nt = await req<DaemonError>(B, 'POST', '/api/v1/vms/shutdown', { vm_path: '/DC0/vm/notools' });
    expect(nt.status).to.equal(409);
    expect(nt.body.error).to.match(/VMware Tools are not running in \/DC0\/vm\/notools.*use poweroff/);
    for (const p of PREFIXES) {
      const vm = p ? '/DC0/vm/notools' : '/DC0/vm/DC0_C0_RP0_VM0';
      const r = await req<VmMessage>(B, 'POST', `${p}/vms/poweroff`, { vm_path: vm });
      expect(r.status, r.text).to.equal(200);
      expect(r.body.message).to.equal(`${vm} powered off`);
      expect((await vmDetail(m, vm)).power_state).to.equal('poweredOff');
    }
    const again = await req<DaemonError>(B, 'POST', '/vms/poweroff', { vm_path: '/DC0/vm/notools' });
    expect(again.status).to.equal(409);
    expect(again.body.error).to.include('already powered off');
    // Each action was a vm_power job on the worker: the shutdown and two power-offs completed, the refusals failed.
    const jobs = (await req<DaemonJobList>(B, 'GET', '/jobs?limit=100')).body.jobs.filter((j) => j.definition.operation === 'vm_power');
    const byPath = (status: string) => jobs.filter((j) => j.status === status).map((j) => j.definition.vm_path).sort();
    expect(byPath('completed')).to.deep.equal(['/DC0/vm/DC0_C0_RP0_VM0', '/DC0/vm/DC0_H0_VM0', '/DC0/vm/notools']);
    expect(byPath('failed')).to.include.members(['/DC0/vm/notools']);
  });

  it('GET /vms/discover: the whole inventory of the default manager, both path forms', async () => {
    for (const p of PREFIXES) {
      const r = await req<VmDiscovery>(B, 'GET', `${p}/vms/discover`);
      expect(r.status, r.text).to.equal(200);
      expect(r.body.total).to.equal((await listVms(m)).length);
      expect(r.body.datacenters).to.deep.equal(['DC0']);
      expect(Object.values(r.body.by_power_state).reduce((a: number, b: number) => a + b, 0)).to.equal(r.body.total);
    }
  });

  it('the client keeps one session per manager and logs in again when the manager has ended it', async () => {
    const mm = managerFor({ url: v.url, username: v.username, password: PASSWORD, ca: readFileSync(v.caFile, 'utf8') });
    expect(mm).to.equal(m);
    const cookie = await mm.sessionCookie();
    expect(await mm.sessionCookie()).to.equal(cookie);
    // End the session on the manager side (as an idle timeout or an administrator would), then use the client.
    const sc = await mm.serviceContent();
    await mm.call('Logout', sc.sessionManager);
    const vms = await listVms(mm);
    expect(vms.length).to.be.greaterThan(4);
    expect(await mm.sessionCookie()).to.not.equal(cookie);
  });

  // Last: it stops the daemon and the worker (whose vm_power jobs above opened sessions of their own).
  it('a daemon and a worker stopped with SIGTERM log out of the vSphere sessions they opened, on each manager used', async () => {
    const m2 = managerFor({ url: v2.url, username: v2.username, password: OTHER_PASSWORD, insecure: true });
    expect((await req(B, 'GET', '/vms/list')).status).to.equal(200);
    expect((await req(B, 'GET', `/vms/list${q({ server: v2.url, insecure: true })}`, undefined, creds(v2.username, OTHER_PASSWORD))).status).to.equal(200);
    const [daemon1, daemon2] = [await otherSessions(m), await otherSessions(m2)];
    expect(daemon1, "the daemon's and the worker's sessions on the default manager").to.have.length.above(1);
    expect(daemon2, "the daemon's session on the per-request manager").to.have.length.above(0);
    await daemon.stop('SIGTERM');
    expect(daemon.proc.exitCode, 'a clean exit, within the shutdown bound').to.equal(0);
    await worker.stop('SIGTERM');
    expect(worker.proc.exitCode, "the worker's clean exit").to.equal(0);
    expect((await otherSessions(m)).filter((k) => daemon1.includes(k)), 'still open on the default manager').to.deep.equal([]);
    expect((await otherSessions(m2)).filter((k) => daemon2.includes(k)), 'still open on the per-request manager').to.deep.equal([]);
  });
});
