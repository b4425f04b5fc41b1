import Joi from 'joi';
import { refusePattern } from '../../platform/linear-regex';

export const isoTimestamp = Joi.string().isoDate();
export const jobId = Joi.string().pattern(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/)
  .messages({ 'string.pattern.base': '{{#label}} must be 1-128 characters of letters, digits, ".", "_" or "-", starting with a letter or digit' });
export const workerId = Joi.string().pattern(/^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$/)
  .messages({ 'string.pattern.base': '{{#label}} must be 1-128 characters of letters, digits, ".", "_", ":", "@" or "-"' });
export const absolutePath = Joi.string().pattern(/^\//).max(4096)
  .messages({ 'string.pattern.base': '{{#label}} must be an absolute path' });
export const DISK_FORMATS = ['vmdk', 'qcow2', 'raw', 'vhd', 'vhdx', 'vdi'] as const;
export const OUTPUT_FORMATS = ['qcow2', 'raw', 'vdi'] as const;
/** The file extension of an output Ferry names itself (docs/pipeline.md: output names): the format's own name,
 *  so a raw output is `.raw` (never `.img`) whether a convert job, a migration or an import wrote it. */
export function outputExtension(format: string): string {
  return format;
}

/** A regular expression given as a string (a serial-console pattern), run on the linear-time engine
 *  (platform/linear-regex.ts): refused with the parser's message, or when that engine cannot run it. */
export const regexString = Joi.string().max(500).custom((v: string, h) => {
  const r = refusePattern(v);
  // V8's message quotes the pattern: kept out of the joi template, which would read braces in it.
  return r ? h.message({ custom: `{{#label}} ${r.replace(/[{}]/g, '')}` }) : v;
});

const U64_MAX = 18446744073709551615n;
/** A Redis stream id ("ms-seq", each part a 64-bit unsigned integer), as SSE sends it in id: and clients return
 *  it in Last-Event-ID or after_id. Anything else is refused before it reaches Redis. */
export function isStreamId(s: string): boolean {
  const m = /^(\d{1,20})-(\d{1,20})$/.exec(s);
  return !!m && BigInt(m[1]) <= U64_MAX && BigInt(m[2]) <= U64_MAX;
}
/** Whether `s` is the largest stream id: no event can come after it, and Redis refuses an exclusive range from it
 *  ("invalid start ID for the interval"). */
export function isLastStreamId(s: string): boolean {
  const m = /^(\d{1,20})-(\d{1,20})$/.exec(s);
  return !!m && BigInt(m[1]) === U64_MAX && BigInt(m[2]) === U64_MAX;
}
export const streamId = Joi.string().max(41).custom((v: string, h) => (isStreamId(v) ? v : h.error('streamId.invalid')))
  .messages({ 'streamId.invalid': '{{#label}} must be an event id such as 1700000000000-0 (two unsigned 64-bit integers)' });
