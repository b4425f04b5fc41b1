// POST /import/kvm, POST /virt/template/export and POST /virt/volume/upload through a worker (FERRY_LIBVIRT_VIA=worker, issue 38 item 2),
// against a real daemon process whose PATH has neither virsh nor qemu-img, real worker processes and the run's
// private libvirtd. Each route runs whole as a virt_files job on a worker with libvirt_access and img_tool: the
// domain and its volume exist afterwards with the image's bytes, the export's files are the volume's bytes, an
// uploaded volume has the image's bytes, and
// the answers (data, refusals) are those of a daemon running the tools itself (direct mode, beside it on the same
// libvirtd). With no such worker: 503 naming both capabilities, nothing made, no job. A key whose role direct
// mode refuses is refused the same way (403); a path outside the daemon's roots is a 400 naming the field before
// anything is queued, and one outside the worker's own roots is refused by the worker, naming the field. The VM
// console runs on a worker too (virt_console): a real guest's boot text live, typed input answered, roles as in
// direct mode, and closing either side (the socket, or the console on the host) ends both. Its messages cross Redis
// sealed with FERRY_SECRET_KEY: a password typed into it is in no pub/sub message, key or value of Redis, nor in a
// log; a message forged (plain JSON, another key) or replayed on its channels is logged as dropped and reaches
// neither the guest nor the socket; a daemon without the key refuses the console through a worker, naming it, and a
// worker without it fails the job, not retried, naming it.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync } from 'node:fs';
import { createHash } from 'node:crypto';
import path from 'node:path';
import { req, until } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import { defineGuest, domState, GUEST_MARKER } from '../helpers/libvirt';
import { openWs } from '../helpers/ws';
import { awaitWorkers, startDaemonProc, startWorkerProc, type Proc } from '../helpers/procs';
import IORedis from 'ioredis';
import { encryptSecret } from '../../platform/secretbox';
import { startWorkerModeStack, type VirtStack } from './stack';

const K = { read: 'vfile-reader-0123456789abcdef', submit: 'vfile-submitter-0123456789a', worker: 'vfile-worker-0123456789abcde', admin: 'vfile-admin-0123456789abcdef' };
const KEYS = Object.entries(K).map(([role, key]) => `${role}-key:${role}:${key}`).join(',');
const admin = { 'X-API-Key': K.admin };
type Imported = { data: { domain: string; uuid: string; pool: string; volumes: { name: string; path: string | null; format: string | null }[] } };
type Exported = { data: { template: string; export_path: string; xml: string; disks: { target: string; file: string; bytes: number; compressed: boolean }[] } };

const sha256 = (f: string) => createHash('sha256').update(readFileSync(f)).digest('hex');
const SECRET_KEY = 'vfile-secret-key-0123456789abcdef';

/** Every key of the Redis on `port` (`redis-cli --scan`) with its value read by type: DUMP's serialization
 *  compresses long strings, which could hide a password from a text search. */
async function redisText(port: number, rc: IORedis): Promise<string> {
  const keys = execFileSync('redis-cli', ['-p', String(port), '--scan'], { encoding: 'utf8', timeout: 10_000 }).split('\n').filter(Boolean);
  const out: string[] = [];
  for (const k of keys) {
    const t = await rc.type(k);
    const v = t === 'string' ? await rc.get(k) : t === 'hash' ? await rc.hgetall(k) : t === 'list' ? await rc.lrange(k, 0, -1)
      : t === 'set' ? await rc.smembers(k) : t === 'zset' ? await rc.zrange(k, 0, -1) : t === 'stream' ? await rc.xrange(k, '-', '+') : `(${t})`;
    out.push(k, JSON.stringify(v));
  }
  return out.join('\n');
}

