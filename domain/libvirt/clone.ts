// Clones with virt-clone (Debian virtinst) and the template marker kept in the domain's <metadata>.
import { ApiError } from '../../platform/errors';
import { checkDomainName, checkName } from './names';
import { domainExists, domainInfo, domainState } from './domains';
import { LibvirtError, runTool, Virsh } from './virsh';

export interface CloneSpec { source: string; target: string; files?: string[]; new_mac?: boolean; auto_clone?: boolean; preserve?: boolean }

/** virt-clone --original <source> --name <target>: new disks named after the target in the source's pool
 *  (`--auto-clone`) unless `files` names them; `new_mac: false` keeps the source's MACs (virt-clone's own
 *  default is new ones); `preserve` keeps the new disks' data as is (`--preserve-data`: nothing copied). */
export async function cloneDomain(v: Virsh, s: CloneSpec) {
  checkName(s.source, 'source'); checkDomainName(s.target, 'target');
  if (await domainExists(v, s.target)) throw new LibvirtError(409, `domain ${s.target} already exists`, 'exists');
  const src = await domainInfo(v, s.source);
  const state = await domainState(v, s.source);
  if (state === 'running' || state === 'blocked') throw new ApiError(409, `domain ${s.source} is ${state}: shut it down or pause it before cloning`);
  const files = s.files || [];
  const args = ['--connect', v.uri, '--original', s.source, '--name', s.target, '--check', 'path_exists=off'];
  if (files.length) for (const f of files) args.push('--file', f); else if (s.auto_clone !== false) args.push('--auto-clone');
  if (s.preserve) args.push('--preserve-data');
  // Keeping the MACs means two domains share them: virt-clone's in-use check is turned off for exactly that.
  if (s.new_mac === false && src.interfaces.some((n) => n.mac)) {
    for (const nic of src.interfaces) if (nic.mac) args.push('--mac', nic.mac);
    args.push('--check', 'mac_in_use=off');
  }
  await runTool('virt-clone', args, v.uri, { timeoutMs: 3_600_000 });
  const out = await domainInfo(v, s.target);
  return { source: s.source, target: s.target, uuid: out.uuid, disks: out.disks, interfaces: out.interfaces };
}

/** clone/multiple: `<name_prefix>-<n>` for n = start_index .. start_index + count - 1, one after another
 *  (virt-clone reads the source's disks; parallel copies would only compete for the same disk). */
export async function cloneMany(v: Virsh, s: { source: string; name_prefix: string; count: number; start_index?: number }) {
  const first = s.start_index ?? 1;
  const out: { name: string; success: boolean; uuid?: string; error?: string }[] = [];
  for (let i = first; i < first + s.count; i++) {
    const name = `${s.name_prefix}-${i}`;
    try { out.push({ name, success: true, uuid: (await cloneDomain(v, { source: s.source, target: name })).uuid }); } catch (e) {
      out.push({ name, success: false, error: (e as Error).message });
    }
  }
  return { source: s.source, total: out.length, successful: out.filter((r) => r.success).length, failed: out.filter((r) => !r.success).length, clones: out };
}
