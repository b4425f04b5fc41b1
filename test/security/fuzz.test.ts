// No 5xx for bad input: a property-based fuzz (fast-check) of every route of both APIs, as their own OpenAPI
// documents list them (the gateway's /openapi.json, the daemon's /openapi.yaml, with the /api/v1 prefix too), plus
// the static trees, against the real services as processes on a real Redis, with auth off and on (FERRY_API_KEYS;
// requests with and without the key). Malformed and oversized bodies (JSON, YAML, text), the route's own fields
// with hostile values, odd content types and encodings, hostile headers (Last-Event-ID beyond 64 bits,
// Authorization), hostile YAML (alias bombs, deep nesting, huge scalars), Host and Origin headers a rebinding or
// cross-site page would send, path parameters with bad percent escapes and traversal, junk query values. While Redis is up
// no answer may be >= 500, an SSE stream may not start with an `error` event, and a 400 that blames fields must
// name each of them in its message. A second property sends only hostile bodies and checks that no service's event
// loop paused over 50 ms (its own monitorEventLoopDelay, read from /metrics).
// Random image headers (qcow2 with backing names and extensions, VMDK descriptors and sparse headers, VHD footers
// with parent locators) are written to disk and named by convert jobs, /convert/vm, /import/kvm and
// /virt/volume/upload: the same rule holds. The seed is printed; replay a failure with FUZZ_SEED=<seed> (and FUZZ_PATH).
import { expect } from 'chai';
import http from 'node:http';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import fc from 'fast-check';
import yaml from 'js-yaml';
import { TestRedis } from '../helpers/redis';
import { startDaemonProc, startGatewayProc, startWorkerProc, testEnv, Proc } from '../helpers/procs';
import { req, until } from '../helpers/http';
import type { DaemonError, FieldError, JobApiError } from '../helpers/http';
import type { JobStatus } from '../helpers/api-types';
import { pauseDuring } from '../helpers/loop';
import { arbImageFile } from '../helpers/hostile-images';

