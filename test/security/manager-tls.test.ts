// vSphere credentials only over verified TLS (issue 18, item 8), tried as an attacker against the real daemon,
// gateway and a native worker. A loopback HTTPS listener stands for a manager the attacker controls on a host the
// deployment allows (FERRY_VSPHERE_MANAGERS lists the bare host, so any port may be named): its certificate is
// trusted, it answers RetrieveServiceContent like a manager and records every request body, so it would see a
// Login with the default GOVC_PASSWORD. A plain HTTP listener records whether anything is sent in clear.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import http from 'node:http';
import https from 'node:https';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { TestRedis } from '../helpers/redis';
import { Proc, startDaemonProc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DaemonError, JobApiError } from '../helpers/http';
import type { BatchSubmitted, JobStatus } from '../helpers/api-types';

const K = { read: 'tls-read-key-0123456789', submit: 'tls-submit-key-0123456789', admin: 'tls-admin-key-0123456789' };
const ENV_PASSWORD = 'env-govc-password-7731';
const OWN_PASSWORD = 'own-request-password-4410';

const SERVICE_CONTENT = '<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body>'
  + '<RetrieveServiceContentResponse xmlns="urn:vim25"><returnval><rootFolder type="Folder">group-d1</rootFolder><propertyCollector type="PropertyCollector">propertyCollector</propertyCollector>'
  + '<viewManager type="ViewManager">ViewManager</viewManager><sessionManager type="SessionManager">SessionManager</sessionManager><searchIndex type="SearchIndex">SearchIndex</searchIndex>'
  + '<about><name>not a manager</name></about></returnval></RetrieveServiceContentResponse></soapenv:Body></soapenv:Envelope>';
const FAULT = '<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"><soapenv:Body><soapenv:Fault><faultcode>ServerFaultCode</faultcode>'
  + '<faultstring>Cannot complete login</faultstring><detail><InvalidLoginFault xmlns="urn:vim25"/></detail></soapenv:Fault></soapenv:Body></soapenv:Envelope>';

/** A listener recording every request body; answers like a manager that refuses every login. */
function recorder(server: http.Server) {
  const bodies: string[] = [];
  server.on('request', (rq: http.IncomingMessage, rs: http.ServerResponse) => {
    let b = '';
    rq.setEncoding('utf8').on('data', (c: string) => { b += c; }).on('end', () => {
      bodies.push(b);
      const login = b.includes('<Login');
      rs.writeHead(login ? 500 : 200, { 'content-type': 'text/xml' }).end(login ? FAULT : SERVICE_CONTENT);
    });
  });
  return { bodies, listen: () => new Promise<number>((r) => server.listen(0, '127.0.0.1', () => r((server.address() as AddressInfo).port))) };
}

