// What Ferry made on a libvirt host, by identities virsh cannot confuse: a domain's UUID, a volume's key (in a dir
// pool its path). The import writes each entry into its job's record at the moment it makes the thing (the
// worker's Ledger, kept in Redis by queue/commands/addMade-2.lua), so a job killed half-way still has it; rollback,
// cancel clean-up and a retry remove ledger entries and nothing else (removeMade), each only while its job owns it
// (MadeGuard: another job may have made the same volume path since). No name is ever looked up:
// virsh resolves a domain argument as an ID, then a UUID, then a name, so a name could reach another domain.
import Joi from 'joi';
import { LibvirtError, Virsh } from './virsh';
import { expectedError } from '../../platform/log';

export interface Made {
  kind: 'domain' | 'volume';
  /** the domain's UUID, or the volume's key */
  id: string;
  /** what it was called when made: for people, never used to find it */
  name: string;
  virt_uri: string;
  /** the volume's pool (refreshed before the volumes are looked up by key) */
  pool?: string;
}
/** A ledger entry as the job record keeps it: which attempt made it, and when. */
export interface MadeEntry extends Made { attempt: number; at: string }

export const madeEntrySchema = Joi.object({
  kind: Joi.string().valid('domain', 'volume'), id: Joi.string().description('the domain\'s UUID, the volume\'s key (its path in a dir pool)'),
  name: Joi.string(), virt_uri: Joi.string(), pool: Joi.string(), attempt: Joi.number().integer(), at: Joi.string().isoDate(),
}).label('MadeEntry').description('something the job made on a libvirt host; rollback, cancel clean-up and retries remove these and nothing else');

/** Where an import writes what it makes. `record` throws when the attempt no longer holds its job (cancelled, or
 *  taken over): the import then makes nothing more, and removes what it made but could not record. Recording an
 *  entry again only confirms the attempt still holds the job. */
export interface Ledger { record(e: Made): Promise<void> }

/** A ledger that keeps nothing: an import no job runs (POST /import/kvm answers with what it made). */
export const NO_LEDGER: Ledger = { record: () => Promise.resolve() };

const notFound = (e: unknown) => e instanceof LibvirtError && e.status === 404;

/** Whether the domain with this UUID is there: `dominfo` (which, unlike `domuuid`, looks a UUID up) answers the
 *  UUID of whatever the argument resolved to, so a domain that is merely named like the UUID answers another one
 *  and is not ours. */
async function domainThere(v: Virsh, uuid: string): Promise<boolean> {
  try { return /^UUID:\s*(\S+)/m.exec(await v.run(['dominfo', uuid]))?.[1].toLowerCase() === uuid.toLowerCase(); } catch (e) {
    if (notFound(e)) return false;
    throw e;
  }
}

/** A domain gone meanwhile (another clean-up of the same ledger: the worker's and the plan's) is not an error. */
async function removeDomain(v: Virsh, d: Made): Promise<string | null> {
  if (!(await domainThere(v, d.id))) return null;
  try {
    await v.run(['destroy', d.id]).catch((e) => { if (!(e instanceof LibvirtError) || e.status !== 409) throw e; }); // already off
    // Its NVRAM goes with it; its disks are removed by key below, only those the ledger lists.
    await v.run(['undefine', '--nvram', d.id]);
  } catch (e) {
    if (notFound(e)) return null;
    throw e;
  }
  return `domain ${d.name} (${d.id}) with its NVRAM removed from ${v.uri}`;
}

/** `vol-key <key>` without a pool looks the volume up by key, then by path (the same string in a dir pool). */
async function removeVolume(v: Virsh, vol: Made): Promise<string | null> {
  try {
    if ((await v.run(['vol-key', vol.id])).trim() !== vol.id) return null;
    await v.run(['vol-delete', vol.id]);
  } catch (e) {
    if (notFound(e)) return null;
    throw e;
  }
  return `volume ${vol.id} removed`;
}

/** Who owns each entry now (JobStore.madeGuard): a dir pool's volume key is its path, which a later job can make
 *  again once this job's volume is gone, so an entry is acted on only while its job still owns it. */
export interface MadeGuard {
  /** the job whose ledger is acted on */
  job: string;
  /** the job that owns the thing now; null: nobody (Ferry removed it already) */
  owner(e: Made): Promise<string | null>;
  /** gives up the job's ownership of things removed or found gone */
  released(es: Made[]): Promise<void>;
}

/** One entry, checked right before it is acted on: removed only while `guard.job` owns it, its ownership given up
 *  once it is gone. A line for what was done, or for what is left because another job made it since. */
async function removeOwned(v: Virsh, e: Made, guard: MadeGuard): Promise<string | null> {
  const owner = await guard.owner(e);
  if (owner === null) return null;
  if (owner !== guard.job) return `${e.kind} ${e.id} left: job ${owner} made it since`;
  const r = e.kind === 'domain' ? await removeDomain(v, e) : await removeVolume(v, e);
  await guard.released([e]);
  return r;
}

/** Removes what the entries name (domains first, so that no domain is left with a missing disk), each found by its
 *  UUID or key, skipped when gone, and only while the guard's job owns it; returns what was done, one line each.
 *  Idempotent. */
export async function removeMade(entries: Made[], guard: MadeGuard): Promise<string[]> {
  const did: string[] = [];
  for (const uri of new Set(entries.map((e) => e.virt_uri))) {
    const v = new Virsh(uri);
    const of = (kind: Made['kind']) => [...new Map(entries.filter((e) => e.virt_uri === uri && e.kind === kind).map((e) => [e.id, e])).values()];
    for (const d of of('domain')) { const r = await removeOwned(v, d, guard); if (r) did.push(r); }
    const vols = of('volume');
    // A file copied into a dir pool is a volume libvirt knows only after a refresh.
    for (const pool of new Set(vols.map((x) => x.pool).filter((x): x is string => !!x))) {
      await v.run(['pool-refresh', pool]).catch(expectedError('a pool that is gone or inactive holds none of these volumes; each is looked up by its key',
        { pool }));
    }
    for (const x of vols) { const r = await removeOwned(v, x, guard); if (r) did.push(r); }
  }
  return did;
}
