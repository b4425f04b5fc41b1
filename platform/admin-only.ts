// Fields that lower a safeguard (VNC/SPICE passwords in an export, an untrusted manager certificate) are set by
// admin keys only. With authentication off every caller is trusted, as for the privileged execution mode.
import type { Caller } from './auth';
import { fieldError } from './errors';

/** 403 naming `field` unless `key` is an admin's (or auth is off). */
export function adminOnly(key: Caller | null | undefined, field: string, why: string): void {
  if (!key || key.role === 'admin') return;
  throw fieldError(403, field, `needs an admin key: ${why}`, `${field} needs an admin key (${why}); the key "${key.name}" has role ${key.role}`);
}
