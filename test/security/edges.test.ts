// The edges of issue 33, each tried as the attacker's request against a real gateway and daemon on one Redis, with
// keys of each role: a keyless client flooding refusals gets 429 and cannot push the accepted requests' audit
// records out (the audit's sorted set and refusal stream are read in Redis); a spoofed X-Forwarded-For from an
// untrusted peer is not what the audit records (nor what the refusal budget counts), from a trusted proxy it is;
// a read key's GET /webhooks shows no token; /vms credentials in a query string are refused (400 naming the
// field); plans past FERRY_PLAN_MAX_STORED are 409 and past FERRY_PLAN_MAX_VMS 400 naming vms, nothing stored. And
// the plain metrics ports (the daemon's and a worker's) send the APIs' frame headers and CSP, and count and audit
// their refusals as the APIs do, in the same budget. The served OpenAPI document offers the X-VSphere-* headers,
// and a plan stored with the old string created_by is read as {name, role}.
import { expect } from 'chai';
import yaml from 'js-yaml';
import type IORedis from 'ioredis';
import { useStack, type Stack } from '../helpers/stack';
import { freePort } from '../helpers/redis';
import { Proc, startWorkerWithMetrics } from '../helpers/procs';
import { req } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import type { AuditRecord } from '../../platform/audit';
import type { AuditPage } from '../helpers/api-types';

const K = { ops: 'edges-admin-key-0123456789', ci: 'edges-submit-key-0123456789', viewer: 'edges-read-key-0123456789' };
const P = 'edg';
const BUDGET = 20;
const SAMPLE = 5;

