// Templates: a domain marked in its <metadata> with Ferry's own element (namespace TEMPLATE_NS), deployed by
// cloning, exported as XML plus disk images.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { ApiError } from '../../platform/errors';
import { guestfsEnv } from '../guestfs-env';
import { convert, noProgress } from '../qemu';
import { checkDomainName, checkName } from './names';
import { cloneDomain } from './clone';
import { defineDomain, domainInfo, domainXml, listDomains } from './domains';
import { nicSource } from './networks';
import { downloadVolume } from './volumes';
import { confinePath } from './paths';
import { buildXml, list, Many, parseXml, text, XmlAttrs, XmlValue } from './xml';
import { LibvirtError, runTool, Virsh } from './virsh';

export const TEMPLATE_NS = 'https://ferry.dev/xmlns/libvirt/template/1';
const KEY = 'ferry';

/** Ferry's marker element as `virsh metadata` prints it. */
interface MarkDoc { template?: XmlAttrs & { description?: XmlValue; meta?: Many<XmlAttrs> } }

export interface TemplateMark { description: string | null; created_at: string | null; source: string | null; metadata: Record<string, string> }

/** The marker element of a domain, or null (libvirt: "metadata not found"). */
export async function readMark(v: Virsh, name: string): Promise<TemplateMark | null> {
  let xml: string;
  try { xml = await v.run(['metadata', name, '--uri', TEMPLATE_NS, '--config']); } catch (e) {
    if (/metadata not found|not present/i.test((e as Error).message)) return null;
    throw e;
  }
  const t = parseXml<MarkDoc>(xml).template;
  if (!t) return null;
  return {
    description: text(t.description) ?? null, created_at: t['@_created_at'] ?? null, source: t['@_source'] ?? null,
    metadata: Object.fromEntries(list(t.meta).map((m): [string, string] => [String(m['@_key']), text(m) ?? ''])),
  };
}

async function setMark(v: Virsh, name: string, m: TemplateMark | null) {
  if (!m) { await v.run(['metadata', name, '--uri', TEMPLATE_NS, '--config', '--remove']); return; }
  const doc = { template: {
    '@_created_at': m.created_at, '@_source': m.source ?? undefined, ...(m.description ? { description: m.description } : {}),
    meta: Object.entries(m.metadata).map(([k, val]) => ({ '@_key': k, '#text': val })),
  } };
  await v.run(['metadata', name, '--uri', TEMPLATE_NS, '--key', KEY, '--set', buildXml(doc), '--config']);
}

/** Marks `domain` as a template, or a clone of it named `name` when that differs; `seal` runs virt-sysprep on it
 *  (machine ids, SSH host keys, logs, ... removed; libguestfs). */
export async function createTemplate(v: Virsh, s: { domain: string; name?: string; description?: string; metadata?: Record<string, string>; seal?: boolean }) {
  checkName(s.domain, 'domain');
  const target = s.name && s.name !== s.domain ? s.name : s.domain;
  if (target !== s.domain) await cloneDomain(v, { source: s.domain, target });
  else await domainInfo(v, target);
  await setMark(v, target, { description: s.description ?? null, created_at: new Date().toISOString(), source: s.domain, metadata: s.metadata || {} });
  // Without its "customize" operation: that one runs last and writes a fresh random /etc/machine-id (and random
  // seed), which every clone of the template would then share. Left empty, each guest makes its own at first boot.
  if (s.seal) {
    await runTool('virt-sysprep', ['-c', v.uri, '-d', target, '--operations', 'defaults,-customize'], v.uri, { env: guestfsEnv(), timeoutMs: 3_600_000 });
  }
  return { name: target, source: s.domain, sealed: !!s.seal, template: await readMark(v, target) };
}

const NAME_RULE = /(^|[^A-Za-z0-9])template([^A-Za-z0-9]|$)/i;

/** Marked templates, plus (the seed's rule) domains whose name holds the word "template" or that are shut off;
 *  `reason` says which. */
export async function listTemplates(v: Virsh) {
  const doms = await listDomains(v);
  const out = [];
  for (const d of doms) {
    const mark = await readMark(v, d.name);
    const reason = mark ? 'marked' : NAME_RULE.test(d.name) ? 'name' : d.state === 'shut off' ? 'shut off' : null;
    if (reason) {
      out.push({
        name: d.name, state: d.state, marked: !!mark, reason,
        description: mark?.description ?? null, created_at: mark?.created_at ?? null, metadata: mark?.metadata ?? {},
      });
    }
  }
  return out;
}

export interface Customize { hostname?: string; root_password_hash?: string; ssh_keys?: string[]; ssh_user?: string; first_boot_command?: string }

/** virt-customize arguments: each value is one argv element (never a shell line on this host). */
export function customizeArgs(c: Customize): string[] {
  const a: string[] = [];
  if (c.hostname) a.push('--hostname', c.hostname);
  // The hash travels as a file's content ("usermod -p" inside the guest reads it), never in this host's argv.
  if (c.root_password_hash) a.push('--run-command', 'usermod -p "$(cat /root/.ferry-root-hash)" root && rm -f /root/.ferry-root-hash');
  for (const k of c.ssh_keys || []) a.push('--ssh-inject', `${c.ssh_user || 'root'}:string:${k}`);
  if (c.first_boot_command) a.push('--firstboot-command', c.first_boot_command);
  return a;
}

