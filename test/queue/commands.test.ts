// The Lua commands (queue/commands/) as Redis runs them: each file's name gives its key count and its header
// lists exactly those KEYS; includes and the generated rules are resolved; every key a command touches is one
// it was given in KEYS (Redis Cluster and Redis's own scripting rules need it), watched with MONITOR over a whole
// lifecycle; and the messages they publish carry exactly the fields queue/bus.ts declares.
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import IORedis from 'ioredis';
import { TestRedis } from '../helpers/redis';
import { until } from '../helpers/http';
import { createRedis, RedisClient } from '../../platform/redis';
import { jobSpecSchema, JobSpec } from '../../domain/schemas/job';
import { HELD, STATES, TRANSITIONS } from '../../domain/states';
import { commandFiles, rulesLua } from '../../queue/scripts';
import { DURATION_BUCKETS, STAT_FIELDS } from '../../queue/stat-fields';
import { JobStore } from '../../queue/store';
import { QueueRouter } from '../../queue/router';
import { Registry } from '../../queue/registry';
import { Lifecycle } from '../../queue/lifecycle';
import { Bus, MESSAGE_FIELDS, type JobEventMessage, type JobStateMessage } from '../../queue/bus';

describe('Lua commands (queue/commands/)', function () {
  this.timeout(60000);

  describe('files', () => {
    it('each <name>-<N>.lua lists KEYS[1..N] in its header (<name>-n.lua: KEYS[1..n]), resolves every include, and gets the rules generated', () => {
      const files = commandFiles();
      expect(files.map((f) => f.file).sort()).to.deep.equal(['addEvent-2.lua', 'addMade-2.lua', 'addOutput-1.lua', 'createJob-14.lua', 'dropLease-1.lua', 'holdLease-2.lua', 'madeOwners-1.lua', 'readFields-n.lua', 'releaseMade-1.lua', 'removeJob-9.lua', 'transitionJob-13.lua']);
      for (const f of files) {
        const listed = [...f.lua.matchAll(/^\s+KEYS\[(\d+)(?:\.\.(\d+|n))?\]/gm)].map((m) => (m[2] === 'n' ? undefined : Number(m[2] || m[1])));
        expect(listed.includes(undefined) ? undefined : Math.max(...(listed as number[])), `${f.file}: the last KEYS the header lists`).to.equal(f.numberOfKeys);
        expect(f.lua, f.file).not.to.match(/@include/);
        expect(f.lua.match(/^local TRANSITIONS = /gm)?.length || 0, `${f.file}: rules included at most once`).to.be.at.most(1);
      }
      const rules = rulesLua();
      for (const s of STATES) for (const to of TRANSITIONS[s]) expect(rules).to.match(new RegExp(`\\['${s}'\\] = \\{[^}]*\\['${to}'\\] = true`));
      expect(rules).to.include(`local DURATION_BUCKETS = {${DURATION_BUCKETS.join(', ')}}`);
      expect(rules).to.include(`local HELD = {${HELD.map((s) => `['${s}'] = true`).join(', ')}}`);
      expect(rules).to.include(`local STAT_TOTAL, STAT_DURATION_IN, STAT_DURATION_SUM = '${STAT_FIELDS.total}', '${STAT_FIELDS.durationIn}', '${STAT_FIELDS.durationSum}'`);
      // The rules are written once: no command or include spells a state or a statistics field itself.
      const dir = path.join(__dirname, '..', '..', 'queue', 'commands');
      for (const f of [...readdirSync(dir).filter((x) => x.endsWith('.lua')), ...readdirSync(path.join(dir, 'includes')).map((x) => `includes/${x}`)]) {
        const code = readFileSync(path.join(dir, f), 'utf8').replace(/--\[\[[\s\S]*?\]\]/g, '').replace(/--.*$/gm, '');
        expect(code, f).not.to.match(new RegExp(`'(${STATES.join('|')})'`));
        expect(code, f).not.to.match(/'(total:|duration_in:|duration_sum)'/);
      }
    });
  });

  describe('on a real Redis', () => {
    const server = new TestRedis();
    let redis: RedisClient;
    let monitor: IORedis;
    let store: JobStore;
    let router: QueueRouter;
    let life: Lifecycle;
    let bus: Bus;
    let n = 0;
    const spec = (over: Record<string, unknown> = {}): JobSpec => jobSpecSchema.validate({ job_id: `k-${++n}`, operation: 'noop', ...over }).value as JobSpec;

    before(async () => {
      await server.start();
      redis = createRedis({ url: server.url });
      store = new JobStore(redis);
      router = new QueueRouter(redis, { stalledCheck: false });
      life = new Lifecycle(store, router, new Registry(redis));
      bus = new Bus(server.url);
      monitor = new IORedis(server.url);
    });
    after(async () => {
      await router?.close();
      await bus?.close();
      monitor?.disconnect();
      redis?.disconnect();
      await server.stop();
    });

    it('touch only the keys they are given, over create, claim, start, progress, complete, fail, cancel and the retention sweep', async () => {
      const ours = new Map(commandFiles().map((f) => [createHash('sha1').update(f.lua).digest('hex'), f]));
      const calls: { file: string; keys: Set<string>; touched: string[][] }[] = [];
      const mon = await monitor.monitor();
      let current: (typeof calls)[number] | null = null;
      mon.on('monitor', (_t: string, args: string[], source: string) => {
        if (source === 'lua') { current?.touched.push(args); return; }
        const cmd = args[0].toLowerCase();
        // ioredis sends EVALSHA, or EVAL with the text when Redis does not have the script yet (pipelines); MONITOR
        // shows the text escaped, so it is known by its header.
        const f = cmd === 'evalsha' ? ours.get(args[1]) : cmd === 'eval' ? [...ours.values()].find((x) => args[1].replace(/\\n/g, '\n').startsWith(x.lua.slice(0, 120))) : undefined;
        current = f ? { file: f.file, keys: new Set(args.slice(3, 3 + Number(args[2]))), touched: [] } : null;
        if (current) calls.push(current);
      });
      // Every command, every path: create, claim, start (event after), progress, complete (event before),
      // a retried failure, a cancel, and the sweep.
      const a = spec();
      await life.submit(a, { enqueue: true });
      const l = (await life.claim({ worker_id: 'w', capabilities: [] }))!;
      await life.start(a.job_id, 'w', l.token, l.record.attempts);
      await life.progress(a.job_id, l.token, { phase: 'work', percentage: 50, message: 'half', details: {} });
      await life.complete(a.job_id, 'w', l.token, {}, l.queue);
      const b = spec({ execution_policy: { retry_count: 1 } });
      await life.submit(b, { enqueue: true });
      const lb = (await life.claim({ worker_id: 'w', capabilities: [] }))!;
      await life.fail(b.job_id, 'w', lb.token, 'drill', true);
      await life.cancel(b.job_id);
      expect(await store.purgeFinished(0)).to.equal(2);
      await until(() => calls.filter((c) => c.file === 'removeJob-9.lua').length === 2, 5000, 'the sweep seen by MONITOR');
      mon.disconnect();

      expect([...new Set(calls.map((c) => c.file))].sort()).to.deep.equal(['addEvent-2.lua', 'createJob-14.lua', 'removeJob-9.lua', 'transitionJob-13.lua']);
      for (const c of calls) {
        expect(c.touched.length, `${c.file}: commands seen inside it`).to.be.above(0);
        for (const args of c.touched) {
          const cmd = args[0].toUpperCase();
          if (cmd === 'PUBLISH') continue; // a channel, not a key
          // DEL names several keys; the others name one, first.
          for (const key of cmd === 'DEL' ? args.slice(1) : [args[1]]) expect(c.keys.has(key), `${c.file}: ${cmd} ${key} is not in its KEYS`).to.equal(true);
        }
      }
    });

    it('publish the bus messages queue/bus.ts declares, field for field', async () => {
      const seen: { jobs: JobStateMessage[]; events: JobEventMessage[] } = { jobs: [], events: [] };
      await bus.on('jobs', (m) => seen.jobs.push(m));
      await bus.on('events', (m) => seen.events.push(m));
      const s = spec();
      await life.submit(s, { enqueue: true });
      const l = (await life.claim({ worker_id: 'w2', capabilities: [] }))!;
      await life.start(s.job_id, 'w2', l.token, l.record.attempts);
      await life.progress(s.job_id, l.token, { phase: 'work', percentage: 50, message: 'half', details: { a: '1' } });
      await life.complete(s.job_id, 'w2', l.token, {}, l.queue);
      await until(() => seen.jobs.some((m) => m.job_id === s.job_id && m.state === 'COMPLETED') && seen.events.filter((m) => m.job_id === s.job_id).length === 3, 5000, 'the messages');
      const jobs = seen.jobs.filter((m) => m.job_id === s.job_id);
      expect(jobs.map((m) => m.state)).to.deep.equal(['QUEUED', 'ASSIGNED', 'RUNNING', 'COMPLETED']);
      for (const [channel, msgs] of [['jobs', jobs], ['events', seen.events.filter((m) => m.job_id === s.job_id)]] as const) {
        const f = MESSAGE_FIELDS[channel];
        for (const m of msgs) {
          for (const k of f.required) expect(m, `${channel} message`).to.have.property(k);
          expect(Object.keys(m).filter((k) => !([...f.required, ...f.optional] as string[]).includes(k)), `${channel}: undeclared fields`).to.deep.equal([]);
        }
      }
      expect(jobs[0]).not.to.have.property('prev'); // a new job
      expect(jobs.slice(1).map((m) => m.prev)).to.deep.equal(['QUEUED', 'ASSIGNED', 'RUNNING']);
      const ev = seen.events.filter((m) => m.job_id === s.job_id);
      expect(ev.map((m) => (m.event as { phase: string }).phase)).to.deep.equal(['initialization', 'work', 'completed']);
      expect(ev.map((m) => m.id)).to.deep.equal((await store.events(s.job_id)).map((e) => e.id));
    });
  });
});
