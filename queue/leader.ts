// One process at a time runs a group's periodic work (the gateways' sweeps, the schedulers' outcome sweep): it
// holds a Redis lease (holdLease-2.lua) renewed every third of its length, and each take of the lease has a new
// fencing token. A sweep re-checks the lease before each step (`still`), so a holder whose lease ran out during
// a pause stops before its next write. Each sweep runs on a timer chain (the next run is set when this one
// ends), so a sweep never overlaps itself. When the holder dies its lease expires within 60% of the shortest
// sweep interval and another process takes it on its next try (a third of the lease later): the sweeps resume
// within one interval.
import { randomUUID } from 'node:crypto';
import type { Keys, RedisClient } from '../platform/redis';
import type { Logger } from '../platform/log';
import { leaderGauge, sweepRuns } from '../platform/metrics';
import { withCommands } from './scripts';

/** A sweep step's guard: true while this process still holds the lease it started the sweep under. */
export type Still = () => Promise<boolean>;
export interface Sweep { name: string; everyMs: number; run: (still: Still) => Promise<void> }

export class Leader {
  readonly id = `${process.pid}:${randomUUID()}`;
  private value: string | null = null; // `<id>#<fence>` while this process leads
  private validUntil = 0;
  private stopped = false;
  private timers = new Set<NodeJS.Timeout>();
  private sweeps: Sweep[] = [];
  private ttlMs = 0;
  private running = new Set<Promise<void>>();
  /** Counts takes and losses: each take starts one chain per sweep, which ends at the next change. */
  private generation = 0;

  constructor(private redis: RedisClient, private k: Keys, readonly group: string, private log: Logger) {}

  /** Adds a sweep; call before start(). */
  every(name: string, everyMs: number, run: (still: Still) => Promise<void>): this {
    this.sweeps.push({ name, everyMs, run });
    return this;
  }

  /** True while the lease is ours by our own clock (a renewal that has not answered does not extend it). */
  get leading(): boolean { return this.value !== null && Date.now() < this.validUntil; }

  /** The lease this process holds now (`<id>#<fence>`), null while it does not lead: what a fenced write
   *  compares with the lease key (`leaseKey`) in the same script, so a deposed leader's write is refused. */
  get lease(): string | null { return this.leading ? this.value : null; }
  get leaseKey(): string { return this.k.leader(this.group); }

  /** Reads the lease: true when it is still the one this process took (the fence included). */
  readonly still: Still = async () => this.leading && (await this.redis.get(this.k.leader(this.group))) === this.value;

  private holding: Promise<void> = Promise.resolve();

  start(): this {
    this.ttlMs = Math.max(1000, Math.floor(Math.min(...this.sweeps.map((s) => s.everyMs)) * 0.6));
    this.holding = this.hold();
    return this;
  }

  private later(fn: () => void, ms: number) {
    if (this.stopped) return;
    const t = setTimeout(() => { this.timers.delete(t); fn(); }, ms);
    t.unref();
    this.timers.add(t);
  }

  /** Takes or renews the lease, and starts the sweeps when it was just taken. */
  private async hold() {
    const sent = Date.now();
    try {
      const [what, v] = await withCommands(this.redis).ferryHoldLease(this.k.leader(this.group), this.k.leaderFence(this.group), this.id, this.ttlMs);
      if (this.stopped) { if (what !== 'other') this.value = `${this.id}#${v}`; } // stop() drops it after this call
      else if (what === 'other') this.lost(`held by ${v}`);
      else {
        const value = `${this.id}#${v}`;
        const fresh = value !== this.value;
        this.value = value;
        this.validUntil = sent + this.ttlMs;
        if (fresh) this.took();
      }
    } catch (e) {
      this.log.warn('could not take or renew the lease of periodic work; tried again in a third of the lease',
        { group: this.group, error: (e as Error).message });
      if (!this.leading) this.lost('lease expired while Redis did not answer');
    }
    this.later(() => { this.holding = this.hold(); }, Math.floor(this.ttlMs / 3));
  }

  private took() {
    this.log.info('leading the periodic work', { group: this.group, lease: this.value, sweeps: this.sweeps.map((s) => s.name) });
    leaderGauge.set({ group: this.group }, 1);
    const gen = ++this.generation;
    for (const s of this.sweeps) this.later(() => void this.tick(s, gen), 0);
  }

  private lost(why: string) {
    if (this.value) {
      this.log.info('no longer leading the periodic work', { group: this.group, why });
      this.generation++;
    }
    this.value = null;
    leaderGauge.set({ group: this.group }, 0);
  }

  /** One run of a sweep, then the next one set; the chain ends when the lease it started under is lost (a
   *  later take starts its own). A renewal that is late only skips runs until it answers. */
  private async tick(s: Sweep, gen: number) {
    if (gen !== this.generation) return;
    if (this.leading) {
      const run = this.runOnce(s);
      this.running.add(run);
      await run;
      this.running.delete(run);
    }
    this.later(() => void this.tick(s, gen), s.everyMs);
  }

  private async runOnce(s: Sweep) {
    try {
      if (await this.still()) {
        await s.run(this.still);
        sweepRuns.inc({ sweep: s.name, outcome: 'ok' });
      }
    } catch (e) {
      sweepRuns.inc({ sweep: s.name, outcome: 'error' });
      this.log.warn('sweep failed; it runs again at its next interval', { sweep: s.name, error: (e as Error).message });
    }
  }

  /** Stops the sweeps (waiting for a run under way) and hands the lease over at once. */
  async stop() {
    this.stopped = true;
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    await Promise.all([...this.running, this.holding]);
    const v = this.value;
    this.lost('stopping');
    if (v) await withCommands(this.redis).ferryDropLease(this.k.leader(this.group), v)
      .catch((e) => this.log.warn('could not drop the lease on shutdown; another process takes it when it expires',
        { group: this.group, error: (e as Error).message }));
  }
}