/** Clone of a template with its own memory (MiB), vCPUs, network, autostart and guest customisation; the clone
 *  loses the template marker. */
export async function deployTemplate(v: Virsh, s: {
  template: string; name: string; memory?: number; vcpus?: number; network?: string; autostart?: boolean; customize?: Customize;
}) {
  checkName(s.template, 'template'); checkDomainName(s.name, 'name');
  if (s.network) checkName(s.network, 'network');
  await cloneDomain(v, { source: s.template, target: s.name });
  const doc = await domainXml(v, s.name, true);
  const d = doc.domain;
  delete d.metadata;
  if (s.memory) {
    d.memory = { '@_unit': 'MiB', '#text': String(s.memory) };
    d.currentMemory = { '@_unit': 'MiB', '#text': String(s.memory) };
  }
  if (s.vcpus) d.vcpu = typeof d.vcpu === 'object' ? { ...d.vcpu, '#text': String(s.vcpus) } : String(s.vcpus);
  if (s.network) {
    const to = await nicSource(v, s.network, 'network');
    const devices = d.devices!; // every domain definition has <devices>
    const nics = list(devices.interface);
    const nic = {
      '@_type': to.type, source: to.type === 'network' ? { '@_network': to.source } : { '@_bridge': to.source },
      mac: nics[0]?.mac, model: { '@_type': 'virtio' },
    };
    devices.interface = [nic, ...nics.slice(1)];
  }
  await defineDomain(v, doc);
  if (s.autostart) await v.run(['autostart', s.name]);
  // ssh_user only says whose keys ssh_keys are (the schema defaults it): alone it customizes nothing.
  const customized = Object.entries(s.customize || {}).filter(([k, val]) => k !== 'ssh_user' && val !== undefined).map(([k]) => k);
  if (customized.length) {
    const c = s.customize!;
    const tmp = c.root_password_hash ? await fs.mkdtemp('/tmp/ferry-customize-') : undefined;
    try {
      const pre: string[] = [];
      if (tmp) {
        await fs.writeFile(path.join(tmp, '.ferry-root-hash'), c.root_password_hash!, { mode: 0o600 });
        pre.push('--upload', `${path.join(tmp, '.ferry-root-hash')}:/root/.ferry-root-hash`);
      }
      await runTool('virt-customize', ['-c', v.uri, '-d', s.name, ...pre, ...customizeArgs(c)], v.uri, { env: guestfsEnv(), timeoutMs: 3_600_000 });
    } finally { if (tmp) await fs.rm(tmp, { recursive: true, force: true }); }
  }
  const info = await domainInfo(v, s.name);
  return { name: s.name, template: s.template, uuid: info.uuid, autostart: !!s.autostart, customized, interfaces: info.interfaces, disks: info.disks };
}

/** `<export_path>/<template>/domain.xml` and one image per disk (qcow2, compressed when `compress`), written
 *  under a temporary name and renamed into place. The folder is 0700 and every file 0600 (a disk holds the guest's
 *  own secrets); the XML has VNC/SPICE passwords only when `security_info` (an admin's request, checked by the
 *  route). */
export async function exportTemplate(v: Virsh, s: { template: string; export_path: string; compress?: boolean; overwrite?: boolean; security_info?: boolean }) {
  checkName(s.template, 'template');
  const base = await confinePath(s.export_path, 'output_dir', 'export_path');
  const dir = path.join(base, s.template);
  const part = path.join(base, `.${s.template}.ferry-partial`);
  if (await fs.stat(dir).then(() => true, () => false)) throw new ApiError(409, `${dir} already exists`);
  const xml = await v.run(['dumpxml', '--inactive', ...(s.security_info ? ['--security-info'] : []), s.template]);
  const info = await domainInfo(v, s.template);
  await fs.rm(part, { recursive: true, force: true });
  await fs.mkdir(part, { recursive: true, mode: 0o700 });
  try {
    await fs.writeFile(path.join(part, 'domain.xml'), xml, { mode: 0o600 });
    const files = [];
    for (const d of info.disks.filter((x): x is typeof x & { source: string } => x.device === 'disk' && !!x.source)) {
      const raw = path.join(part, `${d.target}.${d.format || 'raw'}`);
      await downloadVolume(v, '', d.source, raw).catch((e: unknown) => {
        if (e instanceof LibvirtError && e.status === 404) {
          throw new ApiError(409, `disk ${d.source} of ${s.template} is not a volume of any storage pool: it cannot be exported`);
        }
        throw e;
      });
      let file = raw;
      if (s.compress) {
        file = path.join(part, `${d.target}.qcow2`);
        const tmp = `${file}.tmp`;
        await convert({ src: raw, srcFormat: d.format || 'raw', dest: tmp, destFormat: 'qcow2', compress: true }, noProgress);
        await fs.rm(raw);
        await fs.rename(tmp, file);
      }
      await fs.chmod(file, 0o600); // vol-download and qemu-img create files with the umask's mode
      files.push({
        target: d.target, source: d.source, file: path.join(dir, path.basename(file)), bytes: (await fs.stat(file)).size, compressed: !!s.compress,
      });
    }
    await fs.rename(part, dir);
    return { template: s.template, export_path: dir, xml: path.join(dir, 'domain.xml'), disks: files };
  } catch (e) {
    await fs.rm(part, { recursive: true, force: true });
    throw e;
  }
}