describe('security: the edges (refusals, client address, webhook URLs, /vms query, plan caps)', function () {
  this.timeout(180_000);
  /** The gateway sits behind a proxy it trusts (127.0.0.1, where the test's requests come from); the daemon trusts none. */
  const s = useStack({
    name: 'sec-edges', prefix: P, gateway: { FERRY_TRUSTED_PROXIES: '127.0.0.1/32, ::1' },
    env: {
      LOG_LEVEL: 'warn', FERRY_SECRET_KEY: 'edges-test-secret-key', GOVC_URL: 'https://vc.example.test/sdk',
      FERRY_API_KEYS: `ops:admin:${K.ops},ci:submit:${K.ci},viewer:read:${K.viewer}`,
      FERRY_REFUSAL_LIMIT: String(BUDGET), FERRY_REFUSAL_WINDOW_SECONDS: '600', FERRY_REFUSAL_AUDIT_SAMPLE: String(SAMPLE),
      FERRY_REFUSAL_AUDIT_MAX_ENTRIES: '100', FERRY_AUDIT_MAX_ENTRIES: '1000', FERRY_PLAN_MAX_STORED: '3', FERRY_PLAN_MAX_VMS: '2',
    },
  });
  let gw: Stack['gw'];
  let dm: Stack['dm'];
  let rc: IORedis;
  const as = (k: string, more: Record<string, string> = {}) => ({ 'x-api-key': k, ...more });
  const accepted = async () => (await rc.zrange(`${P}:audit`, 0, -1)).map((r) => JSON.parse(r) as AuditRecord);
  const refusals = async () => (await rc.xrange(`${P}:audit:refusals`, '-', '+')).map(([, f]) => JSON.parse(f[1]) as AuditRecord);

  before(() => { ({ gw, dm, rc } = s); });

  it('X-Forwarded-For from an untrusted peer is not the audit ip; from a trusted proxy it is (its rightmost untrusted hop)', async () => {
    const spoofed = await req(dm.url, 'POST', '/jobs/cancel', { job_ids: ['edg-none'] }, as(K.ci, { 'x-forwarded-for': '203.0.113.66' }));
    expect(spoofed.status, spoofed.text).to.be.below(500);
    const viaProxy = await req(gw.url, 'POST', '/jobs', { job_id: 'edg-xff', operation: 'noop' }, as(K.ci, { 'x-forwarded-for': '6.6.6.6, 203.0.113.9' }));
    expect(viaProxy.status, viaProxy.text).to.equal(201);
    const recs = await accepted();
    const d = recs.find((r) => r.service === 'daemon' && r.path === '/jobs/cancel')!;
    expect(d.ip).to.equal('127.0.0.1');
    const g = recs.find((r) => r.targets.job_id === 'edg-xff')!;
    expect(g.ip).to.equal('203.0.113.9'); // the hop the trusted proxy saw; 6.6.6.6 is what the client claimed
  });

  it('a keyless client flooding refusals gets 429 past its budget; the accepted records stay; another address is not slowed', async () => {
    for (let i = 0; i < 3; i++) expect((await req(gw.url, 'POST', '/jobs', { job_id: `edg-ok-${i}`, operation: 'noop' }, as(K.ci))).status).to.equal(201);
    const flooder = { 'x-forwarded-for': '198.51.100.7' };
    const statuses: number[] = [];
    let retryAfter: string | null = null;
    // More refusals than the accepted records' cap (FERRY_AUDIT_MAX_ENTRIES 1000): before the refusal stream
    // they shared the cap, and these pushed every accepted record out.
    for (let batch = 0; batch < 60; batch++) {
      const rs = await Promise.all(Array.from({ length: 20 }, () => fetch(`${gw.url}/jobs`, { method: 'POST', headers: { 'content-type': 'application/json', ...flooder }, body: '{"operation":"noop"}' })));
      for (const r of rs) { statuses.push(r.status); if (r.status === 429) retryAfter = r.headers.get('retry-after'); await r.arrayBuffer(); }
    }
    expect(statuses.filter((s) => s === 401)).to.have.length(BUDGET);
    expect(statuses.filter((s) => s === 429)).to.have.length(1200 - BUDGET);
    expect(Number(retryAfter)).to.be.within(1, 600);
    // The accepted records are all there, in the accepted set; the refusals are a sample of SAMPLE, the rest counted.
    const ids = (await accepted()).map((r) => r.targets.job_id);
    expect(ids).to.include.members(['edg-xff', 'edg-ok-0', 'edg-ok-1', 'edg-ok-2']);
    expect((await accepted()).some((r) => r.ip === '198.51.100.7')).to.equal(false);
    const mine = (await refusals()).filter((r) => r.ip === '198.51.100.7');
    expect(mine).to.have.length(SAMPLE);
    expect(mine.every((r) => r.outcome === 'refused' && r.status === 401 && r.key_name === null)).to.equal(true);
    expect(Number(await rc.get(`${P}:audit:refusals:unwritten`))).to.equal(1200 - SAMPLE);
    const page = await req<AuditPage>(dm.url, 'GET', '/audit?limit=1000', undefined, as(K.ops));
    expect(page.status, page.text).to.equal(200);
    expect(page.body.refusals_unwritten).to.equal(1200 - SAMPLE);
    expect(page.body.records.filter((r) => r.ip === '198.51.100.7')).to.have.length(SAMPLE);
    // Another client address: refused as before (401), not 429; the flooder's own address with a good key: accepted.
    expect((await req(gw.url, 'POST', '/jobs', { operation: 'noop' }, { 'x-forwarded-for': '198.51.100.8' })).status).to.equal(401);
    expect((await req(gw.url, 'POST', '/jobs', { job_id: 'edg-after', operation: 'noop' }, as(K.ci, flooder))).status).to.equal(201);
  });

  it('behind no trusted proxy, a varied X-Forwarded-For does not escape the refusal budget (the socket address counts)', async () => {
    const statuses: number[] = [];
    for (let i = 0; i < BUDGET + 5; i++) {
      statuses.push((await req(dm.url, 'GET', '/jobs', undefined, { 'x-forwarded-for': `192.0.2.${i + 1}` })).status);
    }
    expect(statuses.slice(0, BUDGET).every((s) => s === 401)).to.equal(true);
    expect(statuses.slice(BUDGET)).to.deep.equal([429, 429, 429, 429, 429]);
    expect((await refusals()).filter((r) => r.service === 'daemon').every((r) => r.ip === '127.0.0.1')).to.equal(true);
    // A key that is accepted still passes from that address.
    expect((await req(dm.url, 'GET', '/jobs', undefined, as(K.viewer))).status).to.equal(200);
  });

  it("a read key's GET /webhooks shows the URL without its query or userinfo; an admin's shows it whole", async () => {
    const url = 'https://hook-user:hook-pass-77@93.184.216.34/ferry/in?token=s3cret-hook-token&x=1';
    const add = await req(dm.url, 'POST', '/webhooks', { url, events: ['job.completed'] }, as(K.ci));
    expect(add.status, add.text).to.equal(201);
    for (const base of ['', '/api/v1']) {
      const r = await req<{ webhooks: { url: string }[] }>(dm.url, 'GET', `${base}/webhooks`, undefined, as(K.viewer));
      expect(r.status).to.equal(200);
      expect(r.text).to.not.include('s3cret-hook-token').and.not.include('hook-pass-77').and.not.include('hook-user');
      expect(r.body.webhooks[0].url).to.equal('https://[redacted]@93.184.216.34/ferry/in?[redacted]');
      const sub = await req(dm.url, 'GET', `${base}/webhooks`, undefined, as(K.ci));
      expect(sub.text).to.not.include('s3cret-hook-token');
      const d = await req(dm.url, 'GET', `${base}/webhooks/0/deliveries`, undefined, as(K.viewer));
      expect(d.status).to.equal(200);
      expect(d.text).to.not.include('s3cret-hook-token');
    }
    const admin = await req<{ webhooks: { url: string }[] }>(dm.url, 'GET', '/webhooks', undefined, as(K.ops));
    expect(admin.body.webhooks[0].url).to.equal(url);
  });

  it('/vms credentials in a query string are refused with 400 naming the field, and never reach a log line', async () => {
    for (const [p, field] of [['/vms/list?password=qs-secret-pw-1', 'password'], ['/api/v1/vms/resources?username=qs-user', 'username'], ['/vms/info?path=/DC0/vm/a&password=qs-secret-pw-1', 'password']]) {
      const r = await req<DaemonError>(dm.url, 'GET', p, undefined, as(K.viewer));
      expect(r.status, `${p}: ${r.text}`).to.equal(400);
      expect(r.body.fields!.map((f) => f.field), p).to.deep.equal([field]);
      expect(r.body.error).to.include('query string').and.include('X-VSphere-');
    }
    expect(dm.logs.join('')).to.not.include('qs-secret-pw-1');
  });

  it('the served OpenAPI document declares X-VSphere-Username/Password as header parameters of the /vms GETs that take credentials; one past its length is a 400 naming it', async () => {
    const r = await req(dm.url, 'GET', '/openapi.yaml');
    expect(r.status).to.equal(200);
    const doc = yaml.load(r.text) as { paths: Record<string, Record<string, { parameters?: { name: string; in: string; required: boolean; schema: { type: string; maxLength?: number } }[] }>> };
    for (const p of ['/vms/list', '/vms/info', '/vms/resources']) {
      const headers = (doc.paths[p].get.parameters ?? []).filter((x) => x.in === 'header');
      expect(headers.map((x) => [x.name, x.required, x.schema.type, x.schema.maxLength]), p).to.deep.equal([['X-VSphere-Username', false, 'string', 256], ['X-VSphere-Password', false, 'string', 1024]]);
      // Never as query parameters: the query refuses them.
      expect((doc.paths[p].get.parameters ?? []).filter((x) => x.in === 'query').map((x) => x.name), p).to.not.include.members(['username', 'password']);
    }
    // The managers list takes none, the actions take them in their body.
    expect((doc.paths['/vms/managers'].get.parameters ?? []).filter((x) => x.in === 'header')).to.deep.equal([]);
    expect((doc.paths['/vms/poweroff'].post.parameters ?? []).filter((x) => x.in === 'header')).to.deep.equal([]);
    for (const [name, value] of [['X-VSphere-Username', 'u'.repeat(257)], ['X-VSphere-Password', 'p'.repeat(1025)]]) {
      const bad = await req<DaemonError>(dm.url, 'GET', '/api/v1/vms/list', undefined, as(K.viewer, { [name]: value }));
      expect(bad.status, bad.text).to.equal(400);
      expect(bad.body.fields!.map((f) => f.field)).to.deep.equal([name]);
      expect(bad.text).to.not.include(value);
    }
  });

  it('a plan stored with the old string created_by (and a string started_by) is read as {name, role} with no role above submit; a change writes it back so', async () => {
    const body = { id: 'edg-old', name: 'edg-old', vms: ['/DC0/vm/a'], network_map: { 'VM Network': 'default' }, storage_map: { LocalDS_0: 'default' } };
    expect((await req(dm.url, 'POST', '/plans', body, as(K.ops))).status).to.equal(201);
    const key = `${P}:plan:edg-old`;
    const old = JSON.parse((await rc.get(key))!) as Record<string, unknown>;
    // As a plan stored before callers were records: the key's name only, and no starter.
    old.created_by = 'ops';
    delete old.started_by;
    await rc.set(key, JSON.stringify(old));
    type Read = { created_by: { name: string; role: string | null }; started_by?: { name: string; role: string | null } | null };
    const one = await req<Read>(dm.url, 'GET', '/plans/edg-old', undefined, as(K.viewer));
    expect(one.status, one.text).to.equal(200);
    expect(one.body.created_by).to.deep.equal({ name: 'ops', role: 'submit' });
    const list = await req<{ plans: (Read & { id: string })[] }>(dm.url, 'GET', '/plans', undefined, as(K.viewer));
    expect(list.body.plans.find((x) => x.id === 'edg-old')!.created_by).to.deep.equal({ name: 'ops', role: 'submit' });
    // A string started_by (an admin key's name) gives the plan's jobs no more than submit.
    await rc.set(key, JSON.stringify({ ...old, started_by: 'ops' }));
    expect((await req<Read>(dm.url, 'GET', '/plans/edg-old', undefined, as(K.viewer))).body.started_by).to.deep.equal({ name: 'ops', role: 'submit' });
    await rc.set(key, JSON.stringify({ ...old, created_by: 'anonymous' }));
    expect((await req<Read>(dm.url, 'GET', '/plans/edg-old', undefined, as(K.viewer))).body.created_by).to.deep.equal({ name: 'anonymous', role: null });
    // A change writes the plan back in the current form.
    await rc.set(key, JSON.stringify(old));
    const put = await req(dm.url, 'PUT', '/plans/edg-old', { description: 'changed' }, as(K.ci));
    expect(put.status, put.text).to.equal(200);
    expect((JSON.parse((await rc.get(key))!) as Read).created_by).to.deep.equal({ name: 'ops', role: 'submit' });
    expect((await req(dm.url, 'DELETE', '/plans/edg-old', undefined, as(K.ci))).status).to.equal(200);
  });

  it('plans: a fourth past FERRY_PLAN_MAX_STORED=3 is 409, three VMs past FERRY_PLAN_MAX_VMS=2 are 400 naming vms; nothing stored', async () => {
    const plan = (id: string, vms: string[]) => ({ id, name: id, vms, network_map: { 'VM Network': 'default' }, storage_map: { LocalDS_0: 'default' } });
    const big = await req<DaemonError>(dm.url, 'POST', '/plans', plan('edg-big', ['/DC0/vm/a', '/DC0/vm/b', '/DC0/vm/c']), as(K.ci));
    expect(big.status, big.text).to.equal(400);
    expect(big.body.fields!.map((f) => f.field)).to.deep.equal(['vms']);
    expect(await rc.exists(`${P}:plan:edg-big`)).to.equal(0);
    for (const id of ['edg-p1', 'edg-p2', 'edg-p3']) expect((await req(dm.url, 'POST', '/plans', plan(id, ['/DC0/vm/a']), as(K.ci))).status).to.equal(201);
    const grow = await req<DaemonError>(dm.url, 'PUT', '/plans/edg-p1', { vms: ['/DC0/vm/a', '/DC0/vm/b', '/DC0/vm/c'] }, as(K.ci));
    expect(grow.status, grow.text).to.equal(400);
    expect(grow.body.fields!.map((f) => f.field)).to.deep.equal(['vms']);
    expect((JSON.parse((await rc.get(`${P}:plan:edg-p1`))!) as { vms: unknown[] }).vms).to.have.length(1);
    const fourth = await req<DaemonError>(dm.url, 'POST', '/plans', plan('edg-p4', ['/DC0/vm/a']), as(K.ci));
    expect(fourth.status, fourth.text).to.equal(409);
    expect(fourth.body.error).to.include('FERRY_PLAN_MAX_STORED');
    expect(await rc.zcard(`${P}:plans`)).to.equal(3);
    expect(await rc.exists(`${P}:plan:edg-p4`)).to.equal(0);
    // Deleting one makes room again.
    expect((await req(dm.url, 'DELETE', '/plans/edg-p3', undefined, as(K.ci))).status).to.equal(200);
    expect((await req(dm.url, 'POST', '/plans', plan('edg-p4', ['/DC0/vm/a']), as(K.ci))).status).to.equal(201);
  });
});

