// Conversion and import end to end on a real libvirtd: a bootable disk converted by a convert job (POST
// /convert/vm, a real worker), imported with POST /import/kvm, started, its serial console showing the marker;
// UEFI firmware from Debian's ovmf; the same import as an import_kvm job on a worker with libvirt_access; and
// through qemu+ssh:// to a private sshd on 127.0.0.1.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { req, until } from '../helpers/http';
import { makeBootableImage } from '../helpers/images';
import { domState } from '../helpers/libvirt';
import { awaitWorkers, startGatewayProc, startWorkerProc, Proc } from '../helpers/procs';
import { startSshd, TestSshd } from '../helpers/sshd';
import { importDisk, Virsh } from '../../domain/libvirt';
import IORedis from 'ioredis';
import { JobStore } from '../../queue/store';
import { bootAndWatch, okData, startVirtStack, VirtStack } from './stack';
import type { DaemonError } from '../helpers/http';
import type { DaemonJob, JobStatus, Submitted, VirtOk } from '../helpers/api-types';
import type { ImportResult } from '../../domain/libvirt/import';

/** POST /convert/vm's data. */
interface ConvertQueued { job_id: string; status: string; source_path: string; dest_path: string; format: string; compression: string }

describe('convert and import into libvirt @vm', function () {
  this.timeout(300_000);
  let s: VirtStack;
  let B: string;
  let worker: Proc;
  let v: Virsh;
  let converted: string;

  before(async () => {
    s = await startVirtStack();
    B = s.daemon.url;
    v = new Virsh(s.lv.uri);
    worker = await startWorkerProc(s.env, 'virt-worker', ['img_tool', 'libvirt_access']);
    await awaitWorkers(B, [worker]);
  });
  after(async () => { await worker?.stop(); await s?.stop(); });

  it('converts with POST /convert/vm as a convert job (answered at once with the job id)', async () => {
    const src = makeBootableImage(s.dir, 'boot', 'raw');
    converted = path.join(s.dir, 'boot.qcow2');
    const r = await req<VirtOk<ConvertQueued>>(B, 'POST', '/api/v1/convert/vm', { source_path: src, dest_path: converted, format: 'qcow2', compression: 'zlib' });
    expect(r.status, r.text).to.equal(200);
    expect(r.body).to.include({ status: 'success' });
    const id = r.body.data.job_id;
    expect(id).to.be.a('string');
    let seen = '';
    const job = await until(async () => { const j = await req<DaemonJob>(B, 'GET', `/jobs/${id}`); seen = j.text; return ['completed', 'failed'].includes(j.body?.status) && j.body; }, 120000, 'the convert job')
      .catch((e: Error) => { throw new Error(`${e.message}; last seen ${seen}\n${worker.logs.join('')}`); });
    expect(job.status, JSON.stringify(job)).to.equal('completed');
    expect((JSON.parse(execFileSync('qemu-img', ['info', '--output=json', converted]).toString()) as { format: string }).format).to.equal('qcow2');
    execFileSync('qemu-img', ['compare', '-f', 'raw', '-F', 'qcow2', src, converted]);
    const bad = await req<DaemonError>(B, 'POST', '/convert/vm', { source_path: path.join(s.dir, 'absent.vmdk'), dest_path: converted });
    expect(bad.status).to.equal(400);
    expect(bad.body.error).to.include('source_path');
  });

  it('imports the converted qcow2 with POST /import/kvm; the domain boots and its console shows the marker', async () => {
    const d = await okData<ImportResult>(B, 'POST', '/import/kvm', { image_path: converted, vm_name: 'imported', memory: 64, cpus: 1 }, 201);
    expect(d).to.include({ domain: 'imported', pool: 'ferry', firmware: 'bios', domain_type: 'qemu' });
    expect(d.uuid).to.equal((await s.lv.virsh(['domuuid', 'imported'])).trim());
    const xml = await s.lv.virsh(['dumpxml', 'imported']);
    expect(xml).to.include("<domain type='qemu'").and.include("bus='virtio'").and.include("<serial type='pty'>").and.include(path.join(s.dir, 'ferry-pool', 'imported.qcow2'));
    expect(await s.lv.virsh(['pool-list', '--name'])).to.include('ferry');
    const text = await bootAndWatch(v, 'imported', 'FERRY-BOOT-OK');
    expect(text).to.include('FERRY-BOOT-OK');
    expect(await domState(s.lv, 'imported')).to.equal('running');
    // The same name again: refused, and the copy started beside the checks leaves nothing in the pool folder.
    const poolFiles = () => readdirSync(path.join(s.dir, 'ferry-pool')).sort();
    const filesBefore = poolFiles();
    const again = await req(B, 'POST', '/import/kvm', { image_path: converted, vm_name: 'imported' });
    expect(again.status).to.equal(409);
    expect(poolFiles()).to.deep.equal(filesBefore);
    // An image qemu-img cannot read: refused, nothing left either.
    const junk = path.join(s.dir, 'junk.qcow2');
    writeFileSync(junk, Buffer.concat([Buffer.from([0x51, 0x46, 0x49, 0xfb]), Buffer.alloc(4096, 0xff)])); // qcow2's magic, then nonsense
    const bad = await req<DaemonError>(B, 'POST', '/import/kvm', { image_path: junk, vm_name: 'junk' });
    expect(bad.status, bad.text).to.equal(400);
    expect(bad.body.error).to.contain('image_path');
    expect(poolFiles()).to.deep.equal(filesBefore);
    await s.lv.virsh(['destroy', 'imported']);
  });

  it('imports with UEFI firmware (Debian ovmf) and a network; the domain starts', async () => {
    await okData(B, 'POST', '/virt/network/create', { name: 'imp-net', forward: 'none' }, 201);
    const d = await okData<ImportResult>(B, 'POST', '/import/kvm', { image_path: converted, vm_name: 'imported-efi', memory: 128, cpus: 1, network: 'imp-net', firmware: 'uefi' }, 201);
    expect(d.firmware).to.equal('uefi');
    expect(await s.lv.virsh(['dumpxml', '--inactive', 'imported-efi'])).to.include("<os firmware='efi'>").and.include("<source network='imp-net'/>");
    await s.lv.virsh(['net-start', 'imp-net']);
    await s.lv.virsh(['start', 'imported-efi']);
    const live = await s.lv.virsh(['dumpxml', 'imported-efi']);
    expect(live).to.match(/<loader[^>]*>\/usr\/share\/OVMF\/OVMF_CODE/);
    // The NIC alone behind the first PCIe root port (bus 1), where Ferry's repair expects it (enp1s0).
    expect(live).to.match(/<model type='virtio'\/>\s*(?:<alias[^>]*\/>\s*)?<address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'\/>\s*<\/interface>/);
    expect(live).to.match(/<controller type='pci' index='1' model='pcie-root-port'>/);
    await s.lv.virsh(['destroy', 'imported-efi']);
  });

  it('imports as an import_kvm job on a worker with libvirt_access; the result names the domain and its UUID', async () => {
    let id = '';
    const gw = await startGatewayProc(s.env);
    try {
      const r = await req<Submitted>(gw.url, 'POST', '/jobs?queue=true', { operation: 'import_kvm', parameters: { disks: [{ path: converted }], name: 'imported-job', memory: 64 } });
      expect(r.status, r.text).to.be.oneOf([200, 201, 202]);
      id = r.body.job_id;
      let seen = '';
      const job = await until(async () => { const j = await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`); seen = j.text; return ['COMPLETED', 'FAILED'].includes(j.body?.state) && j.body; }, 120000, 'the import job')
        .catch((e: Error) => { throw new Error(`${e.message}; last seen ${seen}\n${worker.logs.join('')}`); });
      expect(job.state, JSON.stringify(job)).to.equal('COMPLETED');
    } finally { await gw.stop(); }
    const redis = new IORedis(s.redis.url);
    try {
      const rec = await new JobStore(redis).get(id);
      expect(rec!.result).to.include({ domain: 'imported-job', uuid: (await s.lv.virsh(['domuuid', 'imported-job'])).trim(), virt_uri: s.lv.uri });
    } finally { redis.disconnect(); }
  });

  describe('on another host through qemu+ssh://', () => {
    let sshd: TestSshd;
    before(async () => { sshd = await startSshd(path.join(s.dir, 'ssh')); });
    after(async () => { await sshd?.stop(); });

    it('imports through qemu+ssh:// to the test sshd on 127.0.0.1 and the domain boots', async () => {
      const uri = `qemu+ssh://root@127.0.0.1:${sshd.port}/system?socket=${s.lv.sockDir}/libvirt-sock&keyfile=${sshd.key}&no_verify=1&no_tty=1`;
      const remote = new Virsh(uri);
      const r = await importDisk(remote, { disks: [{ path: converted }], name: 'imported-ssh', memoryMiB: 64, cpus: 1, networks: [], pool: s.lv.pool });
      expect(r.uuid).to.equal((await s.lv.virsh(['domuuid', 'imported-ssh'])).trim());
      expect(sshd.log()).to.match(/Accepted publickey for root from 127\.0\.0\.1/);
      const text = await bootAndWatch(remote, 'imported-ssh', 'FERRY-BOOT-OK');
      expect(text).to.include('FERRY-BOOT-OK');
      await remote.run(['destroy', 'imported-ssh']);
    });
  });
});
