// virt_test on the virtualization host: the converted disk boots in a transient libvirt domain (removed
// afterwards, its disk unchanged) and the serial-console judgement is the one of domain/converter/testboot.ts.
import { expect } from 'chai';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { makeBootableImage } from '../helpers/images';
import { releaseLibvirt, useLibvirt, TestLibvirt } from '../helpers/libvirt';
import { testBoot, testBootLibvirt } from '../../domain/converter/testboot';
import { Virsh } from '../../domain/libvirt';

describe('virt_test through libvirt (a transient domain) @vm', function () {
  this.timeout(180_000);
  let lv: TestLibvirt;
  let dir: string;
  const sha = (f: string) => createHash('sha256').update(readFileSync(f)).digest('hex');
  before(async () => { lv = await useLibvirt(); dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-virttest-')); });
  after(async () => { await releaseLibvirt(); rmSync(dir, { recursive: true, force: true }); });

  it('passes when the console shows virt_test_expect; the domain is gone and the disk unchanged', async () => {
    const disk = makeBootableImage(dir, 'ok', 'qcow2');
    const before = sha(disk);
    process.env.FERRY_LIBVIRT_URI = lv.uri;
    process.env.FERRY_LIBVIRT_DOMAIN_TYPE = 'qemu';
    try {
      const r = await testBoot({ disks: [{ path: disk, format: 'qcow2' }], expect: /FERRY-BOOT-OK/, memoryMiB: 64, timeoutSeconds: 90 });
      expect(r.status, r.detail).to.equal('passed');
      expect(r.matched).to.equal('FERRY-BOOT-OK');
      expect(r.accelerator).to.equal('tcg');
      expect(r.console_tail).to.include('FERRY-BOOT-OK');
    } finally { delete process.env.FERRY_LIBVIRT_URI; delete process.env.FERRY_LIBVIRT_DOMAIN_TYPE; }
    expect((await lv.virsh(['list', '--all', '--name'])).trim()).not.to.match(/ferry-virt-test/);
    expect(sha(disk)).to.equal(before);
  });

  it('fails when the disk does not boot (the domain resets and ends)', async () => {
    const blank = path.join(dir, 'blank.qcow2');
    execFileSync('qemu-img', ['create', '-q', '-f', 'qcow2', blank, '8M']);
    const r = await testBootLibvirt({ disks: [{ path: blank, format: 'qcow2' }], expect: /FERRY-BOOT-OK/, memoryMiB: 64, timeoutSeconds: 90 }, new Virsh(lv.uri));
    expect(r.status, r.detail).to.equal('failed');
    expect(r.detail).to.include('stopped by itself');
    expect((await lv.virsh(['list', '--all', '--name'])).trim()).not.to.match(/ferry-virt-test/);
  });
});
