// Issue 33, item 1, end to end on a real gateway, workers and the tests' libvirtd: an import_kvm job whose first
// attempt dies (its worker SIGKILLed) after it made a volume and started a partial copy, both in its ledger, is
// taken by another worker, whose attempt removes exactly those (found by key) before it makes anything, then
// imports under the same names (which would otherwise be a 409 that fails the job). Checked with the ledger in
// Redis, the job's events, the pool folder, vol-key and dominfo by UUID. And a cancelled import_kvm job: the
// worker removes what its ledger lists, and look-alikes of it (a partial copy by Ferry's naming, a volume the old
// leftover pattern matched, a domain named after the job's) stay.
import { expect } from 'chai';
import { closeSync, mkdirSync, openSync, readdirSync, writeFileSync, writeSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { awaitWorkers, Proc, startWorkerProc } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';
import { releaseLibvirt, TestLibvirt, useLibvirt } from '../helpers/libvirt';
import { useStack } from '../helpers/stack';
import { tolerate } from '../helpers/teardown';
import type { MadeEntry } from '../../domain/libvirt/ledger';

const P = 'lret';
const NAME = 'lret-vm';

describe('security: a retried import removes what its first attempt recorded, and only that, before it makes anything', function () {
  this.timeout(600_000);
  let lv: TestLibvirt;
  let root: string;
  const s = useStack({
    name: 'sec-ledger-retry', prefix: P, daemon: false,
    prepare: async (st) => {
      lv = await useLibvirt();
      root = path.join(st.dir, 'root');
      mkdirSync(root);
      execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', path.join(root, 'small.qcow2'), '1M']);
      // Written, not sparse, so that its copy into the pool takes a while: the first attempt dies during it.
      const fd = openSync(path.join(root, 'big.raw'), 'w');
      const chunk = Buffer.alloc(1 << 20, 0x5a);
      for (let i = 0; i < 384; i++) writeSync(fd, chunk);
      closeSync(fd);
    },
    env: () => ({ FERRY_INPUT_ROOTS: root, FERRY_OUTPUT_ROOTS: root, FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_POOL: lv.pool, FERRY_LIBVIRT_POOL_DIR: lv.poolDir }),
  });
  const ledger = async (id: string) => JSON.parse((await s.rc.hget(`${P}:job:${id}`, 'ledger')) ?? '[]') as MadeEntry[];
  const importJob = (id: string, name: string) => ({
    job_id: id, operation: 'import_kvm',
    parameters: { disks: [{ path: path.join(root, 'small.qcow2'), format: 'qcow2' }, { path: path.join(root, 'big.raw'), format: 'raw' }], name, pool: lv.pool, memory: 64 },
  });
  /** Waits, closely, until the job's ledger holds `key`: the first disk's volume is in place while the second
   *  disk is still being copied. */
  async function recorded(id: string, key: string) {
    const deadline = Date.now() + 240_000;
    while (!(await ledger(id)).some((e) => e.id === key)) {
      if (Date.now() > deadline) throw new Error(`${key} not recorded: ${JSON.stringify(await ledger(id))}`);
      await new Promise((r) => setTimeout(r, 10));
    }
  }
  const final = (id: string) => until(async () => { const j = (await req<JobStatus>(s.gw.url, 'GET', `/jobs/${id}`)).body; return ['COMPLETED', 'FAILED', 'CANCELLED'].includes(j.state) && j; }, 300_000, `job ${id} to end`);
  let spare: Proc | undefined;
  const gone = (args: string[]) => lv.virsh(args).then(() => 'there', () => 'gone');

  after(async () => {
    if (!lv) return;
    await lv.virsh(['destroy', NAME]).catch(tolerate(`destroy ${NAME}`));
    await lv.virsh(['undefine', '--nvram', NAME]).catch(tolerate(`undefine ${NAME}`));
    await releaseLibvirt();
  });

  it('the second attempt removes the first one\'s volume and partial copy (by key), then imports; one domain, the pool holds only its volumes', async () => {
    const w1: Proc = await s.add(startWorkerProc(s.env, 'lret-w1', ['img_tool', 'libvirt_access']));
    await awaitWorkers(s.gw.url, [w1]);
    const id = 'lret-1';
    const sub = await req(s.gw.url, 'POST', '/jobs?queue=true', importJob(id, NAME));
    expect(sub.status, sub.text).to.equal(201);
    // The first disk's volume is in place and recorded while the second disk is still being copied: the worker
    // dies there, as a crash would take it.
    const vol0 = path.join(lv.poolDir, `${NAME}.qcow2`);
    await recorded(id, vol0);
    w1.proc.kill('SIGSTOP');
    await w1.kill();
    const first = await ledger(id);
    console.log(`      first attempt's ledger: ${first.map((e) => `${e.kind} ${path.basename(e.id)}`).join(', ')}`);
    expect(first.every((e) => e.attempt === 1 && e.kind === 'volume')).to.equal(true);
    const parts = first.filter((e) => e.id.endsWith('.ferry-partial')).map((e) => e.id);
    expect(parts, 'a partial copy of each disk').to.have.length(2);
    expect(readdirSync(lv.poolDir), 'the first volume is in the pool').to.include(`${NAME}.qcow2`);

    const w2 = spare = await s.add(startWorkerProc(s.env, 'lret-w2', ['img_tool', 'libvirt_access']));
    await awaitWorkers(s.gw.url, [w2], {}, 300_000);
    const job = await final(id);
    expect(job.state, `${job.error}\n${w2.logs.join('').slice(-2000)}`).to.equal('COMPLETED');
    expect(job.attempts).to.equal(2);

    const all = await ledger(id);
    const second = all.filter((e) => e.attempt === 2);
    // What the second attempt said it removed, before its first entry: the first attempt's entries still there.
    const events = (await req<{ message?: string; timestamp: string }[]>(s.gw.url, 'GET', `/jobs/${id}/events`)).body;
    const removal = events.find((e) => e.message?.startsWith('removed what an earlier attempt made'));
    expect(removal, JSON.stringify(events.map((e) => e.message))).to.not.equal(undefined);
    console.log(`      ${removal!.message}`);
    expect(removal!.message).to.include(`volume ${vol0} removed`);
    expect(Date.parse(removal!.timestamp)).to.be.at.most(Math.min(...second.map((e) => Date.parse(e.at))));
    // The first attempt's partial copies are gone from the folder and from libvirt; the pool holds the two volumes.
    for (const p of parts) expect(await gone(['vol-key', p]), p).to.equal('gone');
    expect(readdirSync(lv.poolDir).sort()).to.deep.equal([`${NAME}-disk1.raw`, `${NAME}.qcow2`]);
    // One domain, the second attempt's, found by its UUID.
    const domains = all.filter((e) => e.kind === 'domain');
    expect(domains.map((e) => e.attempt)).to.deep.equal([2]);
    expect((await lv.virsh(['domuuid', NAME])).trim()).to.equal(domains[0].id);
    expect(await gone(['dominfo', domains[0].id])).to.equal('there');
  });

  it('a cancelled import_kvm job: the worker removes exactly its ledger entries; a look-alike partial copy, volume and domain stay', async () => {
    const name = 'lret-c';
    // Look-alikes of what the job makes, none in its ledger: a partial copy by Ferry's naming, a volume the old
    // leftover pattern would have taken, a domain named after the job's.
    const fake = path.join(lv.poolDir, `.${name}.0badf00d.ferry-partial`);
    writeFileSync(fake, 'not the job\'s');
    await lv.virsh(['vol-create-as', lv.pool, `${name}-disk2.qcow2`, '1M', '--format', 'qcow2']);
    const xml = path.join(s.dir, 'keep.xml');
    writeFileSync(xml, `<domain type="qemu"><name>${name}-keep</name><memory unit="MiB">16</memory><os><type arch="x86_64">hvm</type></os></domain>`);
    await lv.virsh(['define', xml]);
    const keepUuid = (await lv.virsh(['domuuid', `${name}-keep`])).trim();
    const before = readdirSync(lv.poolDir).sort();

    // The first test's second worker when it runs (a worker starting on a loaded host can take minutes).
    if (!spare || spare.proc.exitCode !== null) spare = await s.add(startWorkerProc(s.env, 'lret-w3', ['img_tool', 'libvirt_access']));
    await awaitWorkers(s.gw.url, [spare], {}, 300_000);
    const id = 'lret-cancel';
    expect((await req(s.gw.url, 'POST', '/jobs?queue=true', importJob(id, name))).status).to.equal(201);
    const vol0 = path.join(lv.poolDir, `${name}.qcow2`);
    await recorded(id, vol0);
    const c = await req(s.gw.url, 'DELETE', `/jobs/${id}`);
    expect(c.status, c.text).to.equal(200);
    expect((await final(id)).state).to.equal('CANCELLED');
    // Every entry gone, found by its key or UUID: the worker's clean-up and the import's own undo, whichever ran.
    // The ledger is read again each time: the worker learns of the cancel after the API has answered, and what its
    // copy recorded meanwhile must go too.
    let made: MadeEntry[] = [];
    await until(async () => {
      made = await ledger(id);
      for (const e of made) if ((await gone(e.kind === 'domain' ? ['dominfo', e.id] : ['vol-key', e.id])) !== 'gone') return false;
      return readdirSync(lv.poolDir).sort().join() === before.join();
    }, 60_000, 'every ledger entry removed, and the pool as it was').catch((e: Error) => { throw new Error(`${e.message}: ${JSON.stringify(readdirSync(lv.poolDir).sort())} against ${JSON.stringify(before)}`); });
    console.log(`      ledger: ${made.map((e) => `${e.kind} ${path.basename(e.id)}`).join(', ')}`);
    expect(made.map((e) => e.id)).to.include(vol0);
    // The look-alikes stay, and the pool holds what it held before.
    expect(readdirSync(lv.poolDir).sort()).to.deep.equal(before);
    expect(before).to.include.members([path.basename(fake), `${name}-disk2.qcow2`]);
    expect((await lv.virsh(['domuuid', `${name}-keep`])).trim()).to.equal(keepUuid);
    await lv.virsh(['undefine', `${name}-keep`]);
  });
});
