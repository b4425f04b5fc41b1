// Guest-level preflight: a plan's validate reads each VM's disk in place on the simulator's datastore (nbdkit's
// curl plugin under a read-only libguestfs appliance) and says, before any copy, what the guest is and what the
// repair would change. The real Debian guest (test/fixtures/debian-guest.ts) is one VM, a clone of it (same file
// system UUIDs: it must not share the appliance with it) another, and a disk with a LUKS root made here (a text
// descriptor with a flat extent) a third. The read runs on a worker with the guest-read capabilities, as a
// guest_preflight job (the daemon is Node only). Nothing of the disks may land on this host's disks: the worker's
// and daemon's TMPDIR and the export folder stay empty, no nbdkit outlives the validation, no cache directory
// stays in /dev/shm.
// The validation is a reused proof (test/helpers/proofs.ts; the simulator, libvirtd and the daemon start only when it
// runs): with every input unchanged (the code the daemon loads, the LUKS disk's recipe in this file, the fixture, the
// simulator's build and the tools among them) the same check() re-asserts the evidence of the last passing run.
import { expect } from 'chai';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Agent, request } from 'undici';
import { imageInfo } from '../../domain/qemu';
import { guestfsEnv } from '../../domain/guestfs-env';
import { managerFor } from '../../domain/vsphere/client';
import { ensureDebianGuest, DebianGuest } from '../fixtures/debian-guest';
import { TestRedis } from '../helpers/redis';
import { awaitWorkers, Proc, startDaemonProc, startWorkerProc, testEnv } from '../helpers/procs';
import { req } from '../helpers/http';
import type { DaemonJobList, PlanView, Validation } from '../helpers/api-types';
import type { VmResult } from '../../domain/plans/preflight';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { releaseLibvirt, TestLibvirt, useLibvirt } from '../helpers/libvirt';
import { createVm, upload } from '../vsphere/fixture';
import { tolerate } from '../helpers/teardown';
import { fixtureInputs, reusedProof } from '../helpers/proofs';
import type { InspectionHint } from '../../domain/converter/inspection-hint';

/** The guest_inspected finding's `guest` (domain/plans/guest-rules.ts), with the fields read here. */
interface InspectedGuest {
  os: string; distro?: string; version?: string; boot_loader: string; root: string; initramfs_tool: string | null; files_changed: string[]; network: string[];
  inspection?: InspectionHint;
}
type PreflightFinding = VmResult['findings'][number];
type GuestInspected = PreflightFinding & { guest: InspectedGuest };

const MiB = 1 << 20;
const NET = 'ferry-gpre';
const shmLeft = () => (readdirSync('/dev/shm').filter((n) => n.startsWith('ferry-guest-preflight-')));
/** The /dev/shm folders of the nbdkit readers running below `pids` now (from their `--unix` socket path): other
 *  files running beside this one (a shape B copy's repair reads its source the same way) make folders too. */
