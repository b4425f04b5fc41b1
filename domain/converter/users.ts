// configuration.users for Linux guests, applied offline: /etc/passwd, /etc/shadow, /etc/group (and /etc/gshadow)
// are edited as text, the home directory, authorized_keys and a sudoers drop-in are written through libguestfs.
// Nothing runs inside the guest, so it works on a guest whose binaries cannot run in the appliance.
// The pure part (planUsers) is tested without an appliance; applyUsers does the guest I/O.
import { spawn } from 'node:child_process';
import type { GuestSession } from './guestfs';
import type { FixAction } from './types';

/** One account as docs/pipeline.md documents it (configuration.users.<name>). */
export interface UserSpec {
  password?: string; password_hash?: string; uid?: number; gid?: number; groups?: string[]; shell?: string; home?: string;
  gecos?: string; ssh_authorized_keys?: string[]; sudo?: boolean;
}

export interface AccountFiles { passwd: string; shadow?: string; group: string; gshadow?: string }

export interface UserPlan {
  name: string; uid: number; gid: number; home: string; created: boolean; group_created: boolean;
  /** Set when the password changes: the crypt(3) hash that goes into /etc/shadow. */
  hash?: string; groups_added: string[]; keys: string[]; sudo: boolean;
}

const NAME = /^[a-z_][a-z0-9_-]{0,31}$/;
const CRYPT = /^\$(1|5|6|y|2[aby]|7)\$[./A-Za-z0-9$=,]+$|^[!*]/;
const FIRST_UID = 1000;
const LAST_UID = 60000;

type Warn = (path: string, message: string) => void;

/** Checks the known fields of configuration.users; a bad one is a warning naming its path and skips that account. */
export function readUserSpecs(users: unknown, warn: Warn): [string, UserSpec][] {
  if (!users || typeof users !== 'object' || Array.isArray(users)) { warn('configuration.users', 'must be an object keyed by user name'); return []; }
  const out: [string, UserSpec][] = [];
  for (const [name, raw] of Object.entries(users as Record<string, unknown>)) {
    const u = readUserSpec(name, raw, warn);
    if (u) out.push([name, u]);
  }
  return out;
}

/** Warns about field `f` of an account and returns true, so a check reads `cond && bad(f, message)`. */
type Bad = (f: string, m: string) => boolean;

/** One account of configuration.users, checked; undefined (after a warning) when it is to be skipped. */
function readUserSpec(name: string, raw: unknown, warn: Warn): UserSpec | undefined {
  const p = `configuration.users.${name}`;
  if (!NAME.test(name)) { warn(p, 'is not a valid user name (lower case letters, digits, _ and -, at most 32)'); return undefined; }
  if (name === 'root' && raw && typeof raw === 'object' && ('uid' in raw || 'home' in raw)) {
    warn(p, 'root can only get a password, keys or groups');
    return undefined;
  }
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) { warn(p, 'must be an object'); return undefined; }
  const u = raw as Record<string, unknown>;
  const bad: Bad = (f, m) => { warn(`${p}.${f}`, m); return true; };
  if (badFieldType(u, bad) || badFieldValue(u, bad) || badListEntry(u, bad)) return undefined;
  return u;
}

/** True (after a warning) when a string, integer or string-array field of the account has another type. */
function badFieldType(u: Record<string, unknown>, bad: Bad): boolean {
  const str = (f: string) => u[f] !== undefined && typeof u[f] !== 'string' && bad(f, 'must be a string');
  const int = (f: string) => u[f] !== undefined && !(Number.isInteger(u[f]) && (u[f] as number) >= 0 && (u[f] as number) < 2 ** 31)
    && bad(f, 'must be a non-negative integer');
  const strs = (f: string) => u[f] !== undefined && !(Array.isArray(u[f]) && (u[f] as unknown[]).every((x) => typeof x === 'string'))
    && bad(f, 'must be an array of strings');
  return str('password') || str('password_hash') || str('shell') || str('home') || str('gecos')
    || int('uid') || int('gid') || strs('groups') || strs('ssh_authorized_keys');
}

