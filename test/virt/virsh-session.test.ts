// The long-lived virsh per URI (domain/libvirt/virsh-session.ts), against libvirt's built-in test driver
// (test:///default: libvirt's own code, a domain "test" and a network "default", no daemon): every answer is what
// a virsh of its own gives, errors included; one process serves many commands, including commands issued at
// once; an unreachable URI is a 503 naming it; an idle session never keeps Node running. The real libvirtd paths
// (imports, /virt) go through it in test/virt/*.test.ts.
import { expect } from 'chai';
import { execFile, spawn } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { LibvirtError, Virsh } from '../../domain/libvirt/virsh';
import { virshSession } from '../../domain/libvirt/virsh-session';

const URI = 'test:///default';
const oneShot = async (args: string[]) => (await promisify(execFile)('virsh', ['-q', '-c', URI, ...args])).stdout;

describe('virsh session (one virsh per URI for short commands)', function () {
  this.timeout(60000);
  const v = new Virsh(URI);

  it('answers as a virsh of its own would, output and errors alike, and one process serves every command', async () => {
    const first = await v.run(['dumpxml', 'test']);
    const pid = virshSession(URI).pid;
    expect(pid).to.be.a('number');
    for (const args of [['dumpxml', 'test'], ['domstate', 'test'], ['net-list', '--all', '--name'], ['list', '--all'], ['pool-list', '--all', '--name']]) {
      expect(await v.run(args), args.join(' ')).to.equal(await oneShot(args));
    }
    expect(first).to.equal(await oneShot(['dumpxml', 'test']));
    const err = await v.run(['dominfo', 'no-such-domain']).then(() => null, (e: LibvirtError) => e);
    expect(err).to.be.instanceOf(LibvirtError);
    expect(err!.status).to.equal(404);
    expect(err!.message).to.contain("'no-such-domain'");
    // The session goes on after a failed command.
    expect(await v.run(['domuuid', 'test'])).to.equal(await oneShot(['domuuid', 'test']));
    expect(virshSession(URI).pid).to.equal(pid);
  });

  it('passes arguments exactly: quotes, semicolons, spaces and empty ones do not reach the shell as syntax', async () => {
    const args = ["it's", '"quoted"', 'a ; list', '', '\\back'];
    const echoed = await virshSession(URI).run(['echo', ...args], 10000);
    expect(echoed.failed).to.equal(false);
    expect(echoed.stdout).to.equal(args.join(' '));
    // A newline would end the command: such arguments get a virsh of their own.
    const err = await v.run(['dominfo', 'a\nlist']).then(() => null, (e: LibvirtError) => e);
    expect(err?.status).to.equal(404);
  });

  it('commands issued at once are each answered with their own output', async () => {
    const cmds = [['dumpxml', 'test'], ['domuuid', 'test'], ['net-dumpxml', 'default'], ['domstate', 'test'], ['dominfo', 'nope'], ['net-uuid', 'default']];
    const got = await Promise.all(cmds.map((c) => v.run(c).catch((e: LibvirtError) => `status ${e.status}`)));
    const want = await Promise.all(cmds.map((c) => oneShot(c).catch(() => 'status 404')));
    expect(got).to.deep.equal(want);
  });

  it('an unreachable URI is a 503 naming it, every time it is tried', async () => {
    const bad = new Virsh('qemu:///system?socket=/nonexistent/ferry-test.sock');
    for (let i = 0; i < 2; i++) {
      const e = await bad.run(['list']).then(() => null, (x: LibvirtError) => x);
      expect(e?.status).to.equal(503);
      expect(e!.message).to.contain('qemu:///system?socket=/nonexistent/ferry-test.sock');
    }
  });

  it('an idle session does not keep a Node process running', async () => {
    const script = `const { Virsh } = require(${JSON.stringify(path.resolve(__dirname, '../../domain/libvirt/virsh'))}); new Virsh('${URI}').run(['domstate', 'test']).then((s) => console.log(s.trim()));`;
    const child = spawn(process.execPath, ['-r', 'tsx/cjs', '-e', script], { cwd: path.resolve(__dirname, '../..'), stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    // Well before the session's 30 s idle limit: the process ends as soon as its work is done.
    const code = await new Promise<number | null>((resolve, reject) => {
      const t = setTimeout(() => { child.kill(); reject(new Error('the process was still running after 15 s')); }, 15000);
      child.on('exit', (c) => { clearTimeout(t); resolve(c); });
    });
    expect(code).to.equal(0);
    expect(out.trim()).to.equal('running');
  });
});
