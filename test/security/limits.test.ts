// Bounded spawning and rate limits (issue 18 item 11), tried as a caller looping requests would: two daemon
// replicas sharing one Redis count one key's requests together (X-RateLimit-Limit / -Remaining on each answer,
// 429 with Retry-After past the limit, another key unaffected); and /virt calls, each a virsh command, are capped
// per key (429) and in all (503), with Retry-After, while libvirt is slow to answer (a TCP libvirt URI whose
// server accepts and never answers), so a loop of calls cannot pile up commands without end.
import { expect } from 'chai';
import net from 'node:net';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { TestRedis, freePort } from '../helpers/redis';
import { Proc, startDaemonProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import { openWs } from '../helpers/ws';

const K = { a: 'caller-a-key-0123456789abcdef', b: 'caller-b-key-0123456789abcdef', c: 'caller-c-key-0123456789abcdef', d: 'caller-d-key-0123456789abcdef' };
const key = (k: keyof typeof K) => ({ 'x-api-key': K[k] });

describe('security: rate limits shared by replicas, spawn caps per key and in all', function () {
  this.timeout(120_000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-sec-limits-'));
  const procs: Proc[] = [];
  const held: net.Socket[] = [];
  const silent = net.createServer((s) => { held.push(s); s.on('error', () => undefined); }); // a held socket the server under test resets: expected
  let d1: Proc & { url: string };
  let d2: Proc & { url: string };

  before(async () => {
    await redis.start();
    const port = await freePort();
    await new Promise<void>((r) => silent.listen(port, '127.0.0.1', r));
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'metrics:\n  enabled: true\n');
    const env = {
      ...testEnv(redis.url, 'limits'),
      FERRY_API_KEYS: Object.entries(K).map(([n, k]) => `${n}:read:${k}`).join(','),
      FERRY_RATE_LIMIT: '5', FERRY_RATE_WINDOW_SECONDS: '60',
      FERRY_LIBVIRT_URI: `qemu+tcp://127.0.0.1:${port}/system`, FERRY_VIRT_CALLS_PER_CALLER: '1', FERRY_VIRT_CALLS: '3', FERRY_CONSOLE_SESSIONS_PER_CALLER: '1',
    };
    [d1, d2] = await Promise.all([startDaemonProc(env, cfg), startDaemonProc(env, cfg)]);
    procs.push(d1, d2);
  });
  after(async () => {
    for (const s of held) s.destroy();
    silent.close();
    await Promise.all(procs.map((p) => p.stop()));
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('counts one key across two replicas: 5 answers with falling X-RateLimit-Remaining, then 429 with Retry-After', async () => {
    const remaining: number[] = [];
    for (let i = 0; i < 5; i++) {
      const r = await req(i % 2 ? d2.url : d1.url, 'GET', '/jobs', undefined, key('a'));
      expect(r.status, r.text).to.equal(200);
      expect(r.headers.get('x-ratelimit-limit')).to.equal('5');
      remaining.push(Number(r.headers.get('x-ratelimit-remaining')));
    }
    expect(remaining).to.deep.equal([4, 3, 2, 1, 0]);
    for (const base of [d1.url, d2.url]) {
      const over = await req<DaemonError>(base, 'GET', '/jobs', undefined, key('a'));
      expect(over.status, over.text).to.equal(429);
      expect(Number(over.headers.get('retry-after'))).to.be.within(1, 60);
      expect(over.headers.get('x-ratelimit-remaining')).to.equal('0');
      expect(over.body.error).to.include('rate limit');
    }
    // Another key has its own count; liveness probes are never limited.
    expect((await req(d1.url, 'GET', '/jobs', undefined, key('d'))).status).to.equal(200);
    for (const p of ['/health', '/api/v1/health']) {
      const h = await req(d2.url, 'GET', p, undefined, key('a'));
      expect(h.status, p).to.equal(200);
      expect(h.headers.get('x-ratelimit-limit'), p).to.equal(null);
    }
  });

  it('caps console sessions per key: a second console of the same key is refused (429) until the first closes', async () => {
    const url = `${d1.url.replace('http', 'ws')}/virt/console?name=vm1`;
    const one = openWs(url, key('a'));
    await one.opened; // its bridge now waits on libvirt, holding a's one console slot (and one libvirt call)
    const two = openWs(url, key('a'));
    expect(await two.opened.then(() => 'opened', (e: Error) => e.message)).to.equal('HTTP 429');
    const closed = new Promise((r) => one.ws.once('close', r));
    one.ws.close();
    await closed;
    await until(async () => {
      const three = openWs(url, key('a'));
      const got = await three.opened.then(() => 'opened', (e: Error) => e.message);
      three.ws.close();
      return got === 'opened';
    }, 15000, 'the slot given back when the first console closed');
  });

  it('caps /virt calls per key (429) and in all (503), with Retry-After, while libvirt does not answer', async () => {
    // b's first call waits on libvirt and holds b's one slot: b's next call is refused at once. (Each key may make
    // 5 requests a minute here, so the polls are few.)
    const capped = (k: keyof typeof K) => until(async () => {
      const r = await req(d1.url, 'GET', '/virt/networks', undefined, key(k));
      return r.status === 429 && /FERRY_VIRT_CALLS_PER_CALLER/.test(r.text) ? r : undefined;
    }, 15000, `a 429 for a second concurrent call of key ${k}`);
    const first = req(d1.url, 'GET', '/virt/domains', undefined, key('b'));
    const second = await capped('b');
    expect(Number(second.headers.get('retry-after'))).to.be.at.least(1);
    // c takes the last slot of this replica (a's consoles still wait on libvirt with one); then d finds none.
    const third = req(d1.url, 'GET', '/virt/domains', undefined, key('c'));
    await capped('c');
    const full = await req<DaemonError>(d1.url, 'GET', '/virt/networks', undefined, key('d'));
    expect(full.status, full.text).to.equal(503);
    expect(Number(full.headers.get('retry-after'))).to.be.at.least(1);
    expect(full.body.error).to.include('FERRY_VIRT_CALLS').and.include('retry');
    // libvirt goes away: the held calls end (503, libvirt does not answer) and give their slots back.
    for (const s of held) s.destroy();
    silent.close();
    const ends = await Promise.all([first, third]);
    for (const e of ends) expect(e.status, e.text).to.equal(503);
    for (const e of ends) expect(e.text).to.include('does not answer');
    const after = await req(d1.url, 'GET', '/virt/networks', undefined, key('d'));
    expect(after.text, after.text).to.not.include('too many');
  });
});