/** True (after a warning) when sudo, the password, the shell, the home or the gecos of the account is unusable. */
function badFieldValue(u: Record<string, unknown>, bad: Bad): boolean {
  if (u.sudo !== undefined && typeof u.sudo !== 'boolean' && bad('sudo', 'must be a boolean')) return true;
  if (u.password !== undefined && u.password_hash !== undefined && bad('password', 'give password or password_hash, not both')) return true;
  if (typeof u.password_hash === 'string' && !CRYPT.test(u.password_hash)
    && bad('password_hash', 'is not a crypt(3) hash ($6$..., $y$..., or ! / * to lock)')) return true;
  if (typeof u.shell === 'string' && !u.shell.startsWith('/') && bad('shell', 'must be an absolute path')) return true;
  if (typeof u.home === 'string' && !u.home.startsWith('/') && bad('home', 'must be an absolute path')) return true;
  if (typeof u.gecos === 'string' && /[:\n]/.test(u.gecos) && bad('gecos', 'must not contain ":" or a newline')) return true;
  return false;
}

/** True (after a warning) when a group name or an authorized key of the account is malformed. */
function badListEntry(u: Record<string, unknown>, bad: Bad): boolean {
  const badGroup = (u.groups as string[] | undefined)?.find((g) => !NAME.test(g));
  if (badGroup !== undefined && bad('groups', `"${badGroup}" is not a valid group name`)) return true;
  const badKey = (u.ssh_authorized_keys as string[] | undefined)?.find((k) => /\n/.test(k) || !/^(ssh-|ecdsa-|sk-)\S+ \S+/.test(k.trim()));
  if (badKey !== undefined && bad('ssh_authorized_keys', 'every entry must be one public key line ("ssh-ed25519 AAAA... comment")')) return true;
  return false;
}

const rows = (text: string) => text.split('\n').filter((l) => l.length).map((l) => l.split(':'));
const join = (rs: string[][]) => rs.map((r) => r.join(':')).join('\n') + '\n';

/** The account files as rows of fields, edited in place while planning. */
interface AccountRows { passwd: string[][]; shadow?: string[][]; group: string[][]; gshadow?: string[][] }

/** The first number from `from` up that is not in `taken`. */
function nextFree(taken: Set<number>, from: number): number { let i = from; while (taken.has(i)) i++; return i; }

/**
 * The new contents of the account files for `specs` (hash: the crypt(3) hash per user whose password is set).
 * Existing accounts are updated (password, groups), never duplicated; new ones get the next free uid from 1000,
 * a primary group of their own name and a locked password unless one is given.
 */
export function planUsers(
  files: AccountFiles, specs: [string, UserSpec][], hashes: Record<string, string>, today: number, warn: Warn,
): { files: AccountFiles; plans: UserPlan[] } {
  const passwd = rows(files.passwd);
  const shadow = files.shadow !== undefined ? rows(files.shadow) : undefined;
  const group = rows(files.group);
  const gshadow = files.gshadow !== undefined ? rows(files.gshadow) : undefined;
  const t: AccountRows = { passwd, shadow, group, gshadow };
  const plans: UserPlan[] = [];

  for (const [name, u] of specs) {
    const p = `configuration.users.${name}`;
    let row = passwd.find((r) => r[0] === name);
    const plan: UserPlan = {
      name, uid: 0, gid: 0, home: '', created: !row, group_created: false, groups_added: [], keys: u.ssh_authorized_keys || [], sudo: !!u.sudo,
    };
    if (row) updateAccount(row, name, u, p, warn);
    else {
      row = createAccount(t, name, u, plan, today, p, warn);
      if (!row) continue;
    }
    plan.uid = Number(row[2]);
    plan.gid = Number(row[3]);
    plan.home = row[5];
    if (hashes[name] !== undefined) setPassword(t, row, plan, hashes[name], today);
    addToGroups(t, name, u, plan, p, warn);
    plans.push(plan);
  }
  return { files: { passwd: join(passwd), shadow: shadow && join(shadow), group: join(group), gshadow: gshadow && join(gshadow) }, plans };
}

