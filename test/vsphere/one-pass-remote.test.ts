// Issue 36 item 1, another host: a shape B job whose destination is a libvirt host reached over qemu+ssh:// (the
// tests' libvirtd behind a private sshd on 127.0.0.1) writes each disk straight into its volume there, through
// libvirt's upload streams, with nothing of the disk landing on the worker. Checked as its operator would: the
// volume on the host (named after the domain, its zero runs holes) equals the source plus exactly the repair's
// writes, the domain boots, the data path names the host, the block check ran, the worker's export folder holds no
// copy, the connection went through ssh; a worker killed mid-copy resumes into the same volume; a volume of that
// name Ferry did not make is refused before any byte moves, left as it was; and a worker whose reader of the source
// cannot start, so that the disk would go through its export folder instead, is refused before any byte moves when
// that folder is too small for it, its volume on the host removed again.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, statfsSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { until } from '../helpers/http';
import type { Proc } from '../helpers/procs';
import { startProxy, type ProxyControl } from '../helpers/tcp-proxy';
import { startSshd, type TestSshd } from '../helpers/sshd';
import { releaseLibvirt, useLibvirt } from '../helpers/libvirt';
import { createPlanVm, type PlanStack, startPlanStack } from '../plans/fixture';
import { upload } from './fixture';
import { tolerate } from '../helpers/teardown';
import { BOOT_BYTES, blockList, flatBootDisk, identical, jobDriver, MIB, repairedExactly, sha256, walk } from './one-pass-jobs';

interface BlockCheck { block_bytes: number; blocks: number; checked_after_merge: number; repair_written: number[]; repair_uploaded_bytes: number }
interface Rec {
  status: string; attempts: number; state_history: { state: string; reason?: string }[]; error?: string; ledger: { id: string; kind: string; virt_uri: string }[];
  result?: {
    boot: { status: string }; domain: string; virt_uri: string; volumes: { name: string; path: string; format: string }[];
    data_path: { mode: string; volume?: string; virt_uri?: string; verified?: string; block_check?: BlockCheck }[];
    conversion: { report_path: string; artifacts: { disk_id: string; path: string; modified_by_fix?: boolean }[] };
    export: { manifest_path: string; bytes_sparse: number; bytes_rehashed: number };
    repair_beside_copy: { ran: boolean; reason?: string; overlap_seconds?: number };
  };
}

