// The last step: the guest is read back after everything that could undo a repair. What the report calls done
// is what the guest holds; a repair that did not hold is `failed` and fails the fix stage.
import type { LinuxFix } from './context';
import { blsFiles, CRYPTTAB, filesIn, RESUME_FILES, WANTS } from './context';
import { rewriteFstab } from '../fstab';
import { crypttabLeftovers, dracutDeviceLeftovers, grubDefaultsLeftovers, kernelArgLeftovers, resumeLeftovers } from '../bootchain';
import { namesInterface } from '../nic-names';
import { HV_TOOL_UNITS, installedHvPackages } from './tools';
import { fallbackLeftovers } from '../firmware';
import { verifyInitrds } from './initrd-verify';
import { verifyRebuildUnit } from './initrd-firstboot';
import { HV_PURGE, purgeUnitProblems } from './hv-tools';

/** Reads the guest back after the last step that could undo a repair; a repair that did not hold is `failed`. */
export async function verifyLinux(x: LinuxFix): Promise<void> {
  const { g, info, o, ctx, act } = x;
  const check = (what: string, bad: string[], ok: string) => act(bad.length
    ? { action: 'verify', status: 'failed', detail: `${what}: ${bad.join('; ')}`, check: what }
    : { action: 'verify', status: 'done', detail: `${what}: ${ok}`, check: what });
  const read = async (f: string) => ((await g.isFile(f)) ? g.read(f) : undefined);

  if (x.mode !== 'noop') {
    const fstab = await read('/etc/fstab');
    if (fstab !== undefined) {
      check('/etc/fstab', rewriteFstab(fstab, x.mode, ctx).changes.map((c) => `line ${c.line} still names ${c.from}`),
        'no entry names a device that changes on the new bus');
    }
    const crypttab = await read(CRYPTTAB);
    if (crypttab !== undefined) check(CRYPTTAB, crypttabLeftovers(crypttab).map((d) => `still names ${d}`), 'every encrypted device is named stably');
    for (const f of RESUME_FILES) { const t = await read(f); if (t !== undefined && /RESUME=/.test(t)) check(f, resumeLeftovers(t).map((d) => `RESUME still names ${d}`), 'the resume device is named stably'); }
    for (const f of await filesIn(g, '/etc/dracut.conf.d', '.conf')) { const t = await read(f); if (t !== undefined && /add_device|kernel_cmdline/.test(t)) check(f, dracutDeviceLeftovers(t).map((d) => `still names ${d}`), 'names devices stably'); }
  }
  for (const a of x.r.actions.filter((y) => y.action === 'disk_pins' && y.status === 'done' && y.removed)) {
    check(String(a.file), (await g.exists(String(a.file))) ? ['is back'] : [], 'is gone');
  }
  for (const a of x.r.actions.filter((y) => y.action === 'cloud_init' && y.status === 'done')) {
    const t = await read(String(a.file));
    check(String(a.file), t && /^network: \{config: disabled\}$/m.test(t) ? [] : ['is missing or does not disable the network configuration'], 'cloud-init renders no network');
  }
  if (o.update_grub) {
    const defaults = await read('/etc/default/grub');
    if (defaults !== undefined) check('/etc/default/grub', grubDefaultsLeftovers(defaults), 'nothing makes grub-mkconfig write kernel device names');
    for (const f of [info.grub_config, ...(await blsFiles(g))].filter((f): f is string => !!f)) {
      const t = await read(f);
      if (t !== undefined) check(f, kernelArgLeftovers(t).map((a) => `still has ${a}`), 'every root=/resume= names a stable device');
    }
  }
  if (o.regen_initramfs) await verifyInitrds(x, check);
  await verifyRebuildUnit(x, check);
  for (const a of x.r.actions.filter((y) => y.action === 'uefi_fallback' && y.status === 'done')) {
    const fallback = (a.files as string[])[0];
    check(fallback, await fallbackLeftovers(g, fallback, String(a.from)), `is ${String(a.from)}: a fresh NVRAM boots it`);
  }
  for (const a of x.r.actions.filter((y) => y.action === 'nic_names' && y.status === 'done')) {
    const t = await read(String(a.file));
    if (typeof a.name === 'string' && a.name) {
      check(String(a.file), t && t.includes(`Name=${a.name}`) ? [] : ['is missing or does not set the name'], `names the NIC ${a.name}`);
      continue;
    }
    const renamed = Object.entries(a.renamed as Record<string, string>);
    check(String(a.file), t === undefined ? ['is missing'] : renamed.flatMap(([from, to]) => [
      ...(namesInterface(t, from) ? [`still names ${from}`] : []),
      ...(namesInterface(t, to) ? [] : [`does not name ${to}`]),
    ]),
      renamed.length ? `names ${renamed.map(([, to]) => to).join(', ')}, not ${renamed.map(([from]) => from).join(', ')}` : 'is in place');
  }
  if (o.remove_source_hv_tools) {
    const installed = x.purged?.length ? await installedHvPackages(g, info.root_device) : [];
    const left = (x.purged || []).filter((p) => installed.includes(p));
    const links: string[] = [];
    for (const unit of HV_TOOL_UNITS) {
      for (const dir of WANTS) if ((await g.tryCmd('is-symlink', `${dir}/${unit}`))?.trim() === 'true') links.push(`${dir}/${unit}`);
    }
    const atBoot = await purgeUnitProblems(x);
    check('source hypervisor tools', [...left.map((p) => `package ${p} is still installed`), ...links.map((l) => `${l} still enables it`), ...atBoot],
      x.purgeAtBoot?.length
        ? `no unit enabled; ${x.purgeAtBoot.join(', ')} removed at the first boot by ${HV_PURGE.name}, in place and enabled`
        : 'no package installed, no unit enabled');
  }
}
