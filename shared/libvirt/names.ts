// What a name, MAC address or size may look like before it reaches libvirt. The joi schemas of the /virt API
// (shared/schemas/virt.ts) and the library's own entry points use these same rules.
import { randomBytes } from 'node:crypto';
import Joi from 'joi';
import { fieldError } from '../errors';

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

/** A locally administered MAC in QEMU/KVM's 52:54:00 prefix. */
export function randomMac(): string {
  return `52:54:00:${[...randomBytes(3)].map((x) => x.toString(16).padStart(2, '0')).join(':')}`;
}
