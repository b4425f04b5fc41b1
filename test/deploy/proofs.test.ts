// Reused proofs (issue 32 item 1, test/helpers/proofs.ts): a guest test's record is keyed by everything it depends
// on. Shown on the repository's real files, each changed in memory (a reader that overrides one file's content, so the
// tree is never edited): a change in the converter, in domain/libvirt, in a test helper, in the fixture's build script,
// in package-lock.json or in a tool's version gives another key; a change to docs/*.md gives the same key. Then the
// record itself: written only when the check passed, re-checked with the same function instead of running again,
// ignored under FERRY_FRESH_PROOFS=1, and a real mocha run (parallel, as npm test) names the reused proofs and their
// commit before its closing line, which stays last.
import { expect } from 'chai';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { closure, currentCommit, proofKey, ProofLogLine, Reader, reusedProof, ROOT, toolVersions } from '../helpers/proofs';

const GUEST_TEST = path.join(ROOT, 'test/guest/uefi.test.ts');
const rel = (files: string[]) => files.map((f) => path.relative(ROOT, f));
/** The real files, with `file`'s content changed. */
const changed = (file: string): Reader => (f) => {
  const real = readFileSync(f);
  return f === path.join(ROOT, file) ? Buffer.concat([real, Buffer.from('\n// changed\n')]) : real;
};

describe('reused proofs: the key covers every input (issue 32)', function () {
  this.timeout(120_000);
  const spec = { name: 'uefi', entries: [GUEST_TEST], extra: { fixture: 'debian12-uefi-x' } };

  it('the closure of a guest test holds the converter command, the code it loads, the helpers and the fixture scripts, and no docs', () => {
    const files = rel(closure([GUEST_TEST]));
    expect(files).to.include.members(['test/guest/uefi.test.ts', 'services/converter/ferry-convert.js', 'services/converter/cli.ts',
      'domain/converter/testboot.ts', 'test/helpers/procs.ts', 'test/fixtures/debian-guest.ts', 'test/fixtures/source-proof.ts',
      'scripts/guest-image/build.sh', 'scripts/guest-image/uefi.sh', 'scripts/guest-image/rootfs.sh']);
    expect(files.filter((f) => f.startsWith('domain/libvirt/')).length).to.be.greaterThan(0);
    expect(files.filter((f) => f.startsWith('docs/') || f.startsWith('node_modules/') || f.startsWith('test/artifacts/'))).to.deep.equal([]);
    expect(Object.keys(proofKey(spec).inputs.files)).to.include('package-lock.json');
  });

  it('the closure of a test that starts the services holds each service, their run-time scripts and the simulator\'s build script', () => {
    const files = rel(closure([path.join(ROOT, 'test/guest/migration.test.ts')]));
    expect(files).to.include.members(['services/gateway/main.ts', 'services/daemon/main.ts', 'services/worker/main.ts', 'scripts/vcsim.sh',
      'test/helpers/libvirtd-ns.sh', 'domain/libvirt/domains.ts']);
    expect(files.filter((f) => /^queue\/commands\/.*\.lua$/.test(f)).length, 'the Lua scripts queue/scripts.ts reads').to.be.greaterThan(0);
  });

  it('changing a file in the converter, domain/libvirt, a test helper, the fixture script or package-lock.json changes the key; a docs change does not', () => {
    const files = rel(closure([GUEST_TEST]));
    const converter = files.find((f) => f.startsWith('domain/converter/') && f !== 'domain/converter/testboot.ts')!;
    const libvirt = files.find((f) => f.startsWith('domain/libvirt/'))!;
    const base = proofKey(spec).key;
    for (const f of [converter, libvirt, 'test/helpers/boot-logs.ts', 'scripts/guest-image/build.sh', 'services/converter/cli.ts', 'package-lock.json']) {
      expect(proofKey(spec, changed(f)).key, f).to.not.equal(base);
    }
    for (const f of readdirSync(path.join(ROOT, 'docs')).filter((d) => d.endsWith('.md')).map((d) => `docs/${d}`)) {
      expect(proofKey(spec, changed(f)).key, f).to.equal(base);
    }
    expect(proofKey(spec).key, 'the same inputs, the same key').to.equal(base);
  });

  it('the heavy files of issue 32 item 2: the plan on the tiny guest keys the services it starts and the fixture; the in-process conversions key the converter', () => {
    const scale = { name: 'plans-scale', entries: [path.join(ROOT, 'test/plans/scale.test.ts')], extra: { fixture: 'tiny-guest-x' } };
    const pipeline = { name: 'pipeline-real-guests', entries: [path.join(ROOT, 'test/pipeline/pipeline.test.ts')], extra: { fixture: 'ferry-guest-fixtures-v7' } };
    expect(rel(closure(scale.entries))).to.include.members(['services/daemon/main.ts', 'services/worker/main.ts', 'test/plans/fixture.ts', 'test/fixtures/tiny-guest.ts', 'queue/slots.ts', 'scripts/vcsim.sh', 'test/helpers/libvirtd-ns.sh']);
    expect(rel(closure(pipeline.entries))).to.include.members(['domain/converter/pipeline.ts', 'domain/converter/fstab.ts', 'test/fixtures/guests.ts']);
    for (const [spec, inputs] of [[scale, ['queue/slots.ts', 'services/worker/main.ts', 'test/fixtures/tiny-guest.ts', 'domain/converter/fstab.ts']], [pipeline, ['domain/converter/fstab.ts', 'test/fixtures/guests.ts']]] as const) {
      const base = proofKey(spec).key;
      for (const f of inputs) expect(proofKey(spec, changed(f)).key, `${spec.name}: ${f}`).to.not.equal(base);
      expect(proofKey(spec, changed('docs/testing.md')).key, `${spec.name}: docs`).to.equal(base);
    }
  });

  it('the files that became proofs for the docs-only figure key what they run: the services and the ledger, the guest reading, the helper their checks go through', () => {
    const ledger = { name: 'security-ledger', entries: [path.join(ROOT, 'test/security/ledger.test.ts')], extra: { fixture: 'tiny-guest-x' } };
    const reading = { name: 'pipeline-linux-reading', entries: [path.join(ROOT, 'test/pipeline/linux-reading.test.ts')] };
    const live = { name: 'plans-live-kill', entries: [path.join(ROOT, 'test/plans/live.test.ts')] };
    for (const [spec, inputs] of [
      [ledger, ['domain/libvirt/ledger.ts', 'orchestration/plans.ts', 'services/worker/main.ts', 'test/plans/fixture.ts', 'test/helpers/proof-tests.ts', 'test/fixtures/tiny-guest.ts']],
      [reading, ['domain/converter/linux-reading.ts', 'domain/converter/guestfs.ts', 'domain/converter/root-choice.ts', 'test/helpers/proof-tests.ts']],
      [live, ['services/daemon/main.ts', 'queue/slots.ts', 'test/helpers/sse.ts', 'test/helpers/ws.ts']],
    ] as const) {
      expect(rel(closure(spec.entries))).to.include.members([...inputs]);
      const base = proofKey(spec).key;
      for (const f of inputs) expect(proofKey(spec, changed(f)).key, `${spec.name}: ${f}`).to.not.equal(base);
      expect(proofKey(spec, changed('docs/testing.md')).key, `${spec.name}: docs`).to.equal(base);
    }
  });

  it('another qemu, OVMF, libguestfs or kernel version, or another fixture, changes the key', () => {
    const tools = toolVersions();
    expect(tools['qemu-system-x86']).to.match(/^\d/);
    expect(tools.kernel).to.equal(os.release());
    const base = proofKey(spec).key;
    for (const t of ['qemu-system-x86', 'ovmf', 'libguestfs0', 'kernel', 'appliance_kernels']) {
      expect(proofKey(spec, undefined, { ...tools, [t]: `${tools[t]}+1` }).key, t).to.not.equal(base);
    }
    expect(proofKey({ ...spec, extra: { fixture: 'debian12-uefi-y' } }).key).to.not.equal(base);
  });
});

