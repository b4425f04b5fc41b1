// The suite's tiers and order (scripts/test-order.ts, scripts/test.ts): which files each tier takes from the real
// test/ folder, the order from the times the reporter writes (test/helpers/file-times.cjs, on a real file), and the
// fast tier's guard (test/helpers/tier.hooks.ts) against a real qemu.
import { expect } from 'chai';
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { allTagged, orderFiles, proofTimes, readTimes, testFiles, tierFiles, type FileTimes } from '../../scripts/test-order';
import { GUARD_ENV, vmsUnder } from '../helpers/tier.hooks';
import { until } from '../helpers/http';

// eslint-disable-next-line @typescript-eslint/no-require-imports -- the reporter's CommonJS helper, as mocha loads it
const { FileTimes: Recorder } = require('../helpers/file-times.cjs') as { FileTimes: new () => { add(r: object): void; save(file: string, tier: string): void } };

const ROOT = path.resolve(__dirname, '..', '..');
const ME = 'test/deploy/test-order.test.ts';

describe('test tiers and order (scripts/test-order.ts)', function () {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-order-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('takes every test file of test/<folder>/, the guest files first, as the two patterns npm test gave mocha', () => {
    const files = testFiles(ROOT);
    const guest = readdirSync(path.join(ROOT, 'test/guest')).filter((f) => f.endsWith('.test.ts')).map((f) => `test/guest/${f}`).sort();
    expect(guest.length).to.be.above(0);
    expect(files.slice(0, guest.length)).to.deep.equal(guest);
    const rest = files.slice(guest.length);
    expect(rest).to.deep.equal([...rest].sort());
    expect(rest).to.include(ME).and.include('test/spine/cluster.test.ts');
    expect(files.every((f) => /^test\/[^/]+\/.+\.test\.ts$/.test(f))).to.equal(true);
    expect(new Set(files).size).to.equal(files.length);
  });

  it('the fast tier leaves out test/guest/ and files whose every top-level describe has the VM tag, and keeps files with some untagged tests', () => {
    const fast = tierFiles(ROOT, 'fast');
    expect(fast.filter((f) => f.startsWith('test/guest/'))).to.deep.equal([]);
    expect(fast).to.not.include('test/plans/scale.test.ts'); // one describe, tagged
    expect(fast).to.include('test/pipeline/cli.test.ts'); // four of its tests are tagged, the rest run
    expect(fast).to.include('test/pipeline/test-boot.test.ts'); // its pure describe runs
    expect(fast).to.include(ME).and.include('test/deploy/build.test.ts').and.include('test/spine/cluster.test.ts');
    expect(tierFiles(ROOT, 'full')).to.deep.equal(testFiles(ROOT));
    expect(allTagged("describe('a @vm', () => {});\ndescribe(`b ${1} @vm`, function () {});\n")).to.equal(true);
    expect(allTagged("describe('a @vm', () => {});\ndescribe('b', () => {});\n")).to.equal(false);
    // A describe made in a loop is indented: the least indented ones are the top level.
    expect(allTagged("for (const v of vs) {\n  describe(`on ${v} @vm`, () => {});\n}\n")).to.equal(true);
    expect(allTagged("describe('a', () => {\n  describe('nested @vm', () => {});\n});\n")).to.equal(false);
  });

  it('the VM tag stands at the end of a describe or it title, nowhere else in one (mocha greps the full title)', () => {
    const wrong = testFiles(ROOT).flatMap((f) => readFileSync(path.join(ROOT, f), 'utf8').split('\n').flatMap((l, i) => {
      const title = /^\s*(?:describe|it)(?:\.\w+)?\(\s*(['"`])(.*?)\1\s*,/.exec(l)?.[2];
      return title?.includes('@vm') && !/ @vm$/.test(title) ? [`${f}:${i + 1}`] : [];
    }));
    expect(wrong).to.deep.equal([]);
  });

  it('with no times keeps the default order; with times starts the longest first and a file with no time before them', () => {
    const files = ['test/guest/a.test.ts', 'test/guest/b.test.ts', 'test/x/c.test.ts', 'test/x/d.test.ts', 'test/y/e.test.ts'];
    expect(orderFiles(files, {}, 'full')).to.deep.equal(files);
    const times: FileTimes = { full: { 'test/guest/a.test.ts': 300, 'test/guest/b.test.ts': 100, 'test/x/c.test.ts': 400, 'test/y/e.test.ts': 5 } };
    expect(orderFiles(files, times, 'full')).to.deep.equal(['test/x/d.test.ts', 'test/x/c.test.ts', 'test/guest/a.test.ts', 'test/guest/b.test.ts', 'test/y/e.test.ts']);
    // The fast tier orders by its own times where it has them (a file's tagged tests do not run there).
    const fast: FileTimes = { ...times, fast: { 'test/x/c.test.ts': 2 } };
    expect(orderFiles(['test/x/c.test.ts', 'test/y/e.test.ts'], fast, 'fast')).to.deep.equal(['test/y/e.test.ts', 'test/x/c.test.ts']);
  });

  it("orders the next run from the reporter's times file: sums per file, merged with other files' and tiers' times, specs outside the repository left out", () => {
    const file = path.join(dir, 'times.json');
    expect(readTimes(file)).to.deep.equal({}); // a clean clone: no file, the default order
    writeFileSync(file, JSON.stringify({ full: { 'test/x/old.test.ts': 50, '../ferry-proofs-test-x/a.test.ts': 0.1 }, fast: { 'test/x/c.test.ts': 9 } }));
    const r = new Recorder();
    r.add({ file: path.join(os.tmpdir(), 'ferry-proofs-test-y/b.test.ts'), duration: 100, type: 'test' }); // a spec outside: not kept
    r.add({ file: path.join(ROOT, 'test/x/c.test.ts'), duration: 1500, type: 'test' });
    r.add({ file: path.join(ROOT, 'test/x/c.test.ts'), duration: 98_500, type: 'hook' }); // a before hook: 98.5 s
    r.add({ file: path.join(ROOT, 'test/x/d.test.ts'), duration: 20_000, type: 'test' });
    r.add({ duration: 7_000, type: 'hook' }); // a root hook: no file
    r.add({ file: path.join(ROOT, 'test/x/d.test.ts'), type: 'test' }); // pending: no duration
    r.save(file, 'full');
    const times = readTimes(file);
    expect(times).to.deep.equal({ full: { 'test/x/old.test.ts': 50, 'test/x/c.test.ts': 100, 'test/x/d.test.ts': 20 }, fast: { 'test/x/c.test.ts': 9 } });
    expect(orderFiles(['test/x/d.test.ts', 'test/x/old.test.ts', 'test/x/c.test.ts'], times, 'full')).to.deep.equal(['test/x/c.test.ts', 'test/x/old.test.ts', 'test/x/d.test.ts']);
    writeFileSync(file, '{"full": '); // cut short: said, and the default order
    expect(readTimes(file)).to.deep.equal({});
    expect(readFileSync(file, 'utf8')).to.equal('{"full": ');
  });

  it('a file with proofs is timed by its proofs\' fresh run too: after a run that reused them it still starts among the longest', () => {
    const records = path.join(dir, 'proof-records');
    mkdirSync(records, { recursive: true });
    const record = (name: string, at: string, seconds: number, file: string) => writeFileSync(path.join(records, `${name}-${at}.json`),
      JSON.stringify({ name, key: at, at, seconds, inputs: { files: { [file]: 'x', 'test/helpers/proofs.ts': 'y' } }, evidence: {} }));
    // Two proofs in one file (their times add), a later record of one of them (the latest counts), and a corrupt record.
    record('p-one', '2026-12-01T01:00:00.000Z', 300, 'test/x/p.test.ts');
    record('p-one', '2026-12-01T02:00:00.000Z', 250, 'test/x/p.test.ts');
    record('p-two', '2026-12-01T01:00:00.000Z', 100, 'test/x/p.test.ts');
    record('q', '2026-12-01T01:00:00.000Z', 50, 'test/x/q.test.ts');
    writeFileSync(path.join(records, 'broken.json'), '{');
    const fresh = proofTimes(records);
    expect(fresh).to.deep.equal({ 'test/x/p.test.ts': 350, 'test/x/q.test.ts': 50 });
    expect(proofTimes(path.join(dir, 'no-records'))).to.deep.equal({});
    // The last run reused both files' proofs (seconds each); the next one orders them by their fresh time.
    const times: FileTimes = { full: { 'test/x/p.test.ts': 2, 'test/x/q.test.ts': 1, 'test/x/r.test.ts': 200 } };
    expect(orderFiles(['test/x/q.test.ts', 'test/x/r.test.ts', 'test/x/p.test.ts'], times, 'full')).to.deep.equal(['test/x/r.test.ts', 'test/x/p.test.ts', 'test/x/q.test.ts']);
    expect(orderFiles(['test/x/q.test.ts', 'test/x/r.test.ts', 'test/x/p.test.ts'], times, 'full', fresh)).to.deep.equal(['test/x/p.test.ts', 'test/x/r.test.ts', 'test/x/q.test.ts']);
  });

  describe("the fast tier's guard sees a VM under the process, not a capability probe @vm", function () {
    this.timeout(120_000);
    /** A q35 machine held paused (-S): a VM in the guard's sense, at no CPU. */
    const ARGS = ['-machine', 'q35', '-accel', 'tcg', '-S', '-nographic', '-nodefaults', '-display', 'none', '-monitor', 'none', '-serial', 'none'];
    it('a paused q35 machine started here counts; qemu with -machine none does not; neither once it has ended', async () => {
      const start = (machine: string) => spawn('qemu-system-x86_64', ['-machine', machine, ...ARGS.slice(2)], { stdio: 'ignore' });
      const probe = start('none');
      const vm = start('q35');
      try {
        const found = await until(() => vmsUnder(process.pid).find((l) => l.startsWith(`${vm.pid}: `)), 60_000, 'the paused machine in /proc');
        expect(found).to.include('-machine q35');
        expect(readFileSync(`/proc/${probe.pid}/comm`, 'utf8'), 'the probe still running').to.match(/^qemu-system/);
        expect(vmsUnder(process.pid).some((l) => l.startsWith(`${probe.pid}: `)), 'the -machine none probe').to.equal(false);
        expect(vmsUnder(1).length).to.be.at.least(1); // pid 1 is an ancestor of everything
      } finally {
        for (const p of [probe, vm]) p.kill('SIGKILL');
      }
      await until(() => !vmsUnder(process.pid).some((l) => l.startsWith(`${vm.pid}: `)), 30_000, 'the machine gone');
    });

    it('a machine that left the process tree (as a guestfish server forks away) counts by the mark in its environment', async () => {
      const sh = spawnSync('sh', ['-c', `qemu-system-x86_64 ${ARGS.join(' ')} >/dev/null 2>&1 </dev/null & echo $!`], { encoding: 'utf8', env: { ...process.env, [GUARD_ENV]: String(process.pid) } });
      const pid = Number(sh.stdout.trim());
      try {
        expect(pid).to.be.above(0);
        await until(() => vmsUnder(process.pid).find((l) => l.startsWith(`${pid}: `)), 60_000, 'the orphaned machine in /proc');
        expect(readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ')[1], 'its parent').to.not.equal(String(process.pid));
        expect(vmsUnder(process.pid + 1_000_000)).to.deep.equal([]); // another worker's mark
      } finally {
        process.kill(pid, 'SIGKILL');
      }
    });
  });
});
