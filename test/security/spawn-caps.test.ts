// The guest preflight's processes capped per caller and per daemon (issue 33 item 5), tried as a submit key's
// validate of a plan whose VM has two disks (one nbdkit each) on the simulator, with the VM's network and pool on a
// private libvirtd so nothing else blocks the guest read: with one nbdkit per caller the second disk is refused,
// 429 with Retry-After; with one in all, 503. The read is a worker's guest_preflight job, and the caps are taken by
// the daemon at its submission: refused, no job is made (none is listed) and no nbdkit of the daemon runs.
import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { managerFor } from '../../domain/vsphere/client';
import { startDaemonProc } from '../helpers/procs';
import { useStack } from '../helpers/stack';
import { req, until } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import type { DaemonJobList } from '../helpers/api-types';
import { startVcsim, Vcsim } from '../helpers/vcsim';
import { releaseLibvirt, TestLibvirt, useLibvirt } from '../helpers/libvirt';
import { createVm, upload } from '../vsphere/fixture';

const NET = 'ferry-caps';
const KEY = 'caps-submit-key-0123456789';

/** The nbdkit processes whose parent is `pid`. */
function nbdkitsOf(pid: number): number[] {
  return readdirSync('/proc').filter((d) => /^\d+$/.test(d)).filter((d) => {
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === pid && stat.includes('(nbdkit)');
    } catch { return false; } // the process ended while it was read
  }).map(Number);
}

describe('security: guest preflight nbdkit processes capped per caller (429) and in all (503)', function () {
  this.timeout(600_000);
  const s = useStack({ name: 'sec-caps', prefix: 'caps', gateway: false, daemon: false });
  let v: Vcsim;
  let lv: TestLibvirt;
  let env: Record<string, string>;

  before(async () => {
    [v, lv] = await Promise.all([startVcsim(), useLibvirt()]);
    const m = managerFor({ url: v.url, username: v.username, password: v.password, ca: readFileSync(v.caFile, 'utf8') });
    const disk = path.join(s.dir, 'd.vmdk');
    execFileSync('qemu-img', ['create', '-q', '-f', 'vmdk', disk, '16M']);
    await createVm(m, { name: 'two', guestId: 'debian11_64Guest', cpus: 1, memoryMB: 512, mac: '00:50:56:aa:dd:01', disks: [{ file: 'two/two.vmdk', bytes: 16 << 20 }, { file: 'two/two_1.vmdk', bytes: 16 << 20 }] });
    await upload(v, disk, 'two/two.vmdk');
    await upload(v, disk, 'two/two_1.vmdk');
    const netXml = path.join(s.dir, 'net.xml');
    writeFileSync(netXml, `<network><name>${NET}</name><bridge name="virbrcap0"/></network>`);
    await lv.virsh(['net-define', netXml]);
    await lv.virsh(['net-start', NET]);
    env = {
      ...s.env, FERRY_GUEST_PREFLIGHT: '1', FERRY_API_KEYS: `ci:submit:${KEY}`,
      GOVC_URL: v.url, GOVC_USERNAME: v.username, GOVC_PASSWORD: v.password, FERRY_VSPHERE_CA: v.caFile, FERRY_VSPHERE_MANAGERS: '127.0.0.1',
      FERRY_LIBVIRT_URI: lv.uri, FERRY_LIBVIRT_POOL: lv.pool,
    };
  });
  after(async () => {
    await v?.stop();
    if (lv) await releaseLibvirt();
  });

  async function validate(caps: Record<string, string>, id: string) {
    const dm = await s.add(startDaemonProc({ ...env, ...caps }, s.config));
    const as = { 'x-api-key': KEY };
    const c = await req(dm.url, 'POST', '/plans', { id, name: id, vms: ['/DC0/vm/two'], network_map: { 'VM Network': NET }, storage_map: { LocalDS_0: lv.pool }, options: { power_off: 'none' } }, as);
    expect(c.status, c.text).to.equal(201);
    const r = await fetch(`${dm.url}/plans/${id}/validate`, { method: 'POST', headers: as });
    const body = await r.json() as DaemonError;
    await until(() => nbdkitsOf(dm.proc.pid!).length === 0, 20000, 'no nbdkit of the daemon left');
    const jobs = await req<DaemonJobList>(dm.url, 'GET', '/jobs', undefined, as);
    expect(jobs.body.jobs, 'no guest_preflight job').to.deep.equal([]);
    await dm.stop();
    return { status: r.status, retryAfter: r.headers.get('retry-after'), body };
  }

  it('one nbdkit per caller: the second disk is refused with 429 and Retry-After, naming the setting', async () => {
    const r = await validate({ FERRY_NBDKIT_PROCESSES_PER_CALLER: '1', FERRY_NBDKIT_PROCESSES: '0' }, 'caps-caller');
    expect(r.status, JSON.stringify(r.body)).to.equal(429);
    expect(Number(r.retryAfter)).to.be.above(0);
    expect(r.body.error).to.include('nbdkit processes').and.include('FERRY_NBDKIT_PROCESSES_PER_CALLER');
  });

  it('one nbdkit in all: 503 with Retry-After, naming the setting', async () => {
    const r = await validate({ FERRY_NBDKIT_PROCESSES_PER_CALLER: '0', FERRY_NBDKIT_PROCESSES: '1' }, 'caps-total');
    expect(r.status, JSON.stringify(r.body)).to.equal(503);
    expect(Number(r.retryAfter)).to.be.above(0);
    expect(r.body.error).to.include('nbdkit processes').and.include('FERRY_NBDKIT_PROCESSES');
  });
});
