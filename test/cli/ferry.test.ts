// The `ferry` command as an operator's script runs it: the real bin against a real daemon and the vSphere
// simulator, the key from FERRY_API_KEY, --json parsed, exit codes checked. The plan commands run a plan whose
// target host does not answer (a libvirt socket nobody listens on): preflight blocks every VM, so `start --wait`
// reaches the plan's end without a worker, and the exit codes for blockers and unmigrated VMs show.
import { expect } from 'chai';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis } from '../helpers/redis';
import { ferryCli, Proc, startDaemonProc, testEnv } from '../helpers/procs';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { managerFor } from '../../domain/vsphere/client';
import { createVm, makeDisks, upload } from '../vsphere/fixture';
import type { PlanView, Validation, VmList } from '../helpers/api-types';
import type { VmDetail } from '../../domain/vsphere/inventory';

const PASSWORD = 'vcsim-cli-pw-41';
const ADMIN = 'cli-admin-key-0123456789';
const READ = 'cli-read-key-0123456789';
const SUBMIT = 'cli-submit-key-0123456789';

describe('the ferry command (vms)', function () {
  this.timeout(60_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-cli-'));
  const TARGET = `qemu+unix:///system?socket=${dir}/no-libvirtd.sock`;
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
    daemon = await startDaemonProc({ ...testEnv(redis.url), FERRY_LIBVIRT_URI: TARGET, FERRY_API_KEYS: `ops:admin:${ADMIN},viewer:read:${READ},ci:submit:${SUBMIT}`, FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1', GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: PASSWORD }, cfg);
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
    const listed = JSON.parse(all.stdout) as VmList;
    expect(listed.total).to.equal(listed.vms.length).and.be.greaterThan(1);
    expect(listed.vms.map((x) => x.path)).to.include('/DC0/vm/cli-web1');
    const one = JSON.parse((await ferryCli(['vms', 'list', '--json', '--name', 'cli-*'], env)).stdout) as VmList;
    expect(one.vms.map((x) => x.name)).to.deep.equal(['cli-web1']);
    const text = await ferryCli(['vms', 'list', '--name', 'cli-*'], env);
    expect(text.stdout.split('\n')[0]).to.match(/^PATH\s+POWER\s+CPU/);
    expect(text.stdout).to.match(/\/DC0\/vm\/cli-web1\s+poweredOff\s+2\s+2048 MiB/);
  });

  it('vms info shows disks and firmware; an unknown VM exits 1 naming the 404', async () => {
    const r = await ferryCli(['vms', 'info', '/DC0/vm/cli-web1', '--json'], env);
    expect(r.code, r.stderr).to.equal(0);
    const d = JSON.parse(r.stdout) as Omit<VmDetail, 'moref'>;
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

  it('plan create from YAML, validate (exit 2 on blockers, a table naming them), start --wait to the end (exit 3), --json parsed', async () => {
    const file = path.join(dir, 'plan.yaml');
    writeFileSync(file, ['name: cli wave', 'vms: [/DC0/vm/cli-web1]', `destination: {type: kvm, virt_uri: "${TARGET}"}`,
      'network_map: {VM Network: default}', 'storage_map: {LocalDS_0: default}', 'options: {power_off: none}', ''].join('\n'));
    const submit = { ...env, FERRY_API_KEY: SUBMIT };
    const created = await ferryCli(['plan', 'create', '-f', file, '--json'], submit);
    expect(created.code, created.stderr).to.equal(0);
    const id = (JSON.parse(created.stdout) as PlanView).id;
    expect(id).to.be.a('string');
    const readOnly = await ferryCli(['plan', 'start', id], env);
    expect(readOnly.code, 'a read key cannot start a plan').to.equal(1);
    expect(readOnly.stderr).to.match(/403/);
    const table = await ferryCli(['plan', 'validate', id], submit);
    expect(table.code).to.equal(2);
    expect(table.stdout.split('\n')[0]).to.match(/^SEVERITY\s+VM\s+RULE/);
    expect(table.stdout).to.match(/blocker\s+\/DC0\/vm\/cli-web1\s+target_unreachable/);
    const findings = JSON.parse((await ferryCli(['plan', 'validate', id, '--json'], submit)).stdout) as Validation;
    expect(findings.vms[0].findings.map((f) => f.rule)).to.include('target_unreachable');
    const run = await ferryCli(['plan', 'start', id, '--wait', '--interval', '0.5', '--json'], submit);
    expect(run.code, run.stderr).to.equal(3);
    const final = JSON.parse(run.stdout) as PlanView;
    expect(final.status).to.equal('failed');
    expect(final.vms.map((x) => x.status)).to.deep.equal(['blocked']);
    const status = await ferryCli(['plan', 'status', id], env);
    expect(status.stdout).to.match(/plan cli wave failed: 1\/1 VMs done/);
    expect(status.stdout).to.match(/\/DC0\/vm\/cli-web1\s+blocked\s+.*blocked by preflight: .*target_unreachable/);
  });
});
