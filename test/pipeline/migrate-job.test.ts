// The `migrate` operation as a job, end to end with real processes: redis, gateway, a worker with img_tool.
// A manifest (inspect + convert + validate, checksum verified) runs to COMPLETED with report.json as the
// result and each stage's phase in the progress stream; capability routing from the enabled stages keeps a
// fix job (needs mount_operations) QUEUED with a waiting reason; a failing stage fails the job, report kept.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { EventSource } from 'eventsource';
import { sha256File } from '../../domain/qemu';
import { migrateCapabilities } from '../../domain/operations';
import { requirementsOf } from '../../queue/lifecycle';
import { queueName } from '../../platform/capabilities';
import { startStack } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobApiError } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';
import type { JobSpec, ProgressEvent } from '../../domain/schemas/job';
import { makeImage } from '../helpers/images';

const MIB = 1024 * 1024;
/** The migrate operation's result, report.json (domain/converter/stages/report.ts), as far as these tests read it. */
type MigrateReport = {
  success: boolean; report_path?: string; tool: string;
  artifacts: Array<{ disk_id: string; path: string; format: string; source_sha256?: string; sha256?: string }>;
  stages: { validate: { result: { checks: Array<Record<string, unknown>> } } };
  summary: { stages_failed: string[] };
};

