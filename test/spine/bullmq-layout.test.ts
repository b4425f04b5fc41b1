// queue/bullmq-layout.ts reads BullMQ's Redis layout directly (the queue position, waiting counts, whether a job
// exists). Here those reads are checked against BullMQ's own API on a real Redis, through Ferry's QueueRouter as
// the gateway uses it: if an upgrade of BullMQ moves or renames what the adapter relies on, this fails, saying
// which read no longer agrees, before a queue position or the reconciler silently goes wrong.
import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Queue } from 'bullmq';
import { TestRedis } from '../helpers/redis';
import { createRedis, RedisClient } from '../../platform/redis';
import { QueueRouter, bullId } from '../../queue/router';

const ROOT = path.resolve(__dirname, '..', '..');
const QUEUE = 'jobs.layout_cap';

/** What this test reads of a package.json (the repository's and bullmq's own). */
interface PackageJson { version: string; dependencies: Record<string, string> }

describe('BullMQ layout adapter (queue/bullmq-layout.ts) against BullMQ itself', function () {
  this.timeout(60000);
  const redis = new TestRedis();
  let conn: RedisClient;
  let router: QueueRouter;
  let bull: Queue;

  before(async () => {
    await redis.start();
    conn = createRedis({ url: redis.url });
    router = new QueueRouter(conn, { stalledCheck: false });
    bull = router.queue(QUEUE);
  });
  after(async () => {
    await router?.close();
    conn?.disconnect();
    await redis.stop();
  });

  it('runs on the BullMQ version range package.json pins, which is the one this test passed with', () => {
    const range: string = (JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as PackageJson).dependencies.bullmq;
    const installed: string = (JSON.parse(readFileSync(require.resolve('bullmq/package.json'), 'utf8')) as PackageJson).version;
    const m = /^~(\d+)\.(\d+)\.(\d+)$/.exec(range);
    expect(m, `package.json pins bullmq to one minor version (~x.y.z), not ${range}`).to.not.equal(null);
    const [maj, min, patch] = installed.split('.').map(Number);
    expect([maj, min], `installed bullmq ${installed} is outside ${range}`).to.deep.equal([Number(m![1]), Number(m![2])]);
    expect(patch).to.be.at.least(Number(m![3]));
  });

  it('the queue position (rank in the prioritized set) is the order BullMQ hands jobs out in', async () => {
    // Ferry priorities (higher first), equal priorities in submission order.
    const jobs: [string, number][] = [['low', 10], ['high-a', 90], ['mid', 50], ['high-b', 90], ['top', 100]];
    for (const [id, prio] of jobs) await router.enqueue(QUEUE, id, prio);
    const bullOrder = (await bull.getPrioritized(0, -1)).map((j) => j.id);
    expect(bullOrder, 'BullMQ\'s own order').to.deep.equal(['top', 'high-a', 'high-b', 'mid', 'low'].map(bullId));
    for (const [id] of jobs) {
      expect(await router.position(QUEUE, id), `position of ${id}`).to.equal(bullOrder.indexOf(bullId(id)) + 1);
      expect((await router.bull.rank(conn.pipeline(), QUEUE, bullId(id)).exec())![0][1], `rank of ${id}`).to.equal(bullOrder.indexOf(bullId(id)));
    }
    expect(await router.position(QUEUE, 'never-queued')).to.equal(null);
  });

  it('the waiting count is BullMQ\'s prioritized + wait, jobs with and without a priority', async () => {
    await bull.add('job', {}, { jobId: 'plain-1' }); // no priority: BullMQ's wait list
    await bull.add('job', {}, { jobId: 'plain-2' });
    const counts = await bull.getJobCounts('prioritized', 'wait');
    expect(counts).to.deep.equal({ prioritized: 5, wait: 2 });
    const replies = (await router.bull.countWaiting(conn.pipeline(), QUEUE).exec())!.map(([e, n]) => { expect(e).to.equal(null); return Number(n); });
    expect(replies).to.deep.equal([counts.prioritized, counts.wait]);
  });

  it('a job exists for the adapter exactly while BullMQ can find it', async () => {
    const ids = ['top', 'low', 'plain-1', 'never-queued'].map((id) => (id.startsWith('plain') ? id : bullId(id)));
    const exists = async () => {
      const p = conn.pipeline();
      for (const id of ids) router.bull.exists(p, QUEUE, id);
      return (await p.exec())!.map(([, v]) => Number(v));
    };
    const viaApi = async () => Promise.all(ids.map(async (id) => ((await bull.getJob(id)) ? 1 : 0)));
    expect(await exists()).to.deep.equal([1, 1, 1, 0]);
    expect(await exists()).to.deep.equal(await viaApi());
    await router.remove(QUEUE, 'low');
    await bull.remove('plain-1');
    expect(await exists()).to.deep.equal([1, 0, 0, 0]);
    expect(await exists()).to.deep.equal(await viaApi());
    // Taken by a worker: no longer waiting (no rank), still existing. (BullMQ hands out plain jobs before
    // prioritized ones; Ferry never queues a job without a priority.)
    await bull.remove('plain-2');
    const claimed = await router.next([QUEUE], 'tok-1');
    expect(claimed?.job.id).to.equal(bullId('top'));
    expect((await router.bull.rank(conn.pipeline(), QUEUE, bullId('top')).exec())![0][1]).to.equal(null);
    expect((await exists())[0]).to.equal(1);
    expect(await bull.getJobState(bullId('top'))).to.equal('active');
  });
});
