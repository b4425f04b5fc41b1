// The host is admin's, tried as an attacker would against a real daemon on the run's private libvirtd with a real
// guest: a submit key cannot delete domains or networks (virsh still lists them), a read key (or its ticket) cannot
// type into a VM's serial console, a second writer is refused, and only admin may take the console over, from
// another viewer or from a virsh outside Ferry (--force). The admin's own flows still work.
import { expect } from 'chai';
import WebSocket from 'ws';
import { req, until } from '../helpers/http';
import type { DaemonError } from '../helpers/http';
import { defineGuest, GUEST_MARKER } from '../helpers/libvirt';
import { openConsole, Virsh } from '../../domain/libvirt';
import { startVirtStack, VirtStack } from '../virt/stack';
import type { BatchResult } from '../../domain/libvirt/batch';
import type { AuditPage, VirtOk } from '../helpers/api-types';

const K = { read: 'conroles-reader-0123456789ab', submit: 'conroles-submit-0123456789ab', admin: 'conroles-admin-0123456789abc' };
const as = (r: keyof typeof K) => ({ 'X-API-Key': K[r] });

/** What the console sends (services/daemon/console.ts). */
type ConsoleMsg = { type: 'status'; status: string; domain: string; state: string; mode: 'read' | 'write' } | { type: 'data'; data: string }
  | { type: 'error'; error: string } | { type: 'closed'; error?: string };
interface Con { ws: WebSocket; text: () => string; msgs: ConsoleMsg[]; closed: Promise<{ code: number; reason: string }>; opened: Promise<void> }
function connect(url: string, headers: Record<string, string> = {}): Con {
  const ws = new WebSocket(url, { headers });
  const msgs: ConsoleMsg[] = [];
  ws.on('message', (d: Buffer) => msgs.push(JSON.parse(d.toString()) as ConsoleMsg));
  const closed = new Promise<{ code: number; reason: string }>((r) => ws.once('close', (code, reason) => r({ code, reason: String(reason) })));
  const opened = new Promise<void>((resolve, reject) => { ws.once('open', () => resolve()); ws.once('unexpected-response', (_q, res) => reject(new Error(`HTTP ${res.statusCode}`))); ws.once('error', reject); });
  return { ws, msgs, closed, opened, text: () => msgs.filter((m) => m.type === 'data').map((m) => m.data).join('') };
}
const type = (c: Con, line: string) => c.ws.send(JSON.stringify({ type: 'input', data: `${line}\r` }));
const statusOf = (c: Con) => until(() => c.msgs.find((m) => m.type === 'status'), 30000, 'console status');

