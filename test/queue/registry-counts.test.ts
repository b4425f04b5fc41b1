// Registry.counts() (what /status and /health show) and Registry.active() (what GET /queue and the waiting
// reasons match queues against) read the heartbeat index, not every worker record; they must agree with what
// reading every record says (list()), stale and removed workers included.
import { expect } from 'chai';
import { TestRedis } from '../helpers/redis';
import { createRedis, RedisClient } from '../../platform/redis';
import { Registry } from '../../queue/registry';
import { config } from '../../platform/config';

describe('queue: worker counts from the heartbeat index', function () {
  const server = new TestRedis();
  let redis: RedisClient;
  let registry: Registry;

  before(async () => {
    await server.start();
    redis = createRedis({ url: server.url });
    registry = new Registry(redis);
  });
  after(async () => {
    redis?.disconnect();
    await server.stop();
  });

  /** The worker falls silent: its heartbeat is older than the stale limit (in its record and in the index, as a
   *  heartbeat writes both). */
  const fallSilent = async (id: string) => {
    const old = Date.now() - (config.workerStaleSeconds + 5) * 1000;
    await redis.multi().hset(registry.k.worker(id), 'last_heartbeat', new Date(old).toISOString()).zadd(registry.k.workers, old, id).exec();
  };
  const fromRecords = async () => { const ws = await registry.list(); return { total: ws.length, active: ws.filter((w) => w.active).length }; };

  it('counts registered and active workers as list() does, a stale worker and a removed one included', async () => {
    expect(await registry.counts()).to.deep.equal({ total: 0, active: 0 });
    for (const id of ['a', 'b', 'c']) await registry.register({ worker_id: id, capabilities: [], system_info: {}, execution_mode: 'PROCESS' }, 'http');
    expect(await registry.counts()).to.deep.equal({ total: 3, active: 3 });
    await fallSilent('b');
    expect(await registry.counts()).to.deep.equal({ total: 3, active: 2 });
    expect(await registry.counts()).to.deep.equal(await fromRecords());
    await registry.heartbeat('b');
    expect(await registry.counts()).to.deep.equal({ total: 3, active: 3 });
    await registry.remove('c');
    expect(await registry.counts()).to.deep.equal({ total: 2, active: 2 });
    expect(await registry.counts()).to.deep.equal(await fromRecords());
  });

  const activeFromRecords = async () => (await registry.list()).filter((w) => w.active)
    .map(({ worker_id, capabilities, execution_mode }) => ({ worker_id, capabilities, execution_mode }));
  const byId = (a: { worker_id: string }, b: { worker_id: string }) => a.worker_id.localeCompare(b.worker_id);

  it('lists the active workers with their capabilities and mode as list() does, without the stale or removed', async () => {
    await registry.register({ worker_id: 'gpu', capabilities: ['nbdkit', 'img_tool'], system_info: { cpus: 2 }, execution_mode: 'PRIVILEGED' }, 'native');
    expect((await registry.active()).sort(byId)).to.deep.equal((await activeFromRecords()).sort(byId));
    const gpu = (await registry.active()).find((w) => w.worker_id === 'gpu');
    expect(gpu).to.deep.equal({ worker_id: 'gpu', capabilities: ['img_tool', 'nbdkit'], execution_mode: 'PRIVILEGED' });
    await fallSilent('gpu');
    expect((await registry.active()).map((w) => w.worker_id)).to.not.include('gpu');
    expect((await registry.active()).sort(byId)).to.deep.equal((await activeFromRecords()).sort(byId));
    await registry.remove('a');
    expect((await registry.active()).map((w) => w.worker_id).sort()).to.deep.equal(['b']);
  });

  it('list() reads every record past one Lua call\'s batch, each with the jobs it holds; a record gone from under the index is skipped', async () => {
    const ids = Array.from({ length: 1001 }, (_, i) => `many-${String(i).padStart(4, '0')}`);
    for (const id of ids) await registry.register({ worker_id: id, capabilities: ['img_tool'], system_info: { n: id }, execution_mode: 'PROCESS' }, 'http');
    // A RUNNING job held by the last worker (the held jobs are derived from the job records' worker_id).
    await redis.multi().zadd(registry.k.jobsInState('RUNNING'), 1, 'held-1').hset(registry.k.job('held-1'), 'worker_id', ids[1000]).exec();
    await redis.del(registry.k.worker(ids[3])); // gone, its index entry not yet
    const listed = await registry.list();
    const many = listed.filter((w) => w.worker_id.startsWith('many-'));
    expect(many.map((w) => w.worker_id).sort()).to.deep.equal(ids.filter((id) => id !== ids[3]));
    const last = many.find((w) => w.worker_id === ids[1000])!;
    expect(last).to.include({ execution_mode: 'PROCESS', kind: 'http', active: true });
    expect(last.capabilities).to.deep.equal(['img_tool']);
    expect(last.system_info).to.deep.equal({ n: ids[1000] });
    expect(last.jobs).to.deep.equal(['held-1']);
    expect(many.filter((w) => w.jobs.length).map((w) => w.worker_id)).to.deep.equal([ids[1000]]);
    expect((await registry.active()).filter((w) => w.worker_id.startsWith('many-'))).to.have.length(1000);
  });
});
