// The bus subscribes only once its connection is ready: a SUBSCRIBE sent during ioredis's connection handshake
// (ioredis issue #2037) made Redis refuse the handshake's own commands, and a worker failed to start with
// "Connection in subscriber mode, only subscriber commands may be used" in a loaded test run. Here fresh buses
// subscribe at once, as a starting service does, and each must hear a message, with no error on its connection.
// And a listener hears every message Redis delivered to it, the first one too: in a loaded run a message that came
// in the same read as SUBSCRIBE's reply reached the bus before its listener was added, and was lost.
import { expect } from 'chai';
import { TestRedis } from '../helpers/redis';
import { until } from '../helpers/http';
import { Bus, publish } from '../../queue/bus';
import { createRedis, keys } from '../../platform/redis';

describe('the bus subscribing while its connection starts', function () {
  this.timeout(60_000);
  const server = new TestRedis();
  before(() => server.start());
  after(() => server.stop());

  it('30 buses subscribe as soon as their connections open; each hears a message and logs no connection error', async () => {
    const errors: string[] = [];
    const buses = Array.from({ length: 30 }, () => new Bus(server.url));
    try {
      for (const b of buses) (b as unknown as { sub: NodeJS.EventEmitter }).sub.on('error', (e: Error) => errors.push(e.message));
      // Subscribed the moment the connection is up, while ioredis still runs its handshake on it.
      const heard = buses.map((b) => new Promise<string>((resolve, reject) => {
        (b as unknown as { sub: NodeJS.EventEmitter }).sub.once('connect', () => { b.on('enqueued', (_m, raw) => resolve(raw)).catch(reject); });
      }));
      const pub = createRedis({ url: server.url });
      try {
        // Redis counts the subscribers a message reached: every bus has subscribed when it is 30.
        await until(async () => (await publish(pub, keys(), 'enqueued', 'q1')) === buses.length, 20_000, 'every bus subscribed')
          .catch((e: Error) => { throw new Error(`${e.message}; connection errors: ${errors.join(' | ') || 'none'}`); });
      } finally { pub.disconnect(); }
      expect(await Promise.all(heard)).to.deep.equal(buses.map(() => 'q1'));
      expect(errors).to.deep.equal([]);
    } finally { await Promise.all(buses.map((b) => b.close())); }
  });

  it('a listener hears the first message Redis delivers to it, even one that arrives with the SUBSCRIBE reply', async () => {
    const pub = createRedis({ url: server.url });
    try {
      for (let round = 0; round < 5; round++) {
        // A channel of its own per round: the last round's closed bus may still be counted by Redis for a moment.
        const prefix = `ferry-round${round}`;
        const bus = new Bus(server.url, prefix);
        try {
          const heard = new Set<string>();
          // A flood of numbered messages from another connection while the bus subscribes: Redis queues the first
          // ones it delivers in the same write as SUBSCRIBE's reply.
          const receivers: Promise<number>[] = [];
          let subscribed = false;
          const listening = bus.on('enqueued', (_m, raw) => heard.add(raw)).then(() => { subscribed = true; });
          for (let i = 0; !subscribed && i < 200_000; i++) {
            receivers.push(publish(pub, keys(prefix), 'enqueued', `m${i}`));
            if (i % 500 === 499) await Promise.race([listening, new Promise((r) => setImmediate(r))]);
          }
          await listening;
          const counts = await Promise.all(receivers);
          const first = counts.indexOf(1);
          expect(first, 'a message reached the bus while it subscribed').to.be.at.least(0);
          await until(() => heard.has(`m${counts.lastIndexOf(1)}`), 10_000, 'the last delivered message heard');
          expect(heard.has(`m${first}`), `round ${round}: the first message Redis delivered (m${first}) was heard`).to.equal(true);
        } finally { await bus.close(); }
      }
    } finally { pub.disconnect(); }
  });
});
