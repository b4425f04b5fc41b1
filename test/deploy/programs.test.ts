// Issue 17: the set-up installs every program the project runs. The list (scripts/programs.txt) is checked by
// the set-up itself, shown in docs/testing.md, and proven complete by the record every process of the suite
// keeps (test/helpers/programs.hooks.ts); these tests show each of those pieces can fail.
import { execFile, execFileSync } from 'node:child_process';
import type { ExecFileException } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { expect } from 'chai';
import { documentedTable, programList, programsTable, PROGRAMS_FILE } from '../../scripts/programs';
import { unlisted, which } from '../helpers/programs';
import { recordedPrograms } from '../helpers/programs.hooks';

const run = promisify(execFile);
const ROOT = path.resolve(__dirname, '..', '..');
/** How the promisified execFile rejects: the error with what the command printed. */
type ExecFailure = ExecFileException & { stdout: string; stderr: string };

describe('the programs the set-up installs (scripts/programs.txt)', () => {
  let dir: string;
  before(() => { dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-programs-test-')); });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('lists dnsmasq, which libvirtd starts for any network with an address', () => {
    expect(programList().find((e) => e.names.includes('dnsmasq'))).to.include({ package: 'dnsmasq-base', group: 'libvirt' });
  });

  it('docs/testing.md shows the list as it is', () => {
    expect(documentedTable(), 'run: npx tsx scripts/programs.ts').to.equal(programsTable());
  });

  it('every entry is present on this machine after set-up (setup.sh --check)', async () => {
    await run('bash', [path.join(ROOT, 'scripts/setup.sh'), '--check']);
    for (const e of programList()) for (const n of e.names) expect(which(n), `${n} (${e.package})`).to.be.a('string');
  });

  it('the set-up names what is missing and stops', async () => {
    const list = path.join(dir, 'programs.txt');
    writeFileSync(list, `${readFileSync(PROGRAMS_FILE, 'utf8')}ferry-no-such-tool  -  given  a prerequisite nobody installed\n`);
    const err = await run('bash', [path.join(ROOT, 'scripts/setup.sh'), '--check'], { env: { ...process.env, FERRY_PROGRAMS_FILE: list } }).then(() => undefined, (e: ExecFailure) => e);
    expect(err, 'setup.sh --check passed with a missing program').to.not.be.oneOf([null, undefined]);
    expect(err!.stderr).to.match(/missing ferry-no-such-tool/);
    writeFileSync(list, `${readFileSync(PROGRAMS_FILE, 'utf8')}ferry-no-such-tool  ferry-no-such-package  base  a package not installed\n`);
    const err2 = await run('bash', [path.join(ROOT, 'scripts/setup.sh'), '--check'], { env: { ...process.env, FERRY_PROGRAMS_FILE: list } }).then(() => undefined, (e: ExecFailure) => e);
    expect(err2?.stderr).to.match(/missing packages: ferry-no-such-package/);
  });

  it('records what node processes and bash scripts run, and flags a program the list lacks', async () => {
    // A record of its own, so that these two unlisted programs do not fail the suite's check after the last test.
    const log = path.join(dir, 'programs.log');
    const env = { ...process.env, FERRY_PROGRAM_LOG: log };
    // A child node process (NODE_OPTIONS carries the recorder) spawning tac, and a bash script (BASH_ENV) running rev.
    execFileSync(process.execPath, ['-e', "require('node:child_process').execFileSync('tac', ['/dev/null'])"], { env });
    const script = path.join(dir, 'uses-rev.sh');
    writeFileSync(script, '#!/usr/bin/env bash\nset -euo pipefail\necho abc | rev >/dev/null\n');
    await run('bash', [script], { env });
    const recorded = readFileSync(log, 'utf8').split('\n');
    expect(recorded).to.include.members(['tac', 'rev']);
    // The check after the last test, on this record: the builtin echo, a listed program by name or by path, and
    // the repository's own script pass; tac and rev are named.
    expect(unlisted([...recorded, 'qemu-img', '/usr/bin/qemu-img', path.join(ROOT, 'scripts/vcsim.sh')])).to.deep.equal(['rev', 'tac']);
    expect(recordedPrograms(), 'the suite records into its own log').to.include('bash');
  });
});