const KEY = 'fuzz-test-api-key-0123456789abcdef';
const RUNS = Number(process.env.FUZZ_RUNS || 700);
const METHODS = ['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'HEAD', 'OPTIONS'];

interface Route { method: string; path: string; bodyKeys: string[]; queryKeys: string[] }
interface Target { name: string; base: string; pid: number; routes: Route[]; auth: boolean }
interface Sent { method: string; path: string; headers: Record<string, string>; body?: Buffer }
interface Got { status: number; text: string; type: string; reset?: boolean }
/** The parts of an OpenAPI document (the gateway's openapi.json, the daemon's openapi.yaml) the routes come from. */
interface BodySchema { properties?: Record<string, unknown>; oneOf?: BodySchema[]; anyOf?: BodySchema[] }
interface OpenApiOperation { requestBody?: { content?: Record<string, { schema?: BodySchema }> }; parameters?: Array<{ in: string; name: string }> }
interface OpenApiDoc { paths: Record<string, Record<string, OpenApiOperation>> }
/** An error answer of either API, read through one shape: the daemon's `{ error: string, fields? }` or the job
 *  API's `{ error: { message, fields? } }` (a string's `.message` and `.fields` read as undefined). */
interface ErrorAnswer { error: (string & { message?: undefined; fields?: undefined }) | JobApiError['error']; fields?: FieldError[] }

function routesOf(doc: OpenApiDoc, prefixes: string[]): Route[] {
  const out: Route[] = [];
  for (const [p, ops] of Object.entries(doc.paths)) {
    for (const [m, op] of Object.entries(ops)) {
      const schema = op.requestBody?.content?.['application/json']?.schema;
      const bodyKeys = new Set<string>(Object.keys(schema?.properties || {}));
      for (const alt of [...(schema?.oneOf || []), ...(schema?.anyOf || [])]) for (const k of Object.keys(alt.properties || {})) bodyKeys.add(k);
      const queryKeys = (op.parameters || []).filter((x) => x.in === 'query').map((x) => x.name);
      for (const prefix of prefixes) out.push({ method: m.toUpperCase(), path: prefix + p, bodyKeys: [...bodyKeys], queryKeys });
    }
  }
  return out;
}

/** One raw request (node http, so malformed paths and bodies go out as written); SSE answers are read briefly. */
function send(base: string, r: Sent): Promise<Got> {
  const u = new URL(base);
  return new Promise((resolve, reject) => {
    let answered: Got | undefined;
    const rq = http.request({ host: u.hostname, port: u.port, method: r.method, path: r.path, headers: r.headers, timeout: 15000 }, (res) => {
      const type = String(res.headers['content-type'] || '');
      answered = { status: res.statusCode || 0, text: '', type };
      let text = '';
      res.setEncoding('utf8');
      const done = () => resolve({ status: res.statusCode || 0, text, type });
      if (type.startsWith('text/event-stream')) {
        // A stream stays open: what it says in its first moments is enough (an `error` event comes at once).
        const t = setTimeout(() => { rq.destroy(); done(); }, 150);
        res.on('data', (d) => { text += d; });
        res.on('end', () => { clearTimeout(t); done(); });
        res.on('error', () => { clearTimeout(t); done(); });
        return;
      }
      res.on('data', (d) => { if (text.length < 65536) text += d; });
      res.on('end', done);
      res.on('error', reject);
    });
    rq.on('timeout', () => rq.destroy(new Error(`no answer within 15 s to ${r.method} ${r.path}`)));
    // A server that answers (413) before reading an oversized body closes the connection while it is still
    // being sent: the answer counts, the reset that follows does not.
    // The answer can also lose the race with the reset (the client sees its write fail first): then the service
    // must still be alive and answering, which a /health request right after shows; nothing else is claimed.
    rq.on('error', (e: NodeJS.ErrnoException) => {
      if (answered) return resolve(answered);
      if (!['ECONNRESET', 'EPIPE'].includes(e.code ?? '') || !r.body?.length) return reject(e);
      http.get({ host: u.hostname, port: u.port, path: '/health', timeout: 15000 }, (h) => {
        h.resume();
        if (h.statusCode === 200) resolve({ status: 0, text: '', type: '', reset: true });
        else reject(new Error(`${r.method} ${r.path}: reset while sending, and /health then answered ${h.statusCode}`));
      }).on('error', (he) => reject(new Error(`${r.method} ${r.path}: reset while sending, and /health then failed: ${he.message}`)));
    });
    rq.end(r.body);
  });
}

// Path segments and values that broke, or could break, naive code.
const NASTY_SEGMENTS = ['%E0%A4%A', '%', '%zz', '%00', '..', '%2e%2e', '%2F', '..%2F..%2Fetc%2Fpasswd', '%C0%AE', '%FF%FE', 'a'.repeat(5000), '0', '-1', '1e400', 'NaN', '__proto__', 'constructor', '%7B%7D', '%22', '%0D%0A', '18446744073709551616', '..;', '%u0000'];
const NASTY_VALUES: unknown[] = [null, true, -1, 0, 1e308, -1e308, 1.5, 2 ** 63, '18446744073709551616-0', '', ' ', '%', '../..', '/etc/passwd', '/dev/sda', 'x'.repeat(70000),
  {}, [], [[]], { __proto__: { polluted: 1 } }, { constructor: { prototype: { x: 1 } } }, '\u0000', '\ud800', '2026-13-45T99:99:99Z', '* * * * * * * *', 'http://[::1', 'ftp://x'];
const LAST_EVENT_IDS = ['18446744073709551616-0', '0-18446744073709551616', '99999999999999999999999-1', '1-', '-1', 'abc', '1-1-1', '', '0-0', '18446744073709551615-18446744073709551615'];

function arbPathFor(route: Route, jobIds: string[]): fc.Arbitrary<string> {
  const seg = fc.oneof(
    fc.constantFrom(...NASTY_SEGMENTS),
    fc.constantFrom(...jobIds),
    fc.string({ maxLength: 40, unit: 'grapheme' }).map(encodeURIComponent),
    fc.nat(2000).map(String),
  );
  const params = (route.path.match(/\{[^}]+\}/g) || []).length;
  return fc.tuple(fc.array(seg, { minLength: params, maxLength: params }), arbQuery(route)).map(([vals, q]) => {
    let i = 0;
    return route.path.replace(/\{[^}]+\}/g, () => vals[i++]) + q;
  });
}

