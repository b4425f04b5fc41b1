// Target domain names (options.target_name, docs/plans.md): prefix + template + suffix, lowercased when asked,
// and every character libvirt refuses in a name replaced by "-" (a leading "-" or "." dropped, at most 200). The
// preflight rules then check the result: `name` (still not a libvirt name, e.g. empty), `name_exists` (a
// domain of that name on the VM's target host) and `name_collision` (two VMs of the plan get the same name).
import type { Finding } from './rules';

export interface TargetNameRule { template?: string; prefix?: string; suffix?: string; lowercase?: boolean }

/** /DC0/vm/web/prod/web1 -> {datacenter: DC0, folder: web/prod}. */
function where(vmPath: string) {
  const [dc, ...rest] = vmPath.replace(/^\/+/, '').split('/vm/');
  const parts = rest.join('/vm/').split('/');
  return { datacenter: dc, folder: parts.slice(0, -1).join('/') };
}

/** The domain name for a VM: without a rule its own name, as it is (the `name` rule flags one libvirt refuses). */
export function targetName(rule: TargetNameRule | undefined, vm: { name: string; vm_path: string }): string {
  if (!rule) return vm.name;
  const vals: Record<string, string> = { name: vm.name, ...where(vm.vm_path) };
  let s = (rule.prefix ?? '') + (rule.template ?? '{name}').replace(/\{(name|datacenter|folder)\}/g, (_, k: string) => vals[k]) + (rule.suffix ?? '');
  if (rule.lowercase) s = s.toLowerCase();
  return s.replace(/[^A-Za-z0-9._+:-]/g, '-').replace(/^[.-]+/, '').slice(0, 200);
}

/** VMs of one plan whose target names are the same: each gets a blocker naming the others. */
export function nameCollisions(names: Map<string, string>): Map<string, Finding[]> {
  const by = new Map<string, string[]>();
  for (const [vm, n] of names) by.set(n, [...(by.get(n) ?? []), vm]);
  const out = new Map<string, Finding[]>();
  for (const [n, vms] of by) {
    if (vms.length < 2) continue;
    for (const vm of vms) {
      out.set(vm, [{
        rule: 'name_collision', severity: 'blocker',
        message: `the target name "${n}" is also that of ${vms.filter((x) => x !== vm).join(', ')} in this plan`,
        fix: 'change options.target_name (for the plan or these VMs) so that each VM gets its own name',
      }]);
    }
  }
  return out;
}
