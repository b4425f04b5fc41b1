// Webhook targets (SSRF): every refused address form is refused at POST /webhooks with a 400 naming `url`, before
// anything connects; a host name that resolves to loopback is refused inside the connection's own DNS lookup (so
// a rebinding answer cannot swap the address after the check); redirects are not followed; and a receiver on
// loopback works only with the documented opt-in (webhooks.allow_loopback / FERRY_WEBHOOK_ALLOW_LOOPBACK). No
// traffic goes anywhere but loopback: refused addresses are never connected to.
import { expect } from 'chai';
import http from 'node:http';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { startDaemonProc, startProcess, testEnv, Proc } from '../helpers/procs';
import { useStack } from '../helpers/stack';
import { req, until } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import type { DeliveryLog, WebhookAdded, WebhookList } from '../helpers/api-types';
import { guardedAgents, guardedPost, refuseAddress } from '../../domain/targets';

const REFUSED = [
  'http://127.0.0.1/h', 'http://127.1.2.3:8080/h', 'http://[::1]/h', 'http://[::ffff:127.0.0.1]/h', 'http://[::ffff:7f00:1]/h',
  'http://[::ffff:169.254.169.254]/latest/meta-data', 'http://169.254.169.254/latest/meta-data', 'http://0.0.0.0/h', 'http://[::]/h',
  'http://10.1.2.3/h', 'http://172.16.0.1/h', 'http://192.168.1.1/h', 'http://100.64.0.1/h', 'http://[fc00::1]/h', 'http://[fd12::1]/h',
  'http://[fe80::1]/h', 'http://224.0.0.1/h', 'http://255.255.255.255/h', 'http://localhost/h', 'http://2130706433/h', 'http://0x7f.1/h',
];