/** Updates the passwd row of an existing account (shell, gecos); its uid stays, with a warning when another is asked. */
function updateAccount(row: string[], name: string, u: UserSpec, p: string, warn: Warn): void {
  if (u.uid !== undefined && Number(row[2]) !== u.uid) warn(`${p}.uid`, `${name} exists with uid ${row[2]}; uid left unchanged`);
  if (u.shell) row[6] = u.shell;
  if (u.gecos !== undefined) row[4] = u.gecos;
}

/** Adds a new account (and its primary group when it has none) to the rows; returns its passwd row, or undefined
 *  (after a warning) when its uid is taken or its gid names no group. */
function createAccount(t: AccountRows, name: string, u: UserSpec, plan: UserPlan, today: number, p: string, warn: Warn): string[] | undefined {
  const { passwd, shadow, group, gshadow } = t;
  const uids = new Set(passwd.map((r) => Number(r[2])));
  const gids = new Set(group.map((r) => Number(r[2])));
  if (u.uid !== undefined && uids.has(u.uid)) {
    warn(`${p}.uid`, `uid ${u.uid} is taken by ${passwd.find((r) => Number(r[2]) === u.uid)![0]}`);
    return undefined;
  }
  const uid = u.uid ?? nextFree(
    new Set([...uids].filter((x) => x >= FIRST_UID && x < LAST_UID)),
    Math.max(FIRST_UID, ...[...uids].filter((x) => x < LAST_UID).map((x) => x + 1)),
  );
  let gid = u.gid;
  let grp = gid !== undefined ? group.find((r) => Number(r[2]) === gid) : group.find((r) => r[0] === name);
  if (gid !== undefined && !grp) { warn(`${p}.gid`, `no group has gid ${gid}`); return undefined; }
  if (!grp) {
    gid = gids.has(uid) ? nextFree(gids, FIRST_UID) : uid;
    grp = [name, 'x', String(gid), ''];
    group.push(grp);
    gshadow?.push([name, '!', '', '']);
    plan.group_created = true;
  }
  gid = Number(grp[2]);
  const row = [name, 'x', String(uid), String(gid), u.gecos ?? '', u.home || `/home/${name}`, u.shell || '/bin/bash'];
  passwd.push(row);
  if (shadow) shadow.push([name, '!', String(today), '0', '99999', '7', '', '', '']);
  return row;
}

/** Puts the account's new password hash in /etc/shadow (a row added when missing), or in passwd without shadow. */
function setPassword(t: AccountRows, row: string[], plan: UserPlan, hash: string, today: number): void {
  const { shadow } = t;
  const name = plan.name;
  plan.hash = hash;
  if (shadow) {
    const s = shadow.find((r) => r[0] === name) || (shadow.push([name, '', '', '0', '99999', '7', '', '', '']), shadow[shadow.length - 1]);
    s[1] = hash;
    s[2] = String(today);
  } else row[1] = hash; // no shadow file: the hash lives in passwd, as on very old systems
}

/** Adds the account to the member lists of its `groups` (and gshadow), warning about groups the guest lacks. */
function addToGroups(t: AccountRows, name: string, u: UserSpec, plan: UserPlan, p: string, warn: Warn): void {
  const { group, gshadow } = t;
  for (const gname of u.groups || []) {
    const g = group.find((r) => r[0] === gname);
    if (!g) { warn(`${p}.groups`, `group ${gname} does not exist in the guest; not added`); continue; }
    const members = g[3] ? g[3].split(',') : [];
    if (members.includes(name) || Number(g[2]) === plan.gid) continue;
    g[3] = [...members, name].join(',');
    const gs = gshadow?.find((r) => r[0] === gname);
    if (gs) { const m = gs[3] ? gs[3].split(',') : []; if (!m.includes(name)) gs[3] = [...m, name].join(','); }
    plan.groups_added.push(gname);
  }
}

