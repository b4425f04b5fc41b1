// Windows registry values for the fix stage: building them (pure), writing them as a regedit file that
// hivexregedit --merge applies to a downloaded copy of a hive, and reading hives in the guest with guestfish's
// hivex-* commands. guestfish passes a buffer argument as a C string (strlen of argv), so hivex-node-set-value
// cannot carry a NUL byte, and every REG_SZ (UTF-16LE) and most REG_DWORDs contain one: hence the .reg file.
import { execFile } from 'node:child_process';
import type { GuestSession } from './guestfs';
import { setting } from '../../platform/settings';

export const HIVEXREGEDIT = setting('HIVEXREGEDIT');
const one = (s: string | undefined) => (s ?? '').trim();

export const REG = { SZ: 1, EXPAND_SZ: 2, BINARY: 3, DWORD: 4, MULTI_SZ: 7 } as const;
export interface RegValue { name: string; type: number; data: Buffer }
/** A key (path below the hive root) and the values to set on it; other values of the key are kept. */
export interface RegKey { path: string[]; values?: RegValue[] }

const utf16z = (s: string) => Buffer.from(`${s}\0`, 'utf16le');
export const regValue = {
  sz: (name: string, s: string): RegValue => ({ name, type: REG.SZ, data: utf16z(s) }),
  expandSz: (name: string, s: string): RegValue => ({ name, type: REG.EXPAND_SZ, data: utf16z(s) }),
  multiSz: (name: string, list: string[]): RegValue => ({ name, type: REG.MULTI_SZ, data: Buffer.from(`${list.map((s) => `${s}\0`).join('')}\0`, 'utf16le') }),
  dword: (name: string, n: number): RegValue => { const data = Buffer.alloc(4); data.writeUInt32LE(n >>> 0); return { name, type: REG.DWORD, data }; },
  binary: (name: string, data: Buffer): RegValue => ({ name, type: REG.BINARY, data }),
};

/** Human-readable form of a value, for report details. */
export function describeValue(v: RegValue): string {
  const name = v.name || '(default)';
  if (v.type === REG.DWORD) return `${name}=dword:${v.data.readUInt32LE(0)}`;
  if (v.type === REG.SZ || v.type === REG.EXPAND_SZ) {
    return `${name}=${v.type === REG.SZ ? 'sz' : 'expand_sz'}:"${v.data.toString('utf16le').replace(/\0$/, '')}"`;
  }
  if (v.type === REG.MULTI_SZ) return `${name}=multi_sz:[${v.data.toString('utf16le').split('\0').filter(Boolean).map((s) => `"${s}"`).join(',')}]`;
  return `${name}=hex(${v.type}):${v.data.toString('hex')}`;
}

/** Adds every missing ancestor key (hivexregedit --merge creates one level at a time), keeping the order. */
export function withParents(keys: RegKey[]): RegKey[] {
  const out: RegKey[] = [];
  const seen = new Set<string>();
  const id = (p: string[]) => p.join('\\').toLowerCase();
  for (const k of keys) {
    for (let i = 1; i < k.path.length; i++) {
      const p = k.path.slice(0, i);
      if (!seen.has(id(p))) { seen.add(id(p)); out.push({ path: p }); }
    }
    if (!seen.has(id(k.path))) { seen.add(id(k.path)); out.push(k); }
    else { const prev = out.find((x) => id(x.path) === id(k.path))!; prev.values = [...(prev.values || []), ...(k.values || [])]; }
  }
  return out;
}

const quoteReg = (s: string) => `"${s.replace(/\\/g, '\\\\').replace(/"/g, '\\"')}"`;
/** A regedit-format file for hivexregedit --merge; every value is written as hex(type) bytes, so nothing is re-encoded. */
export function regFile(prefix: string, keys: RegKey[]): string {
  const lines = ['Windows Registry Editor Version 5.00', ''];
  for (const k of withParents(keys)) {
    if (k.path.some((p) => !p || /[\\\]\r\n]/.test(p))) throw new Error(`invalid registry key name in ${k.path.join('\\')}`);
    lines.push(`[${prefix}\\${k.path.join('\\')}]`);
    for (const v of k.values || []) {
      const hex = [...v.data].map((b) => b.toString(16).padStart(2, '0')).join(',');
      lines.push(`${v.name === '' ? '@' : quoteReg(v.name)}=hex(${v.type.toString(16)}):${hex}`);
    }
    lines.push('');
  }
  return lines.join('\n');
}

/** DevicePath with `add` appended (entries already there, compared case-insensitively, are not repeated). */
export function extendDevicePath(old: string | undefined, add: string[]): { value: string; added: string[] } {
  const parts = (old || '').split(';').filter(Boolean);
  const have = new Set(parts.map((p) => p.toLowerCase()));
  const added = add.filter((a) => !have.has(a.toLowerCase()) && have.add(a.toLowerCase()));
  return { value: [...parts, ...added].join(';'), added };
}

/** Read-only navigation of a hive with guestfish's hivex-* commands (one hivex handle per session). */
export class HiveReader {
  constructor(private g: GuestSession) {}
  async open(hive: string): Promise<string> { await this.g.cmd('hivex-open', hive); return one(await this.g.cmd('hivex-root')); }
  async close(): Promise<void> { await this.g.tryCmd('hivex-close'); }
  /** The node at `names` below `from`, or undefined. */
  async node(from: string, names: string[]): Promise<string | undefined> {
    let n = from;
    for (const name of names) {
      n = one(await this.g.cmd('hivex-node-get-child', n, name));
      if (!n || n === '0') return undefined;
    }
    return n;
  }
  async value(node: string, key: string): Promise<{ handle: string; type: number } | undefined> {
    const v = one(await this.g.cmd('hivex-node-get-value', node, key));
    if (!v || v === '0') return undefined;
    return { handle: v, type: Number(one(await this.g.cmd('hivex-value-type', v))) };
  }
  /** A REG_SZ / REG_EXPAND_SZ value as text (guestfish prints a newline after it). */
  async string(node: string, key: string): Promise<string | undefined> {
    const v = await this.value(node, key);
    if (!v) return undefined;
    const out = await this.g.cmd('hivex-value-utf8', v.handle);
    return out.endsWith('\n') ? out.slice(0, -1) : out;
  }
}

/** Applies a regedit-format file to a hive file on the host. */
export async function hivexregedit(hive: string, prefix: string, reg: string): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    execFile(HIVEXREGEDIT, ['--merge', '--prefix', prefix, hive, reg], (e, _out, err) => {
      if (!e) return resolve();
      reject(new Error(e.code === 'ENOENT'
        ? `${HIVEXREGEDIT} is not installed (Debian package libwin-hivex-perl)`
        : `hivexregedit --merge failed: ${String(err).trim() || e.message}`));
    });
  });
}

export async function hasHivexregedit(): Promise<boolean> {
  return new Promise((resolve) => execFile(HIVEXREGEDIT, ['--help'], (e) => resolve(!e || e.code !== 'ENOENT')));
}
