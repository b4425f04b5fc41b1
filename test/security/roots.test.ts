// Storage roots against a real gateway, a real worker, qemu-img and the real filesystem: a path outside every
// root, a symlink that escapes one, a block/char device or /proc as input are refused at submission (400 naming
// the field, nothing recorded); a path that turns bad after submission is refused by the worker before it opens
// anything (FAILED, not retried); an existing output is never replaced without overwrite, in convert and migrate.
import { expect } from 'chai';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, unlinkSync, writeFileSync, existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { checkOutputFree, outputId, placeOutput, refusal } from '../../platform/roots';
import { TestRedis } from '../helpers/redis';
import { awaitWorkers, Proc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import { makeImage } from '../helpers/images';
import type { Stats } from 'node:fs';
import type { JobApiError } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';

describe('security: storage roots', function () {
  this.timeout(120_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-sec-roots-'));
  const IN = path.join(dir, 'in');
  const OUT = path.join(dir, 'out');
  const ELSE = path.join(dir, 'elsewhere');
  const procs: Proc[] = [];
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let src: string;
  let secret: string;

  const submit = <T = unknown>(body: object, q = true) => req<T>(gw.url, 'POST', `/jobs${q ? '?queue=true' : ''}`, body);
  const convert = (id: string, image: string, parameters: object) => ({ job_id: id, operation: 'convert', image: { path: image, format: 'vmdk' }, parameters });
  const finished = (id: string) => until(async () => { const j = (await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`)).body; return j.is_terminal && j; }, 60000, `job ${id}`);
  async function refused(body: object, field: string, words: string) {
    const r = await submit<JobApiError>(body);
    expect(r.status, JSON.stringify(r.body)).to.equal(400);
    expect(r.body.error.fields!.map((f) => f.field)).to.include(field);
    expect(r.body.error.message).to.include(field).and.include(words);
    expect((await req(gw.url, 'GET', `/jobs/${(body as { job_id?: string }).job_id}`)).status).to.equal(404);
  }

  before(async () => {
    for (const d of [IN, OUT, ELSE]) mkdirSync(d);
    src = makeImage(IN, 'src', 'vmdk', 8);
    secret = path.join(ELSE, 'secret.vmdk');
    writeFileSync(secret, 'not yours');
    await redis.start();
    const env = { ...testEnv(redis.url, 'roots'), FERRY_INPUT_ROOTS: IN, FERRY_OUTPUT_ROOTS: OUT, FERRY_RETRY_BACKOFF_MS: '100' };
    gw = await startGatewayProc(env);
    const worker = await startWorkerProc(env, 'roots-w', ['img_tool']);
    procs.push(gw, worker);
    await awaitWorkers(gw.url, [worker]);
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('refuses at submission a path outside every root, naming the field', async () => {
    await refused(convert('out-1', secret, { output_dir: OUT }), 'image.path', 'outside every input root');
    await refused(convert('out-2', src, { output_path: '/root/x.qcow2' }), 'parameters.output_path', 'outside every output root');
    await refused(convert('out-3', src, { output_dir: ELSE }), 'parameters.output_dir', 'FERRY_OUTPUT_ROOTS');
    await refused(convert('out-4', path.join(IN, '..', 'elsewhere', 'secret.vmdk'), { output_dir: OUT }), 'image.path', 'outside');
  });

  it('refuses /dev/sda, a device reached through a symlink, and /proc as input', async () => {
    await refused(convert('dev-1', '/dev/sda', { output_dir: OUT }), 'image.path', 'outside');
    symlinkSync('/dev/zero', path.join(IN, 'zero.vmdk'));
    await refused(convert('dev-2', path.join(IN, 'zero.vmdk'), { output_dir: OUT }), 'image.path', 'resolves to /dev/zero');
    await refused(convert('dev-3', '/proc/self/environ', { output_dir: OUT }), 'image.path', 'outside');
    // Even under a root of "/", devices and /proc stay refused unless a root names them.
    const wide = { input: ['/'], output: ['/'] };
    expect((await refusal({ field: 'image.path', path: '/dev/null', kind: 'input' }, wide)).reason).to.include('device or system path');
    expect((await refusal({ field: 'image.path', path: '/proc/self/status', kind: 'input' }, wide)).reason).to.include('device or system path');
    expect((await refusal({ field: 'image.path', path: '/dev/null', kind: 'input' }, { input: ['/dev'], output: [] })).reason).to.equal(null);
  });

  it('refuses symlinks that escape a root, for inputs and outputs', async () => {
    symlinkSync(secret, path.join(IN, 'escape.vmdk'));
    await refused(convert('sym-1', path.join(IN, 'escape.vmdk'), { output_dir: OUT }), 'image.path', `resolves to ${secret}`);
    symlinkSync(ELSE, path.join(OUT, 'link'));
    await refused(convert('sym-2', src, { output_dir: path.join(OUT, 'link', 'deeper') }), 'parameters.output_dir', 'resolves to');
    await refused(convert('sym-3', src, { output_path: path.join(OUT, 'link', 'x.qcow2') }), 'parameters.output_path', 'outside');
  });

  it('migrate: disk paths, the output directory and the report path are checked too', async () => {
    const manifest = (o: { disk?: string; out?: string; report?: string }) => ({
      manifest_version: '1.0', disks: [{ id: 'root', source_format: 'vmdk', bytes: 8 << 20, local_path: o.disk || src }],
      output: { directory: o.out || path.join(OUT, 'm'), format: 'qcow2' }, ...(o.report ? { options: { report: { path: o.report } } } : {}),
    });
    await refused({ job_id: 'mig-1', operation: 'migrate', parameters: { manifest: manifest({ disk: secret }) } }, 'parameters.manifest.disks[0].local_path', 'outside');
    await refused({ job_id: 'mig-2', operation: 'migrate', parameters: { manifest: manifest({ out: ELSE }) } }, 'parameters.manifest.output.directory', 'outside');
    await refused({ job_id: 'mig-3', operation: 'migrate', parameters: { manifest: manifest({ report: '../../elsewhere/r.json' }) } }, 'parameters.manifest.options.report.path', 'outside');
  });

  it('the worker re-checks before opening: a source swapped for an escaping symlink fails the job, not retried', async () => {
    const swap = path.join(IN, 'swap.vmdk');
    makeImage(IN, 'swap', 'vmdk', 8);
    expect((await submit(convert('swap-1', swap, { output_dir: OUT }), false)).status).to.equal(201);
    unlinkSync(swap);
    symlinkSync(secret, swap);
    await req(gw.url, 'POST', '/jobs/swap-1/queue');
    const j = await finished('swap-1');
    expect(j.state).to.equal('FAILED');
    expect(j.attempts).to.equal(1);
    expect(j.error).to.include('image.path').and.include(secret).and.include('outside');
    expect(existsSync(path.join(OUT, 'swap-1.qcow2'))).to.equal(false);
  });

  it('never replaces an existing output without overwrite (convert), and does with overwrite: true', async () => {
    const target = path.join(OUT, 'precious.qcow2');
    writeFileSync(target, 'precious bytes');
    await submit(convert('ow-1', src, { output_path: target }));
    const j = await finished('ow-1');
    expect(j.state).to.equal('FAILED');
    expect(j.attempts).to.equal(1);
    expect(j.error).to.include('already exists').and.include('overwrite');
    expect(readFileSync(target, 'utf8')).to.equal('precious bytes');
    await submit(convert('ow-2', src, { output_path: target, overwrite: true }));
    expect((await finished('ow-2')).state).to.equal('COMPLETED');
    expect(readFileSync(target).subarray(0, 4).toString('latin1')).to.equal('QFI\xfb');
  });

  it('never replaces an existing output without overwrite (migrate)', async () => {
    const mdir = path.join(OUT, 'mig');
    mkdirSync(mdir);
    writeFileSync(path.join(mdir, 'root.qcow2'), 'precious disk');
    const manifest = { manifest_version: '1.0', disks: [{ id: 'root', source_format: 'vmdk', bytes: 8 << 20, local_path: src }], output: { directory: mdir, format: 'qcow2', filename: 'root.qcow2' } };
    await submit({ job_id: 'mig-ow', operation: 'migrate', parameters: { manifest } });
    const j = await finished('mig-ow');
    expect(j.state).to.equal('FAILED');
    expect(j.attempts).to.equal(1);
    expect(j.error).to.include('already exists');
    expect(readFileSync(path.join(mdir, 'root.qcow2'), 'utf8')).to.equal('precious disk');
  });

  it('a retry may replace only its own earlier output, recognised by its identity, never a file put there by someone else', async () => {
    const own = new Set<string>();
    const claims = { record: (st: Stats) => { own.add(outputId(st)); return Promise.resolve(); }, owns: (st: Stats) => Promise.resolve(own.has(outputId(st))) };
    const out = path.join(OUT, 'retry.qcow2');
    const tmp1 = path.join(OUT, '.retry.qcow2.partial');
    writeFileSync(tmp1, 'attempt 1');
    await placeOutput(tmp1, out, { field: 'parameters.output_path', overwrite: false, claims });
    // Attempt 2 of the same job finds its own output: allowed, and replaced.
    await checkOutputFree(out, 'parameters.output_path', false, claims);
    writeFileSync(tmp1, 'attempt 2');
    await placeOutput(tmp1, out, { field: 'parameters.output_path', overwrite: false, claims });
    expect(readFileSync(out, 'utf8')).to.equal('attempt 2');
    // Someone else's file under that name is refused, before the work and at the final move.
    unlinkSync(out);
    writeFileSync(out, 'not ours');
    let e1 = '';
    await checkOutputFree(out, 'parameters.output_path', false, claims).catch((e: Error) => (e1 = e.message));
    expect(e1).to.include('already exists');
    writeFileSync(tmp1, 'attempt 3');
    let e2 = '';
    await placeOutput(tmp1, out, { field: 'parameters.output_path', overwrite: false, claims }).catch((e: Error) => (e2 = e.message));
    expect(e2).to.include('already exists');
    expect(readFileSync(out, 'utf8')).to.equal('not ours');
  });
});
