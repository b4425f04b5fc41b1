// The whole migration, as an operator runs it: the real Debian 12 guest (test/fixtures/debian-guest.ts, shaped as
// it lives on VMware) is a VM's disk on the vSphere simulator; one shape B job on the daemon exports it, repairs
// and converts it, imports it into the test's own libvirtd (isolated network, dir pool) and starts the domain.
// The job completes only when the domain's own console shows the guest's marker (root mounted read-write, its
// static address up on the interface renamed to the virtio NIC's name); one progress stream covers every stage; the
// VM's disk on the datastore is byte-identical afterwards.
// The migration is a reused proof (test/helpers/proofs.ts; the simulator, Redis, libvirtd and the services start only
// when it runs): with every input unchanged (the code the gateway, daemon and worker load, the simulator's build
// script and the govmomi package among them) the same check() re-asserts the evidence of the last passing run: the
// job's end, libvirt's answers about the domain at that time, its console, the progress phases, the datastore disk.
import { expect } from 'chai';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { imageInfo, sha256File } from '../../domain/qemu';
import { managerFor } from '../../domain/vsphere/client';
import { kvmNicName } from '../../domain/converter/nic-names';
import { ensureDebianGuest, DebianGuest } from '../fixtures/debian-guest';
import { TestRedis } from '../helpers/redis';
import { Proc, startDaemonProc, startGatewayProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req, until } from '../helpers/http';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { releaseLibvirt, TestLibvirt, useLibvirt } from '../helpers/libvirt';
import { createVm, DS, upload } from '../vsphere/fixture';
import { tolerate } from '../helpers/teardown';
import { fixtureInputs, reusedProof } from '../helpers/proofs';
import type { JobStatus, MigrationSubmitted } from '../helpers/api-types';
import type { TestBootResult } from '../../domain/converter/testboot';
import type { PipelineReport } from '../../domain/converter/stages/report';

/** What the test reads of a migration job's result (services/worker/operations/migration-stages.ts afterExport). */
type MigrationResult = {
  domain: string; uuid: string; virt_uri: string; boot: TestBootResult;
  conversion: { summary: PipelineReport['summary'] };
};

const ARTIFACTS = path.resolve(__dirname, '..', 'artifacts');
const NETWORK = 'ferry-migration';

