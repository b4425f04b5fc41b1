// joi -> JSON Schema (OpenAPI 3.0 flavour), so the schemas that validate requests also describe them.
import type Joi from 'joi';

type D = Record<string, any>;

export function toJsonSchema(schema: Joi.Schema | D): D {
  const d: D = typeof (schema as any).describe === 'function' ? (schema as Joi.Schema).describe() : schema;
  return convert(d);
}

function convert(d: D): D {
  const out: D = {};
  const flags = d.flags || {};
  if (flags.description) out.description = flags.description;
  if (flags.default !== undefined && typeof flags.default !== 'function' && !(flags.default && flags.default.special)) out.default = flags.default;
  const rules: D[] = d.rules || [];
  const rule = (name: string) => rules.find((r) => r.name === name);
  switch (d.type) {
    case 'object': {
      out.type = 'object';
      const props: D = {};
      const required: string[] = [];
      for (const [k, v] of Object.entries<D>(d.keys || {})) {
        props[k] = convert(v);
        if (v.flags?.presence === 'required') required.push(k);
      }
      if (Object.keys(props).length) out.properties = props;
      if (required.length) out.required = required;
      if (d.patterns?.length) out.additionalProperties = convert(d.patterns[0].rule);
      else out.additionalProperties = flags.unknown === true || !d.keys;
      const xor = (d.dependencies || []).find((x: D) => x.rel === 'xor');
      if (xor) out.oneOf = xor.peers.map((p: string) => ({ required: [p] }));
      break;
    }
    case 'string': {
      out.type = 'string';
      const pat = rule('pattern');
      if (pat) out.pattern = String(pat.args.regex).replace(/^\/|\/[a-z]*$/g, '');
      if (rule('isoDate')) out.format = 'date-time';
      if (rule('min')) out.minLength = rule('min')!.args.limit;
      if (rule('max')) out.maxLength = rule('max')!.args.limit;
      break;
    }
    case 'number': {
      out.type = rule('integer') ? 'integer' : 'number';
      if (rule('min')) out.minimum = rule('min')!.args.limit;
      if (rule('max')) out.maximum = rule('max')!.args.limit;
      break;
    }
    case 'boolean': out.type = 'boolean'; break;
    case 'date': out.type = 'string'; out.format = 'date-time'; break;
    case 'array': {
      out.type = 'array';
      out.items = d.items?.length === 1 ? convert(d.items[0]) : d.items?.length ? { oneOf: d.items.map(convert) } : {};
      if (rule('min')) out.minItems = rule('min')!.args.limit;
      if (rule('max')) out.maxItems = rule('max')!.args.limit;
      break;
    }
    case 'alternatives':
    case 'any': {
      // Joi.alternatives() lists its choices under matches; Joi.when() on a key puts them under whens.
      const alts = branches([...(d.matches || []), ...(d.whens || [])]);
      if (alts.length) out.oneOf = alts;
      break;
    }
  }
  if (d.allow?.length && flags.only) out.enum = d.allow.filter((v: unknown) => v !== null);
  if (d.allow?.includes(null)) out.nullable = true;
  return out;
}

/** The schemas a conditional can resolve to: plain choices, then/otherwise, and switch cases. */
function branches(conds: D[]): D[] {
  const out: D[] = [];
  for (const c of conds) {
    for (const s of [c.schema, c.then, c.otherwise]) if (s) out.push(convert(s));
    for (const s of c.switch || []) for (const x of [s.then, s.otherwise]) if (x) out.push(convert(x));
  }
  return out;
}
