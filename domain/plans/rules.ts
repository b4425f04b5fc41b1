// The preflight rules (docs/plans.md lists each with its reason): pure functions of the source VM's facts, the
// target's facts and the plan, so they are checked the same on validate and on start. Rule names follow
// Forklift's where one exists, so operators who know those read these.
import { confusableName, NAME_PATTERN } from '../libvirt/names';
import { bridgeAllowed } from '../libvirt/networks';
import { poolShortfall, type SpaceDisk } from '../libvirt/space';
import { osHint } from '../vsphere/export';
import type { VmFacts } from './facts';
import type { TargetFacts } from './target';

export interface Finding {
  rule: string; severity: 'blocker' | 'warning' | 'info'; message: string; fix: string;
  /** guest_inspected only: what the guest-level preflight read, for programs (guest-rules.ts) */
  guest?: Record<string, unknown>;
}
export interface RuleContext {
  network_map: Record<string, string>; storage_map: Record<string, string>; power_off: string;
  /** bytes the plan's earlier VMs will take in each pool, so that together they are checked against free space */
  poolUse: Map<string, number>;
  /** the target domain name (options.target_name); default the VM's name */
  domain?: string;
  /** options.warm is set for this VM (docs/plans.md, Warm migration) */
  warm?: boolean;
  /** options.warm.enable_cbt (default true): Ferry turns changed-block tracking on where it is off */
  enable_cbt?: boolean;
}

const B = 'blocker', W = 'warning', I = 'info';
/** The snapshots' names as a finding says them (the first 10, then how many more). */
const snapNames = (x: VmFacts) => x.snapshot_names.slice(0, 10).map((n) => `"${n}"`).join(', ') + (
  x.snapshot_names.length > 10 ? ` and ${x.snapshot_names.length - 10} more` : '');
const f = (rule: string, severity: Finding['severity'], message: string, fix: string): Finding => ({ rule, severity, message, fix });

function deviceRules(x: VmFacts, c: RuleContext): Finding[] {
  const out: Finding[] = [];
  const has = (re: RegExp) => x.devices.filter((d) => re.test(d));
  // A warm VM's snapshots are a blocker of their own (warmRules).
  if (x.snapshots &&
    !c.warm) out.push(
    f('snapshot', W, `${x.name} has ${x.snapshots} snapshot(s) (${snapNames(x)}): the current state is copied, the snapshot tree is not carried over`,
    'delete or consolidate the snapshots before the migration to keep the copy short'));
  for (const d of x.disks) {
    if (/RawDiskMapping/.test(d.backing)) out.push(f('rdm_disk', B, `${d.label} is a raw device mapping (${d.file}): its LUN is not a file Ferry can copy`,
      'migrate the LUN\'s data by storage means, or convert the RDM to a virtual disk (Storage vMotion)'));
    if (/^independent/.test(d.mode)) out.push(f('disk_mode', W, `${d.label} is ${d.mode}: it is copied as it is now, outside any snapshot`,
      'switch it to persistent if its contents must be consistent with the other disks'));
    if (d.sharing === 'sharingMultiWriter') out.push(f('shared_disk', B,
      `${d.label} is shared (multi-writer) with other VMs: copying it while another writer runs gives an inconsistent disk`,
      'stop every VM that shares it, or migrate the cluster\'s shared storage separately'));
  }
  for (const d of has(/PCIPassthrough/)) out.push(f('passthrough_device', B, `a ${d} device is passed through from the ESXi host`,
    'remove the passthrough device, and give the target VM the equivalent device by hand'));
  for (const d of has(/Sriov/)) out.push(f('sriov_device', B, `a ${d} (SR-IOV) NIC has no virtio equivalent Ferry can map`,
    'replace it with a VMXNET3 NIC on vSphere, or add an SR-IOV interface on the target by hand'));
  const usb = has(/VirtualUSB$|VirtualUSBController|VirtualUSBXHCIController/);
  if (usb.length) out.push(f('usb_controller', W, `USB (${[...new Set(usb)].join(', ')}): USB devices are not carried over`,
    'attach the USB device to the target host and pass it to the domain after the migration'));
  if (has(/VirtualTPM/).length) out.push(
    f('tpm_enabled', B, 'a virtual TPM: its keys (BitLocker, LUKS bound to the TPM) stay behind and the guest may not unlock its disks',
    'suspend disk encryption bound to the TPM before the migration'));
  return out;
}

