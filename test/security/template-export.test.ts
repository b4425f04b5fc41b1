// Template exports keep the domain's secrets (issue 18, item 10): against the run's private libvirtd, a template
// whose VNC console has a password is exported through the daemon. Without `security_info` the password is not in
// domain.xml; asking for it needs an admin key (403 naming the field otherwise); every file is 0600 in a 0700
// folder, whoever's umask the daemon runs with.
import { expect } from 'chai';
import { mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { guestXml } from '../helpers/libvirt';
import { req } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import { startVirtStack, VirtStack } from '../virt/stack';
import { tolerate } from '../helpers/teardown';

const K = { submit: 'tplx-submit-key-0123456789', admin: 'tplx-admin-key-0123456789' };
const VNC_PASSWORD = 'Vq7#kP2z'; // VNC allows 8 characters

describe('security: template exports without console passwords unless an admin asks, files 0600', function () {
  this.timeout(120_000);
  let s: VirtStack;
  const as = (key: string) => ({ 'x-api-key': key });
  const mode = (p: string) => statSync(p).mode & 0o777;

  before(async () => {
    s = await startVirtStack({ FERRY_API_KEYS: `ci:submit:${K.submit},ops:admin:${K.admin}` });
    await s.lv.virsh(['vol-create-as', s.lv.pool, 'tplx.qcow2', '16M', '--format', 'qcow2']);
    const xml = guestXml('tplx', { disk: path.join(s.lv.poolDir, 'tplx.qcow2') })
      .replace('<memballoon', `<graphics type='vnc' port='-1' autoport='yes' passwd='${VNC_PASSWORD}'/><memballoon`);
    const file = path.join(s.dir, 'tplx.xml');
    writeFileSync(file, xml);
    await s.lv.virsh(['define', file]);
    // The control: libvirt keeps the password and shows it to whoever asks for the security information.
    expect(await s.lv.virsh(['dumpxml', '--inactive', '--security-info', 'tplx'])).to.include(VNC_PASSWORD);
  });
  after(async () => {
    await s?.lv.virsh(['undefine', 'tplx', '--remove-all-storage']).catch(tolerate('undefine tplx --remove-all-storage'));
    await s?.stop();
  });

  it('a plain export has no password in domain.xml; folder 0700, every file 0600', async () => {
    const out = path.join(s.dir, 'plain');
    mkdirSync(out);
    const r = await req(s.daemon.url, 'POST', '/virt/template/export', { template: 'tplx', export_path: out }, as(K.admin));
    expect(r.status, r.text).to.equal(201);
    const dir = path.join(out, 'tplx');
    const xml = readFileSync(path.join(dir, 'domain.xml'), 'utf8');
    expect(xml).to.include("<graphics type='vnc'").and.not.include(VNC_PASSWORD);
    expect(mode(dir)).to.equal(0o700);
    const files = readdirSync(dir);
    expect(files).to.include('domain.xml').and.include('vda.qcow2');
    for (const f of files) expect(mode(path.join(dir, f)), f).to.equal(0o600);
  });

  it('the export needs an admin key (403 for a submit key asking for security_info, nothing written); the admin who asks gets the password', async () => {
    const out = path.join(s.dir, 'secure');
    mkdirSync(out);
    const denied = await req<DaemonError>(s.daemon.url, 'POST', '/virt/template/export', { template: 'tplx', export_path: out, security_info: true }, as(K.submit));
    expect(denied.status, denied.text).to.equal(403);
    expect(denied.body.error).to.match(/role admin/);
    expect(readdirSync(out)).to.deep.equal([]);
    const r = await req(s.daemon.url, 'POST', '/virt/template/export', { template: 'tplx', export_path: out, security_info: true }, as(K.admin));
    expect(r.status, r.text).to.equal(201);
    const xml = path.join(out, 'tplx', 'domain.xml');
    expect(readFileSync(xml, 'utf8')).to.include(VNC_PASSWORD);
    expect(mode(xml)).to.equal(0o600);
  });
});
