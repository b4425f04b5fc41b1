// A metric computed at scrape time (platform/metrics.ts registerComputed) whose computation fails is not dropped
// silently (issue 35, item 6): with Redis away the gateway's /metrics still answers, the Redis-backed metrics
// without values, and the log says which metric failed and what happens next, once per outage (not once per
// scrape); when Redis is back the values return and the log says so.
import { expect } from 'chai';
import { TestRedis } from '../helpers/redis';
import { startGatewayProc, testEnv, Proc } from '../helpers/procs';
import { until } from '../helpers/http';

interface LogLine { level: string; service: string; msg: string; metric?: string; error?: string }

describe('metrics: a computed metric that fails is logged, with what happens next', function () {
  this.timeout(90_000);
  const redis = new TestRedis();
  let gw: Proc & { url: string };
  const lines = () => gw.logs.join('').split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as LogLine);
  const about = (metric: string, level: string) => lines().filter((l) => l.metric === metric && l.level === level);
  /** One scrape: its status, its time, and the samples of svc_job_states (state -> value). */
  const scrape = async () => {
    const t0 = Date.now();
    const r = await fetch(`${gw.url}/metrics`);
    const text = await r.text();
    const states = Object.fromEntries([...text.matchAll(/^svc_job_states\{state="([A-Z]+)"[^}]*\} (\d+)/gm)].map((m) => [m[1], Number(m[2])]));
    return { status: r.status, ms: Date.now() - t0, text, states };
  };

  before(async function () {
    this.timeout(60_000);
    await redis.start();
    // The rate limit stays on: with Redis away its count gets a second, then the request goes on uncounted
    // (platform/http.ts), so the scrapes below also show that no request hangs on the limiter.
    gw = await startGatewayProc({ ...testEnv(redis.url), LOG_LEVEL: 'info' });
  });
  after(async () => {
    await gw?.stop();
    await redis.stop();
  });

  it('with Redis up the job states are computed and nothing is logged about them', async () => {
    const s = await scrape();
    expect(s.status).to.equal(200);
    expect(s.states).to.include({ QUEUED: 0, RUNNING: 0, COMPLETED: 0 });
    expect(about('svc_job_states', 'warn')).to.deep.equal([]);
  });

  it('with Redis away, /metrics answers without those values, and one warning per metric says so and what happens next', async () => {
    await redis.kill();
    const first = await scrape();
    expect(first.status).to.equal(200);
    expect(first.ms, 'bounded by the 2 s compute timeout, not a hang').to.be.below(10_000);
    expect(first.text).to.include('# HELP svc_job_states');
    expect(first.states).to.deep.equal({});
    const warned = await until(() => about('svc_job_states', 'warn')[0], 5000, 'the warning');
    expect(warned.msg).to.equal('metric svc_job_states could not be computed: this scrape reports it without values, and the next scrape tries again');
    expect(warned.error).to.be.a('string').and.not.equal('');
    expect(about('svc_migration_total', 'warn'), 'every computed metric that failed is named').to.have.length(1);
    expect((await scrape()).states).to.deep.equal({});
    expect(about('svc_job_states', 'warn'), 'the next failed scrape logs at debug, not another warning').to.have.length(1);
  });

  it('when Redis is back the values return and the log says the metric is computed again', async () => {
    await redis.start();
    const s = await until(async () => { const x = await scrape(); return Object.keys(x.states).length ? x : undefined; }, 30_000, 'svc_job_states with values');
    expect(s.states).to.include({ QUEUED: 0 });
    expect(about('svc_job_states', 'info').map((l) => l.msg)).to.deep.equal(['metric svc_job_states is computed again']);
  });
});
