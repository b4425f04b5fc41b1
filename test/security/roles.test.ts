// Roles as docs/security.md says, tried against the real gateway, daemon and scheduler on a private Redis: the
// role table in the doc is what the route declarations generate (scripts/gen-role-table.ts); every route of both
// OpenAPI documents, under both of the daemon's path forms, answers 401 without a key and 403 to each role that
// does not reach it, and neither to one that does; a route cannot be registered without a role. Then the
// privilege attacks: a submit key listing nbd_access on a noop to get the privileged mode, and a schedule whose
// template asks for it, refused at creation, at a change and when it fires (counted as a failed run, no job).
import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import type IORedis from 'ioredis';
import { startProcess } from '../helpers/procs';
import { useStack, type Stack } from '../helpers/stack';
import { req, until } from '../helpers/http';
import type { DaemonError, JobApiError } from '../helpers/http';
import type { Schedule, ScheduleCreated, ScheduleView, Triggered } from '../helpers/api-types';
import { fetchDocs, RoleRow, SECURITY_DOC, tableFor, tableInDoc } from '../../scripts/gen-role-table';
import { Api, type RouteDef } from '../../platform/http';
import { keys } from '../../platform/redis';

const K = { read: 'roles-reader-0123456789abcdef', submit: 'roles-submitter-0123456789ab', worker: 'roles-worker-0123456789abcdef', admin: 'roles-admin-0123456789abcdef' };
type Role = keyof typeof K;
const ROLES = Object.keys(K) as Role[];
const GRANTS: Record<Role, string[]> = { read: ['read'], submit: ['read', 'submit'], worker: ['read', 'worker'], admin: ['read', 'submit', 'worker', 'admin'] };
const as = (r: Role) => ({ 'X-API-Key': K[r] });
const PRIV = { capabilities: ['nbd_access'], execution_mode: 'PRIVILEGED_CONTAINER' };

/** A concrete path for a documented one: ids nobody has (404 after the role check), indexes 0. */
const concrete = (p: string) => p.replace(/\{index\}/g, '0').replace(/\{[^}]+\}/g, 'nope-roles');