describe('one pass onto another host: each disk streamed once into its volume over qemu+ssh:// (issue 36) @vm', function () {
  this.timeout(1_800_000);
  let s: PlanStack;
  let sshd: TestSshd;
  let uri: string;
  let proxy: ProxyControl;
  let boot: Awaited<ReturnType<typeof flatBootDisk>>;
  let small: string | undefined; // a tmpfs the last test mounts as a worker's export folder
  const workers: Proc[] = [];
  const { finished, worker, submit: submitTo } = jobDriver<Rec>(() => s, () => proxy, workers);
  const submit = (vm: string) => submitTo(vm, uri);
  const addVm = async (name: string, mac: string) => {
    await createPlanVm(s.m, { name, mac, disks: [{ ds: 'LocalDS_0', file: `${name}/boot.vmdk`, bytes: BOOT_BYTES }] });
    await upload(s.v, boot.desc, `${name}/boot.vmdk`);
    await upload(s.v, boot.extent, `${name}/boot-flat.vmdk`);
  };
  const repaired = (volume: string, overlay: string) => repairedExactly(s.dir, boot.raw, volume, overlay);

  before(async function () {
    this.timeout(300_000);
    // The host's URI names the shared libvirtd's socket behind the sshd, so it is known before the stack starts.
    const lv = await useLibvirt();
    sshd = await startSshd(mkdtempSync(path.join(os.tmpdir(), 'ferry-remote1p-ssh-')));
    uri = `qemu+ssh://root@127.0.0.1:${sshd.port}/system?socket=${lv.sockDir}/libvirt-sock&keyfile=${sshd.key}&no_verify=1&no_tty=1`;
    s = await startPlanStack({ prefix: 'remote1p', workers: {}, env: { FERRY_EXPORT_CHUNK_BYTES: String(MIB), FERRY_ONE_PASS_BLOCK_BYTES: String(MIB), FERRY_LIBVIRT_URIS: uri } });
    proxy = await startProxy(s.v.port);
    boot = await flatBootDisk(s.dir, 'boot');
    await addVm('ra', '00:50:56:36:01:01');
    await addVm('rk', '00:50:56:36:01:02');
    await addVm('rx', '00:50:56:36:01:03');
    await addVm('rs', '00:50:56:36:01:04');
    await worker('rp-1');
  });
  after(async () => {
    await Promise.all(workers.map((w) => w.kill()));
    await proxy?.close();
    for (const d of ['ra', 'rk']) {
      await s?.lv.virsh(['destroy', d]).catch(tolerate(`destroy ${d}`));
      await s?.lv.virsh(['undefine', d, '--remove-all-storage']).catch(tolerate(`undefine ${d}`));
    }
    await s?.lv.virsh(['vol-delete', '--pool', s.lv.pool, 'rx.raw']).catch(tolerate('the planted volume'));
    await s?.lv.virsh(['vol-delete', '--pool', s.lv.pool, 'rs.raw']).catch(tolerate('rs.raw (expected gone)'));
    // Unmounted before the stack's folder, which holds it, is removed.
    if (small) { try { execFileSync('umount', [small]); } catch (e) { tolerate(`umount ${small}`)(e as Error); } }
    await s?.stop();
    await sshd?.stop();
    await releaseLibvirt();
  });

  it('the disk goes straight into its volume on the host, named after the domain, holes kept, repaired exactly; it boots; no copy on the worker', async () => {
    const sshLogins = (sshd.log().match(/Accepted publickey/g) ?? []).length;
    const id = await submit('ra');
    const r = await finished(id);
    expect(r.status, JSON.stringify(r.state_history)).to.equal('completed');
    const res = r.result!;
    expect(res.boot.status).to.equal('passed');
    expect(res.virt_uri).to.equal(uri);
    const [dp] = res.data_path;
    expect(dp.mode, JSON.stringify(dp)).to.equal('one_pass');
    expect(dp.virt_uri).to.equal(uri);
    const volume = path.join(s.lv.poolDir, 'ra.raw');
    expect(dp.volume).to.equal(volume);
    expect(res.volumes.map((v) => [v.name, v.path, v.format])).to.deep.equal([['ra.raw', volume, 'raw']]);
    expect(res.repair_beside_copy.ran, JSON.stringify(res.repair_beside_copy)).to.equal(true);
    // On the host: the domain's disk is that volume, its zero runs holes, source + exactly the repair's writes.
    expect(await s.lv.virsh(['domblklist', 'ra'])).to.include(volume);
    expect(statSync(volume).size).to.equal(BOOT_BYTES);
    expect(statSync(volume).blocks * 512, 'zeros left as holes').to.be.below(BOOT_BYTES - 8 * MIB);
    expect(res.export.bytes_sparse).to.be.above(8 * MIB);
    const overlay = res.conversion.artifacts[0];
    expect(overlay.modified_by_fix).to.equal(true);
    expect(identical(['-f', 'raw', '-F', 'raw', boot.raw, volume]), 'the repair was uploaded').to.equal(false);
    expect(repaired(volume, overlay.path)).to.equal(true);
    // The block check: the repair's blocks named, every other block read back from the host and matched.
    const check = dp.block_check!;
    expect(check.blocks).to.equal(48);
    expect(check.repair_written.length).to.be.above(0).and.below(48);
    expect(check.checked_after_merge).to.equal(48 - check.repair_written.length);
    expect(check.repair_uploaded_bytes).to.be.above(0).and.below(BOOT_BYTES / 2);
    const vol = blockList(volume);
    const list = blockList(boot.raw);
    expect(check.repair_written).to.include.members(Array.from({ length: 48 }, (_, i) => i).filter((i) => vol[i] !== list[i]));
    const manifest = JSON.parse(readFileSync(res.export.manifest_path, 'utf8')) as { disks: { data_path: { blocks: { sha256: string[] }; virt_uri: string } }[] };
    expect(manifest.disks[0].data_path.blocks.sha256).to.deep.equal(list);
    expect(manifest.disks[0].data_path.virt_uri).to.equal(uri);
    // The volume, recorded in the job's ledger by its path on that host before it was made.
    expect(r.ledger.filter((e) => e.kind === 'volume').map((e) => [e.id, e.virt_uri])).to.deep.equal([[volume, uri]]);
    // Nothing of the disk on the worker: no extent, no raw copy, no file the size of the disk, no pipe left.
    const files = walk(path.join(s.env.FERRY_EXPORT_DIR, id));
    expect(files.filter((f) => /boot-flat\.vmdk|\.raw$|\.fifo$/.test(f)), files.join('\n')).to.deep.equal([]);
    expect(files.filter((f) => statSync(f).blocks * 512 >= 16 * MIB), 'nothing near the disk\'s size').to.deep.equal([]);
    // It went through the host's sshd (the upload lanes, the merge and the import each log in).
    expect((sshd.log().match(/Accepted publickey/g) ?? []).length - sshLogins).to.be.at.least(3);
    // The source's files on the datastore are as uploaded.
    expect(sha256(path.join(s.v.datastores.LocalDS_0, 'ra', 'boot-flat.vmdk'))).to.equal(sha256(boot.extent));
  });

  it('a worker killed mid-copy: the retry resumes into the same volume, this job\'s own, and the result still compares equal', async () => {
    proxy.throttle(1024 * 1024); // 1 MiB/s per connection: the 48 MiB disk takes about 12 s on 4 streams
    const before = proxy.bytesDown;
    const id = await submit('rk');
    const volume = path.join(s.lv.poolDir, 'rk.raw');
    await until(() => existsSync(volume), 120_000, 'the volume on the host');
    await until(() => proxy.bytesDown - before >= 16 * MIB, 120_000, '16 MiB through the proxy');
    const inode = statSync(volume).ino;
    await workers[0].kill();
    proxy.throttle(0);
    await worker('rp-2');
    const r = await finished(id);
    expect(r.status, JSON.stringify(r.state_history)).to.equal('completed');
    expect(r.attempts).to.be.at.least(2);
    const res = r.result!;
    expect(res.data_path[0].mode).to.equal('one_pass');
    expect(statSync(volume).ino, 'the same volume, continued').to.equal(inode);
    expect(res.export.bytes_rehashed, 'what the killed worker uploaded was read back for the hash').to.be.at.least(4 * MIB);
    expect(proxy.bytesDown - before, 'the disk was not downloaded twice').to.be.below(BOOT_BYTES * 1.6);
    expect(repaired(volume, res.conversion.artifacts[0].path)).to.equal(true);
  });

  it('a volume of that name Ferry did not make: refused before any byte moves, naming it, and left as it was', async () => {
    await s.lv.virsh(['vol-create-as', s.lv.pool, 'rx.raw', String(MIB), '--format', 'raw']);
    const planted = path.join(s.lv.poolDir, 'rx.raw');
    const was = sha256(planted);
    const before = proxy.bytesDown;
    const id = await submit('rx');
    const r = await finished(id, 300_000);
    expect(r.status).to.equal('failed');
    expect(JSON.stringify(r.state_history) + (r.error ?? '')).to.include('volume rx.raw already exists in pool').and.include('this job did not make it');
    expect(sha256(planted)).to.equal(was);
    expect(r.ledger).to.deep.equal([]);
    expect(proxy.bytesDown - before).to.be.below(MIB);
  });

  it('the reader of the source cannot start and the export folder is too small for the disk instead: refused before any byte moves, naming both sizes and why', async () => {
    // A worker host with no nbdkit (NBDKIT names no program) whose export folder is an 8 MiB tmpfs: the disk is placed
    // one pass onto the host, the reader fails, and the disk would now be downloaded and converted in that folder.
    small = path.join(s.dir, 'small-exports');
    mkdirSync(small);
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=8m,mode=0700', 'ferry-small-exports', small]);
    await Promise.all(workers.map((w) => w.kill()));
    await worker('rp-small', { NBDKIT: path.join(s.dir, 'no-nbdkit', 'nbdkit'), FERRY_EXPORT_DIR: small });
    const before = proxy.bytesDown;
    const id = await submit('rs');
    const r = await finished(id, 300_000);
    expect(r.status, JSON.stringify(r.state_history)).to.equal('failed');
    expect(r.attempts, 'not retried').to.equal(1);
    const dir = path.join(small, id);
    const msg = r.error ?? '';
    expect(msg).to.include(`the export folder ${dir} (the worker's scratch space) has `).and.include(': refused before any byte moved')
      .and.include('the reader of the source did not start (nbdkit is not installed (Debian package nbdkit)): the repair runs after the copy');
    // Both sizes: the folder's free bytes (at most the tmpfs), and the download (descriptor and extent) plus its converted copy.
    const [, free, need] = /has [\d.]+ GiB \((\d+) bytes\) free; the disks that go through it need [\d.]+ GiB \((\d+) bytes\)/.exec(msg) ?? [];
    expect(Number(free), msg).to.be.above(0).and.at.most(8 * MIB);
    expect(Number(need), msg).to.equal(statSync(boot.desc).size + 2 * BOOT_BYTES);
    // The volume placed on the host for it was recorded, then removed: no volume of the domain is left in the pool.
    const volume = path.join(s.lv.poolDir, 'rs.raw');
    expect(r.ledger.filter((e) => e.kind === 'volume').map((e) => [e.id, e.virt_uri])).to.deep.equal([[volume, uri]]);
    expect((await s.volumes()).filter((v) => v.startsWith('rs'))).to.deep.equal([]);
    expect(existsSync(volume)).to.equal(false);
    // No byte of the disk on the worker, none fetched: the folder holds no download, the tmpfs is all but empty.
    const files = walk(dir);
    expect(files.filter((f) => /flat\.vmdk|\.ferry-part|\.raw$|\.qcow2$/.test(f)), files.join('\n')).to.deep.equal([]);
    const st = statfsSync(small);
    expect((st.blocks - st.bfree) * st.bsize, 'bytes used in the export folder').to.be.below(MIB);
    expect(proxy.bytesDown - before).to.be.below(MIB);
  });
});
