// The audit log (issue 18 item 12) against a real gateway, a real daemon and a real Redis, with a key of each
// role: a POST that changes state and a refused key each leave one record with the right fields; a password sent
// in a body is in neither Redis nor the log line; filters work on both path forms; only admin reads it; records
// older than the retention are gone after the next write; refused WebSocket upgrades are recorded as well.
import { expect } from 'chai';
import path from 'node:path';
import type IORedis from 'ioredis';
import WebSocket from 'ws';
import type { TestRedis } from '../helpers/redis';
import type { Proc } from '../helpers/procs';
import { useStack, type Stack } from '../helpers/stack';
import { req, until } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import type { AuditRecord } from '../../platform/audit';
import type { AuditPage, BatchSubmitted } from '../helpers/api-types';

/** One structured log line; an audit line carries the record. */
interface LogLine { msg: string; audit?: AuditRecord }

const K = { ops: 'audit-admin-key-0123456789', ci: 'audit-submit-key-0123456789', viewer: 'audit-read-key-0123456789', fleet: 'audit-worker-key-0123456789' };
const SECRET = 'Hunter2-audit-pw-never-stored';

describe('security: the audit log', function () {
  this.timeout(120_000);
  const s = useStack({
    name: 'sec-audit', prefix: 'aud',
    env: {
      FERRY_SECRET_KEY: 'audit-test-secret-key', FERRY_VSPHERE_MANAGERS: 'vc.example.test', LOG_LEVEL: 'warn',
      FERRY_API_KEYS: `ops:admin:${K.ops},ci:submit:${K.ci},viewer:read:${K.viewer},fleet:worker:${K.fleet}`,
    },
  });
  let gw: Stack['gw'];
  let dm: Stack['dm'];
  let rc: IORedis;
  let redis: TestRedis;
  let dir: string;
  before(() => { ({ gw, dm, rc, redis, dir } = s); });
  const as = (k: string) => ({ 'x-api-key': k });
  /** Every record in Redis, oldest first: the accepted requests' sorted set and the refusals' stream (sampled). */
  const stored = async () => [
    ...(await rc.zrange('aud:audit', 0, -1)).map((r) => JSON.parse(r) as AuditRecord),
    ...(await rc.xrange('aud:audit:refusals', '-', '+')).map(([, f]) => JSON.parse(f[1]) as AuditRecord),
  ].sort((a, b) => Date.parse(a.time) - Date.parse(b.time));
  const audit = async (q = '', base = '') => {
    const r = await req<AuditPage>(dm.url, 'GET', `${base}/audit${q}`, undefined, as(K.ops));
    expect(r.status, r.text).to.equal(200);
    return r.body.records;
  };
  /** The structured log lines of a process that carry an audit record. */
  const auditLines = (p: Proc) => p.logs.join('').split('\n').filter((l) => l.includes('"msg":"audit"')).map((l) => JSON.parse(l) as LogLine);
  /** Every value Redis holds, as text (strings, hashes, lists, sets, sorted sets, streams). */
  async function everything(): Promise<string> {
    const out: string[] = [];
    for (const key of await rc.keys('*')) {
      const t = await rc.type(key);
      if (t === 'string') out.push(String(await rc.get(key)));
      else if (t === 'hash') out.push(JSON.stringify(await rc.hgetall(key)));
      else if (t === 'list') out.push(JSON.stringify(await rc.lrange(key, 0, -1)));
      else if (t === 'set') out.push(JSON.stringify(await rc.smembers(key)));
      else if (t === 'zset') out.push(JSON.stringify(await rc.zrange(key, 0, -1)));
      else if (t === 'stream') out.push(JSON.stringify(await rc.xrange(key, '-', '+')));
    }
    return out.join('\n');
  }

  it('a POST /jobs on the gateway leaves one record: time, key name and role, method, route and path, job id, status, outcome', async () => {
    const t0 = Date.now();
    const r = await req(gw.url, 'POST', '/jobs', { job_id: 'aud-noop-1', operation: 'noop' }, as(K.ci));
    expect(r.status, r.text).to.equal(201);
    const recs = (await stored()).filter((x) => x.targets.job_id === 'aud-noop-1');
    expect(recs).to.have.length(1);
    const rec = recs[0];
    expect(rec).to.include({ service: 'gateway', key_name: 'ci', role: 'submit', method: 'POST', route: '/jobs', path: '/jobs', status: 201, outcome: 'ok' });
    expect(Date.parse(rec.time)).to.be.within(t0 - 1000, Date.now());
    const line = await until(() => auditLines(gw).find((l) => l.audit?.id === rec.id), 5000, 'the log line');
    expect(line.audit).to.deep.equal(rec);
  });

  it('a password in a daemon body is in neither Redis nor the log line; the record names the created job', async () => {
    const r = await req<BatchSubmitted>(dm.url, 'POST', '/jobs/submit', { vm_path: '/DC0/vm/web1', output_path: path.join(dir, 'out'), manager_url: 'https://vc.example.test/sdk', username: 'admin', password: SECRET }, as(K.ci));
    expect(r.status, r.text).to.equal(200);
    const id = r.body.job_ids[0];
    const rec = (await stored()).find((x) => x.path === '/jobs/submit');
    expect(rec).to.include({ service: 'daemon', key_name: 'ci', role: 'submit', method: 'POST', status: 200, outcome: 'ok' });
    expect(rec!.targets.job_ids).to.deep.equal([id]);
    expect(rec!.targets.vm_path).to.equal('/DC0/vm/web1');
    await until(() => auditLines(dm).some((l) => l.audit?.path === '/jobs/submit'), 5000, 'the log line');
    expect(await everything()).to.not.include(SECRET);
    expect(dm.logs.join('')).to.not.include(SECRET);
  });

  it('refused keys leave one record each: unknown key (403), no key (401, a GET too), a role too low (403) with its name', async () => {
    expect((await req(gw.url, 'POST', '/jobs', { job_id: 'aud-x', operation: 'noop' }, as('not-a-key-but-long-enough'))).status).to.equal(403);
    expect((await req(dm.url, 'GET', '/jobs')).status).to.equal(401);
    expect((await req(dm.url, 'POST', '/jobs/cancel', { job_ids: ['aud-noop-1'] }, as(K.viewer))).status).to.equal(403);
    const all = await stored();
    const unknown = all.filter((x) => x.service === 'gateway' && x.status === 403);
    expect(unknown).to.have.length(1);
    expect(unknown[0]).to.include({ key_name: null, role: null, outcome: 'refused', method: 'POST', path: '/jobs', reason: 'the API key is not accepted' });
    const none = all.filter((x) => x.status === 401);
    expect(none).to.have.length(1);
    expect(none[0]).to.include({ service: 'daemon', method: 'GET', path: '/jobs', outcome: 'refused', key_name: null });
    const low = all.filter((x) => x.path === '/jobs/cancel');
    expect(low).to.have.length(1);
    expect(low[0]).to.include({ key_name: 'viewer', role: 'read', status: 403, outcome: 'refused' });
    expect(low[0].targets.job_ids).to.deep.equal(undefined); // refused before the body was read
    expect(JSON.stringify(all)).to.not.include('not-a-key-but-long-enough').and.not.include(K.viewer);
    expect(gw.logs.join('') + dm.logs.join('')).to.not.include('not-a-key-but-long-enough');
  });

  it('a refused WebSocket upgrade leaves a record too: /ws with an unknown key, and one from a foreign Origin', async () => {
    const refusedWith = (headers: Record<string, string>) => new Promise<number>((resolve, reject) => {
      const ws = new WebSocket(`${dm.url.replace('http', 'ws')}/ws`, { headers });
      ws.once('unexpected-response', (_q, res) => { resolve(res.statusCode!); ws.terminate(); });
      ws.once('open', () => { ws.close(); reject(new Error('the upgrade was accepted')); });
      ws.once('error', () => undefined); // the refusal above settles the promise
    });
    expect(await refusedWith({ 'x-api-key': 'ws-not-a-key-but-long-enough' })).to.equal(403);
    expect(await refusedWith({ 'x-api-key': K.viewer, origin: 'http://evil.example' })).to.equal(403);
    const ws = (await stored()).filter((x) => x.method === 'WEBSOCKET');
    expect(ws).to.have.length(2);
    expect(ws[0]).to.include({ service: 'daemon', path: '/ws', status: 403, outcome: 'refused', key_name: null, reason: 'the API key is not accepted' });
    expect(ws[1]).to.include({ path: '/ws', status: 403, outcome: 'refused', key_name: 'viewer', role: 'read' });
    expect(ws[1].reason).to.match(/Origin/);
    expect(JSON.stringify(ws)).to.not.include('ws-not-a-key-but-long-enough');
  });

  it('GET /audit filters by key, path, time range and limit, on both path forms; GETs that succeed are not recorded', async () => {
    const byCi = await audit('?key=ci');
    expect(byCi.length).to.equal(2);
    expect(byCi.every((x) => x.key_name === 'ci')).to.equal(true);
    expect(byCi[0].path).to.equal('/jobs/submit'); // newest first
    expect((await audit('?path=/jobs/submit', '/api/v1')).map((x) => x.path)).to.deep.equal(['/jobs/submit']);
    expect((await audit('?path=/jobs/:job_id')).length).to.equal(0);
    expect((await audit('?limit=1')).length).to.equal(1);
    const first = (await stored())[0];
    const t = Date.parse(first.time);
    expect((await audit(`?until=${new Date(t).toISOString()}`)).map((x) => x.id)).to.deep.equal([first.id]);
    expect((await audit(`?since=${new Date(Date.now() + 60_000).toISOString()}`))).to.deep.equal([]);
    expect((await stored()).some((x) => x.method === 'GET' && x.status === 200)).to.equal(false);
    const bad = await req<DaemonError>(dm.url, 'GET', '/audit?limit=0&since=yesterday', undefined, as(K.ops));
    expect(bad.status).to.equal(400);
    expect(bad.body.error).to.include('limit').and.include('since');
  });

  it('a submit or read key gets 403 on /audit (and the refusal is itself recorded)', async () => {
    for (const [name, k] of [['ci', K.ci], ['viewer', K.viewer]]) {
      for (const base of ['', '/api/v1']) {
        const r = await req(dm.url, 'GET', `${base}/audit`, undefined, as(k));
        expect(r.status, `${name} ${base}`).to.equal(403);
        expect(r.text).to.not.include('"records"');
      }
    }
    const refused = (await stored()).filter((x) => x.route?.endsWith('/audit') && x.status === 403);
    expect(refused.map((x) => x.key_name).sort()).to.deep.equal(['ci', 'ci', 'viewer', 'viewer']);
  });

  it('a worker\'s heartbeats are counted in the request metrics, not recorded; its registration and a heartbeat it was refused are', async () => {
    expect((await req(gw.url, 'POST', '/workers/register', { worker_id: 'aud-w1', capabilities: ['img_tool'] }, as(K.fleet))).status).to.equal(201);
    for (let i = 0; i < 3; i++) expect((await req(gw.url, 'POST', '/workers/aud-w1/heartbeat', {}, as(K.fleet))).status).to.equal(200);
    const refused = await req(gw.url, 'POST', '/workers/aud-nobody/heartbeat', {}, as(K.fleet));
    expect(refused.status, refused.text).to.be.within(400, 499);
    const mine = (await stored()).filter((x) => x.key_name === 'fleet');
    expect(mine.map((x) => [x.route, x.status])).to.deep.equal([['/workers/register', 201], ['/workers/:worker_id/heartbeat', refused.status]]);
    expect(mine[1].outcome).to.be.oneOf(['refused', 'rejected']);
    const m = await req(gw.url, 'GET', '/metrics', undefined, as(K.ops));
    const line = m.text.split('\n').find((l) => l.startsWith('svc_api_requests_total{') && l.includes('path="/workers/:worker_id/heartbeat"') && l.includes('status="200"'));
    expect(line, m.text.split('\n').filter((l) => l.startsWith('svc_api_requests_total')).join('\n')).to.match(/ 3$/);
  });

  it('records older than the job retention are removed by the next write; younger ones stay', async () => {
    const day = 86_400_000;
    const old = { id: 'planted-old', time: new Date(Date.now() - 8 * day).toISOString(), path: '/old' };
    const young = { id: 'planted-young', time: new Date(Date.now() - 6 * day).toISOString(), path: '/young' };
    await rc.zadd('aud:audit', Date.parse(old.time), JSON.stringify(old), Date.parse(young.time), JSON.stringify(young));
    expect((await req(gw.url, 'DELETE', '/jobs/aud-noop-1', undefined, as(K.ci))).status).to.be.oneOf([200, 400]);
    const ids = (await stored()).map((x) => x.id);
    expect(ids).to.not.include('planted-old');
    expect(ids).to.include('planted-young');
    expect((await stored()).find((x) => x.method === 'DELETE')).to.include({ key_name: 'ci', route: '/jobs/:job_id', path: '/jobs/aud-noop-1' });
  });

  it('with Redis away, a refused request is still answered at once (log line written), and its record lands when Redis is back', async () => {
    await redis.kill();
    const t0 = Date.now();
    const r = await req(gw.url, 'POST', '/jobs', { job_id: 'aud-away', operation: 'noop' }, as('while-redis-is-away-0123'));
    expect(r.status).to.equal(403);
    expect(Date.now() - t0).to.be.below(5000);
    await until(() => auditLines(gw).some((l) => l.audit?.status === 403 && l.audit?.targets?.job_id === undefined && Date.parse(l.audit.time) >= t0), 5000, 'the log line');
    await redis.start();
    await until(async () => (await stored()).some((x) => x.status === 403 && Date.parse(x.time) >= t0 && x.path === '/jobs'), 30000, 'the record in Redis');
  });
});