describe('security: webhook targets', function () {
  this.timeout(60000);
  // Two daemons on one Redis: the strict one as shipped, the other with the loopback opt-in.
  const s = useStack({
    name: 'ssrf', gateway: false, daemon: false, daemonYaml: 'webhooks:\n  backoff_ms: 100\n',
    env: (st) => ({ FERRY_CONFIG: st.config, FERRY_HOST: '127.0.0.1' }),
  });
  let strict: Proc & { url: string };
  let open: Proc & { url: string };
  let receiver: http.Server;
  let R: string;
  const hits: string[] = [];
  let connections = 0;

  before(async function () {
    this.timeout(90000);
    receiver = http.createServer((rq, rs) => {
      hits.push(rq.url!);
      rq.resume();
      rq.on('end', () => {
        if (rq.url === '/redirect') { rs.writeHead(302, { location: `${R}/redirected` }); rs.end(); return; }
        rs.writeHead(200); rs.end('ok');
      });
    });
    receiver.on('connection', () => connections++);
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
    R = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
    [strict, open] = await Promise.all([s.add(startDaemonProc(s.env, s.config)), s.add(startDaemonProc({ ...s.env, FERRY_WEBHOOK_ALLOW_LOOPBACK: '1' }, s.config))]);
  });
  after(() => { receiver?.close(); });

  it('refuses every private, loopback, link-local, metadata, unspecified, CGNAT, unique-local and multicast form with a 400 naming url', async () => {
    for (const url of REFUSED) {
      const r = await req<DaemonError>(strict.url, 'POST', '/webhooks', { url, events: ['job.completed'] });
      expect(r.status, `${url}: ${r.text}`).to.equal(400);
      expect(r.body.error, url).to.include('url');
      expect(r.body.fields?.[0]?.field, url).to.equal('url');
    }
    expect((await req<WebhookList>(strict.url, 'GET', '/webhooks')).body.total).to.equal(0);
  });

  it('with the loopback opt-in, allows loopback but still never link-local, metadata, unspecified or private', async () => {
    const ok = await req(open.url, 'POST', '/webhooks', { url: `${R}/ok`, events: ['job.completed'] });
    expect(ok.status, ok.text).to.equal(201);
    for (const url of ['http://169.254.169.254/x', 'http://[::ffff:169.254.169.254]/x', 'http://0.0.0.0/x', 'http://[::]/x', 'http://10.0.0.1/x', 'http://[fe80::1]/x']) {
      const r = await req(open.url, 'POST', '/webhooks', { url, events: ['job.completed'] });
      expect(r.status, url).to.equal(400);
    }
    await req(open.url, 'DELETE', '/webhooks/0');
  });

  it('classifies with IPv4-mapped IPv6 unwrapped', () => {
    const none = { allow_loopback: false, allow_private: false };
    expect(refuseAddress('::ffff:127.0.0.1', none)).to.match(/loopback/);
    expect(refuseAddress('::ffff:10.0.0.1', { allow_loopback: true, allow_private: false })).to.match(/private/);
    expect(refuseAddress('::ffff:169.254.169.254', { allow_loopback: true, allow_private: true })).to.match(/linkLocal/);
    expect(refuseAddress('100.64.0.1', none)).to.match(/carrierGradeNat/);
    expect(refuseAddress('93.184.216.34', none)).to.equal(null);
  });

  it('refuses a host name resolving to loopback inside the connection lookup, before any byte is sent', async () => {
    const policy = { allow_loopback: false, allow_private: false };
    const before = connections;
    const port = (receiver.address() as AddressInfo).port;
    let err: NodeJS.ErrnoException | undefined;
    try { await guardedPost(`http://localhost:${port}/sneaky`, '{}', {}, 5000, guardedAgents(policy), policy); } catch (e) { err = e as NodeJS.ErrnoException; }
    expect(err?.code, String(err)).to.equal('EFERRYREFUSED');
    expect(err!.message).to.include('loopback');
    let lit: unknown;
    try { await guardedPost(`http://[::ffff:127.0.0.1]:${port}/sneaky`, '{}', {}, 5000, guardedAgents(policy), policy); } catch (e) { lit = e; }
    expect(String(lit)).to.include('refused');
    expect(connections).to.equal(before);
    expect(hits).to.not.include('/sneaky');
    // The same name with the opt-in connects (so the refusal above is the hook's doing, not a dead receiver).
    const allowed = { allow_loopback: true, allow_private: false };
    expect((await guardedPost(`http://localhost:${port}/fine`, '{}', {}, 5000, guardedAgents(allowed), allowed)).status).to.equal(200);
  });

  it('does not follow redirects', async () => {
    const allowed = { allow_loopback: true, allow_private: false };
    const r = await guardedPost(`${R}/redirect`, '{}', {}, 5000, guardedAgents(allowed), allowed);
    expect(r.status).to.equal(302);
    expect(hits).to.not.include('/redirected');
  });

  it('a notifier without the opt-in refuses a loopback webhook stored by a daemon with it, and logs why', async () => {
    const cfg = path.join(s.dir, 'notifier.yaml');
    writeFileSync(cfg, 'webhooks:\n  backoff_ms: 100\n');
    s.procs.push(startProcess('services/notifier/main.ts', [], { ...testEnv(s.redis.url), FERRY_CONFIG: cfg }));
    {
      const port = (receiver.address() as AddressInfo).port;
      const add = await req<WebhookAdded>(open.url, 'POST', '/webhooks', { url: `http://localhost:${port}/stored`, events: ['job.completed'], retry_count: 2 });
      expect(add.status, add.text).to.equal(201);
      const idx = add.body.webhook.index;
      expect((await req(open.url, 'POST', '/webhooks/test', { index: idx })).status).to.equal(200);
      const log = await until(async () => { const d = (await req<DeliveryLog>(open.url, 'GET', `/webhooks/${idx}/deliveries`)).body.deliveries; return d?.[0]?.status === 'failed' && d; }, 20000, 'the refused delivery');
      expect(log[0].last_error).to.include('loopback');
      expect(log[0].attempts, 'a refused target is not retried').to.equal(1);
      expect(hits).to.not.include('/stored');
    }
  });
});
