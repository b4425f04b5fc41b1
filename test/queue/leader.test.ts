// One leader for periodic work (queue/leader.ts): three gateway processes on one Redis run each sweep once per
// interval between them (not three times), on the process that holds the lease; when that process is killed
// (SIGKILL: no chance to hand the lease over), another takes the lease and the sweeps within one interval.
import { expect } from 'chai';
import IORedis from 'ioredis';
import { TestRedis } from '../helpers/redis';
import { startGatewayProc, testEnv, Proc } from '../helpers/procs';
import { until } from '../helpers/http';

const INTERVAL_S = 2; // every gateway sweep's interval below
const SWEEPS = ['stale-workers', 'retention', 'reconcile', 'timeouts'];

type Gw = Proc & { url: string };

/** The gateway's sweep runs (svc_sweep_runs_total, outcome ok) and whether it leads (svc_leader). */
async function scrape(g: Gw): Promise<{ runs: Record<string, number>; leading: boolean }> {
  const text = await (await fetch(`${g.url}/metrics`)).text();
  const runs: Record<string, number> = Object.fromEntries(SWEEPS.map((s) => [s, 0]));
  for (const m of text.matchAll(/^svc_sweep_runs_total\{sweep="([^"]+)",outcome="ok"[^}]*\} (\d+)/gm)) runs[m[1]] = Number(m[2]);
  return { runs, leading: /^svc_leader\{group="gateway"[^}]*\} 1$/m.test(text) };
}

const total = async (gs: Gw[]) => {
  const all = await Promise.all(gs.map(scrape));
  return Object.fromEntries(SWEEPS.map((s) => [s, all.reduce((n, a) => n + a.runs[s], 0)]));
};

describe('queue: one leader for periodic work (three gateways)', function () {
  this.timeout(120000);
  const redis = new TestRedis();
  let rc: IORedis;
  let gws: Gw[] = [];

  before(async function () {
    this.timeout(120000);
    await redis.start();
    rc = new IORedis(redis.url);
    const env = {
      ...testEnv(redis.url), FERRY_RECONCILE_SECONDS: String(INTERVAL_S), FERRY_TIMEOUT_SWEEP_SECONDS: String(INTERVAL_S),
      FERRY_WORKER_STALE_SECONDS: String(INTERVAL_S * 4), FERRY_JOB_RETENTION: `${INTERVAL_S * 4}s`, FERRY_WORKER_PRUNE_AFTER: `${INTERVAL_S * 4}s`,
    };
    gws = await Promise.all([1, 2, 3].map(() => startGatewayProc(env)));
  });
  after(async () => {
    await Promise.all(gws.map((g) => g.stop()));
    rc?.disconnect();
    await redis.stop();
  });

  const leaderOf = async (among: Gw[]) => {
    const all = await Promise.all(among.map(scrape));
    const leading = among.filter((_, i) => all[i].leading);
    return leading.length === 1 ? leading[0] : undefined;
  };

  it('runs each sweep once per interval, on the one gateway whose process holds the lease', async () => {
    const leader = await until(() => leaderOf(gws), 20000, 'one leading gateway');
    const lease = await rc.get('ferry:leader:gateway');
    expect(lease, 'the lease names the leading process').to.match(new RegExp(`^${leader.proc.pid}:[^#]+#\\d+$`));
    const before = await total(gws);
    const t0 = Date.now();
    // Five intervals; counted on every gateway, so a sweep run by all three would show three times as many.
    await until(async () => (await total(gws)).reconcile - before.reconcile >= 5, 30000, 'five reconcile runs');
    const after = await total(gws);
    const intervals = (Date.now() - t0) / (INTERVAL_S * 1000);
    for (const s of SWEEPS) {
      const runs = after[s] - before[s];
      expect(runs, `${s}: runs in ${intervals.toFixed(1)} intervals`).to.be.within(Math.floor(intervals) - 1, Math.ceil(intervals) + 1);
    }
    const others = await Promise.all(gws.filter((g) => g !== leader).map(scrape));
    for (const o of others) for (const s of SWEEPS) expect(o.runs[s], `${s} on a gateway that does not lead`).to.equal(0);
    expect(await rc.get('ferry:leader:gateway'), 'the lease kept, not retaken').to.equal(lease);
  });

  it('moves to another gateway within one interval when the leader is killed', async () => {
    const leader = (await leaderOf(gws))!;
    const fence = Number((await rc.get('ferry:leader:gateway'))!.split('#')[1]);
    const rest = gws.filter((g) => g !== leader);
    const before = await Promise.all(rest.map(scrape));
    await leader.kill();
    const killed = Date.now();
    gws = rest;
    const next = await until(() => leaderOf(rest), 20000, 'a new leading gateway');
    const i = rest.indexOf(next);
    await until(async () => {
      const now = await scrape(next);
      return SWEEPS.every((s) => now.runs[s] > before[i].runs[s]);
    }, 20000, 'every sweep run on the new leader');
    const took = Date.now() - killed;
    expect(took, 'ms from the kill to every sweep running again').to.be.at.most(INTERVAL_S * 1000 + 500);
    const lease = (await rc.get('ferry:leader:gateway'))!;
    expect(lease).to.match(new RegExp(`^${next.proc.pid}:`));
    expect(Number(lease.split('#')[1]), 'a new fencing token').to.be.above(fence);
    const other = rest.find((g) => g !== next)!;
    const o = await scrape(other);
    for (const s of SWEEPS) expect(o.runs[s], `${s} on the gateway that still does not lead`).to.equal(0);
  });
});