/** SHA-512 crypt(3) of a password, by `openssl passwd -6 -stdin`: the password goes through a pipe, never argv. */
export function cryptPassword(password: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const p = spawn('openssl', ['passwd', '-6', '-stdin'], { stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout.setEncoding('utf8').on('data', (s: string) => { out += s; });
    p.stderr.setEncoding('utf8').on('data', (s: string) => { err += s; });
    p.on('error', (e) => reject(new Error(`openssl is needed to hash configuration.users passwords: ${e.message}`)));
    p.on('close', (code) => (code === 0 && out.startsWith('$6$')
      ? resolve(out.trim())
      : reject(new Error(`openssl passwd failed: ${err.trim() || `exit ${code}`}`))));
    p.stdin.end(`${password}\n`);
  });
}

/** Applies configuration.users to the mounted guest. Hashes and shadow files never pass through argv or logs. */
export async function applyUsers(g: GuestSession, users: unknown, o: { dry_run: boolean; backup: boolean }, act: (a: FixAction) => void): Promise<boolean> {
  const warn: Warn = (path, message) => act({ action: 'configuration.users', status: 'warning', detail: `${path}: ${message}` });
  const specs = readUserSpecs(users, warn);
  if (!specs.length) return false;
  if (!(await g.isFile('/etc/passwd')) || !(await g.isFile('/etc/group'))) {
    warn('configuration.users', 'the guest has no /etc/passwd or /etc/group');
    return false;
  }
  const opt = async (f: string) => ((await g.isFile(f)) ? g.read(f) : undefined);
  const before: AccountFiles = {
    passwd: await g.read('/etc/passwd'), shadow: await opt('/etc/shadow'), group: await g.read('/etc/group'), gshadow: await opt('/etc/gshadow'),
  };
  const hashes = await hashPasswords(specs, warn);
  const { files, plans } = planUsers(before, specs, hashes, Math.floor(Date.now() / 86_400_000), warn);
  if (o.dry_run) { for (const p of plans) act({ action: 'configuration.users', status: 'would_do', detail: summary(p), user: p.name }); return false; }

  await writeAccountFiles(g, files, before, o.backup);
  const sudoGroup = group(files.group, ['sudo', 'wheel']);
  for (const p of plans) {
    if (p.created && p.home !== '/' && !(await g.exists(p.home))) await makeHome(g, p);
    if (p.keys.length) await addAuthorizedKeys(g, p);
    if (p.sudo) await grantSudo(g, p, sudoGroup, warn);
    act({ action: 'configuration.users', status: 'done', detail: summary(p), user: p.name });
  }
  return true;
}

/** The crypt(3) hash per user whose password is set: given, or hashed here (a failure is a warning). */
async function hashPasswords(specs: [string, UserSpec][], warn: Warn): Promise<Record<string, string>> {
  const hashes: Record<string, string> = {};
  for (const [name, u] of specs) {
    if (u.password_hash) hashes[name] = u.password_hash;
    else if (u.password !== undefined) {
      try { hashes[name] = await cryptPassword(u.password); } catch (e) { warn(`configuration.users.${name}.password`, (e as Error).message); }
    }
  }
  return hashes;
}

/** What is done to one account, as the action's detail. */
function summary(p: UserPlan): string {
  return [
    p.created ? `created ${p.name} (uid ${p.uid}, gid ${p.gid}${p.group_created ? ', new group' : ''}, home ${p.home})` : `updated ${p.name}`,
    p.hash ? 'password set' : '', p.groups_added.length ? `added to ${p.groups_added.join(', ')}` : '',
    p.keys.length ? `${p.keys.length} authorized key(s)` : '', p.sudo ? 'sudo' : '',
  ].filter(Boolean).join('; ');
}

