// The manifest's `configuration` block (Linux guests): hostname, services, users, network. The seed leaves the
// inner fields free-form; docs/pipeline.md documents the ones Ferry reads. A field it cannot use is a warning
// naming its path, never a silent skip.
import type { GuestSession } from './guestfs';
import type { FixAction, FixOptions } from './types';
import { applyUsers } from './users';
import { applyNetwork } from './network';

const UNIT = /^[A-Za-z0-9@._-]+\.(service|timer|socket)$/;

/** `v[key]` of a free-form block when it is an object (a string or number has no fields). */
const field = (v: unknown, key: string): unknown => (v && typeof v === 'object' ? (v as Record<string, unknown>)[key] : undefined);

/** Applies every part present; true when the guest was modified. `write` honours dry_run. */
export async function applyConfiguration(
  g: GuestSession, o: FixOptions, act: (a: FixAction) => void, write: (p: string, t: string) => Promise<void>,
): Promise<boolean> {
  const c = o.configuration;
  if (!c) return false;
  let modified = await applyHostname(g, c, o, act, write);
  if (await applyServices(g, c, o, act)) modified = true;

  const io = { dry_run: o.dry_run, backup: o.backup !== false };
  if (c.users !== undefined && (await applyUsers(g, c.users, io, act))) modified = true;
  if (c.network !== undefined && (await applyNetwork(g, c.network, io, act))) modified = true;
  return modified;
}

type Configuration = NonNullable<FixOptions['configuration']>;

/** Writes configuration.hostname to /etc/hostname and /etc/hosts (a bad name is a warning); true when the guest was modified. */
async function applyHostname(
  g: GuestSession, c: Configuration, o: FixOptions, act: (a: FixAction) => void, write: (p: string, t: string) => Promise<void>,
): Promise<boolean> {
  const st = o.dry_run ? 'would_do' : 'done';
  const name = field(c.hostname, 'name') ?? field(c.hostname, 'hostname');
  if (typeof name === 'string' && /^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$/.test(name)) {
    await write('/etc/hostname', `${name}\n`);
    const hosts = (await g.isFile('/etc/hosts')) ? await g.read('/etc/hosts') : '127.0.0.1\tlocalhost\n';
    const short = name.split('.')[0];
    const line = `127.0.1.1\t${name}${short !== name ? ` ${short}` : ''}`;
    const next = /^127\.0\.1\.1\s.*$/m.test(hosts) ? hosts.replace(/^127\.0\.1\.1\s.*$/m, line) : `${hosts.replace(/\n?$/, '\n')}${line}\n`;
    await write('/etc/hosts', next);
    act({ action: 'configuration.hostname', status: st, detail: `hostname ${name}` });
    return !o.dry_run;
  }
  if (c.hostname) act({ action: 'configuration.hostname', status: 'warning', detail: 'configuration.hostname.name: must be a host name' });
  return false;
}

/** Enables and disables the units of configuration.services (bad lists and names are warnings); true when the guest was modified. */
async function applyServices(g: GuestSession, c: Configuration, o: FixOptions, act: (a: FixAction) => void): Promise<boolean> {
  let modified = false;
  const enable = field(c.services, 'enable') ?? [];
  const disable = field(c.services, 'disable') ?? [];
  for (const [list, key] of [[enable, 'enable'], [disable, 'disable']] as const) {
    if (!Array.isArray(list)) {
      act({ action: 'configuration.services', status: 'warning', detail: `configuration.services.${key}: must be an array of unit names` });
      continue;
    }
    for (const unit of list as unknown[]) {
      if (typeof unit !== 'string' || !UNIT.test(unit)) {
        act({ action: 'configuration.services', status: 'warning', detail: `configuration.services.${key}: invalid unit name ${String(unit)}` });
        continue;
      }
      if (key === 'disable' ? await disableUnit(g, unit, o, act) : await enableUnit(g, unit, o, act)) modified = true;
    }
  }
  return modified;
}

/** Removes the unit's multi-user.target.wants link (skipped when it is not enabled); true when the guest was modified. */
async function disableUnit(g: GuestSession, unit: string, o: FixOptions, act: (a: FixAction) => void): Promise<boolean> {
  const link = `/etc/systemd/system/multi-user.target.wants/${unit}`;
  if ((await g.tryCmd('is-symlink', link))?.trim() !== 'true') {
    act({ action: 'configuration.services', status: 'skipped', detail: `${unit} is not enabled` });
    return false;
  }
  let modified = false;
  if (!o.dry_run) { await g.cmd('rm', link); modified = true; }
  act({ action: 'configuration.services', status: o.dry_run ? 'would_do' : 'done', detail: `disabled ${unit}` });
  return modified;
}

/** Links the installed unit into multi-user.target.wants (a warning when it is not installed); true when the guest was modified. */
async function enableUnit(g: GuestSession, unit: string, o: FixOptions, act: (a: FixAction) => void): Promise<boolean> {
  const link = `/etc/systemd/system/multi-user.target.wants/${unit}`;
  const found = await g.firstFile(['/usr/lib/systemd/system', '/lib/systemd/system', '/etc/systemd/system'].map((d) => `${d}/${unit}`));
  if (!found) { act({ action: 'configuration.services', status: 'warning', detail: `unit ${unit} is not installed in the guest` }); return false; }
  let modified = false;
  if (!o.dry_run) { await g.cmd('mkdir-p', '/etc/systemd/system/multi-user.target.wants'); await g.cmd('ln-sf', found, link); modified = true; }
  act({ action: 'configuration.services', status: o.dry_run ? 'would_do' : 'done', detail: `enabled ${unit}` });
  return modified;
}
