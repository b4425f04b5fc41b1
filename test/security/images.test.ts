// The image rule (docs/security.md) tried as an attacker with a `submit` key would, against a real gateway, daemon
// and worker with qemu-img: images inside an input root that reference a root-only file outside every root (a
// qcow2 backing file, a data-file, a VMDK extent or parent, a VHD parent), json: and nbd: backing names, and a
// qcow2 named as raw, are refused at submission (400 naming the field, no job recorded) and by the worker right
// before it opens one that turned bad after submission (FAILED, not retried, naming the file); no output ever
// holds the secret's bytes. A legitimate qcow2 chain and a VMDK descriptor with its extent inside the root convert,
// byte for byte.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis } from '../helpers/redis';
import { awaitWorkers, Proc, startDaemonProc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until, type DaemonError, type JobApiError } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';
import { makeImage } from '../helpers/images';
import { differencingVhd, differencingVhdx, qcow2Backed, qcow2WithDataFile, vmdkDescriptor } from '../helpers/hostile-images';

const SUBMIT = 'images-submit-key-0123456789abcdef';
const ADMIN = 'images-admin-key-0123456789abcdef';
const MARK = 'FERRY-ROOT-ONLY-SECRET-';

describe('security: image files confined with everything they reference', function () {
  this.timeout(180_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-sec-images-'));
  const IN = path.join(dir, 'in');
  const OUT = path.join(dir, 'out');
  const ELSE = path.join(dir, 'elsewhere');
  const secret = path.join(ELSE, 'secret.raw');
  const procs: Proc[] = [];
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let dm: Awaited<ReturnType<typeof startDaemonProc>>;

  const as = (k: string) => ({ 'X-API-Key': k });
  const submit = <T = unknown>(body: object, q = true) => req<T>(gw.url, 'POST', `/jobs${q ? '?queue=true' : ''}`, body, as(SUBMIT));
  const convert = (id: string, image: string, format = 'qcow2', out = 'raw') => ({ job_id: id, operation: 'convert', image: { path: image, format }, parameters: { output_format: out, output_dir: OUT } });
  const finished = (id: string) => until(async () => { const j = (await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`, undefined, as(SUBMIT))).body; return j?.is_terminal && j; }, 90000, `job ${id}`);
  async function refused(body: { job_id: string } & Record<string, unknown>, field: string, ...words: string[]) {
    const r = await submit<JobApiError>(body);
    expect(r.status, JSON.stringify(r.body)).to.equal(400);
    expect(r.body.error.fields!.map((f) => f.field)).to.include(field);
    for (const w of [field, ...words]) expect(r.body.error.message).to.include(w);
    expect((await req(gw.url, 'GET', `/jobs/${body.job_id}`, undefined, as(SUBMIT))).status).to.equal(404);
    expect(readdirSync(OUT).filter((f) => f.includes(body.job_id))).to.deep.equal([]);
  }
  async function daemonRefused(p: string, body: object, key: string, field: string, ...words: string[]) {
    const r = await req<DaemonError>(dm.url, 'POST', p, body, as(key));
    expect(r.status, `${p} ${r.text}`).to.equal(400);
    expect(r.body.fields!.map((f) => f.field)).to.include(field);
    for (const w of [field, ...words]) expect(r.body.error).to.include(w);
  }

  before(async () => {
    for (const d of [IN, OUT, ELSE]) mkdirSync(d);
    writeFileSync(secret, Buffer.alloc(1 << 20, MARK));
    chmodSync(secret, 0o600);
    execFileSync('qemu-img', ['convert', '-q', '-f', 'raw', '-O', 'vmdk', secret, path.join(ELSE, 'secret.vmdk')]);
    await redis.start();
    const env = { ...testEnv(redis.url, 'img'), FERRY_INPUT_ROOTS: IN, FERRY_OUTPUT_ROOTS: OUT, FERRY_API_KEYS: `ci:submit:${SUBMIT},ops:admin:${ADMIN}` };
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 2h\n');
    [gw, dm] = await Promise.all([startGatewayProc(env), startDaemonProc(env, cfg)]);
    const worker = await startWorkerProc(env, 'img-w', ['img_tool']);
    procs.push(gw, dm, worker);
    await awaitWorkers(gw.url, [worker], as(SUBMIT));
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    await redis.stop();
    // No file Ferry wrote holds a byte of the secret.
    for (const f of readdirSync(OUT)) expect(readFileSync(path.join(OUT, f)).includes(MARK), f).to.equal(false);
    rmSync(dir, { recursive: true, force: true });
  });

  it('a qcow2 whose backing file is a root-only file outside every root (absolute, relative, via a symlink): 400 image.path', async () => {
    await refused(convert('bk-abs', qcow2Backed(path.join(IN, 'abs.qcow2'), secret)), 'image.path', 'backing file', secret, 'outside every input root');
    await refused(convert('bk-rel', qcow2Backed(path.join(IN, 'rel.qcow2'), '../elsewhere/secret.raw')), 'image.path', 'outside every input root');
    symlinkSync(secret, path.join(IN, 'innocent.raw'));
    await refused(convert('bk-sym', qcow2Backed(path.join(IN, 'sym.qcow2'), 'innocent.raw')), 'image.path', `resolves to ${secret}`);
    // A backing file inside the root that itself points out: the chain is followed.
    qcow2Backed(path.join(IN, 'mid.qcow2'), secret);
    await refused(convert('bk-deep', qcow2Backed(path.join(IN, 'deep.qcow2'), 'mid.qcow2', 'qcow2')), 'image.path', 'mid.qcow2', 'outside');
    // A missing backing file, and a chain that loops.
    await refused(convert('bk-miss', qcow2Backed(path.join(IN, 'miss.qcow2'), 'nothing-here.raw')), 'image.path', 'does not exist');
    qcow2Backed(path.join(IN, 'loop-a.qcow2'), 'loop-b.qcow2', 'qcow2');
    await refused(convert('bk-loop', qcow2Backed(path.join(IN, 'loop-b.qcow2'), 'loop-a.qcow2', 'qcow2')), 'image.path', 'loops');
  });

  it('json: and nbd: backing names, and a data-file outside the roots: 400', async () => {
    const json = `json:{"driver":"raw","file":{"driver":"file","filename":"${secret}"}}`;
    await refused(convert('bk-json', qcow2Backed(path.join(IN, 'json.qcow2'), json)), 'image.path', 'protocol or json: name');
    await refused(convert('bk-nbd', qcow2Backed(path.join(IN, 'nbd.qcow2'), 'nbd://127.0.0.1:10809/secret')), 'image.path', 'protocol or json: name');
    await refused(convert('bk-http', qcow2Backed(path.join(IN, 'http.qcow2'), 'http://169.254.169.254/latest/meta-data')), 'image.path', 'protocol');
    await refused(convert('df-out', qcow2WithDataFile(path.join(IN, 'df.qcow2'), path.join(ELSE, 'data.raw'))), 'image.path', 'data-file', 'outside');
  });

  it('a VMDK descriptor whose extent names the secret, and a sparse VMDK whose parent is outside: 400', async () => {
    await refused(convert('vmdk-ext', vmdkDescriptor(path.join(IN, 'ext.vmdk'), secret), 'vmdk'), 'image.path', 'extent', 'outside');
    await refused(convert('vmdk-rel', vmdkDescriptor(path.join(IN, 'rel.vmdk'), '../elsewhere/secret.raw'), 'vmdk'), 'image.path', 'extent', 'outside');
    const delta = path.join(IN, 'delta.vmdk');
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', '-o', 'subformat=monolithicSparse', '-u', '-b', '../elsewhere/secret.vmdk', '-F', 'vmdk', delta, '1M'], { cwd: IN });
    await refused(convert('vmdk-parent', delta, 'vmdk'), 'image.path', 'parent', 'outside');
  });

  it('a differencing VHD or VHDX whose parent locator names the secret: 400', async () => {
    await refused(convert('vhd-parent', differencingVhd(path.join(IN, 'diff.vhd'), '../elsewhere/secret.raw'), 'vhd'), 'image.path', 'parent', 'outside');
    await refused(convert('vhdx-parent', differencingVhdx(path.join(IN, 'diff.vhdx'), '../elsewhere/secret.raw'), 'vhdx'), 'image.path', 'parent', 'outside');
    // A parent inside the root: still refused (qemu-img cannot open differencing VHD/VHDX), saying so.
    await refused(convert('vhdx-in', differencingVhdx(path.join(IN, 'diff-in.vhdx'), path.basename(makeImage(IN, 'vparent', 'vhdx', 1))), 'vhdx'), 'image.path', 'differencing VHDX');
  });

  it('a format mismatch (a qcow2 named raw, the classic attack; a VMDK named qcow2): 400 naming the field', async () => {
    await refused(convert('fmt-raw', qcow2Backed(path.join(IN, 'as-raw.qcow2'), secret), 'raw'), 'image.path', 'is qcow2, not raw');
    await refused(convert('fmt-vmdk', makeImage(IN, 'plain', 'vmdk', 1), 'qcow2'), 'image.path', 'is vmdk, not qcow2');
    const manifest = { manifest_version: '1.0', disks: [{ id: 'root', source_format: 'raw', bytes: 1 << 20, local_path: path.join(IN, 'abs.qcow2') }], output: { directory: path.join(OUT, 'm'), format: 'qcow2' } };
    await refused({ job_id: 'mig-img', operation: 'migrate', parameters: { manifest } }, 'parameters.manifest.disks[0].local_path', 'is qcow2, not raw');
  });

  it('the worker checks again before opening: an image swapped after submission fails unretried, naming the file', async () => {
    const img = makeImage(IN, 'swap', 'qcow2', 1);
    expect((await submit(convert('swap-img', img), false)).status).to.equal(201);
    renameSync(qcow2Backed(path.join(IN, 'evil-swap.qcow2'), secret), img);
    expect((await req(gw.url, 'POST', '/jobs/swap-img/queue', undefined, as(SUBMIT))).status).to.be.below(300);
    const j = await finished('swap-img');
    expect(j.state).to.equal('FAILED');
    expect(j.attempts).to.equal(1);
    expect(j.error).to.include('image.path').and.include(img).and.include(secret).and.include('outside');
    expect(readdirSync(OUT).filter((f) => f.includes('swap-img'))).to.deep.equal([]);
  });

  it('the daemon: /convert/vm, /import/kvm and /virt/volume/upload refuse the same images, naming their field', async () => {
    const evil = path.join(IN, 'abs.qcow2');
    await daemonRefused('/convert/vm', { source_path: evil, dest_path: path.join(OUT, 'd1.raw'), format: 'raw' }, SUBMIT, 'source_path', 'outside');
    await daemonRefused('/api/v1/convert/vm', { source_path: evil, source_format: 'raw', dest_path: path.join(OUT, 'd2.raw'), format: 'raw' }, SUBMIT, 'source_path', 'is qcow2, not raw');
    await daemonRefused('/import/kvm', { image_path: evil, vm_name: 'evil' }, ADMIN, 'image_path', 'outside');
    await daemonRefused('/import/kvm', { image_path: path.join(IN, 'ext.vmdk'), vm_name: 'evil2' }, ADMIN, 'image_path', 'extent');
    await daemonRefused('/virt/volume/upload', { pool: 'ferry', volume: 'evil.qcow2', source_path: evil }, ADMIN, 'source_path', 'outside');
    // Inside the root but referencing another file: an import would copy it where the reference means another file.
    const base = makeImage(IN, 'ibase', 'qcow2', 1);
    const top = qcow2Backed(path.join(IN, 'itop.qcow2'), path.basename(base), 'qcow2');
    await daemonRefused('/import/kvm', { image_path: top, vm_name: 'chained' }, ADMIN, 'image_path', 'self-contained');
    await daemonRefused('/virt/volume/upload', { pool: 'ferry', volume: 'chained.qcow2', source_path: top, format: 'qcow2' }, ADMIN, 'source_path', 'references');
    expect(readdirSync(OUT).filter((f) => /^d\d/.test(f))).to.deep.equal([]);
  });

  it('a legitimate qcow2 chain and a VMDK descriptor with its extent inside the root convert, byte for byte', async () => {
    const base = makeImage(IN, 'cbase', 'qcow2', 4);
    const top = qcow2Backed(path.join(IN, 'ctop.qcow2'), 'cbase.qcow2', 'qcow2', 4);
    execFileSync('qemu-io', ['-f', 'qcow2', '-c', 'write -P 0x5a 1M 64k', top]);
    expect((await submit(convert('chain-ok', top))).status).to.equal(201);
    const j = await finished('chain-ok');
    expect(j.state, j.error!).to.equal('COMPLETED');
    const out = path.join(OUT, 'chain-ok.raw');
    execFileSync('qemu-img', ['compare', '-q', '-f', 'raw', '-F', 'qcow2', out, top]);
    const bytes = readFileSync(out);
    expect(bytes.subarray(1 << 20, (1 << 20) + 65536).every((b) => b === 0x5a)).to.equal(true); // the top layer
    expect(bytes.includes('cbase-0-ferry-')).to.equal(true); // the base below it
    expect(existsSync(base)).to.equal(true);
    const flat = makeImage(IN, 'flat', 'raw', 1);
    const desc = vmdkDescriptor(path.join(IN, 'flat.vmdk'), path.basename(flat));
    expect((await submit(convert('vmdk-ok', desc, 'vmdk'))).status).to.equal(201);
    expect((await finished('vmdk-ok')).state).to.equal('COMPLETED');
    expect(readFileSync(path.join(OUT, 'vmdk-ok.raw')).equals(readFileSync(flat))).to.equal(true);
  });
});