function configRules(x: VmFacts, t: TargetFacts, c: RuleContext): Finding[] {
  const out: Finding[] = [];
  if (x.encrypted) out.push(f('encrypted_vm', B, 'the VM is encrypted by vSphere: its disks read as ciphertext', 'decrypt the VM on vSphere first'));
  if (x.cpu_hot_add || x.memory_hot_add) out.push(f('cpu_memory_hotplug', W,
    `${[x.cpu_hot_add && 'CPU', x.memory_hot_add && 'memory'].filter(Boolean).join(' and ')} hot-plug is on; the target domain gets fixed vCPUs and memory`,
    'none needed; add hot-plug on the target by hand if the guest relies on it'));
  if (x.fault_tolerance) out.push(f('fault_tolerance', B, 'fault tolerance is on: its secondary VM would keep running',
    'turn fault tolerance off for this VM'));
  const os = osHint(x.guest_id);
  if (os === 'unknown') out.push(f('vm_os', B, `guestId "${x.guest_id || '(none)'}" is not an OS Ferry can repair for KVM (Linux or Windows)`,
    'set the VM\'s guest OS on vSphere if it is wrong, or migrate it by another means'));
  if (x.power_state === 'poweredOn' && c.power_off === 'none') out.push(
    f('vm_running', B, 'the VM is running and the plan\'s power_off is none: the export would refuse it',
    'set options.power_off to shutdown or force (for the plan or this VM), or power the VM off'));
  if (/efi/i.test(x.firmware) && t.reachable && !t.uefi) out.push(f('firmware', B, `the VM boots with UEFI and ${t.uri} offers no OVMF loader`,
    'install OVMF (Debian: ovmf) on the target host'));
  else if (/efi/i.test(x.firmware) && x.secure_boot) out.push(f('secure_boot', W, 'the VM uses Secure Boot; the imported domain boots UEFI without it',
    'enable Secure Boot on the domain after the migration if the guest needs it'));
  return out;
}

function mapRules(x: VmFacts, t: TargetFacts, c: RuleContext): Finding[] {
  const out: Finding[] = [];
  for (const n of x.nics) {
    const target = c.network_map[n.network];
    if (target === undefined) out.push(f('network_unmapped', B, `${n.label} is on "${n.network}", which network_map does not map`,
      `add "${n.network}" to network_map`));
    else if (t.reachable && !t.networks.has(target) && !bridgeAllowed(target)) out.push(
      f('network_missing', B,
      `network_map sends "${n.network}" to "${target}", which ${t.uri} has no network of (nor is it a host bridge listed in FERRY_LIBVIRT_BRIDGES)`,
      `create network "${target}" on the target, list the bridge in FERRY_LIBVIRT_BRIDGES, or change network_map`));
    const owner = t.macs.get(n.mac);
    if (owner) out.push(f('duplicate_mac', B, `${n.label}'s MAC ${n.mac} is already used by domain ${owner} on ${t.uri}`,
      `remove or re-address ${owner}, or change the VM's MAC`));
  }
  const need = new Map<string, SpaceDisk[]>();
  for (const d of x.disks) {
    const pool = c.storage_map[d.datastore];
    if (pool === undefined) { out.push(f('datastore_unmapped', B, `${d.label} is on datastore "${d.datastore}", which storage_map does not map`,
      `add "${d.datastore}" to storage_map`)); continue; }
    need.set(pool, [...(need.get(pool) ?? []), d]);
  }
  for (const [pool, disks] of need) {
    const p = t.pools.get(pool);
    if (!t.reachable) continue;
    if (!p) { out.push(f('pool_missing', B, `storage_map names pool "${pool}", which ${t.uri} does not have`,
      `create pool "${pool}" on the target or change storage_map`)); continue; }
    const earlier = c.poolUse.get(pool) ?? 0;
    c.poolUse.set(pool, earlier + disks.reduce((a, d) => a + d.capacity_bytes, 0));
    // The job's own check before any byte moves (one-pass.ts), on the same figures: what passes here starts.
    const short = poolShortfall(pool, disks, p.available, earlier);
    if (short) out.push(f('pool_space', B, short, `free space in "${pool}" or map the datastore to a larger pool`));
  }
  return out;
}

