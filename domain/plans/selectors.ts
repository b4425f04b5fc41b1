// VM selectors of a plan (docs/plans.md, "Choosing VMs"): inventory folder, a glob on the name, power state,
// resolved against the manager's inventory (one listVms call). A VM matching any selector is in the plan; within
// a selector every given field must match. The glob becomes a pattern of V8's linear-time engine
// (platform/linear-regex.ts), so no name pattern can stall the daemon.
import { linearRegExp } from '../../platform/linear-regex';
import { listVms } from '../vsphere/inventory';
import type { Manager } from '../vsphere/client';
import type { PlanSelector } from './types';

const escape = (c: string) => c.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');

/** `web-*` -> /^web-.*$/ (only * and ? are special). */
export const globRegExp = (glob: string) => linearRegExp(`^${[...glob].map((c) => (c === '*' ? '.*' : c === '?' ? '.' : escape(c))).join('')}$`);

export function matches(s: PlanSelector, vm: { path: string; name: string; power_state: string }): boolean {
  if (s.folder && !vm.path.startsWith(`${s.folder.replace(/\/+$/, '')}/`)) return false;
  if (s.name && !globRegExp(s.name).test(vm.name)) return false;
  return !s.power_state || s.power_state === vm.power_state;
}

/** Every VM (not template) some selector matches: path -> the selectors' indexes. */
export async function selectVms(m: Manager, selectors: PlanSelector[]): Promise<Map<string, number[]>> {
  const out = new Map<string, number[]>();
  for (const vm of await listVms(m)) {
    if (vm.template) continue;
    const which = selectors.map((s, i) => (matches(s, vm) ? i : -1)).filter((i) => i >= 0);
    if (which.length) out.set(vm.path, which);
  }
  return out;
}
