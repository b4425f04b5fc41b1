// libvirt XML in and out through fast-xml-parser: documents are parsed into plain objects (attributes as
// "@_name", text as "#text" when an element also has attributes) and built back from objects, so every value
// a user gives is escaped by the builder and never spliced into XML text.
import { XMLBuilder, XMLParser } from 'fast-xml-parser';

const OPTS = { ignoreAttributes: false, attributeNamePrefix: '@_' } as const;
const parser = new XMLParser({ ...OPTS, parseTagValue: false, parseAttributeValue: false, trimValues: true });
const builder = new XMLBuilder({ ...OPTS, suppressEmptyNode: true, format: true });

export type XmlNode = Record<string, any>;

export function parseXml(text: string): XmlNode {
  return parser.parse(text);
}

export function buildXml(doc: XmlNode): string {
  return builder.build(doc);
}

/** An element that may appear once or many times, always as an array. */
export function list<T = XmlNode>(v: T | T[] | undefined): T[] {
  return v === undefined || v === null ? [] : Array.isArray(v) ? v : [v];
}

/** The text of an element parsed with or without attributes. */
export function text(v: any): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v === 'object') return v['#text'] !== undefined ? String(v['#text']) : undefined;
  return String(v);
}

/** libvirt sizes (memory, capacity) with their unit attribute, in bytes. */
const UNITS: Record<string, number> = { b: 1, bytes: 1, k: 1024, kib: 1024, kb: 1000, m: 1024 ** 2, mib: 1024 ** 2, mb: 1e6, g: 1024 ** 3, gib: 1024 ** 3, gb: 1e9, t: 1024 ** 4, tib: 1024 ** 4, tb: 1e12 };
export function sizeBytes(v: any, defaultUnit = 'b'): number | undefined {
  const t = text(v);
  if (t === undefined) return undefined;
  const unit = (typeof v === 'object' && v['@_unit']) || defaultUnit;
  return Number(t) * (UNITS[String(unit).toLowerCase()] ?? 1);
}
