// Every /virt endpoint against a real libvirtd (private, TCG guests), in both path forms, each checked afterwards
// with virsh: domains, snapshots, networks (isolated; a NAT network's XML is checked, never started), interfaces,
// volumes (bytes on disk), statistics, clones, templates, errors.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { req, until } from '../helpers/http';
import { defineGuest, domState } from '../helpers/libvirt';
import { makeImage } from '../helpers/images';
import { startDaemonProc } from '../helpers/procs';
import { okData, startVirtStack, VirtStack } from './stack';
import type { DaemonError } from '../helpers/http';
import type * as L from '../../domain/libvirt';
import type { ImageInfo } from '../../domain/qemu';
import type { VirtOk } from '../helpers/api-types';

/** The `data` of a /virt route that answers what the domain/libvirt function `F` returns (services/daemon/virt.ts). */
type Data<F extends (...args: never[]) => Promise<unknown>> = Awaited<ReturnType<F>>;
type Stats = Data<typeof L.domainStats>;

const FORMS = ['', '/api/v1'];

describe('virtualization-host API (/virt) on a real libvirtd @vm', function () {
  this.timeout(300_000);
  let s: VirtStack;
  let B: string;
  const virsh = (args: string[]) => s.lv.virsh(args);

  before(async () => {
    s = await startVirtStack();
    B = s.daemon.url;
    await defineGuest(s.lv, 'api-run', { withDisk: true });
    await defineGuest(s.lv, 'api-off', { withDisk: true });
  });
  after(async () => { await s?.stop(); });

  it('lists domains and starts one (both path forms)', async () => {
    for (const f of FORMS) {
      const d = await okData<{ domains: L.DomainSummary[]; total: number }>(B, 'GET', `${f}/virt/domains`);
      const off = d.domains.find((x) => x.name === 'api-off')!;
      expect(off).to.have.keys('name', 'state', 'state_reason');
      expect(off.state).to.equal('shut off');
    }
    const r = await req<VirtOk<Data<typeof L.startDomain>>>(B, 'POST', '/api/v1/virt/domain/start', { name: 'api-run' });
    expect(r.status, r.text).to.equal(200);
    expect(r.body).to.include({ status: 'success' }).and.have.keys('status', 'message', 'data', 'timestamp');
    expect(r.body.data.state).to.equal('running');
    expect(await domState(s.lv, 'api-run')).to.equal('running');
    const again = await req<DaemonError>(B, 'POST', '/virt/domain/start', { name: 'api-run' });
    expect(again.status, again.text).to.equal(409);
    expect(again.body.error).to.match(/already active|not valid/i);
  });

  it('answers 404 for unknown objects and 400 for bad names without calling libvirt', async () => {
    const r = await req<DaemonError>(B, 'POST', '/virt/domain/start', { name: 'no-such-domain' });
    expect(r.status, r.text).to.equal(404);
    expect(r.body).to.have.keys('error', 'status', 'timestamp');
    expect((await req(B, 'GET', '/virt/network?name=no-such-net')).status).to.equal(404);
    expect((await req(B, 'GET', `/virt/volume/info?pool=${s.lv.pool}&volume=nope.qcow2`)).status).to.equal(404);
    const bad = await req<DaemonError>(B, 'POST', '/virt/domain/start', { name: '--help' });
    expect(bad.status).to.equal(400);
    expect(bad.body.error).to.include('name');
    expect((await req(B, 'POST', '/virt/domain/start', { name: "a'b<c" })).status).to.equal(400);
  });

  it('creates a snapshot with its description', async () => {
    const d = await okData<Data<typeof L.createSnapshot>>(B, 'POST', '/virt/snapshot/create', { domain_name: 'api-off', snapshot_name: 'before-change', description: 'a <test> & "quote"' }, 201);
    expect(d).to.include({ name: 'before-change', description: 'a <test> & "quote"' });
    expect(await virsh(['snapshot-list', 'api-off', '--name'])).to.include('before-change');
    expect(await virsh(['snapshot-dumpxml', 'api-off', 'before-change'])).to.match(/<description>a &lt;test&gt; &amp; (&quot;|")quote(&quot;|")<\/description>/);
  });

  it('creates, starts, stops and deletes an isolated network; a NAT network is defined with its XML checked, never started', async () => {
    const created = await okData<Data<typeof L.createNetwork>>(B, 'POST', '/virt/network/create', { name: 'iso1', bridge: 'ferrybr1', forward: 'none', subnet: '10.77.1.0/24', ip_start: '10.77.1.100', ip_end: '10.77.1.150' }, 201);
    expect(created).to.include({ name: 'iso1', active: false, persistent: true, forward: 'none', bridge: 'ferrybr1' });
    const xml = await virsh(['net-dumpxml', 'iso1']);
    expect(xml).to.include("<ip address='10.77.1.1' prefix='24'>").and.include("<range start='10.77.1.100' end='10.77.1.150'/>").and.not.include('<forward');
    const started = await okData<Data<typeof L.startNetwork>>(B, 'POST', '/api/v1/virt/network/start', { name: 'iso1' });
    expect(started.active).to.equal(true);
    expect(await virsh(['net-list', '--name'])).to.include('iso1');
    const list = await okData<{ networks: Data<typeof L.listNetworks>; total: number }>(B, 'GET', '/virt/networks');
    expect(list.networks.find((n) => n.name === 'iso1')).to.include({ active: true });
    const detail = await okData<Data<typeof L.networkDetail>>(B, 'GET', '/api/v1/virt/network?name=iso1');
    expect(detail).to.include({ name: 'iso1', active: true, bridge: 'ferrybr1' });
    expect(detail.uuid).to.match(/^[0-9a-f-]{36}$/);
    expect(detail.ip[0].dhcp[0]).to.deep.equal({ start: '10.77.1.100', end: '10.77.1.150' });
    await okData(B, 'POST', '/virt/network/stop', { name: 'iso1' });
    expect(await virsh(['net-list', '--name'])).not.to.include('iso1');
    expect(await virsh(['net-list', '--all', '--name'])).to.include('iso1');

    const nat = await okData<Data<typeof L.createNetwork>>(B, 'POST', '/virt/network/create', { name: 'nat1', forward: 'nat', subnet: '10.78.0.0/24', ip_start: '10.78.0.10', ip_end: '10.78.0.20' }, 201);
    expect(nat).to.include({ forward: 'nat', active: false });
    expect(await virsh(['net-dumpxml', 'nat1'])).to.match(/<forward mode='nat'/);
    await okData(B, 'POST', '/virt/network/delete', { name: 'nat1' });
    expect(await virsh(['net-list', '--all', '--name'])).not.to.include('nat1');

    const bad = await req<DaemonError>(B, 'POST', '/virt/network/create', { name: 'iso2', subnet: '10.77.2.0/24', ip_start: '10.77.3.5', ip_end: '10.77.2.9' });
    expect(bad.status).to.equal(400);
    expect(bad.body.error).to.include('ip_start');
    expect((await req(B, 'POST', '/virt/network/create', { name: 'iso1' })).status).to.equal(409);
  });

  it('attaches and detaches a virtio interface', async () => {
    const a = await okData<Data<typeof L.attachInterface>>(B, 'POST', '/virt/interface/attach', { vm_name: 'api-off', network: 'iso1', model: 'virtio' }, 201);
    expect(a.mac).to.match(/^52:54:00:/);
    let xml = await virsh(['dumpxml', '--inactive', 'api-off']);
    expect(xml).to.include(`<mac address='${a.mac}'/>`).and.include("<source network='iso1'/>").and.include("<model type='virtio'/>");
    await okData(B, 'POST', '/api/v1/virt/interface/detach', { vm_name: 'api-off', mac: a.mac });
    xml = await virsh(['dumpxml', '--inactive', 'api-off']);
    expect(xml).not.to.include(a.mac);
    expect((await req(B, 'POST', '/virt/interface/detach', { vm_name: 'api-off', mac: a.mac })).status).to.equal(404);
    expect((await req(B, 'POST', '/virt/interface/detach', { vm_name: 'api-off', mac: 'zz' })).status).to.equal(400);
  });

  it('creates, inspects, clones, resizes, uploads into, wipes and deletes volumes (bytes)', async () => {
    const pool = s.lv.pool;
    const c = await okData<Data<typeof L.createVolume>>(B, 'POST', '/virt/volume/create', { pool, name: 'v1.qcow2', format: 'qcow2', capacity: 8 * 1024 * 1024, prealloc: true }, 201);
    expect(c).to.include({ name: 'v1.qcow2', format: 'qcow2', capacity: 8 * 1024 * 1024 });
    expect(await virsh(['vol-dumpxml', '--pool', pool, 'v1.qcow2'])).to.include("<capacity unit='bytes'>8388608</capacity>");
    const info = await okData<Data<typeof L.volumeInfo>>(B, 'GET', `/api/v1/virt/volume/info?pool=${pool}&volume=v1.qcow2`);
    expect(info.path).to.equal(path.join(s.lv.poolDir, 'v1.qcow2'));
    await okData(B, 'POST', '/virt/volume/clone', { pool, source_volume: 'v1.qcow2', target_volume: 'v1-copy.qcow2' }, 201);
    expect((JSON.parse(execFileSync('qemu-img', ['info', '--output=json', path.join(s.lv.poolDir, 'v1-copy.qcow2')]).toString()) as ImageInfo)['virtual-size']).to.equal(8 * 1024 * 1024);
    const grown = await okData<Data<typeof L.resizeVolume>>(B, 'POST', '/virt/volume/resize', { pool, volume: 'v1.qcow2', capacity: 16 * 1024 * 1024 });
    expect(grown).to.include({ capacity: 16 * 1024 * 1024, previous_capacity: 8 * 1024 * 1024 });
    const refused = await req<DaemonError>(B, 'POST', '/virt/volume/resize', { pool, volume: 'v1.qcow2', capacity: 4 * 1024 * 1024 });
    expect(refused.status).to.equal(400);
    expect(refused.body.error).to.include('shrink');
    await okData(B, 'POST', '/virt/volume/create', { pool, name: 'r1.img', format: 'raw', capacity: 8 * 1024 * 1024 }, 201);
    const shrunk = await okData<Data<typeof L.resizeVolume>>(B, 'POST', '/virt/volume/resize', { pool, volume: 'r1.img', capacity: 4 * 1024 * 1024, shrink: true });
    expect(shrunk.capacity).to.equal(4 * 1024 * 1024);
    expect(readFileSync(path.join(s.lv.poolDir, 'r1.img')).length).to.equal(4 * 1024 * 1024);

    // upload: a raw source converted into a qcow2 volume; the guest-visible bytes are the source's
    const src = makeImage(s.dir, 'up', 'raw', 4);
    const up = await okData<Data<typeof L.uploadVolume>>(B, 'POST', '/virt/volume/upload', { pool, volume: 'up.qcow2', source_path: src, format: 'qcow2' });
    expect(up).to.include({ format: 'qcow2', converted: true, source_format: 'raw' });
    execFileSync('qemu-img', ['compare', '-f', 'raw', '-F', 'qcow2', src, path.join(s.lv.poolDir, 'up.qcow2')]);

    // wipe, every algorithm of the seed, on a small raw volume; after zero every byte is 0
    writeFileSync(path.join(s.lv.poolDir, 'w.img'), Buffer.alloc(256 * 1024, 0xab));
    await virsh(['pool-refresh', pool]);
    for (const algorithm of ['random', 'nnsa', 'dod', 'bsi', 'gutmann', 'schneier', 'pfitzner7', 'pfitzner33', 'zero']) {
      const w = await okData<Data<typeof L.wipeVolume>>(B, 'POST', '/virt/volume/wipe', { pool, volume: 'w.img', algorithm });
      expect(w.algorithm).to.equal(algorithm);
      const bytes = readFileSync(path.join(s.lv.poolDir, 'w.img'));
      expect(bytes.includes(Buffer.alloc(64, 0xab)), algorithm).to.equal(false);
      if (algorithm === 'zero') expect(bytes.every((b) => b === 0)).to.equal(true);
    }
    expect((await req(B, 'POST', '/virt/volume/wipe', { pool, volume: 'w.img', algorithm: 'shred' })).status).to.equal(400);

    await okData(B, 'POST', '/virt/volume/delete', { pool, volume: 'v1-copy.qcow2' });
    expect(existsSync(path.join(s.lv.poolDir, 'v1-copy.qcow2'))).to.equal(false);
    expect(await virsh(['vol-key', '--pool', pool, 'v1-copy.qcow2']).then(() => 'present', (e: { stderr: string }) => String(e.stderr))).to.include('not found');
  });

  it('reports statistics of one domain and of all running domains, CPU percent from two samples', async () => {
    await until(async () => (await domState(s.lv, 'api-run')) === 'running', 20000, 'api-run running');
    const st = await okData<Stats>(B, 'GET', '/virt/stats?name=api-run');
    expect(st).to.include({ name: 'api-run', state: 'running' });
    expect(st.cpu.usage_percent).to.be.a('number').within(0, 100);
    expect(st.cpu.time_ns.total).to.be.greaterThan(0);
    expect(st.memory.total).to.equal(96 * 1024);
    expect(st.disks[0]).to.include({ name: 'vda' });
    const cpu = await okData<Pick<Stats, 'name'> & Stats['cpu']>(B, 'GET', '/api/v1/virt/stats/cpu?name=api-run');
    expect(cpu).to.include({ vcpus: 1 });
    expect((await okData<Pick<Stats, 'name'> & Stats['memory']>(B, 'GET', '/virt/stats/memory?name=api-run')).unit).to.equal('KiB');
    expect((await okData<Pick<Stats, 'name' | 'disks'>>(B, 'GET', '/virt/stats/disk?name=api-run')).disks[0].read_bytes).to.be.greaterThan(0);
    expect((await okData<Pick<Stats, 'name' | 'interfaces'>>(B, 'GET', '/virt/stats/network?name=api-run')).interfaces).to.deep.equal([]);
    const all = await okData<{ domains: Stats[]; total: number }>(B, 'GET', '/virt/stats/all');
    expect(all.domains.map((d) => d.name)).to.include('api-run').and.not.include('api-off');
    expect((await req(B, 'GET', '/virt/stats?name=nope')).status).to.equal(404);
  });

  it('clones with virt-clone (new MAC, or kept) and makes numbered clones', async () => {
    await virsh(['attach-interface', '--domain', 'api-off', '--type', 'network', '--source', 'iso1', '--model', 'virtio', '--config', '--mac', '52:54:00:aa:bb:01']);
    const c = await okData<Data<typeof L.cloneDomain>>(B, 'POST', '/virt/clone', { source: 'api-off', target: 'api-clone', new_mac: true }, 201);
    expect(c.uuid).to.match(/^[0-9a-f-]{36}$/);
    const xml = await virsh(['dumpxml', 'api-clone']);
    expect(xml).not.to.include('52:54:00:aa:bb:01');
    expect(xml).to.include(path.join(s.lv.poolDir, 'api-clone.qcow2'));
    await okData(B, 'POST', '/virt/clone', { source: 'api-off', target: 'api-samemac', new_mac: false }, 201);
    expect(await virsh(['dumpxml', 'api-samemac'])).to.include('52:54:00:aa:bb:01');
    const m = await okData<Data<typeof L.cloneMany>>(B, 'POST', '/virt/clone/multiple', { source: 'api-off', name_prefix: 'web', count: 2, start_index: 3 }, 201);
    expect(m).to.include({ total: 2, successful: 2 });
    const names = await virsh(['list', '--all', '--name']);
    expect(names).to.include('web-3').and.include('web-4').and.not.include('web-5');
    expect((await req(B, 'POST', '/virt/clone', { source: 'api-run', target: 'x1' })).status).to.equal(409);
  });

  it('creates a template marked in <metadata>, lists it, deploys it and exports it', async () => {
    const t = await okData<Data<typeof L.createTemplate>>(B, 'POST', '/virt/template/create', { domain: 'api-off', name: 'base-tpl', description: 'Base', metadata: { os: 'busybox' } }, 201);
    expect(t.template).to.include({ description: 'Base', source: 'api-off' });
    const meta = await virsh(['metadata', 'base-tpl', '--uri', 'https://ferry.dev/xmlns/libvirt/template/1']);
    expect(meta).to.include('<meta key="os">busybox</meta>');
    const l = await okData<{ templates: Data<typeof L.listTemplates>; total: number }>(B, 'GET', '/virt/template/list');
    const byName = Object.fromEntries(l.templates.map((x) => [x.name, x]));
    expect(byName['base-tpl']).to.include({ marked: true, reason: 'marked' });
    expect(byName['api-off']).to.include({ marked: false, reason: 'shut off' });
    expect(byName['api-run']).to.equal(undefined);

    const d = await okData<Data<typeof L.deployTemplate>>(B, 'POST', '/virt/template/deploy', { template: 'base-tpl', name: 'from-tpl', memory: 128, vcpus: 2, network: 'iso1', autostart: true }, 201);
    expect(d.uuid).to.match(/^[0-9a-f-]{36}$/);
    const xml = await virsh(['dumpxml', '--inactive', 'from-tpl']);
    expect(xml).to.include("<memory unit='KiB'>131072</memory>").and.match(/<vcpu[^>]*>2<\/vcpu>/).and.include("<source network='iso1'/>").and.not.include('ferry.dev');
    expect(await virsh(['list', '--all', '--autostart', '--name'])).to.include('from-tpl');

    const out = path.join(s.dir, 'exports');
    execFileSync('mkdir', ['-p', out]);
    const e = await okData<Data<typeof L.exportTemplate>>(B, 'POST', '/virt/template/export', { template: 'base-tpl', export_path: out, compress: true }, 201);
    expect(readFileSync(path.join(out, 'base-tpl', 'domain.xml'), 'utf8')).to.include('<name>base-tpl</name>');
    const disk = JSON.parse(execFileSync('qemu-img', ['info', '--output=json', e.disks[0].file]).toString()) as ImageInfo;
    expect(disk.format).to.equal('qcow2');
    expect(e.disks[0].compressed).to.equal(true);
    expect((await req(B, 'POST', '/virt/template/export', { template: 'base-tpl', export_path: out })).status).to.equal(409);
  });

  it('describes every route in /openapi.yaml', async () => {
    const r = await req(B, 'GET', '/openapi.yaml');
    expect(r.status).to.equal(200);
    for (const p of ['/virt/domains', '/virt/volume/wipe', '/virt/batch/resume', '/virt/template/export', '/import/kvm', '/convert/vm']) expect(r.text).to.include(`${p}:`);
    expect(r.text).to.include('pfitzner33');
  });

  it('answers 503 naming the URI when no libvirtd answers, and still starts', async () => {
    const uri = `qemu+unix:///system?socket=${s.dir}/absent-sock`;
    const d = await startDaemonProc({ ...s.env, FERRY_LIBVIRT_URI: uri }, s.config);
    try {
      const r = await req<DaemonError>(d.url, 'GET', '/virt/domains');
      expect(r.status).to.equal(503);
      expect(r.body.error).to.include(uri);
      expect((await req(d.url, 'GET', '/health')).status).to.equal(200);
      await until(() => d.logs.join('').includes(`no libvirtd answers at ${uri}`), 10000, 'the one-line warning');
    } finally { await d.stop(); }
  });
});