describe('import, template export, volume upload and the console through a worker (FERRY_LIBVIRT_VIA=worker) @vm', function () {
  this.timeout(600_000);
  let B: string;
  let ws: Awaited<ReturnType<typeof startWorkerModeStack>>;
  let s: VirtStack; // ws.s
  let worker: Proc | undefined;
  let inDir: string;
  let outDir: string;
  let image: string;
  /** The worker-mode daemon's jobs of `op` (internal ones listed for an admin). */
  const jobsOf = async (op: string) => ((await req<{ jobs: { id: string; status: string; definition: { operation: string } }[] }>(B, 'GET', '/jobs?limit=1000&internal=true', undefined, admin)).body.jobs || []).filter((j) => j.definition.operation === op);
  const fileJobs = () => jobsOf('virt_files');
  const poolFiles = () => (existsSync(s.env.FERRY_LIBVIRT_POOL_DIR) ? readdirSync(s.env.FERRY_LIBVIRT_POOL_DIR) : []);

  before(async function () {
    this.timeout(300_000);
    ws = await startWorkerModeStack({ FERRY_API_KEYS: KEYS, FERRY_API_KEYS_FILE: '', FERRY_REFUSAL_LIMIT: '0', FERRY_SECRET_KEY: SECRET_KEY }, 'vfile-direct', ['qemu-img', 'qemu-io']);
    B = ws.daemon.url;
    s = ws.s;
    // The worker's roots are narrower than the daemons' (/tmp): in/ to read, out/ to write.
    inDir = path.join(s.dir, 'in');
    outDir = path.join(s.dir, 'out');
    mkdirSync(inDir);
    mkdirSync(outDir);
    image = path.join(inDir, 'vf-src.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', image, '16M']);
    execFileSync('qemu-io', ['-f', 'qcow2', '-c', 'write -P 0xa5 0 1M', '-c', 'write -P 0x3c 8M 512k', image]);
  });
  after(async () => {
    await worker?.kill();
    await ws?.stop();
  });

  it('no worker with libvirt_access and img_tool: 503 naming both, nothing made, no job', async () => {
    const imp = await req<DaemonError>(B, 'POST', '/import/kvm', { image_path: image, vm_name: 'vf-none', memory: 64 }, admin);
    expect(imp.status, imp.text).to.equal(503);
    expect(imp.body.error).to.include('img_tool').and.include('libvirt_access').and.include('FERRY_LIBVIRT_VIA=worker');
    const exp = await req<DaemonError>(B, 'POST', '/virt/template/export', { template: 'vf-none', export_path: outDir }, admin);
    expect(exp.status, exp.text).to.equal(503);
    expect(exp.body.error).to.include('img_tool').and.include('libvirt_access');
    expect(await domState(s.lv, 'vf-none')).to.equal('absent');
    expect(poolFiles().filter((f) => f.includes('vf-none'))).to.deep.equal([]);
    expect(readdirSync(outDir)).to.deep.equal([]);
    expect(await fileJobs()).to.deep.equal([]);
  });

  it('a key of a role direct mode refuses is refused the same way (403), nothing queued', async () => {
    const calls: [string, unknown][] = [['/import/kvm', { image_path: image, vm_name: 'vf-role', memory: 64 }], ['/virt/template/export', { template: 'vf-role', export_path: outDir }], ['/virt/volume/upload', { pool: s.lv.pool, volume: 'vf-role.qcow2', source_path: image }]];
    for (const [role, key] of Object.entries(K)) {
      if (role === 'admin') continue;
      for (const [p, body] of calls) {
        const viaWorker = await req<DaemonError>(B, 'POST', p, body, { 'X-API-Key': key });
        const viaVirsh = await req<DaemonError>(ws.direct.url, 'POST', p, body, { 'X-API-Key': key });
        expect(viaVirsh.status, `direct ${role} ${p}: ${viaVirsh.text}`).to.equal(403);
        expect(viaWorker.status, `${role} ${p}: ${viaWorker.text}`).to.equal(403);
        expect(viaWorker.body.error).to.equal(viaVirsh.body.error);
      }
    }
    expect(await domState(s.lv, 'vf-role')).to.equal('absent');
    expect(await fileJobs()).to.deep.equal([]);
  });

  it('a path outside the daemon\'s roots: 400 naming the field, as direct mode, before anything is queued', async () => {
    const calls: [string, unknown, string][] = [['/import/kvm', { image_path: '/etc/hostname', vm_name: 'vf-etc', memory: 64 }, 'image_path'], ['/virt/template/export', { template: 'vf-etc', export_path: '/etc' }, 'export_path']];
    for (const [p, body, field] of calls) {
      const viaWorker = await req<DaemonError & { fields?: { field: string }[] }>(B, 'POST', p, body, admin);
      const viaVirsh = await req<DaemonError>(ws.direct.url, 'POST', p, body, admin);
      expect(viaWorker.status, viaWorker.text).to.equal(400);
      expect(viaWorker.body.error).to.equal(viaVirsh.body.error).and.include(field);
      expect(viaWorker.body.fields?.map((f) => f.field)).to.deep.equal([field]);
    }
    expect(await domState(s.lv, 'vf-etc')).to.equal('absent');
    expect(await fileJobs()).to.deep.equal([]);
  });

  it('imports on a worker: the domain and its volume exist with the image\'s bytes; the answer is direct mode\'s', async () => {
    worker = await startWorkerProc({ ...s.env, FERRY_INPUT_ROOTS: inDir, FERRY_OUTPUT_ROOTS: outDir }, 'vf-worker', ['libvirt_access', 'img_tool']);
    await awaitWorkers(B, [worker], admin);
    const r = await req<Imported>(B, 'POST', '/import/kvm', { image_path: image, vm_name: 'vf-imp', memory: 64 }, admin);
    expect(r.status, r.text).to.equal(201);
    expect(r.body.data.domain).to.equal('vf-imp');
    expect(await domState(s.lv, 'vf-imp')).to.equal('shut off');
    expect((await s.lv.virsh(['domuuid', 'vf-imp'])).trim()).to.equal(r.body.data.uuid);
    const vol = r.body.data.volumes[0].path!;
    expect((await s.lv.virsh(['domblklist', 'vf-imp'])).split('\n').some((l) => l.includes(vol))).to.equal(true);
    execFileSync('qemu-img', ['compare', '-q', '-f', 'qcow2', '-F', 'qcow2', image, vol]); // throws when the contents differ
    const [job] = (await fileJobs()).filter((j) => j.status === 'completed');
    expect(await ws.rc.hmget(`ferry:job:${job.id}`, 'queue', 'worker_id')).to.deep.equal(['jobs.img_tool+libvirt_access', 'vf-worker']);
    // The same route on a daemon running the tools itself answers the same shape.
    const d = await req<Imported>(ws.direct.url, 'POST', '/import/kvm', { image_path: image, vm_name: 'vf-imp-d', memory: 64 }, admin);
    expect(d.status, d.text).to.equal(201);
    expect(Object.keys(r.body.data).sort()).to.deep.equal(Object.keys(d.body.data).sort());
    expect(Object.keys(r.body).sort()).to.deep.equal(Object.keys(d.body).sort());
  });

  it('import refusals are direct mode\'s (409 a taken name, 400 a missing image); the worker confines to its own roots', async () => {
    const cases: [unknown, number][] = [[{ image_path: image, vm_name: 'vf-imp', memory: 64 }, 409], [{ image_path: path.join(inDir, 'absent.qcow2'), vm_name: 'vf-abs', memory: 64 }, 400]];
    for (const [body, status] of cases) {
      const viaWorker = await req<DaemonError>(B, 'POST', '/import/kvm', body, admin);
      const viaVirsh = await req<DaemonError>(ws.direct.url, 'POST', '/import/kvm', body, admin);
      expect(viaWorker.status, viaWorker.text).to.equal(status);
      expect(viaVirsh.status, viaVirsh.text).to.equal(status);
      expect(viaWorker.body.error).to.equal(viaVirsh.body.error);
    }
    // Inside the daemon's roots (/tmp), outside the worker's (in/): the worker refuses it, naming the field.
    const elsewhere = path.join(s.dir, 'vf-elsewhere.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', elsewhere, '1M']);
    const r = await req<DaemonError & { fields?: { field: string }[] }>(B, 'POST', '/import/kvm', { image_path: elsewhere, vm_name: 'vf-out', memory: 64 }, admin);
    expect(r.status, r.text).to.equal(400);
    expect(r.body.error).to.include('image_path').and.include('outside every input root').and.include(inDir);
    expect(r.body.fields?.map((f) => f.field)).to.deep.equal(['image_path']);
    expect(await domState(s.lv, 'vf-out')).to.equal('absent');
    expect(poolFiles().filter((f) => f.includes('vf-out'))).to.deep.equal([]);
  });

  it('exports a template on a worker: domain.xml and the volume\'s bytes in export_path; refusals as direct mode', async () => {
    const dest = path.join(outDir, 'w');
    mkdirSync(dest);
    const r = await req<Exported>(B, 'POST', '/virt/template/export', { template: 'vf-imp', export_path: dest }, admin);
    expect(r.status, r.text).to.equal(201);
    expect(r.body.data.export_path).to.equal(path.join(dest, 'vf-imp'));
    expect(readFileSync(path.join(dest, 'vf-imp', 'domain.xml'), 'utf8')).to.include('<name>vf-imp</name>');
    const vol = (await s.lv.virsh(['domblklist', 'vf-imp', '--details'])).split('\n').find((l) => /\sdisk\s/.test(l))!.trim().split(/\s+/).pop()!;
    expect(r.body.data.disks.map((x) => x.file)).to.have.length(1);
    expect(sha256(r.body.data.disks[0].file)).to.equal(sha256(vol));
    // A daemon exporting it itself answers the same shape, and both refuse an existing folder the same way (409).
    const d = await req<Exported>(ws.direct.url, 'POST', '/virt/template/export', { template: 'vf-imp', export_path: path.join(s.dir, 'd') }, admin);
    expect(d.status, d.text).to.equal(201);
    expect(Object.keys(r.body.data).sort()).to.deep.equal(Object.keys(d.body.data).sort());
    const again = await req<DaemonError>(B, 'POST', '/virt/template/export', { template: 'vf-imp', export_path: dest }, admin);
    const againD = await req<DaemonError>(ws.direct.url, 'POST', '/virt/template/export', { template: 'vf-imp', export_path: dest }, admin);
    expect(again.status, again.text).to.equal(409);
    expect(again.body.error).to.equal(againD.body.error);
    // Inside the daemon's roots, outside the worker's output roots: refused by the worker, no folder made.
    const elsewhere = path.join(s.dir, 'vf-exp-elsewhere');
    const out = await req<DaemonError & { fields?: { field: string }[] }>(B, 'POST', '/virt/template/export', { template: 'vf-imp', export_path: elsewhere }, admin);
    expect(out.status, out.text).to.equal(400);
    expect(out.body.error).to.include('export_path').and.include('outside every output root');
    expect(out.body.fields?.map((f) => f.field)).to.deep.equal(['export_path']);
    expect(existsSync(elsewhere)).to.equal(false);
  });

  it('uploads a volume on a worker: the volume has the image\'s bytes; the answer and refusals are direct mode\'s', async () => {
    const r = await req<{ data: { path: string; converted: boolean } }>(B, 'POST', '/virt/volume/upload', { pool: s.lv.pool, volume: 'vf-up.qcow2', source_path: image }, admin);
    expect(r.status, r.text).to.equal(200);
    const vol = (await s.lv.virsh(['vol-path', '--pool', s.lv.pool, 'vf-up.qcow2'])).trim();
    expect(r.body.data.path).to.equal(vol);
    execFileSync('qemu-img', ['compare', '-q', '-f', 'qcow2', '-F', 'qcow2', image, vol]); // throws when the contents differ
    const d = await req<{ data: Record<string, unknown> }>(ws.direct.url, 'POST', '/virt/volume/upload', { pool: s.lv.pool, volume: 'vf-up-d.qcow2', source_path: image }, admin);
    expect(d.status, d.text).to.equal(200);
    expect(Object.keys(r.body.data).sort()).to.deep.equal(Object.keys(d.body.data).sort());
    const bodies = [{ pool: s.lv.pool, volume: 'vf-up2.qcow2', source_path: path.join(inDir, 'absent.qcow2') }, { pool: s.lv.pool, volume: 'vf-up2.qcow2', source_path: '/etc/hostname' }];
    for (const body of bodies) {
      const viaWorker = await req<DaemonError>(B, 'POST', '/virt/volume/upload', body, admin);
      const viaVirsh = await req<DaemonError>(ws.direct.url, 'POST', '/virt/volume/upload', body, admin);
      expect(viaWorker.status, viaWorker.text).to.equal(400);
      expect(viaWorker.body.error).to.equal(viaVirsh.body.error).and.include('source_path');
    }
    // Inside the daemon's roots, outside the worker's: the worker refuses it, naming the field.
    const out = await req<DaemonError>(B, 'POST', '/virt/volume/upload', { pool: s.lv.pool, volume: 'vf-up2.qcow2', source_path: path.join(s.dir, 'vf-elsewhere.qcow2') }, admin);
    expect(out.status, out.text).to.equal(400);
    expect(out.body.error).to.include('source_path').and.include('outside every input root');
    expect(await s.lv.virsh(['vol-list', s.lv.pool])).to.not.include('vf-up2.qcow2');
    expect(existsSync(path.join(s.lv.poolDir, 'vf-up2.qcow2'))).to.equal(false);
  });

  it('the console runs on a worker (virt_console): boot text live, input answered, roles as direct mode, sealed in Redis, forgeries dropped; either side closing ends both', async () => {
    type Msg = { type: string; data?: string; error?: string; mode?: string };
    const open = (base: string, q: string, key = K.admin) => openWs<Msg>(`${base.replace('http', 'ws')}/virt/console?name=vf-con${q}`, { 'X-API-Key': key });
    await defineGuest(s.lv, 'vf-con');
    await s.lv.virsh(['start', 'vf-con', '--paused']);
    // A read key asking to type is refused as a daemon running virsh refuses it, before any job.
    for (const base of [B, ws.direct.url]) {
      const r = open(base, '&mode=write', K.read);
      await r.opened;
      await until(() => r.msgs.some((m) => m.type === 'error'), 30_000, 'the refusal');
      expect(r.msgs.find((m) => m.type === 'error')?.error).to.include('mode').and.include('admin');
    }
    // A daemon without FERRY_SECRET_KEY refuses the console through a worker, naming the key, and queues nothing.
    const keyless = await startDaemonProc({ ...s.env, FERRY_SECRET_KEY: '' }, s.config);
    try {
      const k = open(keyless.url, '');
      await k.opened;
      await until(() => k.msgs.some((m) => m.type === 'closed' || m.type === 'error'), 60_000, 'the keyless daemon\'s refusal');
      expect(k.msgs.map((m) => m.error).join(' ')).to.include('FERRY_SECRET_KEY');
    } finally { await keyless.stop(); }
    expect(await jobsOf('virt_console')).to.deep.equal([]);
    // Everything published on the console channels, as anyone reaching Redis sees it.
    const sniff = new IORedis(s.redis.url);
    const heard: { channel: string; message: string }[] = [];
    sniff.on('pmessage', (_p: string, channel: string, message: string) => heard.push({ channel, message }));
    await sniff.psubscribe('ferry:job:*:console-*');
    const c = open(B, '');
    const closed = new Promise<number>((resolve) => c.ws.once('close', (code) => resolve(code)));
    await c.opened;
    await until(() => c.msgs.some((m) => m.type === 'status'), 60_000, 'the console attached on the worker');
    expect(c.msgs.find((m) => m.type === 'status')?.mode).to.equal('write');
    const [job] = await jobsOf('virt_console');
    expect(job.status).to.equal('running');
    expect(await ws.rc.hget(`ferry:job:${job.id}`, 'worker_id')).to.equal('vf-worker');
    await s.lv.virsh(['resume', 'vf-con']);
    const text = () => c.msgs.filter((m) => m.type === 'data').map((m) => m.data).join('');
    await until(() => text().includes(GUEST_MARKER), 150_000, 'the boot marker through the worker');
    await until(() => text().split(GUEST_MARKER)[1]?.includes('/ # '), 30_000, 'the shell prompt');
    c.ws.send(JSON.stringify({ type: 'input', data: 'echo hi-$((6*7))\r' }));
    await until(() => text().includes('hi-42'), 30_000, 'the guest\'s answer to what was typed');
    // A password typed into the console (a no-op command here, so the guest echoes it back) crosses Redis sealed.
    const MARKER = 'Pw-marker-7Zq3x9KvT';
    c.ws.send(JSON.stringify({ type: 'input', data: `: ${MARKER}\r` }));
    await until(() => text().includes(MARKER), 30_000, 'the marker echoed by the guest');
    const inCh = `ferry:job:${job.id}:console-in`;
    const outCh = `ferry:job:${job.id}:console-out`;
    await until(() => heard.filter((h) => h.channel === inCh).length >= 2 && heard.some((h) => h.channel === outCh), 10_000, 'both keystrokes and output heard');
    expect(heard.filter((h) => h.message.includes(MARKER)).map((h) => h.channel), 'channels carrying the typed password in clear').to.deep.equal([]);
    for (const h of heard) expect(h.message, h.channel).to.match(/^v1:[^:]+:[^:]+:[^:]+$/); // platform/secretbox.ts's box, nothing in clear beside it
    // Forged and replayed messages: each logged as dropped by the side that reads the channel, none acted on.
    const dropped = (p: Proc, channel: string, why: string) => p.logs.join('').split('\n').filter((l) => l.includes('did not open') && l.includes(why) && l.includes(channel)).length;
    const forge = async (p: Proc, channel: string, message: string, why: string) => {
      const before = dropped(p, channel, why);
      await ws.rc.publish(channel, message);
      await until(() => dropped(p, channel, why) > before, 30_000, `"${why}" logged for a forged message on ${channel}`);
    };
    const hi = () => text().split('hi-42').length - 1;
    const hiBefore = hi();
    const typed = heard.filter((h) => h.channel === inCh).map((h) => h.message);
    await forge(worker!, inCh, JSON.stringify({ type: 'input', data: 'echo forged-$((6*9))\r' }), 'it is not sealed');
    await forge(worker!, inCh, encryptSecret(JSON.stringify({ ch: inCh, n: 1e9, m: { type: 'input', data: 'echo forged-$((6*9))\r' } }),
      { FERRY_SECRET_KEY: 'another-key' }), 'does not open with this FERRY_SECRET_KEY');
    await forge(worker!, inCh, typed[0], 'out of sequence'); // the `echo hi` keystrokes again, as captured
    await forge(ws.daemon, outCh, JSON.stringify({ type: 'data', data: 'FORGED-OUTPUT' }), 'it is not sealed');
    await forge(ws.daemon, outCh, JSON.stringify({ type: 'closed', error: 'forged' }), 'it is not sealed');
    await forge(ws.daemon, outCh, typed[typed.length - 1], 'another channel'); // the marker's keystrokes, sealed for the worker
    // A real keystroke after them is answered: the forged ones before it reached nothing.
    c.ws.send(JSON.stringify({ type: 'input', data: 'echo after-$((7*7))\r' }));
    await until(() => text().includes('after-49'), 30_000, 'the answer to the keystroke after the forged ones');
    expect(text()).to.not.include('forged-').and.not.include('FORGED-OUTPUT');
    expect(hi(), 'the replayed `echo hi` did not run again').to.equal(hiBefore);
    expect(c.msgs.some((m) => m.type === 'closed'), 'a forged `closed` ended nothing').to.equal(false);
    for (const p of [ws.daemon, worker!]) expect(p.logs.join('')).to.not.include(MARKER).and.not.include('forged-').and.not.include('FORGED');
    // The socket closing ends the worker's console and its job.
    c.ws.close();
    await closed;
    await until(async () => (await jobsOf('virt_console')).find((j) => j.id === job.id)?.status === 'completed', 30_000, 'the console job ended');
    await sniff.quit();
    expect(heard.filter((h) => h.message.includes(MARKER)), 'the marker in a pub/sub message').to.deep.equal([]);
    expect(await redisText(s.redis.port, ws.rc), 'the marker in a key or value of Redis').to.not.include(MARKER);
    // The console ending on the host (the domain stopped) ends the socket.
    const c2 = open(B, '');
    const closed2 = new Promise<number>((resolve) => c2.ws.once('close', (code) => resolve(code)));
    await c2.opened;
    await until(() => c2.msgs.some((m) => m.type === 'status'), 60_000, 'the second session attached');
    await s.lv.virsh(['destroy', 'vf-con']);
    expect(await closed2).to.equal(1000);
    expect(c2.msgs.some((m) => m.type === 'closed')).to.equal(true);
    await until(async () => (await jobsOf('virt_console')).filter((j) => j.status === 'completed').length === 2, 30_000, 'the second console job ended');
  });

  it('a worker without FERRY_SECRET_KEY fails the console job, not retried, naming the key; the socket is told', async () => {
    await worker?.kill();
    worker = await startWorkerProc({ ...s.env, FERRY_SECRET_KEY: '' }, 'vf-keyless', ['libvirt_access']);
    await awaitWorkers(B, [worker], admin);
    await s.lv.virsh(['start', 'vf-con', '--paused']);
    const c = openWs<{ type: string; error?: string }>(`${B.replace('http', 'ws')}/virt/console?name=vf-con`, admin);
    await c.opened;
    await until(() => c.msgs.some((m) => m.type === 'closed'), 60_000, 'the session ended by the keyless worker');
    expect(c.msgs.find((m) => m.type === 'closed')?.error).to.include('FERRY_SECRET_KEY');
    const failed = (await jobsOf('virt_console')).filter((j) => j.status === 'failed');
    expect(failed).to.have.length(1);
    expect(await ws.rc.hmget(`ferry:job:${failed[0].id}`, 'worker_id', 'attempts')).to.deep.equal(['vf-keyless', '1']);
    await s.lv.virsh(['destroy', 'vf-con']);
  });
});
