import Joi from 'joi';

export const isoTimestamp = Joi.string().isoDate();
export const jobId = Joi.string().pattern(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/)
  .messages({ 'string.pattern.base': '{{#label}} must be 1-128 characters of letters, digits, ".", "_" or "-", starting with a letter or digit' });
export const workerId = Joi.string().pattern(/^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$/)
  .messages({ 'string.pattern.base': '{{#label}} must be 1-128 characters of letters, digits, ".", "_", ":", "@" or "-"' });
export const absolutePath = Joi.string().pattern(/^\//).max(4096)
  .messages({ 'string.pattern.base': '{{#label}} must be an absolute path' });
export const DISK_FORMATS = ['vmdk', 'qcow2', 'raw', 'vhd', 'vhdx', 'vdi'] as const;
export const OUTPUT_FORMATS = ['qcow2', 'raw', 'vdi'] as const;

/** A regular expression given as a string (a serial-console pattern): refused with the parser's message. */
export const regexString = Joi.string().max(500).custom((v: string, h) => {
  try { new RegExp(v); return v; } catch (e) { return h.message({ custom: `{{#label}} is not a regular expression: ${(e as Error).message}` }); }
});