describe('a whole migration of the real Debian guest: vSphere -> repair -> libvirt, one shape B job @vm', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the guest fixture and the simulator first
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-migration-'));
  const procs: Proc[] = [];
  let g: DebianGuest;
  let v: Vcsim;
  let lv: TestLibvirt;
  let gw: Awaited<ReturnType<typeof startGatewayProc>>;
  let daemon: Awaited<ReturnType<typeof startDaemonProc>>;
  let sourceSha: string;
  let vmPath: string;

  /** The simulator with the guest's VM, a private Redis, the run's libvirtd with the destination network, and the
   *  gateway, daemon and worker: started only when the proof runs (a reused one needs none of them). */
  async function start() {
    [v, lv] = await Promise.all([startVcsim(), useLibvirt(), redis.start()]);
    const m = managerFor({ url: v.url, username: v.username, password: v.password, ca: readFileSync(v.caFile, 'utf8') });
    vmPath = await createVm(m, { name: 'debian12', guestId: 'debian11_64Guest', cpus: 1, memoryMB: 1024, mac: g.mac,
      disks: [{ file: 'debian12/debian12.vmdk', bytes: (await imageInfo(g.vmdk, 'vmdk'))['virtual-size'] }] });
    await upload(v, g.vmdk, 'debian12/debian12.vmdk');
    sourceSha = await sha256File(g.vmdk);
    // The destination's network: isolated (no forwarding on this machine), the target of the VM's "VM Network".
    const netXml = path.join(dir, 'net.xml');
    writeFileSync(netXml, `<network><name>${NETWORK}</name><bridge name="virbrfm0"/></network>`);
    await lv.virsh(['net-define', netXml]);
    await lv.virsh(['net-start', NETWORK]);

    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 3h\n');
    const env = {
      ...testEnv(redis.url, 'migration'), FERRY_LEASE_SECONDS: '30', FERRY_SECRET_KEY: 'migration-test-key',
      GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: v.password, FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1',
      FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_POOL: lv.pool, FERRY_LIBVIRT_POOL_DIR: lv.poolDir, FERRY_EXPORT_DIR: path.join(dir, 'exports'),
    };
    gw = await startGatewayProc(env);
    daemon = await startDaemonProc(env, cfg);
    procs.push(gw, daemon, await startWorkerProc(env, 'migrator', ['vsphere_access', 'img_tool', 'mount_operations', 'libvirt_access']));
  }
  after(async () => {
    await lv?.virsh(['destroy', 'debian12']).catch(tolerate('destroy debian12')); // only when the test left it running
    await Promise.all(procs.map((p) => p.kill()));
    await v?.stop();
    await redis.stop();
    if (lv) await releaseLibvirt();
    rmSync(dir, { recursive: true, force: true });
  });

  /** What the check reads: the submission, the job at its end, what libvirt says of the domain, the domain's
   *  console, the job's progress phases, and the VM's disk on the datastore before and after. */
  interface Evidence {
    submitted: { status: number; text: string }; job: Pick<JobStatus, 'state' | 'state_history' | 'result'>; uri: string;
    domstate: string; domuuid: string; xml: string; console: string; phases: string[]; source: string[];
  }

  async function migrate(): Promise<Evidence> {
    await start();
    const r = await req<MigrationSubmitted>(daemon.url, 'POST', '/jobs/submit', {
      name: 'debian12-to-kvm', vm_path: vmPath,
      source: { type: 'vsphere' }, destination: { type: 'kvm', virt_uri: lv.uri },
      options: { network_mapping: { 'VM Network': NETWORK }, virt_test: { expect: g.ready.source, timeout_seconds: 1800 } },
    });
    expect(r.status, r.text).to.equal(200);
    const id = r.body.job_id;
    const j = await until(async () => { const x = (await req<JobStatus>(gw.url, 'GET', `/jobs/${id}`)).body; return x.is_terminal && x; }, 3 * 3600 * 1000, `job ${id} to finish`);
    const consoleLog = path.join(dir, 'exports', id, 'debian12.console.log');
    if (j.state !== 'COMPLETED' && existsSync(consoleLog)) { mkdirSync(ARTIFACTS, { recursive: true }); copyFileSync(consoleLog, path.join(ARTIFACTS, 'migration-debian12.console.log')); }
    const virsh = (args: string[]) => lv.virsh(args).catch((e: unknown) => `virsh ${args[0]} failed: ${String(e)}`);
    const events = (await req(gw.url, 'GET', `/jobs/${id}/events`)).body as { phase: string }[];
    return {
      submitted: { status: r.status, text: r.text }, job: { state: j.state, state_history: j.state_history, result: j.result }, uri: lv.uri,
      domstate: (await virsh(['domstate', 'debian12'])).trim(), domuuid: (await virsh(['domuuid', 'debian12'])).trim(), xml: await virsh(['dumpxml', 'debian12']),
      console: existsSync(consoleLog) ? readFileSync(consoleLog, 'latin1') : '', phases: [...new Set(events.map((e) => e.phase))],
      source: [sourceSha, await sha256File(path.join(v.datastores[DS], 'debian12', 'debian12.vmdk'))],
    };
  }

  /** The assertions, on a fresh run's evidence or on the record's. */
  function check(e: Evidence) {
    expect(e.submitted.status, e.submitted.text).to.equal(200);
    expect(e.job.state, JSON.stringify(e.job.state_history.slice(-3))).to.equal('COMPLETED');
    // The result names the domain, and libvirt agrees: running, same UUID, virtio disk and NIC, the VM's MAC.
    const res = e.job.result as MigrationResult;
    expect(res).to.include({ domain: 'debian12', virt_uri: e.uri });
    expect(e.domstate).to.equal('running');
    expect(e.domuuid).to.equal(res.uuid);
    const xml = e.xml;
    expect(xml).to.match(/<target dev="vda" bus="virtio"\/>|<target dev='vda' bus='virtio'\/>/);
    expect(xml).to.match(new RegExp(`<mac address=['"]${g.mac.toLowerCase()}['"]`));
    expect(xml).to.match(new RegExp(`<source network=['"]${NETWORK}['"]`));
    expect(xml).to.match(/<model type=['"]virtio['"]\/>/);

    // The boot that decided it: the marker, on the interface renamed to the virtio NIC's name, with its address.
    expect(res.boot.status).to.equal('passed');
    const m = g.ready.exec(res.boot.matched!);
    expect(m, res.boot.matched).to.not.equal(null);
    expect(m![1]).to.equal(kvmNicName(0));
    expect(xml).to.match(/<address type=['"]pci['"] domain=['"]0x0000['"] bus=['"]0x01['"] slot=['"]0x00['"] function=['"]0x0['"]\/>\s*<\/interface>/);
    expect(e.console).to.match(g.ready);
    expect(e.console).to.match(new RegExp(`virtio_net \\S+ ${kvmNicName(0)}: renamed from eth0`));

    // One progress stream through every stage.
    for (const p of ['export', 'inspect', 'fix', 'convert', 'validate', 'import', 'boot']) expect(e.phases, p).to.include(p);

    // The repairs were read back after the last step that could undo them, and the source never changed.
    expect(res.conversion.summary.stages_failed).to.deep.equal([]);
    expect(e.source[1]).to.equal(e.source[0]);
  }

  it('exports, repairs, imports and boots: COMPLETED only once the domain console shows the marker', async () => {
    g = await ensureDebianGuest('plain');
    const spec = { name: 'guest-migration', entries: [__filename], extra: fixtureInputs(g.vmdk) };
    await reusedProof(spec, migrate, check);
  });
});