/** Writes the account files that changed, with the same mode and owner as before. */
async function writeAccountFiles(g: GuestSession, files: AccountFiles, before: AccountFiles, backup: boolean): Promise<void> {
  for (const k of ['passwd', 'group', 'shadow', 'gshadow'] as const) {
    const f = `/etc/${k}`;
    const text = files[k];
    const old = before[k];
    if (text === undefined || text === (old?.endsWith('\n') ? old : `${old}\n`)) continue;
    if (backup) await g.backup(f);
    const st = await g.stat(f);
    // Through a private file, not argv: the shadow files hold hashes, and so does passwd on a guest without shadow.
    await g.writeFile(f, text);
    await g.cmd('chown', String(st.uid), String(st.gid), f);
    await g.cmd('chmod', `0${(st.mode & 0o7777).toString(8)}`, f);
  }
}

/** Creates a new account's home from /etc/skel, owned by the account. */
async function makeHome(g: GuestSession, p: UserPlan): Promise<void> {
  await g.cmd('mkdir-p', p.home);
  if (await g.isDir('/etc/skel')) for (const f of g.lines(await g.cmd('ls', '/etc/skel'))) await g.cmd('cp-a', `/etc/skel/${f}`, `${p.home}/${f}`);
  for (const f of g.lines(await g.cmd('find', p.home))) await g.cmd('lchown', String(p.uid), String(p.gid), `${p.home}/${f}`);
  await g.cmd('chown', String(p.uid), String(p.gid), p.home);
  await g.cmd('chmod', '0750', p.home);
}

/** Adds the account's keys that are not there yet to ~/.ssh/authorized_keys, owned by the account. */
async function addAuthorizedKeys(g: GuestSession, p: UserPlan): Promise<void> {
  const dir = `${p.home}/.ssh`;
  const file = `${dir}/authorized_keys`;
  await g.cmd('mkdir-p', dir);
  const cur = (await g.isFile(file)) ? await g.read(file) : '';
  const have = new Set(cur.split('\n').map((l) => l.trim()).filter(Boolean));
  const add = p.keys.map((k) => k.trim()).filter((k) => !have.has(k));
  if (add.length) await g.writeFile(file, `${cur}${cur && !cur.endsWith('\n') ? '\n' : ''}${add.join('\n')}\n`);
  await g.cmd('chown', String(p.uid), String(p.gid), dir);
  await g.cmd('chmod', '0700', dir);
  await g.cmd('chown', String(p.uid), String(p.gid), file);
  await g.cmd('chmod', '0600', file);
}

/** Writes the account's sudoers drop-in, or warns (naming the sudo or wheel group when there is one) without sudoers.d. */
async function grantSudo(g: GuestSession, p: UserPlan, sudoGroup: string | undefined, warn: Warn): Promise<void> {
  if (await g.isDir('/etc/sudoers.d')) {
    const f = `/etc/sudoers.d/90-ferry-${p.name}`;
    await g.writeFile(f, `# written by Ferry (configuration.users.${p.name}.sudo)\n${p.name} ALL=(ALL:ALL) ALL\n`);
    await g.cmd('chown', '0', '0', f);
    await g.cmd('chmod', '0440', f);
  } else if (!sudoGroup) warn(`configuration.users.${p.name}.sudo`, 'the guest has neither /etc/sudoers.d nor a sudo or wheel group');
  else warn(`configuration.users.${p.name}.sudo`, `no /etc/sudoers.d in the guest; add ${p.name} to the ${sudoGroup} group with "groups" instead`);
}

function group(text: string, names: string[]): string | undefined {
  const have = new Set(rows(text).map((r) => r[0]));
  return names.find((n) => have.has(n));
}