function arbQuery(route: Route): fc.Arbitrary<string> {
  const key = fc.oneof(fc.constantFrom(...route.queryKeys, 'last_event_id', 'after_id', 'limit', 'offset', 'status', 'state', 'queue', 'since'), fc.string({ maxLength: 10 }).map(encodeURIComponent));
  const val = fc.oneof(fc.constantFrom('', '%', '%E0%A4%A', '-1', '1e9', '99999999999999999999', 'true', 'null', '[]', ...LAST_EVENT_IDS, 'running,,', 'COMPLETED'), fc.string({ maxLength: 30 }).map(encodeURIComponent));
  return fc.option(fc.array(fc.tuple(key, val), { maxLength: 4 }).map((kv) => '?' + kv.map(([k, v]) => `${k}=${v}`).join('&')), { nil: '' });
}

/** YAML that costs a naive parser or walker dearly: alias bombs (levels x fan-out), nesting thousands deep (flow
 *  and block), huge scalars, self-referencing anchors. */
const arbHostileYaml: fc.Arbitrary<string> = fc.oneof(
  fc.tuple(fc.integer({ min: 2, max: 9 }), fc.integer({ min: 2, max: 12 })).map(([levels, fan]) => {
    let y = 'a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n';
    for (let i = 1; i <= levels; i++) y += `a${i}: &a${i} [${Array(fan).fill(`*a${i - 1}`).join(', ')}]\n`;
    return y;
  }),
  fc.integer({ min: 50, max: 20000 }).map((n) => 'a: ' + '['.repeat(n) + ']'.repeat(n)),
  fc.integer({ min: 50, max: 2000 }).map((n) => Array.from({ length: n }, (_, i) => ' '.repeat(i) + 'k:').join('\n') + ' x'),
  fc.constantFrom(60_000, 70_000, 3 * 1024 * 1024).map((n) => 'status: "' + 'x'.repeat(n) + '"'),
  fc.constantFrom('a: &a [*a]', 'a: &x {b: *x, c: [*x, *x]}', '<<: *nope', 'a: &a {<<: *a}'),
);

function arbBody(route: Route): fc.Arbitrary<{ type?: string; body?: Buffer; encoding?: string }> {
  const value = fc.oneof(fc.constantFrom(...NASTY_VALUES), fc.jsonValue({ maxDepth: 3 }));
  const ownFields = fc.dictionary(fc.constantFrom(...route.bodyKeys, 'unknown_field', 'job_id', 'jobs'), value, { maxKeys: 6 });
  const json = (v: unknown) => Buffer.from(JSON.stringify(v) ?? 'null');
  return fc.oneof(
    { weight: 4, arbitrary: ownFields.map((o) => ({ type: 'application/json', body: json(o) })) },
    { weight: 2, arbitrary: fc.jsonValue({ maxDepth: 4 }).map((v) => ({ type: 'application/json', body: json(v) })) },
    { weight: 1, arbitrary: fc.constantFrom('{"a":', '{', '[', '"unterminated', '{"a":1}{"b":2}', 'null', '1e999', '\uFEFF{}', '[' .repeat(20000) + ']'.repeat(20000)).map((t) => ({ type: 'application/json', body: Buffer.from(t) })) },
    { weight: 1, arbitrary: ownFields.map((o) => ({ type: 'application/x-yaml', body: Buffer.from(yaml.dump(o, { skipInvalid: true })) })) },
    { weight: 1, arbitrary: fc.constantFrom('a: &a [*a]', 'a: !!js/function "x"', ': :', '- - -\n  : x', 'a: &x {b: *x}', '%YAML 9.9\n---\n{}', 'x: [1, 2').map((t) => ({ type: 'text/yaml', body: Buffer.from(t) })) },
    { weight: 1, arbitrary: fc.constant({ type: 'application/json', body: Buffer.alloc(3 * 1024 * 1024, 0x20) }) },
    { weight: 1, arbitrary: arbHostileYaml.map((t) => ({ type: 'application/x-yaml', body: Buffer.from(t) })) },
    { weight: 1, arbitrary: fc.tuple(fc.constantFrom('text/plain', 'application/xml', 'multipart/form-data; boundary=x', 'application/json; charset=utf-32', 'application/json; charset=bogus', 'application/x-www-form-urlencoded', ''), fc.string({ maxLength: 200 })).map(([type, t]) => ({ type, body: Buffer.from(t) })) },
    { weight: 1, arbitrary: fc.constantFrom('gzip', 'deflate', 'br', 'bogus').map((encoding) => ({ type: 'application/json', body: Buffer.from('not compressed'), encoding })) },
    { weight: 1, arbitrary: fc.constant({}) },
  );
}

