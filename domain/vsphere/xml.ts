// SOAP/XML for the vSphere API (vim25): envelopes out, parsed trees in. fast-xml-parser keeps every value a
// string (parseTagValue off) and keeps attributes (a ManagedObjectReference's `type`, an element's `xsi:type`).
import { XMLParser } from 'fast-xml-parser';

export interface MoRef { type: string; value: string }

const parser = new XMLParser({
  ignoreAttributes: false, attributeNamePrefix: '@_', removeNSPrefix: true, parseTagValue: false, parseAttributeValue: false,
  trimValues: true, processEntities: true, htmlEntities: false,
});

/** One parsed element. Every leaf is a string (parseTagValue and parseAttributeValue off): a text-only element
 *  comes as its text, one with attributes or children as an object of "@_name" attributes, "#text" and child
 *  elements by tag name, and a repeated element as an array. */
export type XmlValue = string | XmlNode | XmlValue[];
export interface XmlNode { '#text'?: string; [attr: `@_${string}`]: string | undefined; [name: string]: XmlValue | undefined }

/** An element carrying an xsi:type (a VirtualDevice, its backing, a fault). */
export interface XsiTyped { '@_type'?: string }

/** A parsed document (the parser's own result is `any`; what it builds is always XmlNode's shape). */
export function parseXml(text: string): XmlNode { return parser.parse(text) as XmlNode; }

/** A child element (or attribute) of a parsed element; undefined when v is text, missing or has no such child. */
export function child(v: XmlValue | undefined, name: string): XmlValue | undefined {
  return v && typeof v === 'object' && !Array.isArray(v) ? v[name] : undefined;
}

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
export function arr<T>(v: T | T[] | undefined | null): T[] {
  return v === undefined || v === null || v === '' ? [] : Array.isArray(v) ? v : [v];
}

/** The text of an element that may carry attributes. */
export function text(v: XmlValue | undefined): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v === 'string') return v;
  return Array.isArray(v) ? undefined : v['#text'];
}

export function moref(v: XmlValue | undefined): MoRef | undefined {
  if (!v || typeof v !== 'object' || Array.isArray(v) || v['@_type'] === undefined) return undefined;
  return { type: v['@_type'], value: String(v['#text']) };
}

/** The xsi:type of a polymorphic element (VirtualDisk, VirtualCdrom, ...). */
export const xsiType = (v: XmlValue | XsiTyped | undefined): string | undefined => (v && typeof v === 'object' && !Array.isArray(v) ? v['@_type'] : undefined);

export const num = (v: XmlValue | undefined): number | undefined => { const t = text(v); return t === undefined || t === '' ? undefined : Number(t); };
export const bool = (v: XmlValue | undefined): boolean | undefined => { const t = text(v); return t === undefined ? undefined : t === 'true'; };