const shmOfReaders = (pids: number[]) => pids.flatMap((p) => spawnSync('pgrep', ['-P', String(p), 'nbdkit'], { encoding: 'utf8' }).stdout.split('\n')
  .filter(Boolean).map((k) => { try { return readFileSync(`/proc/${k}/cmdline`, 'utf8').split('\0'); } catch { return []; } })
  .map((argv) => /^\/dev\/shm\/(ferry-guest-preflight-[^/]+)\//.exec(argv[argv.indexOf('--unix') + 1] ?? '')?.[1]).filter((d): d is string => !!d));

/** Bytes in every file under `dir` (0 when it does not exist). */
function bytesUnder(dir: string): number {
  let n = 0;
  let names: string[];
  try { names = readdirSync(dir); } catch { return 0; }
  for (const x of names) { const p = path.join(dir, x); const st = statSync(p, { throwIfNoEntry: false }); if (st?.isDirectory()) n += bytesUnder(p); else n += st?.size ?? 0; }
  return n;
}

/** A 64 MiB disk whose only partition is LUKS holding an ext4 root with /etc, made in libguestfs's appliance. */
function makeLuksDisk(dir: string): string {
  const raw = path.join(dir, 'luks.raw');
  execFileSync('qemu-img', ['create', '-f', 'raw', raw, '64M']);
  const cmds = [['run'], ['part-disk', '/dev/sda', 'mbr'], ['luks-format', '/dev/sda1', '0'], ['luks-open', '/dev/sda1', 'cryptroot'], ['mkfs', 'ext4', '/dev/mapper/cryptroot'],
    ['mount', '/dev/mapper/cryptroot', '/'], ['mkdir', '/etc'], ['write', '/etc/fstab', '/dev/mapper/cryptroot / ext4 defaults 0 1\n'], ['umount-all'], ['luks-close', '/dev/mapper/cryptroot']];
  // The commands as arguments (":" between them), so stdin carries only the passphrase, once per command asking.
  const args = cmds.flatMap((c, i) => (i ? [':', ...c] : c));
  const r = spawnSync('guestfish', ['--keys-from-stdin', '--format=raw', '-a', raw, '--', ...args], { input: 'ferry-test-passphrase\nferry-test-passphrase\n', env: guestfsEnv(), encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`making the LUKS disk: ${r.stderr}`);
  execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=monolithicFlat', raw, path.join(dir, 'luks.vmdk')]);
  return raw;
}

describe('plans: guest-level preflight reads the guest in place on the datastore @vm', function () {
  this.timeout(3 * 3600 * 1000); // a fresh machine builds the guest fixture first
  const redis = new TestRedis();
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-guest-preflight-test-'));
  const tmp = path.join(dir, 'daemon-tmp');
  const exports = path.join(dir, 'exports');
  let g: DebianGuest;
  let v: Vcsim;
  let lv: TestLibvirt;
  let daemon: Proc & { url: string };
  let worker: Proc;
  const shmBefore = new Set(shmLeft());

  /** The simulator with the three VMs, a private Redis, the run's libvirtd, the daemon and the guest-read worker:
   *  started only when the proof runs (a reused one needs none of them). */
  async function start() {
    [v, lv] = await Promise.all([startVcsim(), useLibvirt(), redis.start()]);
    const m = managerFor({ url: v.url, username: v.username, password: v.password, ca: readFileSync(v.caFile, 'utf8') });
    const bytes = (await imageInfo(g.vmdk, 'vmdk'))['virtual-size'];
    for (const name of ['debian12', 'clone12']) {
      await createVm(m, { name, guestId: 'debian11_64Guest', cpus: 1, memoryMB: 1024, mac: name === 'debian12' ? g.mac : '00:50:56:aa:cc:02', disks: [{ file: `${name}/${name}.vmdk`, bytes }] });
      await upload(v, g.vmdk, `${name}/${name}.vmdk`);
    }
    makeLuksDisk(dir);
    await createVm(m, { name: 'luks', guestId: 'debian11_64Guest', cpus: 1, memoryMB: 512, mac: '00:50:56:aa:cc:03', disks: [{ file: 'luks/luks.vmdk', bytes: 64 * MiB }] });
    await upload(v, path.join(dir, 'luks.vmdk'), 'luks/luks.vmdk');
    await upload(v, path.join(dir, 'luks-flat.vmdk'), 'luks/luks-flat.vmdk');
    mkdirSync(tmp);
    const netXml = path.join(dir, 'net.xml');
    writeFileSync(netXml, `<network><name>${NET}</name><bridge name="virbrgp0"/></network>`);
    await lv.virsh(['net-define', netXml]);
    await lv.virsh(['net-start', NET]);
    const cfg = path.join(dir, 'daemon.yaml');
    writeFileSync(cfg, 'daemon:\n  job_timeout: 1h\n');
    const env = {
      ...testEnv(redis.url, 'gpre'), FERRY_GUEST_PREFLIGHT: '1', FERRY_HOST: '127.0.0.1',
      // Three appliance launches on a shared, loaded host (load 50-70 here) outlast the default bound of 600 s.
      FERRY_GUEST_PREFLIGHT_SECONDS: '3000',
      GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: v.password, FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1',
      FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_POOL: lv.pool, FERRY_EXPORT_DIR: exports,
      // The daemon's and the worker's own temporary folder, to see that nothing lands there; libguestfs's appliance cache stays shared.
      TMPDIR: tmp, LIBGUESTFS_CACHEDIR: process.env.LIBGUESTFS_CACHEDIR || '/var/tmp',
    };
    daemon = await startDaemonProc(env, cfg);
    worker = await startWorkerProc(env, 'gpre-guest', ['vsphere_access', 'mount_operations', 'nbd_access']);
    await awaitWorkers(daemon.url, [worker]);
  }
  after(async () => {
    await worker?.stop();
    await daemon?.stop();
    await lv?.virsh(['net-destroy', NET]).catch(tolerate(`net-destroy ${NET}`)); // only when before() got that far
    await lv?.virsh(['net-undefine', NET]).catch(tolerate(`net-undefine ${NET}`));
    await v?.stop();
    await redis.stop();
    if (lv) await releaseLibvirt();
    rmSync(dir, { recursive: true, force: true });
  });

  /** What the check reads: the plan's creation, the validation's answer, the plan's record after it, and what the
   *  host held before, during (the most bytes added) and after it. */
  interface Evidence {
    created: { status: number; text: string }; validated: { status: number; text: string }; plan: PlanView;
    tmpBefore: string[]; tmpAfter: string[]; exportBytes: number; most: number; shmNew: string[]; nbdkit: string;
    /** how many /dev/shm folders this test's own nbdkit readers used (seen while validate ran) */
    shmUsed: number;
    /** the states of the guest_preflight jobs the validation made */
    reads: string[];
  }

  async function validate(): Promise<Evidence> {
    await start();
    const c = await req(daemon.url, 'POST', '/plans', {
      id: 'gp', name: 'guest preflight', vms: ['/DC0/vm/debian12', '/DC0/vm/clone12', '/DC0/vm/luks'], destination: { type: 'kvm', virt_uri: lv.uri },
      network_map: { 'VM Network': NET }, storage_map: { LocalDS_0: lv.pool }, options: { power_off: 'none' },
    });
    expect(c.status, c.text).to.equal(201);
    // Validate runs for minutes under TCG: no client-side timeout; meanwhile the folders are sampled.
    // The daemon's TMPDIR already holds tsx's compile cache: what validate adds is measured against it.
    const tmpBefore = readdirSync(tmp).sort();
    const base = bytesUnder(tmp);
    let most = 0;
    let sampling = true;
    const readers = new Set<string>();
    const sampler = (async () => {
      while (sampling) {
        most = Math.max(most, bytesUnder(tmp) - base + bytesUnder(exports));
        for (const d of shmOfReaders([daemon.proc.pid!, worker.proc.pid!])) readers.add(d);
        await new Promise((r) => setTimeout(r, 200));
      }
    })();
    const res = await request(`${daemon.url}/plans/gp/validate`, { method: 'POST', dispatcher: new Agent({ headersTimeout: 0, bodyTimeout: 0 }) });
    const text = await res.body.text();
    sampling = false;
    await sampler;
    const plan = (await req<PlanView>(daemon.url, 'GET', '/plans/gp')).body;
    const jobs = (await req<DaemonJobList>(daemon.url, 'GET', '/jobs?limit=50')).body.jobs;
    return {
      created: { status: c.status, text: c.text }, validated: { status: res.statusCode, text }, plan, tmpBefore, tmpAfter: readdirSync(tmp).sort(),
      exportBytes: bytesUnder(exports), most, shmNew: shmLeft().filter((n) => !shmBefore.has(n) && readers.has(n)), shmUsed: readers.size,
      nbdkit: [daemon, worker].map((p) => spawnSync('pgrep', ['-P', String(p.proc.pid), 'nbdkit'], { encoding: 'utf8' }).stdout.trim()).join(''),
      reads: jobs.filter((j) => j.definition.operation === 'guest_preflight').map((j) => j.status),
    };
  }

  /** The assertions, on a fresh run's evidence or on the record's. */
  function check(e: Evidence) {
    expect(e.created.status, e.created.text).to.equal(201);
    expect(e.validated.status, e.validated.text).to.equal(200);
    const body = JSON.parse(e.validated.text) as Validation;
    const by = Object.fromEntries(body.vms.map((x) => [x.vm_path.split('/').pop()!, x.findings]));
    const rules = (n: string) => by[n].map((f) => `${f.rule}:${f.severity}`);

    for (const n of ['debian12', 'clone12']) {
      expect(rules(n).filter((r: string) => r.endsWith(':blocker')), `${n}: ${JSON.stringify(by[n], null, 1)}`).to.deep.equal([]);
      const info = by[n].find((f): f is GuestInspected => f.rule === 'guest_inspected')!;
      expect(info, `${n}: ${String(rules(n))}`).to.not.equal(undefined);
      expect(info.severity).to.equal('info');
      expect(info.guest).to.include({ os: 'linux', distro: 'debian', root: '/dev/sda1', initramfs_tool: 'update-initramfs' });
      expect(info.guest.version).to.match(/^12\./);
      expect(info.guest.boot_loader).to.match(/GRUB for BIOS \(msdos/);
      const files: string[] = info.guest.files_changed;
      expect(files).to.include.members(['/boot/grub/grub.cfg', '/etc/initramfs-tools/modules']);
      expect(files.some((f) => /^\/boot\/initrd\.img-/.test(f)), files.join(' ')).to.equal(true);
      // The network configuration Ferry would rewrite: the VMware NIC's name in the guest's configuration.
      expect(info.guest.network.join(' '), files.join(' ')).to.include(g.vmwareNic);
      for (const word of ['Debian 12.', 'GRUB for BIOS', '/boot/grub/grub.cfg', g.vmwareNic]) expect(info.message).to.include(word);
      // The reading the VM's job's repair reuses: device names as its own appliance sees them (its disk sda).
      const read = info.guest.inspection;
      expect(read, `${n}: no reading for the repair`).to.not.equal(undefined);
      expect(read).to.deep.include({ os: 'linux', distro: 'debian', package_format: 'deb', root: '/dev/sda1' });
      expect(read!.hypervisor_packages).to.include('open-vm-tools');
      for (const f of ['/etc/fstab', '/etc/os-release', '/var/lib/dpkg/status']) expect(read!.evidence[f], `${n} ${f}`).to.match(/^[0-9a-f]{64}$/);
    }
    expect(rules('luks'), JSON.stringify(by.luks)).to.include('guest_luks:blocker');
    expect(by.luks.find((f) => f.rule === 'guest_luks')!.message).to.include('/dev/sd');
    expect(body.blockers, JSON.stringify(body)).to.equal(1);

    // In the plan's record too, and the LUKS VM would be blocked at start.
    expect(e.plan.vms.find((x) => x.vm_path === '/DC0/vm/luks')!.findings.map((f) => f.rule)).to.include('guest_luks');

    // Nothing downloaded: the TMPDIR and export folder hold nothing new (and gained at most libguestfs's small
    // sockets and logs meanwhile), no cache folder is left in /dev/shm, no nbdkit outlives the validation.
    expect(e.tmpAfter).to.deep.equal(e.tmpBefore);
    expect(e.exportBytes).to.equal(0);
    expect(e.most, 'bytes added to TMPDIR and the export folder during validate').to.be.below(4 * MiB);
    expect(e.shmUsed, 'the readers kept their cache in /dev/shm').to.be.above(0);
    expect(e.shmNew, 'no folder of this validation\'s readers is left').to.deep.equal([]);
    expect(e.nbdkit).to.equal('');
    // Read by the worker, as one guest_preflight job.
    expect(e.reads).to.deep.equal(['completed']);
  }

  it('names the OS, boot loader and files the repair would change; a LUKS root is a blocker; nothing is downloaded', async () => {
    g = await ensureDebianGuest('plain');
    const spec = { name: 'plans-guest-preflight', entries: [__filename], extra: fixtureInputs(g.vmdk) };
    await reusedProof(spec, validate, check);
  });
});
