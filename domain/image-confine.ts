// The image rule (docs/security.md, Storage roots): before any tool opens an input image, its header is read by
// Ferry (domain/image-format.ts), its format must be the one the request names, and every file it references
// (backing files, data files, extents, parents, recursively) must resolve inside an input root. Protocol and
// json: names are always refused. A backing file whose format the header does not record is refused: qemu would
// probe it. One check for the gateway, the daemon and the workers; each renders a refusal its own way.
import { promises as fs } from 'node:fs';
import { ApiError, fieldError, OperationError } from '../platform/errors';
import { inspectImage, OPENED_FORMATS, qemuFormat, type ImageRef } from './image-format';
import { configuredRoots, refusal, type Roots } from '../platform/roots';

/** Longest chain followed (qemu has no bound of its own that would stop a loop of names). */
export const MAX_CHAIN = 16;

export interface ImageLayer { file: string; format: string; refs: ImageRef[] }
/** What a tool may open: the top's format (qemu's name) and every layer, top first. */
export interface ConfinedImage { format: string; layers: ImageLayer[]; references: string[] }

export class ImageRefused extends Error {}

/** qemu treats a name with a colon before any slash as `protocol:...` (nbd:, http:, ssh:, json:, file:...). */
export const isProtocolName = (name: string) => /^[^/]*:/.test(name);

/** A reference as qemu combines it: absolute as it is, relative to the referencing name's directory, joined as
 *  text (not normalised: `link/..` must go where the kernel takes it, which realpath then follows). */
function combine(from: string, name: string) {
  return name.startsWith('/') ? name : from.slice(0, from.lastIndexOf('/') + 1) + name;
}

async function checkRef(from: string, ref: ImageRef, roots: Roots): Promise<string> {
  const what = `${from}: its ${ref.kind} "${ref.name.slice(0, 200)}"`;
  if (!ref.name) throw new ImageRefused(`${what} is empty`);
  if (isProtocolName(ref.name)) throw new ImageRefused(`${what} is a protocol or json: name, which is never accepted`);
  const named = combine(from, ref.name);
  const real = await fs.realpath(named).catch(() => null);
  if (!real) throw new ImageRefused(`${what} does not exist (${named})`);
  const r = await refusal({ field: ref.kind, path: real, kind: 'input' }, roots, { mustExist: true });
  if (r.reason) throw new ImageRefused(`${what}${real !== named ? ` resolves to ${real}, which` : ''} is refused: ${r.reason}`);
  return named;
}

/** Walks `file` (a path already confined) and everything it references; throws ImageRefused naming the file. */
export async function confineImage(file: string, format: string | undefined, roots: Roots = configuredRoots()): Promise<ConfinedImage> {
  const layers: ImageLayer[] = [];
  const references: string[] = [];
  const seen = new Set<string>();
  type Step = { file: string; format?: string; what: string };
  let cur: Step | undefined = { file, format: format && qemuFormat(format), what: 'the request names it' };
  while (cur) {
    if (layers.length >= MAX_CHAIN) throw new ImageRefused(`${file}: its chain is longer than ${MAX_CHAIN} images`);
    const at = cur.file;
    // Gone or unreadable since it was checked (a file swapped for a FIFO, say): refused like any bad image.
    const unreadable = (e: Error): never => { throw new ImageRefused(`${at} cannot be read: ${e.message}`); };
    const real = await fs.realpath(at).catch(unreadable);
    if (seen.has(real)) throw new ImageRefused(`${at}: the chain of ${file} loops back to it`);
    seen.add(real);
    const got = await inspectImage(at).catch(unreadable);
    if (got.problem) throw new ImageRefused(`${cur.file}: ${got.problem}`);
    if (cur.format && cur.format !== got.format) throw new ImageRefused(`${cur.file} is ${got.format}, not ${cur.format} as ${cur.what}`);
    if (!OPENED_FORMATS.includes(got.format)) throw new ImageRefused(`${cur.file} is ${got.format}, a format Ferry does not open`);
    if ((got.format === 'vpc' || got.format === 'vhdx') && got.refs.length) {
      // qemu cannot open differencing VHD/VHDX; the names are still checked first, so the refusal says the worst.
      for (const ref of got.refs) await checkRef(cur.file, ref, roots);
      throw new ImageRefused(
        `${cur.file} is a differencing ${got.format === 'vpc' ? 'VHD' : 'VHDX'} (parent "${got.refs[0].name}"), which Ferry does not open; merge it first`);
    }
    layers.push({ file: cur.file, format: got.format, refs: got.refs });
    let next: Step | undefined;
    for (const ref of got.refs) {
      const named = await checkRef(cur.file, ref, roots);
      references.push(named);
      if (!ref.image) continue;
      if (!ref.format) throw new ImageRefused(
        `${cur.file}: its ${ref.kind} "${ref.name}" has no recorded format, so qemu would probe it; recreate the image with its backing format (qemu-img ` +
        `rebase -u -F <format>)`);
      next = { file: named, format: qemuFormat(ref.format), what: `the ${ref.kind} format recorded in ${cur.file} says` };
    }
    cur = next;
  }
  return { format: layers[0].format, layers, references };
}

/** An image a request names: `field` (image.path...), the path as confined, the format the request gives. */
export interface JobImage { field: string; path: string; format?: string; selfContained?: boolean }

async function confineOne(img: JobImage, roots: Roots): Promise<ConfinedImage> {
  const c = await confineImage(img.path, img.format, roots);
  if (img.selfContained && c.references.length) {
    throw new ImageRefused(`${img.path} references ${c.references[0]}; an imported disk must be self-contained (convert it first)`);
  }
  return c;
}

/** At submission: 400 naming every field whose image is refused. Paths not there are left to the roots check. */
export async function checkSubmittedImages(images: JobImage[], roots: Roots = configuredRoots()): Promise<void> {
  const bad: { field: string; message: string }[] = [];
  for (const img of images) {
    const real = await fs.realpath(img.path).catch(() => null);
    if (!real) continue;
    try { await confineOne({ ...img, path: real }, roots); } catch (e) {
      if (!(e instanceof ImageRefused)) throw e;
      bad.push({ field: img.field, message: e.message });
    }
  }
  if (bad.length) throw new ApiError(400, bad.map((b) => `${b.field}: ${b.message}`).join('; '), { fields: bad });
}

/** A daemon route's image: the confined chain, or a 400 naming `field`. */
export async function confineRequestImage(img: JobImage, roots: Roots = configuredRoots()): Promise<ConfinedImage> {
  try { return await confineOne(img, roots); } catch (e) {
    if (e instanceof ImageRefused) throw fieldError(400, img.field, e.message);
    throw e;
  }
}

/** On the worker, right before a tool opens it (`img.path` the resolved path): the job fails, not retried. */
export async function checkRunImage(img: JobImage, roots: Roots = configuredRoots()): Promise<ConfinedImage> {
  try { return await confineOne(img, roots); } catch (e) {
    if (e instanceof ImageRefused) throw new OperationError(`${img.field}: ${e.message}`, false);
    throw e;
  }
}
