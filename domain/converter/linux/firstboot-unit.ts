// What Ferry leaves for the guest's first boot on KVM, where the guest's own tools run natively in seconds instead
// of under TCG in the appliance: a oneshot systemd unit with a script that does one job, says so on the console
// (opened afresh for each line: a serial getty may have hung up the descriptor systemd would hand it) and then
// removes itself, its script and its enablement link. A run that fails leaves everything in place and runs again
// at the next boot. Two use it: the initramfs rebuild (initrd-firstboot.ts) and the source hypervisor's tools'
// removal (hv-tools.ts), the removal ordered before the rebuild so the rebuild's "done" means both are.
import type { GuestSession } from '../guestfs';
import type { LinuxFix } from './context';

export interface FirstBootUnit {
  /** the unit's name, e.g. ferry-initramfs-rebuild.service */
  name: string;
  /** the script it runs (its name is the unit's without .service, under /usr/local/sbin) */
  script: string;
  description: string;
  /** units this one runs before (at the same boot) */
  before?: string[];
}

export const unitPath = (u: FirstBootUnit) => `/etc/systemd/system/${u.name}`;
export const unitLink = (u: FirstBootUnit) => `/etc/systemd/system/multi-user.target.wants/${u.name}`;
/** The files a unit leaves until it has run: the unit, its script, its link. */
export const unitFiles = (u: FirstBootUnit) => [unitPath(u), u.script, unitLink(u)];
/** A word for the shell, quoted. */
export const shq = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

function unitText(u: FirstBootUnit): string {
  return `# Written by Ferry: runs once at the first boot after the migration, then removes itself (${u.script} says
# what it does).
[Unit]
Description=Ferry: ${u.description}
After=local-fs.target
${u.before?.length ? `Before=${u.before.join(' ')}\n` : ''}ConditionPathExists=${u.script}

[Service]
Type=oneshot
ExecStart=${u.script}
StandardOutput=journal
StandardError=journal
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
`;
}

/** The script around `body` (which sets failed=1 when its work failed): on success the unit removes itself and
 *  prints `<done>: <what>`; on failure it prints why and stays for the next boot. */
export function firstBootScript(u: FirstBootUnit, o: { header: string; body: string; done: string; what: string; failed: string }): string {
  return `#!/bin/sh
${o.header.split('\n').map((l) => `# ${l}`).join('\n')}
say() { echo "$*"; echo "$*" > /dev/console 2>/dev/null || true; }
failed=0
${o.body}
if [ "$failed" != 0 ]; then say ${shq(o.failed)}; exit 1; fi
sync
rm -f ${unitFiles(u).join(' ')}
sync
say ${shq(`${o.done}: ${o.what}`)}
`;
}

/** Whether the guest boots with systemd (the units need it). */
export async function runsSystemd(g: GuestSession): Promise<boolean> {
  return (await g.isDir('/etc/systemd/system')) && !!(await g.firstFile(['/lib/systemd/systemd', '/usr/lib/systemd/systemd']));
}

/** Writes the script and the unit and enables it. Returns the files written. */
export async function writeFirstBootUnit(x: LinuxFix, u: FirstBootUnit, script: string): Promise<string[]> {
  const { g } = x;
  await g.cmd('mkdir-p', '/usr/local/sbin');
  await x.write(u.script, script);
  await g.cmd('chmod', '0755', u.script);
  await x.write(unitPath(u), unitText(u));
  await g.cmd('chmod', '0644', unitPath(u));
  await g.cmd('mkdir-p', '/etc/systemd/system/multi-user.target.wants');
  await g.cmd('ln-sf', unitPath(u), unitLink(u));
  return unitFiles(u);
}

/** verify.ts's part: what is wrong with a unit that should be in place and enabled. */
export async function unitProblems(g: GuestSession, u: FirstBootUnit): Promise<string[]> {
  const bad: string[] = [];
  for (const f of [unitPath(u), u.script]) if (!(await g.isFile(f))) bad.push(`${f} is missing`);
  if ((await g.tryCmd('is-symlink', unitLink(u)))?.trim() !== 'true') bad.push(`${unitLink(u)} does not enable it`);
  return bad;
}
