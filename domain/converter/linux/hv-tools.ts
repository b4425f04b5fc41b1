// Step 1 (virt-v2v's unconfigure_vmware and its siblings): the source hypervisor's guest tools are removed with
// the guest's own package tool, and whatever enablement links remain are removed too.
import type { LinuxFix } from './context';
import { runEnv, WANTS } from './context';
import { HV_TOOL_PACKAGES, HV_TOOL_UNITS, PURGE, withEnv } from './tools';

/** Removes the source hypervisor's tools (packages, then leftover unit links). */
export async function removeHvTools(x: LinuxFix): Promise<void> {
  const { g, info, o, act } = x;
  const st = o.dry_run ? 'would_do' : 'done';
  let did = 0;
  const pkgs = info.hypervisor_tools.filter((p) => HV_TOOL_PACKAGES.includes(p));
  if (pkgs.length) {
    const tool = PURGE[info.package_format || ''];
    const bin = tool && await g.firstFile(tool.bin);
    if (!tool || !bin) act({ action: 'remove_source_hv_tools', status: 'warning', detail: `packages ${pkgs.join(', ')} are installed but ${tool ? `${tool.bin[0]} is not in the guest` : `the package format "${info.package_format || 'unknown'}" has no removal tool here`}; services disabled only` });
    else if (o.dry_run) act({ action: 'remove_source_hv_tools', status: 'would_do', detail: `would run ${tool.cmd} ${pkgs.join(' ')}` });
    else {
      try { x.purged = pkgs; await g.cmd('command', withEnv([tool.cmd, ...pkgs], await runEnv(x, tool.env))); x.r.modified = true; did++; act({ action: 'remove_source_hv_tools', status: 'done', detail: `ran ${tool.cmd} ${pkgs.join(' ')}` }); }
      catch (e) { act({ action: 'remove_source_hv_tools', status: 'warning', detail: `${tool.cmd} failed: ${(e as Error).message}` }); }
    }
  }
  // Whatever the package tool left (or a tools install without a package): the units' enablement links.
  for (const unit of HV_TOOL_UNITS) {
    for (const dir of WANTS) {
      const p = `${dir}/${unit}`;
      if ((await g.tryCmd('is-symlink', p))?.trim() !== 'true') continue;
      if (!o.dry_run) { await g.cmd('rm', p); x.r.modified = true; }
      did++;
      act({ action: 'remove_source_hv_tools', status: st, detail: `disabled ${unit} (removed ${p})` });
    }
  }
  if (!did && !pkgs.length) act({ action: 'remove_source_hv_tools', status: 'skipped', detail: 'no source hypervisor tools found' });
}