/** Undefined most of the time (so most requests still reach the handlers), else one of `a`. */
const rarely = (a: fc.Arbitrary<string>) => fc.oneof({ weight: 6, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: a });

const arbHeaders = (auth: boolean) => fc.record({
  lastEventId: fc.option(fc.constantFrom(...LAST_EVENT_IDS), { nil: undefined }),
  key: fc.constantFrom<string | undefined>(...(auth ? [KEY, KEY, undefined, 'wrong-key', ''] : [undefined, 'any-key'])),
  keyHow: fc.constantFrom('x-api-key', 'bearer', 'basic'),
  accept: fc.constantFrom('application/json', 'text/event-stream', '*/*', 'text/html', 'bogus'),
  host: rarely(fc.constantFrom('localhost', 'rebind.evil.example', 'evil.example:80', '127.0.0.1:1', '[::1]', '[::1', '', 'x'.repeat(300), 'localhost.', 'a.localhost', '999.1.1.1')),
  origin: rarely(fc.constantFrom('http://evil.example', 'null', 'garbage', 'http://localhost', 'file://', 'http://[::1')),
  fetchSite: rarely(fc.constantFrom('cross-site', 'same-site', 'same-origin', 'none', 'bogus')),
});

function check(sent: Sent, got: Got) {
  if (got.reset) return; // answered early and closed while the body was still going out; the service is alive
  const where = `${sent.method} ${sent.path.slice(0, 200)} -> ${got.status} ${got.text.slice(0, 300)}`;
  // The virtualization-host routes answer 503 (naming the URI, saying retry) while no libvirtd answers, as here:
  // that is the one 5xx allowed, and only there (docs/virt.md).
  const virt = /^(\/api\/v1)?\/(virt|import)\//.test(sent.path);
  // (A HEAD answer has no body to say so.)
  if (!(virt && got.status === 503 && (sent.method === 'HEAD' || /does not answer/.test(got.text)))) expect(got.status, where).to.be.below(500);
  expect(got.status, where).to.be.at.least(100);
  if (got.type.startsWith('text/event-stream')) expect(got.text, where).to.not.include('event: error');
  if (got.status >= 400 && sent.method !== 'HEAD' && got.type.includes('json')) {
    let body: ErrorAnswer;
    try { body = JSON.parse(got.text) as ErrorAnswer; } catch { throw new Error(`error answer is not JSON: ${where}`); }
    const message: string = typeof body.error === 'string' ? body.error : body.error?.message;
    expect(message, where).to.be.a('string').and.not.equal('');
    const fields: { field: string }[] = body.fields || body.error?.fields || [];
    for (const f of fields) expect(message, `${where}: message does not name field ${f.field}`).to.include(f.field.split('.').pop()!.replace(/\[\d+\]$/, ''));
    if (got.status === 503) expect(message.toLowerCase(), where).to.include('retry');
  }
}