describe('security: the host and the VM console are admin\'s @vm', function () {
  this.timeout(300_000);
  let s: VirtStack;
  let url: string;
  const virsh = (args: string[]) => s.lv.virsh(args);
  const open: Con[] = [];
  const con = (q: string, headers: Record<string, string>) => { const c = connect(`${url}?name=roles-con${q}`, headers); open.push(c); return c; };

  before(async () => {
    s = await startVirtStack({ FERRY_API_KEYS: `reader:read:${K.read},ci:submit:${K.submit},ops:admin:${K.admin}` }, 'auth:\n  enabled: true\n');
    url = `${s.daemon.url.replace('http', 'ws')}/virt/console`;
    for (const d of ['roles-victim', 'roles-gone', 'roles-con']) await defineGuest(s.lv, d);
  });
  after(async () => { for (const c of open) c.ws.terminate(); await s?.stop(); });

  it('a submit key cannot delete domains or networks: 403 and virsh still has them; admin can', async () => {
    const B = s.daemon.url;
    const net = await req(B, 'POST', '/virt/network/create', { name: 'roles-net', forward: 'none' }, as('admin'));
    expect(net.status, net.text).to.equal(201);
    const del = await req<DaemonError>(B, 'POST', '/virt/batch/delete', { domains: ['roles-victim'], remove_storage: true }, as('submit'));
    expect(del.status, del.text).to.equal(403);
    expect(del.body.error).to.include('needs role admin');
    const ndel = await req(B, 'POST', '/virt/network/delete', { name: 'roles-net' }, as('submit'));
    expect(ndel.status, ndel.text).to.equal(403);
    expect(await virsh(['list', '--all', '--name'])).to.include('roles-victim');
    expect(await virsh(['net-list', '--all', '--name'])).to.include('roles-net');
    for (const [p, body] of [['/import/kvm', { image_path: '/tmp/x.qcow2', vm_name: 'roles-imp' }], ['/virt/template/deploy', { template: 'roles-victim', name: 'roles-dep' }], ['/virt/volume/wipe', { pool: 'x', volume: 'y' }]] as const) {
      expect((await req(B, 'POST', p, body, as('submit'))).status, p).to.equal(403);
    }
    // The operator's own flow, with an admin key.
    const ok = await req<VirtOk<BatchResult>>(B, 'POST', '/api/v1/virt/batch/delete', { domains: ['roles-gone'] }, as('admin'));
    expect(ok.status, ok.text).to.equal(200);
    expect(ok.body.data.successful).to.equal(1);
    expect(await virsh(['list', '--all', '--name'])).to.not.include('roles-gone');
  });

  it('a read key watches the console read-only: its keys never reach the guest; the admin writer\'s do', async () => {
    await virsh(['start', 'roles-con', '--paused']);
    const admin = con('', as('admin'));
    expect((await statusOf(admin)).mode).to.equal('write');
    await virsh(['resume', 'roles-con']);
    await until(() => admin.text().includes(GUEST_MARKER), 150000, 'the guest marker');
    await until(() => admin.text().split(GUEST_MARKER)[1]?.includes('/ # '), 30000, 'the shell prompt');
    const reader = con('', as('read'));
    expect((await statusOf(reader)).mode).to.equal('read');
    type(reader, 'echo PWNED$((6*7))');
    await until(() => reader.msgs.find((m) => m.type === 'error' && /read-only/.test(m.error)), 10000, 'the read-only notice');
    type(admin, 'echo OK$((5*5))');
    await until(() => admin.text().includes('OK25') && reader.text().includes('OK25'), 30000, 'the admin\'s command run, seen by both');
    expect(admin.text() + reader.text(), 'the reader\'s command').to.not.include('PWNED');
    // Asking to write, with a key or with the read key's ticket: refused.
    expect((await con('&mode=write', as('read')).closed).code).to.equal(4403);
    const ticket = (await req<{ ticket: string; expires_in: number }>(s.daemon.url, 'POST', '/ws/ticket', undefined, as('read'))).body.ticket;
    const viaTicket = con(`&mode=write&ticket=${ticket}`, {});
    expect((await viaTicket.closed).code).to.equal(4403);
    expect(viaTicket.msgs.find((m) => m.type === 'error')!.error).to.include('needs role admin');
    // The writer is in the audit log (it could type into the guest); the reader is not.
    const log = (await req<AuditPage>(s.daemon.url, 'GET', '/audit?path=/virt/console', undefined, as('admin'))).body.records;
    const writers = log.filter((r) => r.method === 'WEBSOCKET' && r.status === 101);
    expect(writers).to.have.length(1);
    expect(writers[0]).to.include({ key_name: 'ops', role: 'admin', outcome: 'ok' });
    expect(writers[0].targets).to.deep.equal({ domain: 'roles-con', mode: 'write' });
  });

  it('one writer at a time; only admin may force: it takes over from the writer', async () => {
    const first = open.find((c) => c.msgs.some((m) => m.type === 'status' && m.mode === 'write'))!;
    const second = con('&mode=write', as('admin'));
    const c2 = await second.closed;
    expect(c2.code).to.equal(4409);
    expect(second.msgs.find((m) => m.type === 'error')!.error).to.include('already has a writer');
    for (const role of ['read', 'submit'] as const) expect((await con('&force=1', as(role)).closed).code, role).to.equal(4403);
    const taker = con('&force=1', as('admin'));
    expect((await statusOf(taker)).mode).to.equal('write');
    expect((await first.closed).code).to.equal(4409);
    expect(first.msgs.some((m) => m.type === 'closed' && /taken over/.test(m.error!))).to.equal(true);
    type(taker, 'echo NEW$((3*3))');
    await until(() => taker.text().includes('NEW9'), 30000, 'the new writer\'s command');
  });

  it('a console held outside Ferry is reported, not taken, unless an admin forces it (virsh console --force)', async () => {
    for (const c of open) c.ws.close();
    await Promise.all(open.map((c) => c.closed));
    // An operator's own virsh on the console, once the daemon's session has let go of it.
    const v = new Virsh(s.lv.uri);
    const outside = await until(async () => {
      const h = openConsole(v, 'roles-con', false);
      let out = '';
      h.on('data', (t: string) => { out += t; });
      const ended = new Promise<void>((r) => h.on('close', () => r()));
      if (!(await new Promise<boolean>((r) => { h.once('ready', () => r(true)); h.once('close', () => r(false)); }))) return null;
      // Typed until its echo comes back (keys sent while virsh still attaches its stream are lost).
      const retype = setInterval(() => h.write('echo HELD$((2*4))\r'), 2000);
      h.write('echo HELD$((2*4))\r');
      const held = await Promise.race([until(() => out.includes('HELD8'), 20000, 'HELD8').then(() => true, () => false), ended.then(() => false)]);
      clearInterval(retype);
      if (!held) { h.close(); return null; }
      return { h, ended };
    }, 90000, 'an outside virsh holding the console');
    const reader = con('', as('read'));
    const end = await until(() => reader.msgs.find((m) => m.type === 'closed'), 30000, 'the refused session');
    expect(`${end.error} ${reader.text()}`, 'virsh\'s reason').to.match(/active console session/i);
    expect(outside.h.proc.exitCode, 'the outside virsh still holds it').to.equal(null);
    const admin = con('&force=1', as('admin'));
    expect((await statusOf(admin)).mode).to.equal('write');
    await outside.ended; // thrown out by --force
    type(admin, 'echo MINE$((4*4))');
    await until(() => admin.text().includes('MINE16'), 30000, 'the admin\'s command after forcing');
  });
});
