// The real `ferry-convert` command (package.json bin) as a child process: mode local with and without guest
// repair, ${NAME} environment references, fetch-and-fix against a real sshd on 127.0.0.1, batch files,
// manager_export, exit codes and plain progress lines on a non-terminal. One appliance launch (the fix run).
import { expect } from 'chai';
import { execFileSync, spawn } from 'node:child_process';
import { promises as fs, mkdtempSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yaml from 'js-yaml';
import { sha256File } from '../../domain/qemu';
import type { ImageInfo } from '../../domain/qemu';
import type { PipelineReport } from '../../domain/converter/stages/report';
import type { FixAction } from '../../domain/converter/types';
import type { FstabChange } from '../../domain/converter/fstab';
import { makeImage, makeBootableImage } from '../helpers/images';
import { startSshd, TestSshd } from '../helpers/sshd';
import { CommandRun as Run, ferryConvert } from '../helpers/procs';
import { until } from '../helpers/http';
import { buildGuests } from '../fixtures/guests';

/** qemu-img info --output=json (format-specific: qcow2's, absent for raw). */
type QemuInfo = ImageInfo & { 'format-specific'?: { data: Record<string, unknown> } };
/** report.json, with the stage results these tests read (validate's checks, inspect's guest, fix's actions). */
type Report = PipelineReport & { stages: {
  validate: { result: { checks: Record<string, unknown>[] } };
  inspect: { result: { guest: Record<string, unknown> } };
  fix: { result: { actions: Array<FixAction & { changes: FstabChange[] }> } };
} };
/** batch-summary.json (services/converter/cli.ts); an entry that did not run has no times. */
interface BatchSummary {
  total: number; succeeded: number; failed: number; not_run: number; duration_seconds: number;
  migrations: Array<{ index: number; to_output: string; ok: boolean; error?: string; report?: string; output?: string; seconds?: number; started_at?: string; finished_at?: string }>;
}

const BIN = path.resolve(__dirname, '..', '..', 'services', 'converter', 'ferry-convert.js');
const NO_FIX = { fstab_mode: 'preserve', update_grub: false, regen_initramfs: false };

const qemuInfo = (f: string) => JSON.parse(execFileSync('qemu-img', ['info', '--output=json', f], { encoding: 'utf8' })) as QemuInfo;
const identical = (a: string, af: string, b: string, bf: string) => {
  try { execFileSync('qemu-img', ['compare', '-q', '-f', af, '-F', bf, a, b]); return true; } catch { return false; }
};

describe('ferry-convert command line', function () {
  this.timeout(120_000);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-cli-'));
  let srcA: string;
  let srcB: string;
  const writeConfig = (name: string, doc: Record<string, unknown>) => { const f = path.join(dir, name); writeFileSync(f, yaml.dump(doc)); return f; };

  before(() => {
    srcA = makeImage(dir, 'alpha', 'vmdk', 16);
    srcB = makeImage(dir, 'beta', 'vmdk', 12);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  describe('mode local', () => {
    const secret = 'S3cr3t-never-shown-9f2c';

    it('converts to compressed qcow2 with ${NAME} references, exit 0, report.json, plain progress lines, the secret never shown', async () => {
      const out = path.join(dir, 'local-1');
      const cfg = writeConfig('local-1.yaml', {
        command: 'local', vmdk: '${FERRY_TEST_SRC}', output_dir: '${FERRY_TEST_OUT}', to_output: 'alpha.qcow2', out_format: 'qcow2',
        compress: true, compression_level: 5, ...NO_FIX, manager_password: '${FERRY_TEST_PW}', log_file: 'local-1.log',
      });
      const r = await ferryConvert(['--config', cfg], { FERRY_TEST_SRC: srcA, FERRY_TEST_OUT: out, FERRY_TEST_PW: secret });
      expect(r.code, r.stderr).to.equal(0);
      const output = path.join(out, 'alpha.qcow2');
      const info = qemuInfo(output);
      expect(info.format).to.equal('qcow2');
      expect(info['virtual-size']).to.equal(16 * 1024 * 1024);
      expect(['zstd', 'zlib']).to.include(info['format-specific']!.data['compression-type']);
      expect(identical(srcA, 'vmdk', output, 'qcow2')).to.equal(true);
      const report = JSON.parse(await fs.readFile(path.join(out, 'report.json'), 'utf8')) as Report;
      expect(report.success).to.equal(true);
      expect(report.stages.fix).to.include({ enabled: false, success: null });
      expect(report.stages.validate.result.checks[0]).to.include({ compare: 'identical to source', integrity: 'ok' });
      expect(report.artifacts[0]).to.include({ path: output, format: 'qcow2', compressed: true, sha256: await sha256File(output) });
      expect(report.warnings.join()).to.match(/compress_level 5 is not honoured/);
      expect(JSON.parse(r.stdout)).to.include({ disks: 1, message: '1 disk(s) migrated' });
      // Not a terminal: plain lines, no carriage-return bar.
      expect(r.stderr).to.not.contain('\r');
      expect(r.stderr).to.match(/^alpha\.qcow2 \d+% convert: /m);
      expect(r.stderr).to.match(/^alpha\.qcow2: OK: 1 disk\(s\) migrated/m);
      const log = await fs.readFile(path.join(dir, 'local-1.log'), 'utf8');
      for (const text of [r.stdout, r.stderr, JSON.stringify(report), log]) expect(text).to.not.contain(secret);
    });

    it('an unset ${NAME} is exit 2 naming the variable and the key; nothing is written', async () => {
      const out = path.join(dir, 'local-unset');
      const cfg = writeConfig('unset.yaml', { command: 'local', vmdk: srcA, output_dir: out, to_output: 'x.qcow2', manager_password: '${FERRY_TEST_UNSET_PW}' });
      const r = await ferryConvert(['--config', cfg]);
      expect(r.code).to.equal(2);
      expect(r.stderr).to.contain('manager_password: environment variable FERRY_TEST_UNSET_PW is not set');
      expect(existsSync(out)).to.equal(false);
    });

    it('a bad key or value is exit 2 naming it', async () => {
      // Both runs side by side (each is seconds of the command loading its modules).
      const [r, none] = await Promise.all([
        ferryConvert(['--config', writeConfig('bad.yaml', { command: 'local', vmdk: srcA, output_dir: dir, to_output: 'x.qcow2', out_format: 'vmdk', colour: 1 })]),
        ferryConvert([]),
      ]);
      expect(r.code).to.equal(2);
      expect(r.stderr).to.match(/"out_format" must be one of \[qcow2, raw, vdi\]/);
      expect(r.stderr).to.match(/"colour" is not allowed/);
      expect(none.code).to.equal(2);
    });

    it('manager_export without output_dir is a usage error (exit 2) naming the key, the password never shown', async () => {
      // The export itself, against the vSphere simulator, is in test/vsphere/export.test.ts.
      const cfg = writeConfig('manager.yaml', { command: 'manager_export', manager_host: 'vcenter.example', manager_user: 'admin', manager_password: '${FERRY_TEST_PW}', vm_name: 'web-1' });
      const r = await ferryConvert(['--config', cfg], { FERRY_TEST_PW: secret });
      expect(r.code).to.equal(2);
      expect(r.stderr).to.match(/output_dir is required in mode manager_export/);
      expect(r.stdout + r.stderr).to.not.contain(secret);
    });

    it('on a terminal: a live progress bar redrawn in place (\\r), ending at 100% on its own line', async () => {
      const out = path.join(dir, 'tty');
      const cfg = writeConfig('tty.yaml', { command: 'local', vmdk: srcA, output_dir: out, to_output: 'tty.qcow2', ...NO_FIX });
      // script(1) gives the command a pseudo-terminal; what it prints comes back on our stdout.
      const r = await new Promise<Run>((resolve, reject) => {
        const child = spawn('script', ['-q', '-e', '-c', `${BIN} --config ${cfg}`, '/dev/null'], { env: { PATH: process.env.PATH!, HOME: process.env.HOME || '/root', TERM: 'xterm' }, stdio: ['pipe', 'pipe', 'pipe'] });
        let stdout = '';
        child.stdout.setEncoding('utf8').on('data', (s) => { stdout += s; });
        child.on('error', reject);
        child.on('close', (code) => resolve({ code, stdout, stderr: '' }));
        child.stdin.end();
      });
      expect(r.code, r.stdout).to.equal(0);
      const frames = r.stdout.split('\r\x1b[K').slice(1);
      expect(frames.length).to.be.at.least(3);
      for (const f of frames.filter((x) => x.startsWith('tty.qcow2 ['))) expect(f).to.match(/^tty\.qcow2 \[[#.]{30}\] +\d+% /);
      expect(r.stdout).to.match(/tty\.qcow2 \[#{30}\] 100% [^\r]*\r?\n/);
      expect(r.stdout).not.to.match(/^tty\.qcow2 \d+% convert: /m); // no plain progress lines on a terminal
      expect(r.stdout).to.match(/tty\.qcow2: OK: 1 disk\(s\) migrated/);
      expect(identical(srcA, 'vmdk', path.join(out, 'tty.qcow2'), 'qcow2')).to.equal(true);
    });

    it('virt_test boots the output once (qemu, snapshot=on): the console shows the boot, the output is unchanged @vm', async () => {
      const src = makeBootableImage(dir, 'bootable', 'vmdk');
      const out = path.join(dir, 'virt-ok');
      const cfg = writeConfig('virt-ok.yaml', { command: 'local', vmdk: src, output_dir: out, to_output: 'boot.qcow2', ...NO_FIX, virt_test: true, vm_name: 'ferry-test-vm', memory: 256, vcpus: 1, virt_test_expect: 'FERRY-BOOT-OK', virt_test_timeout: 60 });
      const r = await ferryConvert(['--config', cfg]);
      expect(r.code, r.stderr).to.equal(0);
      const report = JSON.parse(await fs.readFile(path.join(out, 'report.json'), 'utf8')) as Report;
      expect(report.test_boot).to.include({ status: 'passed', matched: 'FERRY-BOOT-OK', detail: 'the serial console showed "FERRY-BOOT-OK"' });
      expect(report.test_boot!.console_tail).to.contain('FERRY-BOOT-OK');
      expect(report.artifacts[0].sha256).to.equal(await sha256File(path.join(out, 'boot.qcow2')));
      expect(identical(src, 'vmdk', path.join(out, 'boot.qcow2'), 'qcow2')).to.equal(true);
      expect(r.stderr).to.match(/test boot \((kvm|tcg), bios\): passed/);
    });

    it('virt_test on a disk that cannot boot: exit 1, the report says why, the output is kept for a look @vm', async () => {
      const out = path.join(dir, 'virt-bad');
      const cfg = writeConfig('virt-bad.yaml', { command: 'local', vmdk: srcB, output_dir: out, to_output: 'noboot.qcow2', ...NO_FIX, virt_test: true, virt_test_timeout: 120 });
      const r = await ferryConvert(['--config', cfg]);
      expect(r.code).to.equal(1);
      const report = JSON.parse(await fs.readFile(path.join(out, 'report.json'), 'utf8')) as Report;
      expect(report.success).to.equal(false);
      expect(report.test_boot!.status).to.equal('failed');
      expect(report.errors[0]).to.match(/^virt_test: the test boot failed: the VM stopped by itself before the console showed a boot milestone/);
      expect(report.artifacts[0].path).to.equal(path.join(out, 'noboot.qcow2'));
      expect(existsSync(path.join(out, 'noboot.qcow2'))).to.equal(true);
    });

    it('virt_test on a disk that boots and then shows nothing: exit 1 and FAILED, not OK (no milestone is no success) @vm', async () => {
      const src = makeBootableImage(dir, 'silent', 'vmdk', '');
      const out = path.join(dir, 'virt-silent');
      const cfg = writeConfig('virt-silent.yaml', { command: 'local', vmdk: src, output_dir: out, to_output: 'silent.qcow2', ...NO_FIX, virt_test: true, memory: 64, virt_test_timeout: 8 });
      const r = await ferryConvert(['--config', cfg]);
      expect(r.code, r.stderr).to.equal(1);
      expect(r.stderr).to.match(/: FAILED: failed: virt_test: the test boot failed: /).and.not.match(/: OK: /);
      const report = JSON.parse(await fs.readFile(path.join(out, 'report.json'), 'utf8')) as Report;
      expect(report.success).to.equal(false);
      expect(report.test_boot).to.include({ status: 'failed', firmware: 'bios' });
      expect(report.test_boot!.detail).to.match(/\(bios firmware; the VM was still running\): no boot milestone at all/);
      expect(report.firmware).to.deep.equal({ firmware: 'bios', reason: 'the manifest names no firmware; the guest was not inspected' });
    });

    it('virt_test_expect that is not a regular expression is exit 2 naming the key', async () => {
      const r = await ferryConvert(['--config', writeConfig('virt-re.yaml', { command: 'local', vmdk: srcA, output_dir: dir, to_output: 'x.qcow2', virt_test: true, virt_test_expect: '(' })]);
      expect(r.code).to.equal(2);
      expect(r.stderr).to.match(/"virt_test_expect" is not a regular expression: /);
    });

    it('repairs a real guest (fstab uuid-only) into raw output: fix reported, source untouched @vm', async function () {
      // A whole repair in an emulated appliance: 64-114 s in the suite's runs of 2026-12-01 beside the other lane's
      // guests, and once over the describe's 120 s (stop 58), which is the bound of its short tests.
      this.timeout(300_000);
      const g = buildGuests();
      const before = await sha256File(g.plainVmdk);
      const out = path.join(dir, 'local-fix');
      const cfg = writeConfig('fix.yaml', { command: 'local', vmdk: g.plainVmdk, output_dir: out, to_output: 'plain.img', out_format: 'raw', fstab_mode: 'uuid-only', update_grub: false, regen_initramfs: false });
      const r = await ferryConvert(['--config', cfg]);
      expect(r.code, r.stderr).to.equal(0);
      const info = qemuInfo(path.join(out, 'plain.img'));
      expect(info).to.include({ format: 'raw', 'virtual-size': 134217728 });
      const report = JSON.parse(await fs.readFile(path.join(out, 'report.json'), 'utf8')) as Report;
      expect(report.success, report.errors.join()).to.equal(true);
      expect(report.stages.inspect.result.guest).to.include({ os: 'linux', distro: 'debian', root_device: '/dev/sda1' });
      const fstab = report.stages.fix.result.actions.find((a) => a.action === 'fstab')!;
      expect(fstab.status).to.equal('done');
      expect(fstab.changes.map((c) => c.from)).to.deep.equal(['/dev/sda1', '/dev/disk/by-path/pci-0000:00:10.0-scsi-0:0:0:0-part2']);
      expect(fstab.changes.every((c) => /^UUID=/.test(c.to))).to.equal(true);
      expect(report.artifacts[0]).to.include({ modified_by_fix: true, format: 'raw' });
      expect(await sha256File(g.plainVmdk)).to.equal(before);
    });
  });

  describe('mode fetch-and-fix against a real sshd on 127.0.0.1', () => {
    const sdir = path.join(dir, 'ssh');
    let sshd: TestSshd | undefined;
    let port: number;
    const key = path.join(sdir, 'client_key');

    before(async () => {
      sshd = await startSshd(sdir);
      port = sshd.port;
    });
    after(async () => { await sshd?.stop(); });

    const fetchConfig = (name: string, o: Record<string, unknown>) => writeConfig(name, {
      command: 'fetch-and-fix', host: `127.0.0.1:${port}`, user: 'root', identity: key, timeout: 30, ...NO_FIX, ...o,
    });

    it('fetches the remote disk over SSH and converts it; the fetched copy is removed', async () => {
      const out = path.join(dir, 'fetch-ok');
      const r = await ferryConvert(['--config', fetchConfig('fetch-ok.yaml', { remote: srcB, output_dir: out, to_output: 'beta.qcow2', network_retry: 1 })]);
      expect(r.code, r.stderr).to.equal(0);
      expect(r.stderr).to.contain(`fetching root@127.0.0.1:${port}:${srcB}`);
      expect(r.stderr).to.contain(`fetched ${(await fs.stat(srcB)).size} bytes in 1 attempt(s)`);
      expect(identical(srcB, 'vmdk', path.join(out, 'beta.qcow2'), 'qcow2')).to.equal(true);
      const report = JSON.parse(await fs.readFile(path.join(out, 'report.json'), 'utf8')) as Report;
      expect(report).to.include({ success: true });
      expect(report.source).to.include({ export_method: 'fetch-and-fix' });
      expect(await fs.readdir(path.join(out, '.ferry-fetch'))).to.deep.equal(['known_hosts']);
      expect(sshd!.log()).to.match(/Accepted publickey for root from 127\.0\.0\.1/);
    });

    it('a wrong remote path fails clearly (exit 1) after 1 + network_retry attempts, each a real connection', async () => {
      const out = path.join(dir, 'fetch-bad');
      const accepted = () => (sshd!.log().match(/Accepted publickey for root/g) || []).length;
      const before = accepted();
      const t = Date.now();
      const r = await ferryConvert(['--config', fetchConfig('fetch-bad.yaml', { remote: '/no/such/disk.vmdk', output_dir: out, to_output: 'x.qcow2', network_retry: 2 })]);
      expect(r.code).to.equal(1);
      expect(r.stderr).to.match(/FAILED: fetch of root@127\.0\.0\.1:\d+:\/no\/such\/disk\.vmdk failed after 3 attempt\(s\): .*No such file or directory/);
      expect(Date.now() - t).to.be.at.least(3000); // backoff 1 s + 2 s between the attempts
      // sshd's log may lag the command's exit: awaited, then exactly three.
      await until(() => accepted() - before >= 3, 10_000, 'sshd to log the third connection');
      expect(accepted() - before).to.equal(3);
      expect(existsSync(path.join(out, 'x.qcow2'))).to.equal(false);
    });

    it('a fetch-and-fix batch: two at a time, the same remote file for two entries, one missing; each fetched copy its own', async () => {
      const out = path.join(dir, 'fetch-batch');
      const batch = path.join(dir, 'fetch-batch.json');
      writeFileSync(batch, JSON.stringify({
        migrations: [
          { remote: srcA, to_output: 'a1.qcow2' },
          { remote: srcA, to_output: 'a2.img', out_format: 'raw' },
          { remote: '/no/such/disk.vmdk', to_output: 'gone.qcow2', network_retry: 0 },
          { remote: srcB, to_output: 'b.qcow2' },
        ],
      }));
      const cfg = fetchConfig('fetch-batch.yaml', { output_dir: out, batch_manifest: batch, batch_parallel: 2, batch_continue_on_error: true, network_retry: 1 });
      const r = await ferryConvert(['--config', cfg]);
      expect(r.code, r.stderr).to.equal(1);
      expect(JSON.parse(r.stdout)).to.deep.equal({ total: 4, succeeded: 3, failed: 1, not_run: 0 });
      expect(identical(srcA, 'vmdk', path.join(out, 'a1.qcow2'), 'qcow2')).to.equal(true);
      expect(identical(srcA, 'vmdk', path.join(out, 'a2.img'), 'raw')).to.equal(true);
      expect(identical(srcB, 'vmdk', path.join(out, 'b.qcow2'), 'qcow2')).to.equal(true);
      const summary = JSON.parse(await fs.readFile(path.join(out, 'batch-summary.json'), 'utf8')) as BatchSummary;
      expect(summary.migrations[2].error).to.match(/fetch of root@127\.0\.0\.1:\d+:\/no\/such\/disk\.vmdk failed after 1 attempt\(s\)/);
      // The two copies of alpha.vmdk were fetched side by side under their own names, then removed.
      expect(r.stderr).to.contain('[1/4] a1.qcow2: fetching');
      expect(r.stderr).to.contain('[2/4] a2.img: fetching');
      expect(await fs.readdir(path.join(out, '.ferry-fetch'))).to.deep.equal(['known_hosts']);
    });

    it('a batch where two entries name the same output file is exit 2 before anything runs', async () => {
      const batch = path.join(dir, 'dup.json');
      writeFileSync(batch, JSON.stringify({ migrations: [{ remote: srcA, to_output: 'same.qcow2' }, { remote: srcB, to_output: 'same.qcow2' }] }));
      const out = path.join(dir, 'fetch-dup');
      const r = await ferryConvert(['--config', fetchConfig('dup.yaml', { output_dir: out, batch_manifest: batch })]);
      expect(r.code).to.equal(2);
      expect(r.stderr).to.contain(`migrations[1].to_output: ${path.join(out, 'same.qcow2')} is also the output of migrations[0]`);
      expect(existsSync(out)).to.equal(false);
    });
  });

  describe('batch files', () => {
    const batchRun = async (name: string, continueOnError: boolean) => {
      const out = path.join(dir, name);
      const batch = path.join(dir, `${name}.json`);
      writeFileSync(batch, JSON.stringify({
        migrations: [
          { vmdk: path.join(dir, 'missing.vmdk'), to_output: 'bad.qcow2' },
          { vmdk: srcA, to_output: 'alpha.qcow2' },
          { vmdk: srcB, to_output: 'beta.img', out_format: 'raw' }, // per-entry override of out_format
        ],
      }));
      const cfg = writeConfig(`${name}.yaml`, { command: 'local', output_dir: out, out_format: 'qcow2', ...NO_FIX, batch_manifest: batch, batch_parallel: 2, batch_continue_on_error: continueOnError });
      const r = await ferryConvert(['--config', cfg]);
      const summary = JSON.parse(await fs.readFile(path.join(out, 'batch-summary.json'), 'utf8')) as BatchSummary;
      return { r, out, summary };
    };

    it('batch_continue_on_error: true runs every entry, two at a time, with overrides; exit 1 and a summary', async () => {
      const { r, out, summary } = await batchRun('batch-cont', true);
      expect(r.code, r.stderr).to.equal(1);
      expect(JSON.parse(r.stdout)).to.deep.equal({ total: 3, succeeded: 2, failed: 1, not_run: 0 });
      expect(summary.migrations.map((m) => m.ok)).to.deep.equal([false, true, true]);
      expect(summary.migrations[0].error).to.match(/missing\.vmdk/);
      expect(qemuInfo(path.join(out, 'alpha.qcow2')).format).to.equal('qcow2');
      expect(qemuInfo(path.join(out, 'beta.img')).format).to.equal('raw');
      expect(identical(srcB, 'vmdk', path.join(out, 'beta.img'), 'raw')).to.equal(true);
      const rep = JSON.parse(await fs.readFile(path.join(out, 'beta.report.json'), 'utf8')) as Report;
      expect(rep.artifacts[0]).to.include({ format: 'raw', path: path.join(out, 'beta.img') });
      // batch_parallel 2: entry 3 starts only when one of the first two has finished.
      const [m0, m1, m2] = summary.migrations;
      expect(Date.parse(m1.started_at!)).to.be.below(Date.parse(m0.finished_at!));
      expect(Date.parse(m2.started_at!)).to.be.at.least(Math.min(Date.parse(m0.finished_at!), Date.parse(m1.finished_at!)));
      expect(r.stderr).to.match(/^batch: 2 succeeded, 1 failed, 0 not run/m);
    });

    it('batch_continue_on_error: false starts no entry after the failure; exit 1', async () => {
      const { r, out, summary } = await batchRun('batch-stop', false);
      expect(r.code).to.equal(1);
      expect(JSON.parse(r.stdout)).to.deep.equal({ total: 3, succeeded: 1, failed: 1, not_run: 1 });
      expect(summary.migrations[2]).to.include({ ok: false, error: 'not run: an earlier migration failed and batch_continue_on_error is false' });
      expect(existsSync(path.join(out, 'beta.img'))).to.equal(false);
    });

    it('a batch whose entries all succeed exits 0; a malformed batch file exits 2 naming the path', async () => {
      const good = path.join(dir, 'good.json');
      writeFileSync(good, JSON.stringify({ migrations: [{ vmdk: srcB, to_output: 'b.qcow2' }] }));
      const ok = await ferryConvert(['--config', writeConfig('good.yaml', { command: 'local', output_dir: path.join(dir, 'batch-good'), ...NO_FIX, batch_manifest: good })]);
      expect(ok.code, ok.stderr).to.equal(0);
      writeFileSync(good, JSON.stringify({ migrations: [{ vmdk: srcB }] }));
      const bad = await ferryConvert(['--config', writeConfig('good.yaml', { command: 'local', output_dir: path.join(dir, 'batch-bad'), ...NO_FIX, batch_manifest: good })]);
      expect(bad.code).to.equal(2);
      expect(bad.stderr).to.contain('"migrations[0].to_output" is required');
    });
  });
});
