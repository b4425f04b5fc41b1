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

type Check = (what: string, bad: string[], ok: string) => void;
type Read = (f: string) => Promise<string | undefined>;

/** Reads the guest back after the last step that could undo a repair; a repair that did not hold is `failed`. */
export async function verifyLinux(x: LinuxFix): Promise<void> {
  const { g, o, act } = x;
  const check = (what: string, bad: string[], ok: string) => act(bad.length
    ? { action: 'verify', status: 'failed', detail: `${what}: ${bad.join('; ')}`, check: what }
    : { action: 'verify', status: 'done', detail: `${what}: ${ok}`, check: what });
  const read = async (f: string) => ((await g.isFile(f)) ? g.read(f) : undefined);

  if (x.mode !== 'noop') await verifyDeviceNames(x, check, read);
  await verifyPinsAndCloudInit(x, check, read);
  if (o.update_grub) await verifyGrub(x, check, read);
  if (o.regen_initramfs) await verifyInitrds(x, check);
  await verifyRebuildUnit(x, check);
  await verifyUefiFallbacks(x, check);
  await verifyNicNames(x, check, read);
  if (o.remove_source_hv_tools) await verifyHvToolsGone(x, check);
}

/** Checks that fstab, crypttab, the resume files and dracut's device options no longer name a device that changes on the new bus. */
async function verifyDeviceNames(x: LinuxFix, check: Check, read: Read): Promise<void> {
  const { g, ctx } = x;
  const fstab = await read('/etc/fstab');
  if (fstab !== undefined) {
    check('/etc/fstab', rewriteFstab(fstab, x.mode, ctx).changes.map((c) => `line ${c.line} still names ${c.from}`),
      'no entry names a device that changes on the new bus');
  }
  const crypttab = await read(CRYPTTAB);
  if (crypttab !== undefined) check(CRYPTTAB, crypttabLeftovers(crypttab).map((d) => `still names ${d}`), 'every encrypted device is named stably');
  for (const f of RESUME_FILES) {
    const t = await read(f);
    if (t !== undefined && /RESUME=/.test(t)) check(f, resumeLeftovers(t).map((d) => `RESUME still names ${d}`), 'the resume device is named stably');
  }
  for (const f of await filesIn(g, '/etc/dracut.conf.d', '.conf')) {
    const t = await read(f);
    if (t !== undefined && /add_device|kernel_cmdline/.test(t)) check(f, dracutDeviceLeftovers(t).map((d) => `still names ${d}`), 'names devices stably');
  }
}

/** Checks that removed disk pins stayed gone and that the cloud-init files written still disable its network configuration. */
async function verifyPinsAndCloudInit(x: LinuxFix, check: Check, read: Read): Promise<void> {
  for (const a of x.r.actions.filter((y) => y.action === 'disk_pins' && y.status === 'done' && y.removed)) {
    check(String(a.file), (await x.g.exists(String(a.file))) ? ['is back'] : [], 'is gone');
  }
  for (const a of x.r.actions.filter((y) => y.action === 'cloud_init' && y.status === 'done')) {
    const t = await read(String(a.file));
    check(String(a.file), t && /^network: \{config: disabled\}$/m.test(t) ? [] : ['is missing or does not disable the network configuration'],
      'cloud-init renders no network');
  }
}

/** Checks that grub's defaults, its configuration and the BLS entries name only stable root and resume devices. */
async function verifyGrub(x: LinuxFix, check: Check, read: Read): Promise<void> {
  const defaults = await read('/etc/default/grub');
  if (defaults !== undefined) check('/etc/default/grub', grubDefaultsLeftovers(defaults), 'nothing makes grub-mkconfig write kernel device names');
  for (const f of [x.info.grub_config, ...(await blsFiles(x.g))].filter((f): f is string => !!f)) {
    const t = await read(f);
    if (t !== undefined) check(f, kernelArgLeftovers(t).map((a) => `still has ${a}`), 'every root=/resume= names a stable device');
  }
}

/** Checks that each UEFI fallback loader written is still the loader it was copied from. */
async function verifyUefiFallbacks(x: LinuxFix, check: Check): Promise<void> {
  for (const a of x.r.actions.filter((y) => y.action === 'uefi_fallback' && y.status === 'done')) {
    const fallback = (a.files as string[])[0];
    check(fallback, await fallbackLeftovers(x.g, fallback, String(a.from)), `is ${String(a.from)}: a fresh NVRAM boots it`);
  }
}

/** Checks that each NIC naming file written is in place and names the new interfaces, not the old ones. */
async function verifyNicNames(x: LinuxFix, check: Check, read: Read): Promise<void> {
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
}

/** Checks that no purged hypervisor-tools package is installed and no unit of theirs is enabled (or left to the first-boot purge). */
async function verifyHvToolsGone(x: LinuxFix, check: Check): Promise<void> {
  const { g, info } = x;
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
