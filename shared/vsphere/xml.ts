// SOAP/XML for the vSphere API (vim25): envelopes out, parsed trees in. fast-xml-parser keeps every value a
// string (parseTagValue off) and keeps attributes (a ManagedObjectReference's `type`, an element's `xsi:type`).
import { XMLParser } from 'fast-xml-parser';

export interface MoRef { type: string; value: string }

const parser = new XMLParser({
  ignoreAttributes: false, attributeNamePrefix: '@_', removeNSPrefix: true, parseTagValue: false, parseAttributeValue: false,
  trimValues: true, processEntities: true, htmlEntities: false,
});

export function parseXml(text: string): any { return parser.parse(text); }

export function esc(s: string | number | boolean): string {
  return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&apos;');
}

export const el = (name: string, value: string | number | boolean | undefined) => (value === undefined ? '' : `<${name}>${esc(value)}</${name}>`);
export const ref = (name: string, r: MoRef) => `<${name} type="${esc(r.type)}">${esc(r.value)}</${name}>`;

export function envelope(method: string, thisRef: MoRef, inner = ''): string {
  return '<?xml version="1.0" encoding="UTF-8"?>'
    + '<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
    + `<soapenv:Body><${method} xmlns="urn:vim25">${ref('_this', thisRef)}${inner}</${method}></soapenv:Body></soapenv:Envelope>`;
}

/** Always an array: the parser gives a lone repeated element as an object. */
export function arr<T = any>(v: T | T[] | undefined | null): T[] {
  return v === undefined || v === null || v === '' ? [] : Array.isArray(v) ? v : [v];
}

/** The text of an element that may carry attributes. */
export function text(v: any): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v === 'object') return v['#text'] !== undefined ? String(v['#text']) : undefined;
  return String(v);
}

export function moref(v: any): MoRef | undefined {
  if (!v || typeof v !== 'object' || v['@_type'] === undefined) return undefined;
  return { type: String(v['@_type']), value: String(v['#text']) };
}

/** The xsi:type of a polymorphic element (VirtualDisk, VirtualCdrom, ...). */
export const xsiType = (v: any): string | undefined => (v && typeof v === 'object' ? v['@_type'] : undefined);

export const num = (v: any): number | undefined => { const t = text(v); return t === undefined || t === '' ? undefined : Number(t); };
export const bool = (v: any): boolean | undefined => { const t = text(v); return t === undefined ? undefined : t === 'true'; };
