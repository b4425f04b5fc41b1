// A guestfish server forks away from the worker that started it: when that worker is killed mid-job (SIGKILL,
// the OOM killer), the server and its appliance must go too, not keep the job's disks open and an emulated CPU
// busy for ever (the leftover appliances of killed test runs were found doing exactly that). A real appliance,
// opened by a real child process that is then SIGKILLed.
import { expect } from 'chai';
import { execFileSync, spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { until } from '../helpers/http';
import { ApplianceCrash, GuestSession, LAUNCH_TRIES, LaunchTimeout } from '../../domain/converter/guestfs';
import { runPipeline } from '../../domain/converter/pipeline';
import { validateManifest } from '../../domain/schemas/manifest';

const GUESTFS = path.resolve(__dirname, '../../domain/converter/guestfs.ts');
const alive = (pid: number) => { try { process.kill(pid, 0); return true; } catch { return false; } };
/** The pids pgrep finds with `args` (it exits 1 when none). */
const pgrep = (...args: string[]) => {
  try { return execFileSync('pgrep', args, { encoding: 'utf8' }).split('\n').filter(Boolean).map(Number); } catch { return []; }
};
const children = (pid: number) => pgrep('-P', String(pid));

describe('guestfish servers do not outlive the process that opened them @vm', function () {
  this.timeout(600_000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guestfs-owner-'));
  let server = 0;
  after(() => {
    if (server && alive(server)) process.kill(server, 'SIGKILL'); // the test failed: do not leave what it found
    rmSync(dir, { recursive: true, force: true });
  });

  it('a worker SIGKILLed with a session open takes the server, its appliance and its stderr file with it', async () => {
    const disk = path.join(dir, 'scratch.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', disk, '16M']);
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
    server = Number(await until(() => {
      if (child.exitCode !== null) throw new Error(`the owner exited ${child.exitCode}: ${err}`);
      return /SERVER (\d+)/.exec(out)?.[1];
    }, 400_000, 'the appliance to launch'));
    expect(alive(server), 'the server runs while its owner does').to.equal(true);
    const appliance = children(server);
    expect(appliance.length, 'the server has its appliance (qemu) as a child').to.be.greaterThan(0);

    child.kill('SIGKILL');
    await until(() => !alive(server), 30_000, 'the guestfish server to go with its owner');
    await until(() => appliance.every((p) => !alive(p)), 30_000, 'the appliance to go with its server');
    // The watchdog that did it is gone too.
    await until(() => pgrep('-f', `ferry-guestfish-watchdog ${server} `).length === 0, 10_000, 'the watchdog to exit');
    // And the server's stderr file, which the killed owner could not remove.
    expect(readdirSync(os.tmpdir()).filter((f) => f.startsWith(`ferry-guestfish-${child.pid}-`))).to.deep.equal([]);
  });

  it('a launch that gives no answer in time: its server and appliance are killed, it is tried once more, then fails naming the limit', async () => {
    const disk = path.join(dir, 'hung.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', disk, '16M']);
    // One second is far below a launch here (~20 s), so each try meets the deadline as a hung boot would.
    const before = process.env.FERRY_GUESTFS_LAUNCH_SECONDS;
    process.env.FERRY_GUESTFS_LAUNCH_SECONDS = '1';
    const said: string[] = [];
    const t = Date.now();
    let failure: unknown;
    try {
      await GuestSession.open([{ path: disk, format: 'qcow2' }], { log: (l) => said.push(l) });
    } catch (e) { failure = e; } finally {
      if (before === undefined) delete process.env.FERRY_GUESTFS_LAUNCH_SECONDS; else process.env.FERRY_GUESTFS_LAUNCH_SECONDS = before;
    }
    expect(failure).to.be.instanceOf(LaunchTimeout);
    expect((failure as Error).message).to.equal('the appliance gave no answer within 1 s of its launch (a hung emulated boot); its server and appliance were killed');
    expect(said).to.deep.equal([`${(failure as Error).message}: launching again (try 2 of ${LAUNCH_TRIES})`]);
    expect(Date.now() - t, 'two tries of one second each, not a whole launch').to.be.below(15_000);
    // Nothing of either try is left: no server, no qemu on the disk, no stderr file of this process.
    await until(() => pgrep('-f', disk).length === 0, 30_000, 'every process naming the disk to go');
    expect(readdirSync(os.tmpdir()).filter((f) => f.startsWith(`ferry-guestfish-${process.pid}-`))).to.deep.equal([]);
  });

  /** A qemu that fails to start the appliance (the launch, the one run with -kernel) `times` times, then is qemu;
   *  libguestfs's own probes (-help, -version) reach the real one. Through LIBGUESTFS_HV, as libguestfs documents. */
  const flakyQemu = (name: string, times: number) => {
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
  };
  const openWith = async (hv: string, disk: string, said: string[]) => {
    const before = process.env.LIBGUESTFS_HV;
    process.env.LIBGUESTFS_HV = hv;
    try { return await GuestSession.open([{ path: disk, format: 'qcow2' }], { log: (l) => said.push(l) }); } finally {
      if (before === undefined) delete process.env.LIBGUESTFS_HV; else process.env.LIBGUESTFS_HV = before;
    }
  };

  it('an appliance that crashes at launch is launched once more, and the session works', async () => {
    const disk = path.join(dir, 'crash-once.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', disk, '16M']);
    const q = flakyQemu('crash-once', 1);
    const said: string[] = [];
    const s = await openWith(q.hv, disk, said);
    try {
      expect(await s.cmd('blockdev-getsize64', '/dev/sda')).to.equal(String(16 * 1024 * 1024) + '\n');
      // Commands travel as lines on guestfish's input: a name and a text with quotes, backslashes, a newline, a
      // comment sign and non-ASCII arrive exactly, and a failing command leaves the session usable.
      await s.cmd('mkfs', 'ext2', '/dev/sda');
      await s.cmd('mount', '/dev/sda', '/');
      const name = '/a "b" \\c #d ~e\nf ü';
      const text = 'line "one"\n\tback\\slash $HOME `x`\r\n# not a command\necho ferry-0\n';
      await s.writeFile(name, text);
      expect(await s.read(name)).to.equal(text);
      expect(await s.isFile('/missing/dir/file')).to.equal(false);
      const missing = await s.cmd('cat', '/missing').then(() => undefined, (e: Error) => e.message);
      expect(missing).to.equal('guestfish cat: download: /missing: No such file or directory');
      expect((await s.cmdBytes('read-file', name)).equals(Buffer.from(text))).to.equal(true);
    } finally { await s.close(); }
    expect(q.launches(), 'two launches').to.equal(2);
    expect(said).to.have.length(1);
    expect(said[0]).to.match(/^guestfish run: .*: launching again \(try 2 of 2, with libguestfs's debug output kept\)$/);
  });

  it('an appliance that crashes at every launch fails after two, with what qemu said, and leaves nothing running', async () => {
    const disk = path.join(dir, 'crash-always.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', disk, '16M']);
    const q = flakyQemu('crash-always', 99);
    let failure: unknown;
    try { await openWith(q.hv, disk, []); } catch (e) { failure = e; }
    expect(failure).to.be.instanceOf(ApplianceCrash);
    expect((failure as Error).message).to.include('the appliance crashed at launch twice').and.include('ferry test: the emulator failed to start (crash-always)');
    expect(q.launches()).to.equal(LAUNCH_TRIES);
    await until(() => pgrep('-f', disk).length === 0, 30_000, 'every process naming the disk to go');
    expect(readdirSync(os.tmpdir()).filter((f) => f.startsWith(`ferry-guestfish-${process.pid}-`))).to.deep.equal([]);
  });

  it('a run lost to appliance crashes says it may be tried again (retryable); a disk with no system says it may not', async () => {
    const disk = path.join(dir, 'blank.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', disk, '16M']);
    const m = (out: string) => validateManifest({
      manifest_version: '1.0', disks: [{ id: 'a', source_format: 'qcow2', bytes: 16 * 1024 * 1024, local_path: disk }],
      pipeline: { inspect: { enabled: true, collect_guest_info: true }, convert: { enabled: true }, fix: { enabled: true } }, output: { directory: path.join(dir, out), format: 'qcow2' },
    });
    const q = flakyQemu('crash-pipeline', 99);
    const before = process.env.LIBGUESTFS_HV;
    process.env.LIBGUESTFS_HV = q.hv;
    let crashed;
    try { crashed = await runPipeline(m('crashed')); } finally {
      if (before === undefined) delete process.env.LIBGUESTFS_HV; else process.env.LIBGUESTFS_HV = before;
    }
    expect(crashed.success).to.equal(false);
    expect(crashed.errors.join('\n')).to.include('the appliance crashed at launch twice');
    expect(crashed.retryable, 'a crash is the host\'s, not the guest\'s').to.equal(true);
    const blank = await runPipeline(m('blank'));
    expect(blank.success).to.equal(false);
    expect(blank.errors.join('\n')).to.not.include('crashed');
    expect(blank.retryable, blank.errors.join('; ')).to.equal(false);
  });

  it('an appliance launched with `nice` runs at that much lower CPU priority than its opener, and one without at the same', async () => {
    const disk = path.join(dir, 'nice.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', disk, '16M']);
    const own = os.getPriority();
    for (const nice of [7, 0]) {
      const s = await GuestSession.open([{ path: disk, format: 'qcow2' }], { nice });
      try {
        const qemu = children(s.pid).filter((p) => /qemu/.test(execFileSync('ps', ['-o', 'comm=', '-p', String(p)], { encoding: 'utf8' })));
        expect(qemu.length, 'the appliance (qemu) runs under the session').to.be.greaterThan(0);
        for (const p of [s.pid, ...qemu]) expect(os.getPriority(p), `priority of ${p} opened with nice ${nice}`).to.equal(Math.min(19, own + nice));
      } finally { await s.close(); }
    }
  });
});
