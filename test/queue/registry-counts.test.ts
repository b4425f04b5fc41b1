// Registry.counts() (what /status and /health show) reads only the heartbeat index; it must agree with what
// reading every worker record says (list()), stale and removed workers included.
import { expect } from 'chai';
import { TestRedis } from '../helpers/redis';
import { createRedis, RedisClient } from '../../shared/redis';
import { Registry } from '../../queue/registry';
import { config } from '../../shared/config';

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

  const fromRecords = async () => { const ws = await registry.list(); return { total: ws.length, active: ws.filter((w) => w.active).length }; };

  it('counts registered and active workers as list() does, a stale worker and a removed one included', async () => {
    expect(await registry.counts()).to.deep.equal({ total: 0, active: 0 });
    for (const id of ['a', 'b', 'c']) await registry.register({ worker_id: id, capabilities: [], system_info: {}, execution_mode: 'PROCESS' }, 'http');
    expect(await registry.counts()).to.deep.equal({ total: 3, active: 3 });
    // Worker b falls silent: its heartbeat is older than the stale limit (in its record and in the index, as a
    // heartbeat writes both).
    const old = Date.now() - (config.workerStaleSeconds + 5) * 1000;
    await redis.multi().hset(registry.k.worker('b'), 'last_heartbeat', new Date(old).toISOString()).zadd(registry.k.workers, old, 'b').exec();
    expect(await registry.counts()).to.deep.equal({ total: 3, active: 2 });
    expect(await registry.counts()).to.deep.equal(await fromRecords());
    await registry.heartbeat('b');
    expect(await registry.counts()).to.deep.equal({ total: 3, active: 3 });
    await registry.remove('c');
    expect(await registry.counts()).to.deep.equal({ total: 2, active: 2 });
    expect(await registry.counts()).to.deep.equal(await fromRecords());
  });
});