function nameRules(x: VmFacts, t: TargetFacts, name: string): Finding[] {
  if (!NAME_PATTERN.test(name)) return [f('name', B, `"${name}" is not a domain name libvirt accepts (letters, digits, "._+:-", at most 200)`,
    'rename the VM on vSphere, or give options.target_name (it replaces what libvirt refuses)')];
  const why = confusableName(name);
  if (why) return [f('name', B, `"${name}" ${why}: virsh could take it for another domain`,
    'rename the VM on vSphere, or give options.target_name with a letter in it')];
  if (t.domains.has(name)) return [f('name_exists', B, `${t.uri} already has a domain named ${name}`,
    'remove or rename that domain, or change options.target_name (or the VM\'s name on vSphere)')];
  return [];
}

/** A warm VM copies while it runs, by changed areas of flat disks: a running VM without snapshots, with CBT on (or
 *  Ferry allowed to turn it on). */
function warmRules(x: VmFacts, c: RuleContext): Finding[] {
  if (!c.warm) return [];
  const out: Finding[] = [];
  if (x.power_state !== 'poweredOn') out.push(f('warm_vm_off', B, `the VM is ${x.power_state}: a warm migration copies a running VM`,
    'migrate it cold (remove options.warm for this VM), or power it on'));
  if (x.snapshots) out.push(
    f('warm_snapshots', B,
    `${x.name} has ${x.snapshots} snapshot(s) Ferry did not make (${snapNames(x)}): the disks are delta chains, which warm rounds cannot copy by changed areas`,
    'delete or consolidate the snapshots (left behind by a backup tool, or by hand) before a warm migration'));
  if (!x.cbt &&
    c.enable_cbt === false) out.push(
    f('warm_cbt_off', B, `${x.name} has changed-block tracking off (changeTrackingEnabled false) and options.warm.enable_cbt is false: the job would refuse it`,
    'set options.warm.enable_cbt to true (Ferry turns CBT on, and off again if the job ends without cutover), or turn CBT on in vSphere'));
  else if (!x.cbt) out.push(
    f('warm_cbt_enable', I, `${x.name} has changed-block tracking off: Ferry will enable CBT (a VM reconfiguration, undone if the job ends without cutover)`,
    'none needed; set options.warm.enable_cbt to false to refuse such a VM instead'));
  return out;
}

/** Every finding of one VM. */
export function checkVm(x: VmFacts, t: TargetFacts, c: RuleContext): Finding[] {
  const out = [...deviceRules(x, c), ...configRules(x, t, c), ...warmRules(x, c), ...mapRules(x, t, c), ...nameRules(x, t, c.domain ?? x.name)];
  if (!t.reachable) out.push(f('target_unreachable', B, `the target host ${t.uri} does not answer: ${t.error ?? ''}`,
    'start libvirtd there or fix destination.virt_uri'));
  return out;
}

/** Two VMs of one plan with the same MAC (they would clash on the target network). */
export function planMacClashes(vms: VmFacts[]): Map<string, Finding[]> {
  const seen = new Map<string, string>();
  const out = new Map<string, Finding[]>();
  for (const x of vms) for (const n of x.nics) {
    const other = seen.get(n.mac);
    if (other && other !== x.vm_path) out.set(x.vm_path, [...(out.get(x.vm_path) ?? []),
      f('duplicate_mac', B, `${n.label}'s MAC ${n.mac} is also ${other}'s in this plan`, 'give one of them another MAC')]);
    else seen.set(n.mac, x.vm_path);
  }
  return out;
}
