// What a name, MAC address or size may look like before it reaches libvirt. The joi schemas of the /virt API
// (domain/schemas/virt.ts) and the library's own entry points use these same rules.
import { randomBytes } from 'node:crypto';
import Joi from 'joi';
import { fieldError } from '../../platform/errors';

/** Domain, network, pool, volume, snapshot names: letters, digits, ".", "_", "-", "+", ":"; no "/" and no
 *  leading "-" (it would read as an option), at most 200 characters. */
export const NAME_PATTERN = /^[A-Za-z0-9_][A-Za-z0-9._+:-]{0,199}$/;
export const MAC_PATTERN = /^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$/;

export const virtName = Joi.string().pattern(NAME_PATTERN)
  .messages({ 'string.pattern.base': '{{#label}} must be 1-200 characters of letters, digits, ".", "_", "+", ":" or "-", not starting with "-" or "."' });
export const macAddress = Joi.string().pattern(MAC_PATTERN).lowercase()
  .messages({ 'string.pattern.base': '{{#label}} must be a MAC address such as 52:54:00:12:34:56' });

export function checkName(value: string, field: string): string {
  if (typeof value !== 'string' || !NAME_PATTERN.test(value)) {
    throw fieldError(400, field, 'invalid name', `${field} "${String(value).slice(0, 64)}" is not a valid libvirt name`);
  }
  return value;
}

/** Why virsh would not read `name` as a name: it resolves a domain argument as an ID, then a UUID, then a name, so
 *  a domain named "1" or like a UUID (32 hex digits, "-" anywhere) can be mistaken for another domain. null when
 *  it is read as a name only. */
export function confusableName(name: string): string | null {
  if (/^[0-9]+$/.test(name)) return 'is all digits, which virsh reads as a domain ID';
  if (/^[0-9A-Fa-f]{32}$/.test(name.replace(/-/g, ''))) return 'is shaped like a UUID, which virsh reads as a domain UUID';
  return null;
}

const CONFUSABLE = '{{#label}} "{{#value}}" {{#why}}: choose a name with a letter (e.g. "vm-{{#value}}")';

/** A new domain's name (imports, a plan's target): a libvirt name that virsh can only read as a name. */
export const domainName = virtName.custom((v: string, h) => {
  const why = confusableName(v);
  return why ? h.error('string.confusable', { why }) : v;
}).messages({ 'string.confusable': CONFUSABLE });

/** checkName for a domain Ferry creates: also refused when virsh could read it as an ID or a UUID. */
export function checkDomainName(value: string, field: string): string {
  checkName(value, field);
  const why = confusableName(value);
  if (why) throw fieldError(400, field, `${why}: choose a name with a letter`,
    `${field} "${value.slice(0, 64)}" ${why}: choose a name with a letter (e.g. "vm-${value.slice(0, 64)}")`);
  return value;
}

/** A locally administered MAC in QEMU/KVM's 52:54:00 prefix. */
export function randomMac(): string {
  return `52:54:00:${[...randomBytes(3)].map((x) => x.toString(16).padStart(2, '0')).join(':')}`;
}
