// Writes go through the Lua commands under the lease, and answers say what happened: an output claim of an
// attempt whose lease is gone is refused and changes nothing (addOutput-1.lua); fail() whose transition is
// refused answers the state the job is in, not the QUEUED it asked for; what a job made is owned by the last job
// that made it (a dir pool's volume path made again by another job), given up when removed, and forgotten with the
// job's record.
import { expect } from 'chai';
import { TestRedis } from '../helpers/redis';
import { createRedis, RedisClient } from '../../platform/redis';
import { JobStore } from '../../queue/store';
import { QueueRouter } from '../../queue/router';
import { Lifecycle } from '../../queue/lifecycle';
import { Registry } from '../../queue/registry';
import { jobSpecSchema, JobSpec } from '../../domain/schemas/job';

describe('queue: writes under the lease, answers that say what happened', function () {
  const server = new TestRedis();
  let redis: RedisClient;
  let store: JobStore;
  let router: QueueRouter;
  let life: Lifecycle;
  let n = 0;
  const spec = (over: Record<string, unknown> = {}): JobSpec => jobSpecSchema.validate({ job_id: `w-${++n}`, operation: 'noop', ...over }).value as JobSpec;

  before(async () => {
    await server.start();
    redis = createRedis({ url: server.url });
    store = new JobStore(redis);
    router = new QueueRouter(redis, { stalledCheck: false });
    life = new Lifecycle(store, router, new Registry(redis));
  });
  after(async () => {
    await router?.close();
    redis?.disconnect();
    await server.stop();
  });

  it('records an output only under the lease of the attempt, keeping the newest 64', async () => {
    const s = spec();
    await life.submit(s, { enqueue: true });
    const l = (await life.claim({ worker_id: 'w', capabilities: [] }))!;
    expect(await store.recordOutput(s.job_id, 'w:not-the-lease', 'dev:1:ino:1')).to.equal(false);
    expect(await redis.hget(store.k.job(s.job_id), 'owned_outputs'), 'nothing written on a refused claim').to.equal(null);
    for (let i = 0; i < 70; i++) expect(await store.recordOutput(s.job_id, l.token, `dev:1:ino:${i}`)).to.equal(true);
    const kept = JSON.parse((await redis.hget(store.k.job(s.job_id), 'owned_outputs'))!) as string[];
    expect(kept).to.have.length(64);
    expect(kept[63]).to.equal('dev:1:ino:69');
    expect(await store.ownedOutputs(s.job_id)).to.deep.equal(kept);
    await life.cancel(s.job_id);
    expect(await store.recordOutput(s.job_id, l.token, 'dev:1:ino:99'), 'after the cancel the lease is gone').to.equal(false);
  });

  it('records what an attempt made in the job\'s ledger only under its lease, once per identity, and shows it in the record', async () => {
    const s = spec();
    await life.submit(s, { enqueue: true });
    const l = (await life.claim({ worker_id: 'w', capabilities: [] }))!;
    const dom = { kind: 'domain' as const, id: '6f1c2b3a-0d4e-4f5a-8b6c-7d8e9f0a1b2c', name: 'web1', virt_uri: 'qemu:///system', attempt: 1, at: new Date().toISOString() };
    const vol = { kind: 'volume' as const, id: '/pool/web1.qcow2', name: 'web1.qcow2', virt_uri: 'qemu:///system', pool: 'p', attempt: 1, at: new Date().toISOString() };
    expect(await store.recordMade(s.job_id, 'w:not-the-lease', dom)).to.equal('lease');
    expect(await redis.hget(store.k.job(s.job_id), 'ledger'), 'nothing written without the lease').to.equal(null);
    expect(await store.recordMade(s.job_id, l.token, dom)).to.equal('added');
    expect(await store.recordMade(s.job_id, l.token, vol)).to.equal('added');
    expect(await store.recordMade(s.job_id, l.token, { ...dom, at: 'later' }), 'the same UUID again only confirms').to.equal('known');
    expect(await store.made(s.job_id)).to.deep.equal([dom, vol]);
    expect((await store.get(s.job_id))!.ledger).to.deep.equal([dom, vol]);
    await life.cancel(s.job_id);
    expect(await store.recordMade(s.job_id, l.token, { ...vol, id: '/pool/web1-disk1.qcow2' }), 'after the cancel the lease is gone').to.equal('lease');
    expect(await store.made(s.job_id)).to.have.length(2);
  });

  it('what a job made is owned by the job that made it last: another job making the same volume path takes it over; a removal gives up only its own; the retention sweep forgets it', async () => {
    const made = async (over: Record<string, unknown> = {}) => {
      const s = spec(over);
      await life.submit(s, { enqueue: true });
      const l = (await life.claim({ worker_id: 'w', capabilities: [] }))!;
      return { id: s.job_id, lease: l.token, attempts: l.record.attempts, queue: l.queue };
    };
    const vol = { kind: 'volume' as const, id: '/pool/db.qcow2', name: 'db.qcow2', virt_uri: 'qemu:///system', pool: 'p', attempt: 1, at: new Date().toISOString() };
    const dom = { kind: 'domain' as const, id: '0e6b1a52-8a43-4c1e-9f0d-3b7c2a1d4e5f', name: 'db', virt_uri: 'qemu:///system', attempt: 1, at: vol.at };
    const a = await made();
    expect(await store.recordMade(a.id, a.lease, vol)).to.equal('added');
    expect(await store.recordMade(a.id, a.lease, dom)).to.equal('added');
    const ga = store.madeGuard(a.id);
    expect(await ga.owner(vol)).to.equal(a.id);
    // A's volume removed (by Ferry: ownership given up), then job B makes a volume at the same path.
    await ga.released([vol]);
    expect(await ga.owner(vol), 'removed: nobody owns it').to.equal(null);
    const b = await made();
    expect(await store.recordMade(b.id, b.lease, vol)).to.equal('added');
    expect(await ga.owner(vol), 'A\'s entry now names B\'s volume').to.equal(b.id);
    expect((await store.madeOwners(a.id)).map((x) => [x.entry.kind, x.owner])).to.deep.equal([['volume', b.id], ['domain', a.id]]);
    await ga.released([vol, dom]);
    expect(await store.madeGuard(b.id).owner(vol), 'A gives up only what it owns').to.equal(b.id);
    expect(await ga.owner(dom)).to.equal(null);
    // A retry of B that makes the same path again keeps owning it ('known'); the sweep forgets B's ownership with B.
    expect(await store.recordMade(b.id, b.lease, { ...vol, attempt: 2 })).to.equal('known');
    for (const j of [a, b]) {
      await life.start(j.id, 'w', j.lease, j.attempts);
      await life.complete(j.id, 'w', j.lease, {}, j.queue);
    }
    const ownedBy = async (j: string) => Object.values(await redis.hgetall(store.k.madeOwners)).filter((x) => x === j).length;
    expect([await ownedBy(a.id), await ownedBy(b.id)]).to.deep.equal([0, 1]);
    expect(await store.purgeFinished(0)).to.be.at.least(2);
    expect(await ownedBy(b.id), 'the owner of B\'s volume went with B\'s record').to.equal(0);
  });

  it('fail() answers the state the job is in when its transition is refused', async () => {
    const s = spec({ execution_policy: { retry_count: 2 } });
    await life.submit(s, { enqueue: true });
    const l = (await life.claim({ worker_id: 'w', capabilities: [] }))!;
    // Cancelled through the command without clearing the lease: the lease check passes, the move to QUEUED cannot.
    expect((await store.transition(s.job_id, [{ to: 'CANCELLED', reason: 'test' }])).ok).to.equal(true);
    const r = await life.fail(s.job_id, 'w', l.token, 'drill', true);
    expect(r).to.deep.equal({ ok: false, state: 'CANCELLED' });
    expect(await redis.hget(store.k.job(s.job_id), 'state')).to.equal('CANCELLED');
    expect(await life.fail(s.job_id, 'w', 'w:other', 'drill', true), 'a stale lease').to.deep.equal({ ok: false, state: 'CANCELLED' });
  });
});