describe('security: the plain metrics ports (daemon metrics.port, a worker\'s --metrics-port) answer as the APIs do', function () {
  this.timeout(180_000);
  const M = 'edgm';
  const KEY = 'edges-metrics-read-key-0123456789';
  let dmMetrics = 0;
  before(async () => { dmMetrics = await freePort(); });
  const s = useStack({
    name: 'sec-edges-metrics', prefix: M, gateway: false,
    daemonYaml: () => `metrics:\n  enabled: true\n  port: ${dmMetrics}\n`,
    // Every refusal of the one address is written (no sampling), so the records can be counted.
    env: { FERRY_API_KEYS: `viewer:read:${KEY}`, FERRY_REFUSAL_LIMIT: String(BUDGET), FERRY_REFUSAL_WINDOW_SECONDS: '600', FERRY_REFUSAL_AUDIT_SAMPLE: '1000' },
  });
  let worker: Proc & { metricsPort: number };
  const ports = () => ({ daemon: `http://127.0.0.1:${dmMetrics}`, worker: `http://127.0.0.1:${worker.metricsPort}` });
  const refusals = async () => (await s.rc.xrange(`${M}:audit:refusals`, '-', '+')).map(([, f]) => JSON.parse(f[1]) as AuditRecord);

  before(async () => {
    worker = await s.add(startWorkerWithMetrics(s.env, 'edgm-w', ['img_tool']));
  });

  it('every answer (200, 401, 403, 404, /health) carries X-Frame-Options: DENY and the APIs\' strict CSP', async () => {
    const api = await req(s.dm.url, 'GET', '/health');
    const csp = api.headers.get('content-security-policy');
    expect(csp).to.include("frame-ancestors 'none'").and.include("default-src 'self'");
    const seen: string[] = [];
    for (const [name, base] of Object.entries(ports())) {
      for (const [p, headers, status] of [['/metrics', { 'x-api-key': KEY }, 200], ['/metrics', {}, 401], ['/metrics', { 'x-api-key': 'edges-nobody-0123456789' }, 403], ['/nothing-here', { 'x-api-key': KEY }, 404]] as const) {
        const r = await req(base, 'GET', p, undefined, headers);
        expect(r.status, `${name} ${p}: ${r.text}`).to.equal(status);
        expect(r.headers.get('x-frame-options'), `${name} ${p} ${status}`).to.equal('DENY');
        expect(r.headers.get('content-security-policy'), `${name} ${p} ${status}`).to.equal(csp);
        expect(r.headers.get('x-content-type-options')).to.equal('nosniff');
        seen.push(`${name} ${status}`);
      }
    }
    expect(seen).to.have.length(8);
    const health = await req(ports().worker, 'GET', '/health');
    expect(health.status).to.equal(200);
    expect(health.headers.get('x-frame-options')).to.equal('DENY');
    expect(health.headers.get('content-security-policy')).to.equal(csp);
  });

  it('refusals on both ports count against the address\'s refusal budget with the API\'s own: 429 with Retry-After past it, each audited', async () => {
    const before = (await refusals()).length; // the 401s and 403s of the test above: 2 a port
    expect(before).to.equal(4);
    const statuses: { name: string; status: number; retryAfter: string | null }[] = [];
    for (let i = 0; statuses.length < BUDGET + 6; i++) {
      for (const [name, base] of Object.entries(ports())) {
        const r = await req(base, 'GET', '/metrics');
        statuses.push({ name, status: r.status, retryAfter: r.headers.get('retry-after') });
        expect(r.headers.get('x-frame-options')).to.equal('DENY');
      }
    }
    // The budget is one count in Redis for the address, whichever port or API refused it.
    expect(statuses.slice(0, BUDGET - before).every((x) => x.status === 401), JSON.stringify(statuses)).to.equal(true);
    const over = statuses.slice(BUDGET - before);
    expect(over.map((x) => x.status)).to.deep.equal(over.map(() => 429));
    expect(over.every((x) => Number(x.retryAfter) >= 1 && Number(x.retryAfter) <= 600)).to.equal(true);
    expect(new Set(over.map((x) => x.name))).to.deep.equal(new Set(['daemon', 'worker']));
    // The API's refusal of the same address is past the budget too; a good key passes everywhere.
    expect((await req(s.dm.url, 'GET', '/jobs')).status).to.equal(429);
    for (const base of Object.values(ports())) expect((await req(base, 'GET', '/metrics', undefined, { 'x-api-key': KEY })).status).to.equal(200);
    // Each refusal is in the refusal stream, with the service, path and outcome; the accepted set holds none.
    const recs = (await refusals()).filter((r) => r.path === '/metrics');
    expect(recs.filter((r) => r.status === 401 || r.status === 403)).to.have.length(BUDGET);
    expect(recs.filter((r) => r.status === 429)).to.have.length(over.length);
    for (const service of ['daemon', 'worker']) {
      const mine = recs.filter((r) => r.service === service);
      expect(mine.length, service).to.equal(statuses.filter((x) => x.name === service).length + 2);
      expect(mine.every((r) => r.method === 'GET' && r.ip === '127.0.0.1' && r.key_name === null)).to.equal(true);
      expect(mine.filter((r) => r.status === 401).every((r) => r.outcome === 'refused')).to.equal(true);
      expect(mine.filter((r) => r.status === 429).every((r) => r.outcome === 'rejected')).to.equal(true);
    }
    expect((await s.rc.zrange(`${M}:audit`, 0, -1)).filter((r) => r.includes('/metrics'))).to.deep.equal([]);
  });
});
