// The `ferry` command as an operator's script runs it: the real bin against a real daemon and the vSphere
// simulator, the key from FERRY_API_KEY, --json parsed, exit codes checked.
import { expect } from 'chai';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis } from '../helpers/redis';
import { ferryCli, Proc, startDaemonProc, testEnv } from '../helpers/procs';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { managerFor } from '../../shared/vsphere/client';
import { createVm, makeDisks, upload } from '../vsphere/fixture';

const PASSWORD = 'vcsim-cli-pw-41';
const ADMIN = 'cli-admin-key-0123456789';
const READ = 'cli-read-key-0123456789';

describe('the ferry command (vms)', function () {
  this.timeout(60_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-cli-'));
  let v: Vcsim;
  let daemon: Proc & { url: string };
  let env: Record<string, string>;

  before(async function () {
    this.timeout(180_000);
    v = await startVcsim({ password: PASSWORD });
    await redis.start();
    const m = managerFor({ url: v.url, username: v.username, password: PASSWORD, ca: readFileSync(v.caFile, 'utf8') });
    const d = makeDisks(dir, 2);
    await createVm(m, { name: 'cli-web1', firmware: 'efi', cpus: 2, memoryMB: 2048, mac: '00:50:56:aa:bb:41', disks: [{ file: 'cli-web1/cli-web1.vmdk', bytes: d.bytes }] });
    await upload(v, d.sparse, 'cli-web1/cli-web1.vmdk');
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 1h\n');
    daemon = await startDaemonProc({ ...testEnv(redis.url), FERRY_API_KEYS: `ops:admin:${ADMIN},viewer:read:${READ}`, FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1', GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: PASSWORD }, cfg);
    env = { FERRY_URL: daemon.url, FERRY_API_KEY: READ };
  });
  after(async () => {
    await daemon?.stop();
    await v?.stop();
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('vms list --json gives what GET /vms/list gives; --name filters; the table names each VM path', async () => {
    const all = await ferryCli(['vms', 'list', '--json'], env);
    expect(all.code, all.stderr).to.equal(0);
    const listed = JSON.parse(all.stdout);
    expect(listed.total).to.equal(listed.vms.length).and.be.greaterThan(1);
    expect(listed.vms.map((x: any) => x.path)).to.include('/DC0/vm/cli-web1');
    const one = JSON.parse((await ferryCli(['vms', 'list', '--json', '--name', 'cli-*'], env)).stdout);
    expect(one.vms.map((x: any) => x.name)).to.deep.equal(['cli-web1']);
    const text = await ferryCli(['vms', 'list', '--name', 'cli-*'], env);
    expect(text.stdout.split('\n')[0]).to.match(/^PATH\s+POWER\s+CPU/);
    expect(text.stdout).to.match(/\/DC0\/vm\/cli-web1\s+poweredOff\s+2\s+2048 MiB/);
  });

  it('vms info shows disks and firmware; an unknown VM exits 1 naming the 404', async () => {
    const r = await ferryCli(['vms', 'info', '/DC0/vm/cli-web1', '--json'], env);
    expect(r.code, r.stderr).to.equal(0);
    const d = JSON.parse(r.stdout);
    expect(d.disks).to.have.length(1);
    expect(d.disks[0].file_path).to.match(/cli-web1\.vmdk/);
    const text = await ferryCli(['vms', 'info', '/DC0/vm/cli-web1'], env);
    expect(text.stdout).to.match(/firmware efi/);
    const missing = await ferryCli(['vms', 'info', '/DC0/vm/no-such-vm'], env);
    expect(missing.code).to.equal(1);
    expect(missing.stderr).to.match(/404/);
  });

  it('takes the key from FERRY_API_KEY only: without it 401, a bad flag exits 1 with the usage', async () => {
    const r = await ferryCli(['vms', 'list'], { FERRY_URL: daemon.url });
    expect(r.code).to.equal(1);
    expect(r.stderr).to.match(/401/);
    const bad = await ferryCli(['vms', 'list', '--key', ADMIN], env);
    expect(bad.code).to.equal(1);
    expect(bad.stderr).to.match(/usage: ferry/);
    const down = await ferryCli(['vms', 'list'], { FERRY_URL: 'http://127.0.0.1:1', FERRY_API_KEY: READ });
    expect(down.stderr).to.match(/cannot reach the daemon at http:\/\/127\.0\.0\.1:1/);
  });
});
