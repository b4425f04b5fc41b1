// Step 4 (the network; virt-v2v leaves it to the guest): the NICs the guest's configuration names get their KVM
// names in every stack that names them (ifupdown, netplan with either renderer, NetworkManager keyfiles, RHEL
// ifcfg, systemd-networkd), a .link file per NIC, and cloud-init is kept from rendering the network again.
import type { LinuxFix } from './context';
import { filesIn, NET_DIRS, PERSISTENT_NET_RULES } from './context';
import { configuredInterfaces, LINK_DIR, persistentNetNames, planNicFileEdits, planNicRenames } from '../nic-names';
import type { NicRename } from '../nic-names';

/** Renames the configured NICs to their KVM names (nic-names.ts): the configuration files and the old MAC-to-name
 *  rules rewritten, RHEL's ifcfg-<name> files renamed, a .link file per NIC. Returns the .link files written. */
export async function renameNics(x: LinuxFix): Promise<string[]> {
  const { g, o, act } = x;
  if (o.configuration?.network !== undefined) {
    act({ action: 'nic_names', status: 'skipped', detail: 'configuration.network gives the network configuration' });
    return [];
  }
  const files: { path: string; text: string }[] = [];
  for (const f of ['/etc/network/interfaces', ...(await Promise.all(NET_DIRS.map((d) => filesIn(g, d)))).flat()]) {
    if (await g.isFile(f)) files.push({ path: f, text: await g.read(f) });
  }
  const names = configuredInterfaces(files);
  if (!names.length) {
    act({ action: 'nic_names', status: 'skipped', detail: 'the guest\'s network configuration names no NIC (DHCP on any, or no configuration)' });
    return [];
  }
  await holdCloudInit(x);
  const rules = (await g.isFile(PERSISTENT_NET_RULES)) ? await g.read(PERSISTENT_NET_RULES) : undefined;
  const plan = planNicRenames(names, rules ? persistentNetNames(rules) : [], (o.nic_macs || []).filter(Boolean));
  if (plan.problem) { act({ action: 'nic_names', status: 'warning', detail: plan.problem }); return []; }
  const st = o.dry_run ? 'would_do' : 'done';
  const map = new Map(plan.renames.filter((r) => r.from !== r.to).map((r) => [r.from, r.to]));
  const written = await writeNicFileEdits(x, files, rules, map, st);
  await writeLinkFiles(x, plan.renames, st, written);
  return written;
}

/** Carries the renames through the configuration files and the old rules; returns the ones udev reads (.link, rules). */
async function writeNicFileEdits(
  x: LinuxFix, files: { path: string; text: string }[], rules: string | undefined, map: Map<string, string>, st: 'would_do' | 'done',
): Promise<string[]> {
  const { g, o, act } = x;
  const summary = [...map].map(([f, t]) => `${f} -> ${t}`).join(', ');
  const written: string[] = [];
  // The configuration, and the old rules (they would give the NIC its old name back after the .link file).
  for (const e of planNicFileEdits([...files, ...(rules !== undefined ? [{ path: PERSISTENT_NET_RULES, text: rules }] : [])], map)) {
    const backup = await x.backup(e.path);
    await x.write(e.path, e.text);
    if (e.dest !== e.path && !o.dry_run) await g.cmd('mv', e.path, e.dest);
    x.r.modified ||= !o.dry_run;
    // udev in the initramfs names the NIC first, from the .link files and rules it carries, and a NIC it named
    // keeps that name: the guest's own .link files and the old rules count as baked in, as Ferry's do.
    if (e.dest.endsWith('.link') || e.dest === PERSISTENT_NET_RULES) written.push(e.dest);
    const moved = e.dest !== e.path ? ` (renamed to ${e.dest})` : '';
    act({ action: 'nic_names', status: st, detail: `${e.path}: ${summary}${moved}`, file: e.dest, renamed: e.renamed, backup });
  }
  return written;
}

/** Writes the .link file of each rename that the guest does not have yet, adding its path to `written`. */
async function writeLinkFiles(x: LinuxFix, renames: NicRename[], st: 'would_do' | 'done', written: string[]): Promise<void> {
  const { g, o, act } = x;
  for (const r of renames) {
    const { path: p, text } = r.link;
    if ((await g.isFile(p)) && (await g.read(p)) === text) continue;
    if (!o.dry_run) { await g.cmd('mkdir-p', LINK_DIR); await x.write(p, text); await g.cmd('chmod', '0644', p); x.r.modified = true; }
    written.push(p);
    act({
      action: 'nic_names',
      status: st,
      detail: `${p}: the NIC ${'mac' in r.match ? `with MAC ${r.match.mac}` : 'of the virtio driver'} is named ${r.to} (it was ${r.from})`,
      file: p,
      name: r.to,
    });
  }
}

export const CLOUD_INIT_HOLD = '/etc/cloud/cloud.cfg.d/99-ferry-network.cfg';
const CLOUD_NET_DISABLED = /^network:\s*(?:\{\s*config:\s*disabled\s*\}|\n\s+config:\s*disabled)/m;

/** cloud-init renders the network at every boot from its datasource (netplan's 50-cloud-init.yaml, ifcfg or
 *  keyfiles): on KVM VMware's datasource is gone, and it would write the old NIC's name, or DHCP on the first NIC,
 *  over the renamed static configuration. Its network rendering is disabled; the files it rendered last (now
 *  renamed) stay the guest's configuration. Nothing to do when cloud-init is absent or already disabled. */
export async function holdCloudInit(x: LinuxFix): Promise<void> {
  const { g, o, act } = x;
  if (!(await g.isFile('/etc/cloud/cloud.cfg'))) return;
  for (const f of ['/etc/cloud/cloud.cfg', ...(await filesIn(g, '/etc/cloud/cloud.cfg.d', '.cfg'))]) {
    if (CLOUD_NET_DISABLED.test(await g.read(f))) {
      act({ action: 'cloud_init', status: 'skipped', detail: `${f} already disables cloud-init's network configuration` });
      return;
    }
  }
  if (!o.dry_run) await g.cmd('mkdir-p', '/etc/cloud/cloud.cfg.d');
  await x.write(
    CLOUD_INIT_HOLD,
    '# Written by Ferry: cloud-init would render the network again at boot from a datasource that stayed on\n'
      + '# VMware, undoing the renamed configuration. The files it rendered last are the configuration now.\n'
      + 'network: {config: disabled}\n',
  );
  act({
    action: 'cloud_init',
    status: o.dry_run ? 'would_do' : 'done',
    detail: `${CLOUD_INIT_HOLD}: cloud-init's network configuration disabled (it would rewrite the renamed configuration at boot)`,
    file: CLOUD_INIT_HOLD,
  });
}