describe('migrate operation as a job', function () {
  this.timeout(120_000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-migrate-job-'));
  let stack: Awaited<ReturnType<typeof startStack>> | undefined;
  let gw: Awaited<ReturnType<typeof startStack>>['gw'];
  let src: string;

  const manifest = (o: { out: string; fix?: boolean; checksum?: string; format?: string }) => ({
    manifest_version: '1.0',
    source: { provider: 'test', vm_name: 'job-vm' },
    disks: [{ id: 'root', source_format: o.format || 'vmdk', bytes: 20 * MIB, local_path: src, ...(o.checksum ? { checksum: o.checksum } : {}) }],
    pipeline: { inspect: { enabled: true }, convert: { enabled: true }, fix: { enabled: !!o.fix }, validate: { enabled: true } },
    output: { directory: o.out, format: 'qcow2', filename: 'root.qcow2' },
  });
  const job = async (id: string) => (await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`)).body;

  before(async () => {
    src = makeImage(dir, 'job-src', 'vmdk', 20);
    stack = await startStack('img-only', ['img_tool']);
    gw = stack.gw;
  });
  after(async () => {
    await stack?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('routes by the enabled stages: fix or guest inspection adds mount_operations', () => {
    const base = { job_id: 'x', execution_policy: { priority: 50 } } as Pick<JobSpec, 'job_id' | 'execution_policy'>; // requirementsOf reads neither
    expect(migrateCapabilities({ manifest: manifest({ out: '/o' }) })).to.deep.equal(['img_tool']);
    expect(migrateCapabilities({ manifest: { pipeline: { inspect: { enabled: true } } } })).to.deep.equal(['img_tool']);
    expect(migrateCapabilities({ manifest: { pipeline: { inspect: { enabled: true, collect_guest_info: true } } } })).to.deep.equal(['img_tool', 'mount_operations']);
    expect(queueName(requirementsOf({ ...base, operation: 'migrate', parameters: { manifest: manifest({ out: '/o', fix: true }) } }))).to.equal('jobs.img_tool+mount_operations');
    expect(requirementsOf({ ...base, operation: 'migrate', parameters: { manifest: manifest({ out: '/o' }) }, requirements: { capabilities: ['lvm_tools'] } }).capabilities)
      .to.deep.equal(['img_tool', 'lvm_tools']);
  });

  it('a fix job waits QUEUED with a waiting_reason while the img_tool-only worker completes a convert job after it', async () => {
    const sub = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'mig-fix', operation: 'migrate', parameters: { manifest: manifest({ out: path.join(dir, 'fix'), fix: true }) } });
    expect(sub.status, sub.text).to.equal(201);
    const j = await job('mig-fix');
    expect(j.state).to.equal('QUEUED');
    expect(j.queue.name).to.equal('jobs.img_tool+mount_operations');
    expect(j.queue.waiting_reason).to.match(/no active worker.*mount_operations/);

    const sha = await sha256File(src);
    const out = path.join(dir, 'ok');
    const ok = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'mig-ok', operation: 'migrate', parameters: { manifest: manifest({ out, checksum: `sha256:${sha}` }) } });
    expect(ok.status, ok.text).to.equal(201);
    const events: ProgressEvent[] = [];
    const final = await new Promise<{ state: string }>((resolve, reject) => {
      const es = new EventSource(`${gw.url}/jobs/mig-ok/events/stream`);
      es.addEventListener('progress', (e: MessageEvent) => events.push(JSON.parse(e.data as string) as ProgressEvent));
      es.addEventListener('complete', (e: MessageEvent) => { es.close(); resolve(JSON.parse(e.data as string) as { state: string }); });
      setTimeout(() => { es.close(); reject(new Error(`no complete event; events: ${JSON.stringify(events)}`)); }, 60000);
    });
    expect(final).to.deep.equal({ state: 'COMPLETED' });
    const phases = [...new Set(events.map((e) => e.phase))];
    for (const p of ['inspect', 'convert', 'validate']) expect(phases, JSON.stringify(phases)).to.include(p);
    expect(phases).to.not.include('fix');
    expect(phases.indexOf('inspect')).to.be.below(phases.indexOf('convert'));
    expect(phases.indexOf('convert')).to.be.below(phases.indexOf('validate'));
    const pcts = events.map((e) => e.percentage);
    expect(pcts).to.deep.equal([...pcts].sort((a, b) => a - b));

    const done = await job('mig-ok');
    expect(done.state).to.equal('COMPLETED');
    const onDisk = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as MigrateReport;
    expect(done.result).to.deep.include({ success: true, report_path: path.join(out, 'report.json') });
    expect((done.result as MigrateReport).artifacts).to.deep.equal(onDisk.artifacts);
    expect((done.result as MigrateReport).tool).to.equal('ferry-worker img-only');
    const art = (done.result as MigrateReport).artifacts[0];
    expect(art).to.include({ disk_id: 'root', path: path.join(out, 'root.qcow2'), format: 'qcow2', source_sha256: sha, sha256: await sha256File(path.join(out, 'root.qcow2')) });
    expect((done.result as MigrateReport).stages.validate.result.checks[0]).to.include({ compare: 'identical to source' });
    execFileSync('qemu-img', ['compare', '-q', '-f', 'vmdk', '-F', 'qcow2', src, art.path]);

    // The fix job was never handed to a worker that cannot run it.
    const still = await job('mig-fix');
    expect(still.state).to.equal('QUEUED');
    expect(still.state_history.map((h) => h.state)).to.deep.equal(['CREATED', 'VALIDATED', 'QUEUED']);
    expect((await req(gw.url, 'DELETE', '/jobs/mig-fix')).status).to.be.oneOf([200, 202]);
  });

  it('a failing stage fails the job with its reason (not retried); report.json is still written', async () => {
    const out = path.join(dir, 'bad');
    // A source_format the header contradicts is refused before any stage (docs/security.md, the image rule).
    const wrong = await req<JobApiError>(gw.url, 'POST', '/jobs?queue=true', { job_id: 'mig-fmt', operation: 'migrate', parameters: { manifest: manifest({ out, format: 'qcow2' }) } });
    expect(wrong.status, wrong.text).to.equal(400);
    expect(wrong.body.error.message).to.contain(`parameters.manifest.disks[0].local_path: ${src} is vmdk, not qcow2`);
    const sub = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'mig-bad', operation: 'migrate', parameters: { manifest: manifest({ out, checksum: `sha256:${'0'.repeat(64)}` }) } });
    expect(sub.status, sub.text).to.equal(201);
    const j = await until(async () => { const x = await job('mig-bad'); return ['FAILED', 'COMPLETED'].includes(x.state) && x; }, 60000, 'mig-bad finished');
    expect(j.state).to.equal('FAILED');
    expect(j.error).to.contain(`disk root: checksum mismatch: manifest sha256:${'0'.repeat(64)}`);
    expect(j.state_history.filter((h) => h.state === 'RUNNING')).to.have.length(1);
    const rep = JSON.parse(readFileSync(path.join(out, 'report.json'), 'utf8')) as MigrateReport;
    expect(rep.summary.stages_failed).to.deep.equal(['convert']);
    expect(existsSync(path.join(out, 'root.qcow2'))).to.equal(false);
  });

  it('rejects a bad manifest at submission with 400 naming the parameter path', async () => {
    const m = manifest({ out: path.join(dir, 'x') });
    m.manifest_version = '2.0';
    m.disks[0].local_path = 'relative.vmdk';
    const r = await req<JobApiError>(gw.url, 'POST', '/jobs', { job_id: 'mig-400', operation: 'migrate', parameters: { manifest: m } });
    expect(r.status).to.equal(400);
    expect(r.body.error.message).to.contain('parameters.manifest.manifest_version');
    expect(r.body.error.message).to.contain('parameters.manifest.disks[0].local_path');
  });

  it('refuses a plaintext user password in a job (400 naming it, the value nowhere); password_hash and free-form users pass', async () => {
    const m: ReturnType<typeof manifest> & { configuration?: Record<string, unknown> } = manifest({ out: path.join(dir, 'pw') });
    m.configuration = { users: { alice: { password: 'Pl41n-t3xt-secret', groups: ['sudo'] } } };
    const r = await req<JobApiError>(gw.url, 'POST', '/jobs', { job_id: 'mig-pw', operation: 'migrate', parameters: { manifest: m } });
    expect(r.status).to.equal(400);
    expect(r.body.error.message).to.contain('parameters.manifest.configuration.users.alice.password');
    expect(r.body.error.message).to.contain('give password_hash');
    expect(r.text).not.to.contain('Pl41n-t3xt-secret');
    expect((await req(gw.url, 'GET', '/jobs/mig-pw')).status).to.equal(404);
    m.configuration = { users: { alice: { password_hash: '$6$salt$abc', groups: ['sudo'] }, bob: 'free-form' }, network: ['anything'] };
    const ok = await req(gw.url, 'POST', '/jobs', { job_id: 'mig-pw-ok', operation: 'migrate', parameters: { manifest: m } });
    expect(ok.status, ok.text).to.equal(201);
    expect((await req(gw.url, 'DELETE', '/jobs/mig-pw-ok')).status).to.be.oneOf([200, 202]);
  });
});
