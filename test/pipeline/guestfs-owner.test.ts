// A guestfish server forks away from the worker that started it: when that worker is killed mid-job (SIGKILL,
// the OOM killer), the server and its appliance must go too, not keep the job's disks open and an emulated CPU
// busy for ever (the leftover appliances of killed test runs were found doing exactly that). A real appliance,
// opened by a real child process that is then SIGKILLed. Beside it, what a launch does when the appliance hangs or
// crashes, and the priority an appliance runs at.
// A reused proof (test/helpers/proof-tests.ts): what each scenario saw is its evidence, and with every input
// unchanged (guestfs.ts and what it loads, libguestfs, qemu, the kernel) each test re-asserts the evidence of the
// last passing run; the appliances start only when the proof runs fresh.
import { expect } from 'chai';
import { execFileSync, spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { until } from '../helpers/http';
import { ApplianceCrash, GuestSession, LAUNCH_TRIES, LaunchTimeout } from '../../domain/converter/guestfs';
import { runPipeline } from '../../domain/converter/pipeline';
import { validateManifest } from '../../domain/schemas/manifest';
import { errorText } from '../../platform/errors';
import { proofTests } from '../helpers/proof-tests';

const GUESTFS = path.resolve(__dirname, '../../domain/converter/guestfs.ts');
const alive = (pid: number) => { try { process.kill(pid, 0); return true; } catch { return false; } };
/** The pids pgrep finds with `args` (it exits 1 when none). */
const pgrep = (...args: string[]) => {
  try { return execFileSync('pgrep', args, { encoding: 'utf8' }).split('\n').filter(Boolean).map(Number); } catch { return []; }
};
const children = (pid: number) => pgrep('-P', String(pid));

/** What a scenario's failure was: its class (by instanceof, as the checks ask) and its message. */
interface Failure { launchTimeout: boolean; applianceCrash: boolean; message: string }
const failureOf = (e: unknown): Failure => ({ launchTimeout: e instanceof LaunchTimeout, applianceCrash: e instanceof ApplianceCrash, message: errorText(e) });
/** What is left after a scenario once every process naming its disk went (the run waits for that): the stderr files. */
interface Leftovers { stderrFiles: string[] }
const stderrFiles = (pid: number) => readdirSync(os.tmpdir()).filter((f) => f.startsWith(`ferry-guestfish-${pid}-`));

interface Evidence {
  owner: { serverAliveWithOwner: boolean; applianceCount: number; stderrFiles: string[] };
  hung: { failure: Failure; said: string[]; ms: number } & Leftovers;
  crashOnce: { size: string; readBack: string; text: string; missingIsFile: boolean; missing?: string; bytesEqual: boolean; launches: number; said: string[] };
  crashAlways: { failure: Failure; launches: number } & Leftovers;
  pipeline: Record<'crashed' | 'blank', { success: boolean; errors: string[]; retryable?: boolean }>;
  nice: { own: number; runs: { nice: number; qemu: number; priorities: [pid: number, priority: number][] }[] };
}

const blankDisk = (dir: string, name: string) => {
  const disk = path.join(dir, `${name}.qcow2`);
  execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', disk, '16M']);
  return disk;
};
/** Runs `f` with the environment variable `name` set to `value`, then puts it back as it was. */
async function withEnv<T>(name: string, value: string, f: () => Promise<T>): Promise<T> {
  const before = process.env[name];
  process.env[name] = value;
  try { return await f(); } finally { if (before === undefined) delete process.env[name]; else process.env[name] = before; }
}

/** A qemu that fails to start the appliance (the launch, the one run with -kernel) `times` times, then is qemu;
 *  libguestfs's own probes (-help, -version) reach the real one. Through LIBGUESTFS_HV, as libguestfs documents. */
function flakyQemu(dir: string, name: string, times: number) {
  const count = path.join(dir, `${name}.count`);
  const hv = path.join(dir, `${name}.sh`);
  writeFileSync(hv, `#!/bin/sh
case " $* " in *" -kernel "*)
  n=$(cat ${count} 2>/dev/null || echo 0); echo $((n + 1)) > ${count}
  if [ "$n" -lt ${times} ]; then echo "qemu-system-x86_64: ferry test: the emulator failed to start (${name})" >&2; exit 1; fi;;
esac
exec qemu-system-x86_64 "$@"
`);
  chmodSync(hv, 0o755);
  return { hv, launches: () => (existsSync(count) ? Number(execFileSync('cat', [count], { encoding: 'utf8' })) : 0) };
}
const openWith = (hv: string, disk: string, said: string[]) => withEnv('LIBGUESTFS_HV', hv, () => GuestSession.open([{ path: disk, format: 'qcow2' }], { log: (l) => said.push(l) }));

/** A child process opens a session, prints its server's pid and is SIGKILLed: what went with it. */
async function ownerKilled(dir: string, kill: { server: number }): Promise<Evidence['owner']> {
  const disk = blankDisk(dir, 'scratch');
  const owner = path.join(dir, 'owner.ts');
  writeFileSync(owner, `import { GuestSession } from ${JSON.stringify(GUESTFS)};
GuestSession.open([{ path: ${JSON.stringify(disk)}, format: 'qcow2' }]).then((s) => { console.log('SERVER ' + s.pid); setInterval(() => {}, 1000); },
  (e) => { console.error(e); process.exit(1); });
`);
  const child = spawn(process.execPath, ['--import', 'tsx', owner], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (b: Buffer) => { out += b.toString(); });
  child.stderr.on('data', (b: Buffer) => { err += b.toString(); });
  const server = kill.server = Number(await until(() => {
    if (child.exitCode !== null) throw new Error(`the owner exited ${child.exitCode}: ${err}`);
    return /SERVER (\d+)/.exec(out)?.[1];
  }, 400_000, 'the appliance to launch'));
  const serverAliveWithOwner = alive(server);
  const appliance = children(server);
  child.kill('SIGKILL');
  await until(() => !alive(server), 30_000, 'the guestfish server to go with its owner');
  await until(() => appliance.every((p) => !alive(p)), 30_000, 'the appliance to go with its server');
  // The watchdog that did it is gone too.
  await until(() => pgrep('-f', `ferry-guestfish-watchdog ${server} `).length === 0, 10_000, 'the watchdog to exit');
  return { serverAliveWithOwner, applianceCount: appliance.length, stderrFiles: stderrFiles(child.pid!) };
}

/** A launch deadline of one second, far below a launch here (~20 s), so each try meets it as a hung boot would. */
async function hungLaunch(dir: string): Promise<Evidence['hung']> {
  const disk = blankDisk(dir, 'hung');
  const said: string[] = [];
  const t = Date.now();
  const failure = await withEnv('FERRY_GUESTFS_LAUNCH_SECONDS', '1', () => GuestSession.open([{ path: disk, format: 'qcow2' }], { log: (l) => said.push(l) }))
    .then(async (s) => { await s.close(); return failureOf(new Error('the session opened')); }, failureOf);
  const ms = Date.now() - t;
  // Nothing of either try is left: no server, no qemu on the disk, no stderr file of this process.
  await until(() => pgrep('-f', disk).length === 0, 30_000, 'every process naming the disk to go');
  return { failure, said, ms, stderrFiles: stderrFiles(process.pid) };
}

/** An appliance that crashes at its first launch: the session of the second, and what travels through it. */
async function crashOnce(dir: string): Promise<Evidence['crashOnce']> {
  const disk = blankDisk(dir, 'crash-once');
  const q = flakyQemu(dir, 'crash-once', 1);
  const said: string[] = [];
  const s = await openWith(q.hv, disk, said);
  // Commands travel as lines on guestfish's input: a name and a text with quotes, backslashes, a newline, a
  // comment sign and non-ASCII arrive exactly, and a failing command leaves the session usable.
  const name = '/a "b" \\c #d ~e\nf ü';
  const text = 'line "one"\n\tback\\slash $HOME `x`\r\n# not a command\necho ferry-0\n';
  try {
    const size = await s.cmd('blockdev-getsize64', '/dev/sda');
    await s.cmd('mkfs', 'ext2', '/dev/sda');
    await s.cmd('mount', '/dev/sda', '/');
    await s.writeFile(name, text);
    const readBack = await s.read(name);
    const missingIsFile = await s.isFile('/missing/dir/file');
    const missing = await s.cmd('cat', '/missing').then(() => undefined, (e: Error) => e.message);
    const bytesEqual = (await s.cmdBytes('read-file', name)).equals(Buffer.from(text));
    return { size, readBack, text, missingIsFile, missing, bytesEqual, launches: q.launches(), said };
  } finally { await s.close(); }
}

async function crashAlways(dir: string): Promise<Evidence['crashAlways']> {
  const disk = blankDisk(dir, 'crash-always');
  const q = flakyQemu(dir, 'crash-always', 99);
  const failure = await openWith(q.hv, disk, []).then(async (s) => { await s.close(); return failureOf(new Error('the session opened')); }, failureOf);
  await until(() => pgrep('-f', disk).length === 0, 30_000, 'every process naming the disk to go');
  return { failure, launches: q.launches(), stderrFiles: stderrFiles(process.pid) };
}

/** The pipeline on a blank disk, once with an appliance that always crashes, once as it is. */
async function pipelineRuns(dir: string): Promise<Evidence['pipeline']> {
  const disk = blankDisk(dir, 'blank');
  const m = (out: string) => validateManifest({
    manifest_version: '1.0', disks: [{ id: 'a', source_format: 'qcow2', bytes: 16 * 1024 * 1024, local_path: disk }],
    pipeline: { inspect: { enabled: true, collect_guest_info: true }, convert: { enabled: true }, fix: { enabled: true } }, output: { directory: path.join(dir, out), format: 'qcow2' },
  });
  const q = flakyQemu(dir, 'crash-pipeline', 99);
  const pick = (r: { success: boolean; errors: string[]; retryable?: boolean }) => ({ success: r.success, errors: r.errors, retryable: r.retryable });
  const crashed = pick(await withEnv('LIBGUESTFS_HV', q.hv, () => runPipeline(m('crashed'))));
  return { crashed, blank: pick(await runPipeline(m('blank'))) };
}

/** Sessions opened with nice 7 and 0: the priorities of the server and its qemu. */
async function niceRuns(dir: string): Promise<Evidence['nice']> {
  const disk = blankDisk(dir, 'nice');
  const runs: Evidence['nice']['runs'] = [];
  for (const nice of [7, 0]) {
    const s = await GuestSession.open([{ path: disk, format: 'qcow2' }], { nice });
    try {
      const qemu = children(s.pid).filter((p) => /qemu/.test(execFileSync('ps', ['-o', 'comm=', '-p', String(p)], { encoding: 'utf8' })));
      runs.push({ nice, qemu: qemu.length, priorities: [s.pid, ...qemu].map((p) => [p, os.getPriority(p)]) });
    } finally { await s.close(); }
  }
  return { own: os.getPriority(), runs };
}

async function produce(): Promise<Evidence> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guestfs-owner-'));
  const kill = { server: 0 };
  try {
    const e: Evidence = {
      owner: await ownerKilled(dir, kill), hung: await hungLaunch(dir), crashOnce: await crashOnce(dir),
      crashAlways: await crashAlways(dir), pipeline: await pipelineRuns(dir), nice: await niceRuns(dir),
    };
    return JSON.parse(JSON.stringify(e)) as Evidence;
  } finally {
    if (kill.server && alive(kill.server)) process.kill(kill.server, 'SIGKILL'); // the run failed: do not leave what it found
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('guestfish servers do not outlive the process that opened them @vm', function () {
  this.timeout(600_000);
  proofTests<Evidence>({
    spec: () => ({ name: 'pipeline-guestfs-owner', entries: [__filename] }),
    produce,
    runTitle: 'opens, kills and crashes real appliances (or reuses the record of the same inputs)',
    checks: [
      ['a worker SIGKILLed with a session open takes the server, its appliance and its stderr file with it', ({ owner }) => {
        expect(owner.serverAliveWithOwner, 'the server runs while its owner does').to.equal(true);
        expect(owner.applianceCount, 'the server has its appliance (qemu) as a child').to.be.greaterThan(0);
        // The server, its appliance and its watchdog went (the run waited for each); and the server's stderr file,
        // which the killed owner could not remove.
        expect(owner.stderrFiles).to.deep.equal([]);
      }],
      ['a launch that gives no answer in time: its server and appliance are killed, it is tried once more, then fails naming the limit', ({ hung }) => {
        expect(hung.failure.launchTimeout, hung.failure.message).to.equal(true);
        expect(hung.failure.message).to.equal('the appliance gave no answer within 1 s of its launch (a hung emulated boot); its server and appliance were killed');
        expect(hung.said).to.deep.equal([`${hung.failure.message}: launching again (try 2 of ${LAUNCH_TRIES})`]);
        expect(hung.ms, 'two tries of one second each, not a whole launch').to.be.below(15_000);
        // Nothing of either try is left: no process naming the disk (the run waited for it), no stderr file.
        expect(hung.stderrFiles).to.deep.equal([]);
      }],
      ['an appliance that crashes at launch is launched once more, and the session works', ({ crashOnce: c }) => {
        expect(c.size).to.equal(String(16 * 1024 * 1024) + '\n');
        expect(c.readBack).to.equal(c.text);
        expect(c.missingIsFile).to.equal(false);
        expect(c.missing).to.equal('guestfish cat: download: /missing: No such file or directory');
        expect(c.bytesEqual).to.equal(true);
        expect(c.launches, 'two launches').to.equal(2);
        expect(c.said).to.have.length(1);
        expect(c.said[0]).to.match(/^guestfish run: .*: launching again \(try 2 of 2, with libguestfs's debug output kept\)$/);
      }],
      ['an appliance that crashes at every launch fails after two, with what qemu said, and leaves nothing running', ({ crashAlways: c }) => {
        expect(c.failure.applianceCrash, c.failure.message).to.equal(true);
        expect(c.failure.message).to.include('the appliance crashed at launch twice').and.include('ferry test: the emulator failed to start (crash-always)');
        expect(c.launches).to.equal(LAUNCH_TRIES);
        expect(c.stderrFiles).to.deep.equal([]);
      }],
      ['a run lost to appliance crashes says it may be tried again (retryable); a disk with no system says it may not', ({ pipeline: { crashed, blank } }) => {
        expect(crashed.success).to.equal(false);
        expect(crashed.errors.join('\n')).to.include('the appliance crashed at launch twice');
        expect(crashed.retryable, 'a crash is the host\'s, not the guest\'s').to.equal(true);
        expect(blank.success).to.equal(false);
        expect(blank.errors.join('\n')).to.not.include('crashed');
        expect(blank.retryable, blank.errors.join('; ')).to.equal(false);
      }],
      ['an appliance launched with `nice` runs at that much lower CPU priority than its opener, and one without at the same', ({ nice }) => {
        expect(nice.runs.map((r) => r.nice)).to.deep.equal([7, 0]);
        for (const r of nice.runs) {
          expect(r.qemu, 'the appliance (qemu) runs under the session').to.be.greaterThan(0);
          for (const [p, prio] of r.priorities) expect(prio, `priority of ${p} opened with nice ${r.nice}`).to.equal(Math.min(19, nice.own + r.nice));
        }
      }],
    ],
  });
});
