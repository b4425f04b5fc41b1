// What a caller may ask of a plan beyond the plan routes' own roles (docs/plans.md, "What each role may do through
// a plan"): a plan acts for whoever creates, validates, starts or retries it, so each of those requests is checked
// as the direct request doing the same would be. The jobs a plan submits carry their starter as caller and are
// checked again by Lifecycle.submit (checkCaller), like every submission.
import { grantsRole, type Caller, type KeyRole } from '../../platform/auth';
import { fieldError } from '../../platform/errors';
import { checkInsecure } from '../vsphere/job-credentials';

/** Plan options that delete or power off a source, with the role the same direct action needs (the /vms power-off
 *  routes are admin; deleting a VM is more than powering it off). Listed in docs/security.md's role table. */
export const PLAN_OPTION_ROLES: Record<string, { role: KeyRole; why: string }> = {
  'options.remove_source': { role: 'admin', why: 'it deletes the source VM on vSphere, and powering a source off directly (/vms/poweroff) is admin' },
};

/** What of a plan (or a create or update body) the rules read. */
interface PlanAsked {
  source?: { manager_url?: string; insecure?: boolean };
  options?: Record<string, unknown>;
  vms?: (string | { vm_path: string; options?: Record<string, unknown> })[];
}

/** 403 naming the field when `caller` may not ask what the plan asks: `source.insecure` (TLS checks off for a
 *  manager not configured as insecure), and each option of PLAN_OPTION_ROLES, in the plan's options or one VM's. */
export function checkPlanCaller(p: PlanAsked, caller: Caller | null | undefined) {
  checkInsecure(caller, p.source?.manager_url, p.source?.insecure, 'source.insecure');
  if (!caller) return; // authentication off: every caller has every right
  for (const [field, rule] of Object.entries(PLAN_OPTION_ROLES)) {
    if (grantsRole(caller.role, rule.role)) continue;
    const option = field.slice('options.'.length);
    const refuse = (f: string) => {
      throw fieldError(403, f, `needs role ${rule.role}: ${rule.why}`,
        `${f} needs role ${rule.role} (${rule.why}); the key "${caller.name}" has role ${caller.role}`);
    };
    if (p.options?.[option] === true) refuse(field);
    (p.vms ?? []).forEach((v, i) => { if (typeof v === 'object' && v.options?.[option] === true) refuse(`vms[${i}].${field}`); });
  }
}
