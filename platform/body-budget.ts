// Budgets that keep a request body from freezing a process (docs/security.md, "Bodies"). Parsing and every walk
// that follows (validation, the unknown-field pass) cost time in proportion to the nodes a body expands to, not
// to its bytes: YAML aliases make a 361-byte body into millions of nodes. So a body is measured before anything
// walks it: JSON by its structural characters before JSON.parse, YAML by its size, its aliases and the nodes and
// depth it expands to, each shared node counted once with its expanded size (memoised), never walked twice.
import type { IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import zlib from 'node:zlib';
import yaml from 'js-yaml';
import { fieldError } from './errors';

/** The size limit of every request body, JSON or YAML, after decompression: a larger one is a 413 naming `body`. */
export const MAX_BODY_BYTES = 2 * 1024 * 1024;

/** Nodes (objects, arrays and scalars in them) a body may expand to: a batch of 1000 jobs fits easily. */
export const MAX_BODY_NODES = 100_000;
/** No schema nests deeper than a few levels; deeper bodies would only exhaust the stack of what walks them. */
export const MAX_BODY_DEPTH = 64;
/** YAML parses about 5 MB/s: 64 KiB stays well under a 50 ms pause, and no YAML document Ferry takes is near it. */
export const MAX_YAML_BYTES = 64 * 1024;
/** Aliases per YAML body: enough for anchors that share a disk or network block, too few to multiply much. */
export const MAX_YAML_ALIASES = 32;

const over = (message: string) => fieldError(400, 'body', message);

/** The rest of a JSON string with escapes, up to its closing quote. */
const STRING_REST = /[^"\\]*(?:\\[^][^"\\]*)*"/y;

/** Refuses (400 naming `body`) JSON text whose values would pass MAX_BODY_NODES, counted on the text itself
 *  (commas and brackets outside strings) so JSON.parse never sees a body of a million tiny values. */
export function checkJsonText(text: string): void {
  let nodes = 1;
  let backslash = -1; // the next backslash at or after the current string's start (-2: none left)
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 34) { // a string: skipped by native scans, never a loop over its characters here
      if (backslash !== -2 && backslash <= i) backslash = text.indexOf('\\', i + 1) < 0 ? -2 : text.indexOf('\\', i + 1);
      let end = text.indexOf('"', i + 1);
      if (end > 0 && backslash !== -2 && backslash < end) { // escapes inside: the regex knows where it ends
        STRING_REST.lastIndex = i + 1;
        end = STRING_REST.test(text) ? STRING_REST.lastIndex - 1 : -1;
      }
      if (end < 0) return; // unterminated: JSON.parse says so
      i = end;
    } else if (c === 44 || c === 91 || c === 123) { // , [ {
      if (++nodes > MAX_BODY_NODES) throw over(`more than ${MAX_BODY_NODES} values`);
    }
  }
}

/** A YAML body parsed within the budgets (an empty one is {}); malformed or over budget is a 400 naming `body`. */
export function loadYamlBody(text: string): unknown {
  if (Buffer.byteLength(text) > MAX_YAML_BYTES) throw fieldError(413, 'body', `YAML larger than ${MAX_YAML_BYTES / 1024} KiB (send JSON for larger bodies)`);
  let doc: unknown;
  try {
    doc = text.trim() ? yaml.load(text, { maxAliases: MAX_YAML_ALIASES, maxDepth: MAX_BODY_DEPTH, maxTotalMergeKeys: 1000 }) : undefined;
  } catch (e) {
    throw over(`malformed YAML: ${(e as Error).message.split('\n')[0]}`);
  }
  checkTree(doc);
  return doc ?? {};
}

/** Refuses a parsed body that expands to more than MAX_BODY_NODES nodes, nests deeper than MAX_BODY_DEPTH or
 *  refers to itself (a YAML anchor inside its own alias). Each distinct object is visited once: its expanded size
 *  and height are kept, so a node shared by a thousand aliases costs one visit, not a thousand. */
