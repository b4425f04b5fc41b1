// The one module that knows how BullMQ lays out a queue in Redis. Ferry reads three things BullMQ's API does not
// give cheaply: a waiting job's rank among its queue's prioritized jobs (the queue position), the waiting counts
// of several queues in one pipeline, and whether a batch of jobs still exist. Everything else goes through
// BullMQ's API. test/spine/bullmq-layout.test.ts checks these reads against BullMQ's own API on a real Redis, so
// an upgrade that changes the layout fails there, loudly; package.json pins the BullMQ range it was tested with.
import type { ChainableCommander } from 'ioredis';

export class BullLayout {
  /** `prefix` is the one given to BullMQ's Queue and Worker (keys.bullPrefix). */
  constructor(readonly prefix: string) {}

  /** Sorted set of the waiting jobs that have a priority, scored by priority then insertion order. */
  prioritized(queue: string) { return `${this.prefix}:${queue}:prioritized`; }
  /** List of the waiting jobs without a priority. */
  wait(queue: string) { return `${this.prefix}:${queue}:wait`; }
  /** A job's hash; it exists from add until the job is removed. */
  job(queue: string, bullJobId: string) { return `${this.prefix}:${queue}:${bullJobId}`; }

  /** Queues one command on `p` whose reply is the 0-based rank of a waiting job among its queue's prioritized
   *  jobs, or null when it is not waiting there. */
  rank(p: ChainableCommander, queue: string, bullJobId: string) {
    return p.zrank(this.prioritized(queue), bullJobId);
  }

  /** Queues two commands on `p` whose replies, added, are the queue's waiting jobs (prioritized and plain). */
  countWaiting(p: ChainableCommander, queue: string) {
    return p.zcard(this.prioritized(queue)).llen(this.wait(queue));
  }

  /** Queues one command on `p` whose reply is 1 while the job exists in BullMQ, else 0. */
  exists(p: ChainableCommander, queue: string, bullJobId: string) {
    return p.exists(this.job(queue, bullJobId));
  }
}