describe('security: no 5xx for bad input (fast-check fuzz)', function () {
  this.timeout(180000);
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-fuzz-'));
  const procs: Proc[] = [];
  const targets: Target[] = [];
  const jobIds = ['fuzz-done', 'fuzz-waiting', 'no-such-job'];

  before(async function () {
    this.timeout(120000);
    await redis.start();
    const open = path.join(dir, 'open.yaml');
    const locked = path.join(dir, 'locked.yaml');
    writeFileSync(open, 'metrics:\n  enabled: true\n');
    writeFileSync(locked, 'metrics:\n  enabled: true\nauth:\n  enabled: true\n');
    const env = { ...testEnv(redis.url), FERRY_HOST: '127.0.0.1' };
    const authEnv = { ...env, FERRY_API_KEYS: KEY };
    const [g1, d1, g2, d2] = await Promise.all([startGatewayProc(env), startDaemonProc(env, open), startGatewayProc(authEnv), startDaemonProc(authEnv, locked)]);
    procs.push(g1, d1, g2, d2, await startWorkerProc(env, 'fuzz-worker', [], ['--concurrency', '2']));
    // A finished job with events and a waiting one, so job routes reach their deeper branches.
    expect((await req(g1.url, 'POST', '/jobs?queue=true', { job_id: 'fuzz-done', operation: 'noop', parameters: { steps: 3 } }, { 'x-api-key': KEY })).status).to.equal(201);
    expect((await req(g1.url, 'POST', '/jobs?queue=true', { job_id: 'fuzz-waiting', operation: 'noop', requirements: { capabilities: ['lvm_tools'] } }, { 'x-api-key': KEY })).status).to.equal(201);
    await until(async () => (await req<JobStatus>(g1.url, 'GET', '/jobs/fuzz-done', undefined, { 'x-api-key': KEY })).body?.state === 'COMPLETED', 90000, 'the seed job');
    const gdoc = (await req<OpenApiDoc>(g1.url, 'GET', '/openapi.json', undefined, { 'x-api-key': KEY })).body;
    const ddoc = yaml.load((await req(d1.url, 'GET', '/openapi.yaml', undefined, { 'x-api-key': KEY })).text) as OpenApiDoc;
    const statics: Route[] = ['/web/dashboard/{file}', '/api/v1/web/dashboard/{file}', '/swagger-ui/{file}'].map((p) => ({ method: 'GET', path: p, bodyKeys: [], queryKeys: [] }));
    const gRoutes = routesOf(gdoc, ['']);
    const dRoutes = [...routesOf(ddoc, ['', '/api/v1']), ...statics];
    expect(gRoutes.length).to.be.above(15);
    expect(dRoutes.length).to.be.above(50);
    const target = (name: string, p: Proc & { url: string }, routes: Route[], auth: boolean): Target => ({ name, base: p.url, pid: p.proc.pid!, routes, auth });
    targets.push(target('gateway', g1, gRoutes, false), target('daemon', d1, dRoutes, false), target('gateway+auth', g2, gRoutes, true), target('daemon+auth', d2, dRoutes, true));
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()));
    await redis.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('answers every malformed request to every route below 500, naming the field at fault', async () => {
    const seed = process.env.FUZZ_SEED ? Number(process.env.FUZZ_SEED) : Date.now() ^ (Math.random() * 0x7fffffff);
    console.log(`      fast-check seed ${seed} (replay: FUZZ_SEED=${seed}${process.env.FUZZ_PATH ? ` FUZZ_PATH=${process.env.FUZZ_PATH}` : ''}), ${RUNS} runs over ${targets.map((t) => `${t.name} ${t.routes.length} routes`).join(', ')}`);
    // Indexes, not objects, so a counterexample prints short: target, route.
    const arb = fc.nat(targets.length - 1).chain((ti) => fc.nat(targets[ti].routes.length - 1).chain((ri) => {
      const route = targets[ti].routes[ri];
      return fc.record({
      t: fc.constant(ti),
      route: fc.constant(`${route.method} ${route.path}`),
      method: fc.oneof({ weight: 4, arbitrary: fc.constant(route.method) }, { weight: 1, arbitrary: fc.constantFrom(...METHODS) }),
      path: arbPathFor(route, jobIds),
      body: arbBody(route),
      h: arbHeaders(targets[ti].auth),
    }); }));
    const counts: Record<string, number> = {};
    await fc.assert(fc.asyncProperty(arb, async ({ t: ti, method, path: p, body, h }) => {
      const t = targets[ti];
      const headers: Record<string, string> = { accept: h.accept };
      if (h.host !== undefined) headers.host = h.host;
      if (h.origin !== undefined) headers.origin = h.origin;
      if (h.fetchSite !== undefined) headers['sec-fetch-site'] = h.fetchSite;
      if (h.lastEventId !== undefined) headers['last-event-id'] = h.lastEventId;
      if (h.key !== undefined) {
        if (h.keyHow === 'x-api-key') headers['x-api-key'] = h.key;
        else headers.authorization = h.keyHow === 'bearer' ? `Bearer ${h.key}` : `Basic ${Buffer.from(`u:${h.key}`).toString('base64')}`;
      }
      const withBody = method !== 'GET' && method !== 'HEAD' && body.body !== undefined;
      if (withBody && body.type) headers['content-type'] = body.type;
      if (withBody && body.encoding) headers['content-encoding'] = body.encoding;
      const sent: Sent = { method, path: p, headers, body: withBody ? body.body : undefined };
      const got = await send(t.base, sent);
      counts[Math.floor(got.status / 100) + 'xx'] = (counts[Math.floor(got.status / 100) + 'xx'] || 0) + 1;
      check(sent, got);
    }), { seed, numRuns: RUNS, path: process.env.FUZZ_PATH, endOnFailure: true });
    console.log(`      answers by class: ${JSON.stringify(counts)}`);
    // The run reached the handlers, not only the front door.
    expect(counts['2xx'] || 0).to.be.above(RUNS / 20);
    expect(counts['4xx'] || 0).to.be.above(RUNS / 5);
  });

  it('hostile bodies (YAML alias bombs, deep nesting, huge scalars; JSON of many values) never pause an event loop over 50 ms', async () => {
    const seed = process.env.FUZZ_SEED ? Number(process.env.FUZZ_SEED) : Date.now() ^ (Math.random() * 0x7fffffff);
    const runs = Number(process.env.FUZZ_BODY_RUNS || 40);
    console.log(`      fast-check seed ${seed} (replay: FUZZ_SEED=${seed}), ${runs} hostile bodies`);
    const posts = targets.map((t) => t.routes.filter((r) => r.method === 'POST' && !r.path.includes('{') && (t.name.startsWith('daemon') || r.path === '/migrationjobs')));
    const jsonBomb = fc.oneof(
      fc.integer({ min: 1000, max: 500_000 }).map((n) => '[' + Array(n).fill('0').join(',') + ']'),
      fc.integer({ min: 100, max: 300_000 }).map((n) => '['.repeat(n) + ']'.repeat(n)),
      fc.integer({ min: 1000, max: 2_000_000 }).map((n) => JSON.stringify({ status: 'x'.repeat(n) })),
    );
    const arb = fc.record({
      t: fc.nat(targets.length - 1),
      r: fc.nat(1000),
      body: fc.oneof(arbHostileYaml.map((b) => ({ type: 'application/x-yaml', b })), jsonBomb.map((b) => ({ type: 'application/json', b }))),
    });
    await fc.assert(fc.asyncProperty(arb, async ({ t: ti, r, body }) => {
      const t = targets[ti];
      const route = posts[ti][r % posts[ti].length];
      const auth: Record<string, string> = t.auth ? { 'x-api-key': KEY } : {};
      const sent: Sent = { method: 'POST', path: route.path, headers: { 'content-type': body.type, ...auth }, body: Buffer.from(body.b) };
      // The machine is shared (and the suite runs two files at once): the calmest of up to ten tries, a second
      // apart, counts; a handler that blocks does so every time.
      let best = { lag: Infinity, cpu: Infinity, pause: Infinity };
      for (let i = 0; i < 10 && best.pause >= 50; i++) {
        if (i) await new Promise((r) => setTimeout(r, 1000));
        const r = await pauseDuring({ url: t.base, pid: t.pid }, auth, () => send(t.base, sent));
        check(sent, r.result);
        if (r.pause < best.pause) best = r;
      }
      expect(best.pause, `${t.name} POST ${route.path} ${body.type} ${body.b.length} bytes: event-loop pause (ms): delay ${best.lag.toFixed(1)}, loop CPU ${best.cpu.toFixed(1)}`).to.be.below(50);
    }), { seed, numRuns: runs, endOnFailure: true });
  });

  it('answers requests naming random image headers (qcow2, VMDK, VHD) with references below 500, naming the field', async () => {
    const seed = process.env.FUZZ_SEED ? Number(process.env.FUZZ_SEED) : Date.now() ^ (Math.random() * 0x7fffffff);
    const runs = Number(process.env.FUZZ_IMAGE_RUNS || 200);
    console.log(`      fast-check seed ${seed} (replay: FUZZ_SEED=${seed}), ${runs} image headers`);
    const imgDir = mkdtempSync(path.join(dir, 'images-'));
    writeFileSync(path.join(imgDir, 'base.raw'), Buffer.alloc(65536));
    const formats = ['vmdk', 'qcow2', 'raw', 'vhd', 'vhdx', 'vdi', undefined];
    const counts: Record<number, number> = {};
    let n = 0;
    await fc.assert(fc.asyncProperty(arbImageFile, fc.nat(3), fc.constantFrom(...formats), fc.constantFrom(0, 1), async (bytes, route, format, ti) => {
      const file = path.join(imgDir, `img-${n++}.${format || 'img'}`);
      writeFileSync(file, bytes);
      const g = targets[ti === 0 ? 0 : 2]; const d = targets[ti === 0 ? 1 : 3];
      const auth: Record<string, string> = { 'content-type': 'application/json', 'x-api-key': KEY };
      const [base, p, body] = [
        [g.base, '/jobs', { operation: 'convert', image: { path: file, format: format || 'raw' }, parameters: { output_format: 'raw', output_dir: imgDir } }],
        [d.base, '/convert/vm', { source_path: file, ...(format ? { source_format: format } : {}), dest_path: `${file}.out`, format: 'raw' }],
        [d.base, '/import/kvm', { image_path: file, vm_name: `fuzz-${n}` }],
        [d.base, '/virt/volume/upload', { pool: 'ferry', volume: `fuzz-${n}.img`, source_path: file }],
      ][route] as [string, string, object];
      const sent: Sent = { method: 'POST', path: p, headers: auth, body: Buffer.from(JSON.stringify(body)) };
      const got = await send(base, sent);
      counts[got.status] = (counts[got.status] || 0) + 1;
      check(sent, got);
    }), { seed, numRuns: runs, path: process.env.FUZZ_PATH, endOnFailure: true });
    console.log(`      answers by status: ${JSON.stringify(counts)}`);
    expect(counts[400] || 0).to.be.above(runs / 4);
  });

  it('the known cases: a bad % escape under /web/dashboard/, a body nested thousands deep, Last-Event-ID and after_id beyond 64 bits', async () => {
    const [, d] = [targets[0], targets[1]];
    const g = targets[0];
    for (const p of ['/web/dashboard/%E0%A4%A', '/api/v1/web/dashboard/%E0%A4%A', '/swagger-ui/%']) {
      const got = await send(d.base, { method: 'GET', path: p, headers: {} });
      expect(got.status, p).to.equal(400);
      expect((JSON.parse(got.text) as DaemonError).error).to.include('path');
    }
    // A body nested thousands deep (seed 1401369970 found POST /jobs/query answering 500): the client's error, 400.
    for (const [base, p] of [[d.base, '/jobs/query'], [g.base, '/jobs']]) {
      const got = await send(base, { method: 'POST', path: p, headers: { 'content-type': 'application/json' }, body: Buffer.from('['.repeat(5000) + ']'.repeat(5000)) });
      expect(got.status, `${p} ${got.text}`).to.equal(400);
      expect(JSON.stringify(JSON.parse(got.text))).to.include('body');
    }
    for (const base of [g.base + '/jobs/fuzz-done/events/stream', d.base + '/jobs/fuzz-done/events/stream']) {
      const got = await send(base.replace(/\/jobs.*/, ''), { method: 'GET', path: base.replace(/^http:\/\/[^/]+/, ''), headers: { 'last-event-id': '18446744073709551616-0', accept: 'text/event-stream' } });
      expect(got.status, base).to.equal(400);
      expect(got.text).to.include('Last-Event-ID');
    }
    const a = await send(g.base, { method: 'GET', path: '/jobs/fuzz-done/events?after_id=18446744073709551616-0', headers: {} });
    expect(a.status).to.equal(400);
    expect((JSON.parse(a.text) as JobApiError).error.message).to.include('after_id');
    const ok = await send(g.base, { method: 'GET', path: '/jobs/fuzz-done/events?after_id=18446744073709551615-0', headers: {} });
    expect(ok.status).to.equal(200);
    expect(JSON.parse(ok.text)).to.deep.equal([]);
  });
});
