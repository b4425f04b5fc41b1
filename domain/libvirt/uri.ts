// Which libvirt connection URIs a caller may name (a shape B job's destination.virt_uri, an import_kvm job's
// virt_uri): only the operator's, FERRY_LIBVIRT_URIS (comma-separated; FERRY_LIBVIRT_URI is always one of them),
// each compared as the exact string. A URI picks the program libvirt runs (qemu+ext, command=, netcat=), the
// socket and key it uses and whether it checks the host key, so nothing of it may come from a caller: an entry
// is trusted as the operator wrote it, anything else is refused, with the reason when a part is dangerous.
import Joi from 'joi';
import { OperationError } from '../../platform/errors';
import { setting } from '../../platform/settings';

const DEFAULT_URI = 'qemu:///system';

/** Parameters that name a program, a socket, a key or a host-key policy of the worker (libvirt compares
 *  parameter names without case). */
const HOST_PARAMETERS = ['command', 'netcat', 'socket', 'no_verify', 'keyfile', 'pkipath', 'known_hosts', 'known_hosts_verify', 'proxy'];

export function allowedUris(env: NodeJS.ProcessEnv = process.env): string[] {
  const own = setting('FERRY_LIBVIRT_URI', env) || DEFAULT_URI;
  const listed = setting('FERRY_LIBVIRT_URIS', env);
  return [own, ...listed.filter((u) => u !== own)];
}

/** Why a caller may not name `raw`, or null when it is one of the operator's URIs. */
export function refuseUri(raw: string, env: NodeJS.ProcessEnv = process.env): string | null {
  if (allowedUris(env).includes(raw)) return null;
  let u: URL;
  try { u = new URL(raw); } catch { return 'is not a libvirt connection URI'; }
  const transport = u.protocol.replace(/:$/, '').split('+')[1]?.toLowerCase();
  if (transport === 'ext') return 'uses the ext transport (a program of the caller\'s choosing): never accepted from a request';
  const bad = [...u.searchParams.keys()].map((k) => k.toLowerCase()).filter((k) => HOST_PARAMETERS.includes(k));
  if (bad.length) return `sets ${bad.map((k) => `${k}=`).join(', ')} (a program, socket, key or host-key check of the worker): never accepted from a request`;
  return `is not a libvirt URI this deployment may connect to: it must be one of FERRY_LIBVIRT_URIS (or ` +
         `FERRY_LIBVIRT_URI)${transport === 'tcp' ? '; qemu+tcp sends disks unencrypted and is only used when listed' : ''}`;
}

/** The URI as shown in messages: no user information. */
export const shownUri = (raw: string) => raw.replace(/\/\/[^@/]*@/, '//');

/** A caller's libvirt URI: a 400 naming the field unless it is one of the operator's. */
export const virtUriSchema = Joi.string().max(1024).custom((v: string, h) => {
  const r = refuseUri(v);
  // The reason holds no caller text (a joi template would read braces in it).
  return r ? h.message({ custom: `{{#label}} ${r}` }) : v;
});

/** The URI a job connects to: its own, checked again here (a job in Redis may predate a configuration change),
 *  or the worker's FERRY_LIBVIRT_URI. A refusal fails the job without retry. */
export function jobUri(given: string | undefined, field: string, env: NodeJS.ProcessEnv = process.env): string {
  if (!given) return setting('FERRY_LIBVIRT_URI', env) || DEFAULT_URI;
  const r = refuseUri(given, env);
  if (r) throw new OperationError(`${field} ${shownUri(given)} ${r}`, false);
  return given;
}