export function checkTree(body: unknown): void {
  const memo = new Map<object, { size: number; height: number }>();
  const open = new Set<object>();
  // Explicit stack (no recursion): [node, children already pushed].
  const stack: [object, boolean][] = [];
  const push = (v: unknown) => { if (v !== null && typeof v === 'object' && !memo.has(v)) stack.push([v, false]); };
  push(body);
  while (stack.length) {
    const top = stack[stack.length - 1];
    const [node, expanded] = top;
    if (memo.has(node)) { stack.pop(); continue; }
    const children: unknown[] = Object.values(node);
    if (!expanded) {
      if (open.has(node)) throw over('refers to itself (a YAML alias inside its own anchor)');
      open.add(node);
      if (open.size > MAX_BODY_DEPTH) throw over(`nested deeper than ${MAX_BODY_DEPTH} levels`);
      top[1] = true;
      for (const c of children) push(c);
      continue;
    }
    let size = 1;
    let height = 1;
    for (const c of children) {
      const m = c !== null && typeof c === 'object' ? memo.get(c)! : { size: 1, height: 0 };
      size += m.size;
      height = Math.max(height, m.height + 1);
    }
    if (size > MAX_BODY_NODES) throw over(`expands to more than ${MAX_BODY_NODES} values`);
    if (height > MAX_BODY_DEPTH) throw over(`nested deeper than ${MAX_BODY_DEPTH} levels`);
    memo.set(node, { size, height });
    open.delete(node);
    stack.pop();
  }
}

const tooLarge = () => fieldError(413, 'body', `larger than ${MAX_BODY_BYTES / 1024 / 1024} MiB`);
const DECODERS: Record<string, () => zlib.Gzip | zlib.Inflate | zlib.BrotliDecompress> = {
  gzip: zlib.createGunzip, 'x-gzip': zlib.createGunzip, deflate: zlib.createInflate, br: zlib.createBrotliDecompress,
};

/** A request body as text (decompressed per Content-Encoding), refused (413) as soon as it passes MAX_BODY_BYTES. */
export async function readBodyText(req: IncomingMessage): Promise<string> {
  const encoding = String(req.headers['content-encoding'] || 'identity').trim().toLowerCase();
  if (encoding === 'identity' && Number(req.headers['content-length']) > MAX_BODY_BYTES) throw tooLarge();
  const decoder = DECODERS[encoding];
  if (!decoder && encoding !== 'identity') throw fieldError(415, 'Content-Encoding', `${encoding.slice(0, 64)} is not supported (gzip, deflate, br or none)`);
  const source: Readable = decoder ? req.pipe(decoder()) : req;
  const chunks: Buffer[] = [];
  let n = 0;
  try {
    for await (const c of source) {
      n += (c as Buffer).length;
      if (n > MAX_BODY_BYTES) throw tooLarge();
      chunks.push(c as Buffer);
    }
  } catch (e) {
    if (typeof e === 'object' && e !== null && 'status' in e && e.status) throw e; // our own 413 from the loop
    throw fieldError(400, 'body', `could not be read as ${encoding}: ${(e as Error).message}`);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** A JSON body within the budgets; an empty one is '' (as koa-bodyparser gave). A `__proto__` key is refused, as
 *  bodyparser's parser did, so no later merge can pollute a prototype. */
export async function readJsonBody(req: IncomingMessage): Promise<unknown> {
  const text = await readBodyText(req);
  if (!text.trim()) return '';
  checkJsonText(text);
  try {
    // The reviver (slower) only when the text could hold the key, written plainly or escaped.
    if (!/__proto__|\\u00/i.test(text)) return JSON.parse(text);
    return JSON.parse(text, (k: string, v: unknown) => { if (k === '__proto__') throw new SyntaxError('the key __proto__ is not accepted'); return v; });
  } catch (e) {
    throw over(`malformed request body: ${(e as Error).message}`);
  }
}