describe('reused proofs: recorded when passed, re-checked, forced fresh (issue 32)', function () {
  this.timeout(180_000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-proofs-test-'));
  const saved = { dir: process.env.FERRY_PROOF_DIR, log: process.env.FERRY_PROOF_LOG, fresh: process.env.FERRY_FRESH_PROOFS };
  // These tests show reuse itself, so a FERRY_FRESH_PROOFS=1 the whole run was given must not reach them.
  before(() => { process.env.FERRY_PROOF_DIR = path.join(dir, 'records'); process.env.FERRY_PROOF_LOG = path.join(dir, 'log'); delete process.env.FERRY_FRESH_PROOFS; });
  after(() => {
    for (const [k, v] of [['FERRY_PROOF_DIR', saved.dir], ['FERRY_PROOF_LOG', saved.log], ['FERRY_FRESH_PROOFS', saved.fresh]] as const) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
    rmSync(dir, { recursive: true, force: true });
  });

  it('a failed check records nothing; a passed one is re-checked from the record; FERRY_FRESH_PROOFS=1 runs it again', async () => {
    const spec = { name: 'unit', entries: [__filename], extra: { n: Math.random() } };
    let runs = 0;
    const produce = () => Promise.resolve({ value: ++runs });
    const checked: number[] = [];
    const failing = () => { throw new Error('the proof does not hold'); };
    let err: unknown;
    await reusedProof(spec, produce, failing).catch((e: unknown) => { err = e; });
    expect(String(err)).to.contain('the proof does not hold');
    expect(existsSync(process.env.FERRY_PROOF_DIR!), 'no record of a failed proof').to.equal(false);

    const check = (e: { value: number }) => { checked.push(e.value); expect(e.value).to.be.a('number'); };
    expect(await reusedProof(spec, produce, check)).to.equal('fresh');
    expect(await reusedProof(spec, produce, check)).to.equal('reused');
    expect([runs, checked], 'the second check read the first run\'s evidence').to.deep.equal([2, [2, 2]]);
    process.env.FERRY_FRESH_PROOFS = '1';
    try { expect(await reusedProof(spec, produce, check)).to.equal('fresh'); } finally { delete process.env.FERRY_FRESH_PROOFS; }
    expect(runs).to.equal(3);
    const log = readFileSync(process.env.FERRY_PROOF_LOG!, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as ProofLogLine);
    expect(log.map((l) => [l.name, l.outcome, l.commit])).to.deep.equal([['unit', 'fresh', currentCommit()], ['unit', 'reused', currentCommit()], ['unit', 'fresh (forced)', currentCommit()]]);
  });

  /** mocha as npm test runs it (two files in parallel workers, the repository's .mocharc.json), on two specs that
   *  each hold one proof. */
  function runMocha(specs: string[], env: Record<string, string>): Promise<{ code: number | null; out: string }> {
    return new Promise((resolve, reject) => {
      const child = spawn(process.execPath, [path.join(ROOT, 'node_modules/mocha/bin/mocha.js'), '--parallel', '--jobs', '2', ...specs],
        { cwd: ROOT, env: { ...process.env, NODE_PATH: path.join(ROOT, 'node_modules'), FERRY_PROOF_LOG: '', FERRY_PROOF_MAIN_PID: '', FERRY_FRESH_PROOFS: '', FERRY_TEST_TIMES: '', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      child.stdout.setEncoding('utf8').on('data', (s: string) => { out += s; });
      child.stderr.setEncoding('utf8').on('data', (s: string) => { out += s; });
      child.on('error', reject);
      child.on('close', (code) => resolve({ code, out }));
    });
  }

  it('several tests over one proof (proof-tests.ts): a failing check fails its test alone and records nothing; passed, the next run re-checks each from the record', async () => {
    const f = path.join(dir, 'multi.test.ts');
    writeFileSync(f, `import { expect } from 'chai';\nimport { proofTests } from ${JSON.stringify(path.join(ROOT, 'test/helpers/proof-tests'))};\n`
      + 'describe(\'multi\', () => { proofTests<{ n: number }>({ spec: () => ({ name: \'multi\', entries: [__filename] }), produce: async () => ({ n: Number(process.env.MULTI_N) }), '
      + 'runTitle: \'runs\', checks: [[\'a number\', (e) => { expect(e.n).to.be.a(\'number\'); }], [\'two\', (e) => { expect(e.n).to.equal(2); }]] }); });\n');
    const records = path.join(dir, 'multi-records');
    const run = (n: number) => runMocha([f], { FERRY_PROOF_DIR: records, MULTI_N: String(n) });
    const failed = await run(1);
    expect(failed.code, failed.out).to.not.equal(0);
    expect(failed.out.trim().split('\n').pop(), 'only the failing check fails').to.equal('2 passed, 1 failed, 0 skipped');
    expect(failed.out).to.match(/two:\s*\n\s*AssertionError: expected 1 to equal 2/);
    expect(existsSync(records) ? readdirSync(records) : [], 'no record of a failed proof').to.deep.equal([]);
    const passed = await run(2);
    expect(passed.out.trim().split('\n').pop(), passed.out).to.equal('3 passed, 0 failed, 0 skipped');
    expect(passed.out).to.match(/Proofs: 0 reused from records \(not run again\), 1 run fresh\./);
    // The record's evidence (n = 2), not a new run's (n = 1), is what the checks read now.
    const reused = await run(1);
    expect(reused.out.trim().split('\n').pop(), reused.out).to.equal('3 passed, 0 failed, 0 skipped');
    expect(reused.out).to.match(/Proofs: 1 reused from records \(not run again\), 0 run fresh\./);
  });

  it('a mocha run names the proofs it reused and their commit before its closing line', async () => {
    const specs = ['a', 'b'].map((n) => {
      const f = path.join(dir, `${n}.test.ts`);
      writeFileSync(f, `import { expect } from 'chai';\nimport { reusedProof } from ${JSON.stringify(path.join(ROOT, 'test/helpers/proofs'))};\n`
        + `it('${n}', async () => { await reusedProof({ name: 'summary-${n}', entries: [__filename] }, async () => ({ ok: true }), (e) => { expect(e.ok).to.equal(true); }); });\n`);
      return f;
    });
    const env = { FERRY_PROOF_DIR: path.join(dir, 'summary-records') };
    const first = await runMocha(specs, env);
    expect(first.code, first.out).to.equal(0);
    expect(first.out).to.match(/Proofs: 0 reused from records \(not run again\), 2 run fresh\./);
    const second = await runMocha(specs, env);
    expect(second.code, second.out).to.equal(0);
    expect(second.out).to.match(/Proofs: 2 reused from records \(not run again\), 0 run fresh\./);
    expect(second.out).to.contain(`reused summary-a: recorded `).and.contain(` at commit ${currentCommit()} `);
    const lines = second.out.trim().split('\n');
    expect(lines[lines.length - 1], 'the closing line stays last').to.equal('2 passed, 0 failed, 0 skipped');
  });
});
