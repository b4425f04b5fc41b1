// Step 1 (virt-v2v's unconfigure_vmware and its siblings): the source hypervisor's guest tools are removed with
// the guest's own package tool, and whatever enablement links remain are removed too. On a systemd guest the
// package tool runs at the first boot on KVM (a first-boot unit, firstboot-unit.ts), natively in a second or two,
// not in the appliance under TCG where one `dpkg --purge` took 5-7 s (issue 34 item 4); its units are disabled
// now, so the tools never start on KVM. Elsewhere it runs in the appliance, as virt-v2v does.
import type { LinuxFix } from './context';
import { runEnv, WANTS } from './context';
import { HV_TOOL_PACKAGES, HV_TOOL_UNITS, PURGE, withEnv } from './tools';
import { firstBootScript, runsSystemd, unitProblems, writeFirstBootUnit, type FirstBootUnit } from './firstboot-unit';
import { REBUILD } from './initrd-firstboot';

/** The first-boot unit that removes the tools; before the initramfs rebuild, so that unit's "done" means both are. */
export const HV_PURGE: FirstBootUnit = {
  name: 'ferry-hv-tools-purge.service', script: '/usr/local/sbin/ferry-hv-tools-purge',
  description: 'remove the source hypervisor\'s tools with the guest\'s package tool (once, after the migration)', before: [REBUILD.name],
};
export const HV_PURGE_DONE = 'ferry-hv-tools-purge: done';

/** The script: the package tool's command line, then the unit's removal. */
export function purgeScript(cmdline: string, pkgs: string[]): string {
  return firstBootScript(HV_PURGE, {
    header: `Written by Ferry at the migration to KVM: removes the source hypervisor's tools (${pkgs.join(', ')}) with the
guest's own package tool, then removes itself and ${HV_PURGE.name}. Their units were disabled at the
migration. If the package tool fails, nothing is removed and this runs again at the next boot.`,
    body: `${cmdline} || failed=1`,
    failed: `ferry-hv-tools-purge: ${cmdline} failed; tried again at the next boot`,
    done: HV_PURGE_DONE, what: `${pkgs.join(' ')} removed; the unit removed itself`,
  });
}

/** The packages removed now (in the appliance) or at the first boot (the unit written), with the report's line. */
async function purgePackages(x: LinuxFix, tool: { cmd: string; env?: string[] }, pkgs: string[]): Promise<void> {
  const { g, act } = x;
  const cmdline = withEnv([tool.cmd, ...pkgs], await runEnv(x, tool.env));
  if (await runsSystemd(g)) {
    const files = await writeFirstBootUnit(x, HV_PURGE, purgeScript(cmdline, pkgs));
    x.purgeAtBoot = pkgs;
    act({
      action: 'remove_source_hv_tools',
      status: 'done',
      detail: `${tool.cmd} ${pkgs.join(' ')} runs at the first boot on KVM (${HV_PURGE.name}, which then removes itself); the units are disabled now`,
      deferred_to_first_boot: true,
      files,
    });
    return;
  }
  x.purged = pkgs;
  await g.cmd('command', cmdline);
  x.r.modified = true;
  act({ action: 'remove_source_hv_tools', status: 'done', detail: `ran ${tool.cmd} ${pkgs.join(' ')}` });
}

/** verify.ts's part for a removal left to the first boot: the unit in place and enabled. */
export const purgeUnitProblems = (x: LinuxFix) => (x.purgeAtBoot?.length ? unitProblems(x.g, HV_PURGE) : Promise.resolve([]));

/** Removes the source hypervisor's tools (packages, then leftover unit links). */
export async function removeHvTools(x: LinuxFix): Promise<void> {
  const { g, info, o, act } = x;
  const st = o.dry_run ? 'would_do' : 'done';
  let did = 0;
  const pkgs = info.hypervisor_tools.filter((p) => HV_TOOL_PACKAGES.includes(p));
  if (pkgs.length) {
    const tool = PURGE[info.package_format || ''];
    const bin = tool && await g.firstFile(tool.bin);
    if (!tool || !bin) {
      const missing = tool ? `${tool.bin[0]} is not in the guest` : `the package format "${info.package_format || 'unknown'}" has no removal tool here`;
      act({ action: 'remove_source_hv_tools', status: 'warning', detail: `packages ${pkgs.join(', ')} are installed but ${missing}; services disabled only` });
    } else if (o.dry_run) act({ action: 'remove_source_hv_tools', status: 'would_do', detail: `would run ${tool.cmd} ${pkgs.join(' ')}` });
    else {
      try { await purgePackages(x, tool, pkgs); did++; }
      catch (e) { act({ action: 'remove_source_hv_tools', status: 'warning', detail: `${tool.cmd} failed: ${(e as Error).message}` }); }
    }
  }
  // Whatever the package tool left (or a tools install without a package): the units' enablement links.
  for (const dir of WANTS) {
    // One listing per folder, not a probe per unit and folder (each call costs a round trip under TCG).
    const here = new Set(g.lines(await g.tryCmd('ls', dir)));
    for (const unit of HV_TOOL_UNITS.filter((u) => here.has(u))) {
      const p = `${dir}/${unit}`;
      if ((await g.tryCmd('is-symlink', p))?.trim() !== 'true') continue;
      if (!o.dry_run) { await g.cmd('rm', p); x.r.modified = true; }
      did++;
      act({ action: 'remove_source_hv_tools', status: st, detail: `disabled ${unit} (removed ${p})` });
    }
  }
  if (!did && !pkgs.length) act({ action: 'remove_source_hv_tools', status: 'skipped', detail: 'no source hypervisor tools found' });
}