describe('security: vSphere credentials only go over verified TLS, and the default ones only to listed managers', function () {
  this.timeout(90_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-sec-tls-'));
  const procs: Proc[] = [];
  let dm: Proc & { url: string };
  let gw: Proc & { url: string };
  let evil: ReturnType<typeof recorder>;
  let plain: ReturnType<typeof recorder>;
  let evilUrl = '';
  let plainUrl = '';
  const servers: http.Server[] = [];
  const as = (key: string) => ({ 'x-api-key': key });
  const q = (o: Record<string, string>) => `?${new URLSearchParams(o).toString()}`;
  const seenPassword = (pw: string) => [...evil.bodies, ...plain.bodies].some((b) => b.includes(pw));

  before(async () => {
    execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1', '-subj', '/CN=127.0.0.1',
      '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', path.join(dir, 'key.pem'), '-out', path.join(dir, 'cert.pem')], { stdio: 'ignore' });
    const tlsServer = https.createServer({ key: readFileSync(path.join(dir, 'key.pem')), cert: readFileSync(path.join(dir, 'cert.pem')) });
    const plainServer = http.createServer();
    servers.push(tlsServer, plainServer);
    evil = recorder(tlsServer);
    plain = recorder(plainServer);
    evilUrl = `https://127.0.0.1:${await evil.listen()}/sdk`;
    plainUrl = `http://127.0.0.1:${await plain.listen()}/sdk`;
    await redis.start();
    const env = {
      ...testEnv(redis.url, 'tls'), FERRY_API_KEYS: `r:read:${K.read},ci:submit:${K.submit},ops:admin:${K.admin}`, FERRY_SECRET_KEY: 'tls-test-secret-key',
      // The default manager is elsewhere (nothing listens there); the bare host lets any 127.0.0.1 port be named.
      GOVC_URL: 'https://127.0.0.1:9/sdk', GOVC_USERNAME: 'administrator', GOVC_PASSWORD: ENV_PASSWORD,
      FERRY_VSPHERE_MANAGERS: '127.0.0.1', FERRY_VSPHERE_CA: path.join(dir, 'cert.pem'),
    };
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 1h\n');
    [dm, gw] = await Promise.all([startDaemonProc(env, cfg), startGatewayProc(env)]);
    procs.push(dm, gw, await startWorkerProc(env, 'tls-w', ['vsphere_access']));
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.kill()));
    for (const s of servers) s.close();
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('the listener is a manager Ferry may reach: a request with its own password is sent there (so the checks below can fail)', async () => {
    const r = await req(dm.url, 'GET', `/vms/list${q({ server: evilUrl })}`, undefined, { ...as(K.read), 'x-vsphere-username': 'x', 'x-vsphere-password': OWN_PASSWORD });
    expect(r.status, r.text).to.equal(401);
    expect(seenPassword(OWN_PASSWORD)).to.equal(true);
  });

  it('http:// managers are refused by name on every door; nothing is sent in clear', async () => {
    const list = await req<DaemonError>(dm.url, 'GET', `/vms/list${q({ server: plainUrl })}`, undefined, as(K.read));
    expect(list.status, list.text).to.equal(400);
    expect(list.body.error).to.include('server').and.include('https://');
    const a = await req<DaemonError>(dm.url, 'POST', '/jobs/submit', { vm_path: '/DC0/vm/a', output_path: path.join(dir, 'a'), manager_url: plainUrl, password: OWN_PASSWORD }, as(K.submit));
    expect(a.status, a.text).to.equal(400);
    expect(a.body.fields!.map((f) => f.field)).to.include('manager_url');
    const b = await req<DaemonError>(dm.url, 'POST', '/jobs/submit', { vm_path: '/DC0/vm/a', source: { type: 'vsphere', manager_url: plainUrl, password: OWN_PASSWORD }, destination: { type: 'kvm' } }, as(K.submit));
    expect(b.status, b.text).to.equal(400);
    expect(b.body.fields!.map((f) => f.field)).to.include('source.manager_url');
    const g = await req<JobApiError>(gw.url, 'POST', '/jobs', { operation: 'export', parameters: { vm_path: '/DC0/vm/a', output_path: path.join(dir, 'g'), manager_url: plainUrl } }, as(K.submit));
    expect(g.status, g.text).to.equal(400);
    expect(g.body.error.message).to.include('parameters.manager_url');
    expect(plain.bodies).to.have.length(0);
  });

  it('the default credentials never go to a manager that is not GOVC_URL\'s or listed by scheme, host and port: 400 naming password', async () => {
    const before = evil.bodies.length;
    const list = await req<DaemonError>(dm.url, 'GET', `/vms/list${q({ server: evilUrl })}`, undefined, as(K.read));
    expect(list.status, list.text).to.equal(400);
    expect(list.body.fields!.map((f) => f.field)).to.include('password');
    const a = await req<DaemonError>(dm.url, 'POST', '/jobs/submit', { vm_path: '/DC0/vm/a', output_path: path.join(dir, 'a'), manager_url: evilUrl }, as(K.submit));
    expect(a.status, a.text).to.equal(400);
    expect(a.body.fields!.map((f) => f.field)).to.include('password');
    const b = await req<DaemonError>(dm.url, 'POST', '/jobs/submit', { vm_path: '/DC0/vm/a', source: { type: 'vsphere', manager_url: evilUrl }, destination: { type: 'kvm' } }, as(K.submit));
    expect(b.status, b.text).to.equal(400);
    expect(b.body.fields!.map((f) => f.field)).to.include('source.password');
    expect(evil.bodies.length).to.equal(before);
    expect(seenPassword(ENV_PASSWORD)).to.equal(false);
  });

  it('a job that names such a manager with the environment\'s credentials fails on the worker, not retried; the listener never sees the password', async () => {
    const r = await req(gw.url, 'POST', '/jobs?queue=true', { job_id: 'tls-env', operation: 'export', parameters: { vm_path: '/DC0/vm/a', output_path: path.join(dir, 'w'), manager_url: evilUrl, username: 'administrator', credentials: 'environment' }, execution_policy: { retry_count: 2 } }, as(K.submit));
    expect(r.status, r.text).to.equal(201);
    const j = await until(async () => { const g = await req<JobStatus>(gw.url, 'GET', '/jobs/tls-env', undefined, as(K.read)); return g.body?.state === 'FAILED' && g.body; }, 30000, 'the worker to refuse the job');
    expect(j.attempts).to.equal(1);
    expect(j.error).to.include('default credentials');
    expect(seenPassword(ENV_PASSWORD)).to.equal(false);
  });

  it('insecure for a manager not configured as insecure needs an admin key: 403 naming the field on both APIs and /vms', async () => {
    const shapeA = { vm_path: '/DC0/vm/a', output_path: path.join(dir, 'i'), insecure: true };
    const a = await req<DaemonError>(dm.url, 'POST', '/jobs/submit', shapeA, as(K.submit));
    expect(a.status, a.text).to.equal(403);
    expect(a.body.fields!.map((f) => f.field)).to.include('insecure');
    const b = await req<DaemonError>(dm.url, 'POST', '/jobs/submit', { vm_path: '/DC0/vm/a', source: { type: 'vsphere', insecure: true }, destination: { type: 'kvm' } }, as(K.submit));
    expect(b.status, b.text).to.equal(403);
    expect(b.body.fields!.map((f) => f.field)).to.include('source.insecure');
    const l = await req(dm.url, 'GET', `/vms/list${q({ server: evilUrl, insecure: 'true' })}`, undefined, { ...as(K.read), 'x-vsphere-username': 'x', 'x-vsphere-password': OWN_PASSWORD });
    expect(l.status, l.text).to.equal(403);
    const g = await req<JobApiError>(gw.url, 'POST', '/jobs', { operation: 'export', parameters: { vm_path: '/DC0/vm/a', output_path: path.join(dir, 'gi'), insecure: true } }, as(K.submit));
    expect(g.status, g.text).to.equal(403);
    expect(g.body.error.message).to.include('parameters.insecure');
    // The admin's choice: accepted.
    const ok = await req<BatchSubmitted>(dm.url, 'POST', '/jobs/submit', shapeA, as(K.admin));
    expect(ok.status, ok.text).to.equal(200);
    await req(dm.url, 'POST', '/jobs/cancel', { job_ids: ok.body.job_ids }, as(K.admin));
  });
});
