// libvirt XML in and out through fast-xml-parser: documents are parsed into plain objects (attributes as
// "@_name", text as "#text" when an element also has attributes) and built back from objects, so every value
// a user gives is escaped by the builder and never spliced into XML text.
import { XMLBuilder, XMLParser } from 'fast-xml-parser';

const OPTS = { ignoreAttributes: false, attributeNamePrefix: '@_' } as const;
const parser = new XMLParser({ ...OPTS, parseTagValue: false, parseAttributeValue: false, trimValues: true });
const builder = new XMLBuilder({ ...OPTS, suppressEmptyNode: true, format: true });

/** One parsed element. With parseTagValue and parseAttributeValue off every leaf is a string: a text-only element
 *  comes as its text (an empty one as ""), one with attributes or children as an object of "@_name" attributes,
 *  "#text" and child elements by tag name, and a repeated element as an array. */
export type XmlValue = string | XmlNode | XmlValue[];
export interface XmlNode { '#text'?: string; [attr: `@_${string}`]: string | undefined; [name: string]: XmlValue | undefined }

/** An element read for its attributes and text. An element with neither comes as "" from the parser: reading an
 *  attribute off it gives undefined, as the type says. */
export interface XmlAttrs { [attr: `@_${string}`]: string | undefined; '#text'?: string }

/** One or many of an element, as the parser gives a tag that may repeat. */
export type Many<T> = T | T[];

/** Parses a document into the shape `T` the caller declares for it (the parser's own result is `any`). */
export function parseXml<T = XmlNode>(text: string): T {
  return parser.parse(text) as T;
}

/** Builds XML from a plain object (attributes as "@_name", text as "#text"); the builder takes any object. */
export function buildXml(doc: object): string {
  return builder.build(doc);
}

/** An element that may appear once or many times, always as an array. */
export function list<T = XmlNode>(v: T | T[] | undefined): T[] {
  return v === undefined || v === null ? [] : Array.isArray(v) ? v : [v];
}

/** The text of an element parsed with or without attributes. */
export function text(v: XmlValue | XmlAttrs | undefined): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v === 'string') return v;
  return Array.isArray(v) ? undefined : v['#text'];
}

/** libvirt sizes (memory, capacity) with their unit attribute, in bytes. */
const UNITS: Record<string, number> = { b: 1, bytes: 1, k: 1024, kib: 1024, kb: 1000, m: 1024 ** 2, mib: 1024 ** 2, mb: 1e6, g: 1024 ** 3, gib: 1024 ** 3,
  gb: 1e9, t: 1024 ** 4, tib: 1024 ** 4, tb: 1e12 };
export function sizeBytes(v: XmlValue | XmlAttrs | undefined, defaultUnit = 'b'): number | undefined {
  const t = text(v);
  if (t === undefined) return undefined;
  const unit = (typeof v === 'object' && !Array.isArray(v) && v['@_unit']) || defaultUnit;
  return Number(t) * (UNITS[unit.toLowerCase()] ?? 1);
}