describe('security: roles as the doc says, declared once per route', function () {
  this.timeout(180_000);
  // The walk below is hundreds of refusals from one address by design: the refusal budget (429 past it,
  // test/security/edges.test.ts) is off here, so each answer is the role's own.
  const st = useStack({
    name: 'sec-roles', prefix: 'roles', daemonYaml: '{}\n',
    env: { FERRY_API_KEYS: ROLES.map((role) => `${role}-key:${role}:${K[role]}`).join(','), FERRY_API_KEYS_FILE: '', FERRY_REFUSAL_LIMIT: '0' },
  });
  let gw: Stack['gw'];
  let dm: Stack['dm'];
  let r: IORedis;
  const k = keys('roles');

  before(() => {
    ({ gw, dm, rc: r } = st);
    st.procs.push(startProcess('services/scheduler/main.ts', ['--config', st.config], st.env));
  });

  it('the table in docs/security.md is the one the route declarations generate', async () => {
    const docs = await fetchDocs(gw.url, dm.url);
    const inDoc = tableInDoc(readFileSync(SECURITY_DOC, 'utf8'));
    expect(inDoc, 'role table markers in docs/security.md').to.not.equal(null);
    expect(inDoc!.text, 'docs/security.md is stale: run npx tsx scripts/gen-role-table.ts').to.equal(tableFor(docs.gateway, docs.daemon));
    for (const row of inDoc!.rows) expect(['public', ...ROLES], `${row.method} ${row.path}`).to.include(row.role);
  });

  it('a route without a role cannot be registered', () => {
    const api = new Api();
    expect(() => api.add({ method: 'post', path: '/undeclared', summary: 'x', responses: {}, handler: () => 'x' } as Omit<RouteDef, 'role'> as RouteDef)).to.throw(/declares no role/);
    expect(api.routes).to.have.length(0);
  });

  it('every route of both OpenAPI documents answers each role as the table says (both daemon path forms)', async () => {
    const rows = tableInDoc(readFileSync(SECURITY_DOC, 'utf8'))!.rows.filter((x) => !x.method.startsWith('WS') && !x.method.startsWith('PLAN'));
    const targets = (row: RoleRow) => (row.api === 'gateway' ? [gw.url + concrete(row.path)] : ['', '/api/v1'].map((pre) => dm.url + pre + concrete(row.path)));
    const wrong: string[] = [];
    let calls = 0;
    for (const row of rows) {
      for (const url of targets(row)) {
        const call = async (h: Record<string, string> = {}) => {
          calls++;
          // Without a body: a role that reaches the route gets a 400/404 at most, never a change.
          const res = await fetch(url, { method: row.method, headers: h, signal: AbortSignal.timeout(20_000) });
          await res.body?.cancel();
          return res.status;
        };
        const label = `${row.method} ${url.replace(/^http:\/\/[^/]+/, '')}`;
        const none = await call();
        if (row.role === 'public' ? [401, 403].includes(none) : none !== 401) wrong.push(`${label} without a key: ${none}`);
        for (const role of ROLES) {
          const got = await call(as(role));
          const allowed = row.role === 'public' || GRANTS[role].includes(row.role);
          if (allowed ? [401, 403].includes(got) : got !== 403) wrong.push(`${label} as ${role} (route needs ${row.role}): ${got}`);
        }
      }
    }
    expect(wrong, wrong.join('\n')).to.deep.equal([]);
    expect(calls).to.be.greaterThan(400);
  });

  it('a submit key listing nbd_access on a noop gets no privileged mode: 403, no job', async () => {
    const attack = await req<JobApiError>(gw.url, 'POST', '/jobs?queue=true', { job_id: 'priv-noop', operation: 'noop', requirements: PRIV }, as('submit'));
    expect(attack.status, attack.text).to.equal(403);
    expect(attack.body.error.message).to.include('requirements.execution_mode').and.include('capabilities a job lists do not count');
    expect(await r.exists(k.job('priv-noop')), 'job record in Redis').to.equal(0);
    // The same through the daemon's operation form.
    const viaDaemon = await req(dm.url, 'POST', '/jobs/operation', { operation: 'noop', requirements: PRIV }, as('submit'));
    expect(viaDaemon.status, viaDaemon.text).to.equal(403);
    // Listing a capability without the mode only routes the job; an admin may ask for the mode.
    expect((await req(gw.url, 'POST', '/jobs', { job_id: 'routed-noop', operation: 'noop', requirements: { capabilities: ['nbd_access'] } }, as('submit'))).status).to.equal(201);
    expect((await req(gw.url, 'POST', '/jobs', { job_id: 'admin-priv', operation: 'noop', requirements: PRIV }, as('admin'))).status).to.equal(201);
  });

  it('a schedule by a submit key whose template asks for PRIVILEGED_CONTAINER is refused; so is such a change', async () => {
    const template = { operation: 'noop', requirements: PRIV };
    for (const p of ['/schedules', '/api/v1/schedules/create']) {
      const res = await req<DaemonError>(dm.url, 'POST', p, { id: 'priv-sched', name: 'priv', schedule: '0 3 * * *', job_template: template }, as('submit'));
      expect(res.status, res.text).to.equal(403);
      expect(res.body.error).to.include('job_template.requirements.execution_mode');
    }
    expect(await r.hexists(k.schedules, 'priv-sched'), 'schedule stored').to.equal(0);
    const ok = await req<ScheduleCreated>(dm.url, 'POST', '/schedules', { id: 'plain-sched', name: 'plain', schedule: '0 3 * * *', job_template: { operation: 'noop' } }, as('submit'));
    expect(ok.status, ok.text).to.equal(201);
    expect(ok.body.schedule.owner).to.deep.equal({ key: 'submit-key', role: 'submit' });
    const change = await req(dm.url, 'PUT', '/schedules/plain-sched', { job_template: template }, as('submit'));
    expect(change.status, change.text).to.equal(403);
    expect((JSON.parse((await r.hget(k.schedules, 'plain-sched'))!) as Schedule).job_template, 'stored template').to.not.have.property('requirements');
  });

  it('a stored schedule whose template its owner may not run is refused when it fires: a failed run with the reason, no job', async () => {
    // As if the template was stored before the rule existed: written straight into Redis, owned by a submit key.
    const s = { id: 'legacy-priv', name: 'legacy', description: '', schedule: '* * * * * *', timezone: 'UTC', enabled: true, job_template: { operation: 'noop', requirements: PRIV }, created_at: new Date().toISOString(), updated_at: new Date().toISOString(), owner: { key: 'submit-key', role: 'submit' } };
    await r.hset(k.schedules, s.id, JSON.stringify(s));
    const trig = await req<Triggered>(dm.url, 'POST', `/schedules/${s.id}/trigger`, undefined, as('submit'));
    expect(trig.status, trig.text).to.equal(200);
    expect(trig.body.job_id).to.equal(null);
    const v = (await req<ScheduleView>(dm.url, 'GET', `/schedules/${s.id}`, undefined, as('read'))).body;
    expect(v.failed_runs).to.equal(1);
    expect(v.last_error).to.include('requirements.execution_mode');
    // The scheduler process fires it by cron too (the schedule is enabled once synced): each run refused the same way.
    await req(dm.url, 'POST', `/schedules/${s.id}/enable`, undefined, as('submit'));
    await until(async () => (await req<ScheduleView>(dm.url, 'GET', `/schedules/${s.id}`, undefined, as('read'))).body.failed_runs >= 3, 30000, 'cron runs refused');
    await req(dm.url, 'POST', `/schedules/${s.id}/disable`, undefined, as('submit'));
    const jobs = (await r.keys(`${k.prefix}:job:sched-${s.id}-*`)).filter((x) => !x.includes(':', `${k.prefix}:job:`.length));
    expect(jobs, 'jobs created by the refused runs').to.deep.equal([]);
    const after = (await req<ScheduleView>(dm.url, 'GET', `/schedules/${s.id}`, undefined, as('read'))).body;
    expect(after.successful_runs).to.equal(0);
    // The same template owned by an admin (created with an admin key) runs.
    const adm = await req(dm.url, 'POST', '/schedules', { id: 'admin-priv', name: 'admin', schedule: '0 3 * * *', job_template: s.job_template }, as('admin'));
    expect(adm.status, adm.text).to.equal(201);
    const t2 = await req<Triggered>(dm.url, 'POST', '/schedules/admin-priv/trigger', undefined, as('submit'));
    expect(t2.body.job_id, t2.text).to.be.a('string');
    expect(await r.exists(k.job(t2.body.job_id!))).to.equal(1);
  });
});
