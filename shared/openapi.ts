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
    case 'alternatives': {
      const alts: D[] = [];
      for (const m of d.matches || []) {
        if (m.schema) alts.push(convert(m.schema));
        if (m.then) alts.push(convert(m.then));
        if (m.otherwise) alts.push(convert(m.otherwise));
        for (const s of m.switch || []) {
          if (s.then) alts.push(convert(s.then));
          if (s.otherwise) alts.push(convert(s.otherwise));
        }
      }
      if (alts.length) out.oneOf = alts;
      break;
    }
    case 'any': {
      // Joi.when on a key: describe() puts the alternatives under whens.
      const alts: D[] = [];
      for (const w of d.whens || []) {
        if (w.then) alts.push(convert(w.then));
        if (w.otherwise) alts.push(convert(w.otherwise));
        for (const s of w.switch || []) {
          if (s.then) alts.push(convert(s.then));
          if (s.otherwise) alts.push(convert(s.otherwise));
        }
      }
      if (alts.length) out.oneOf = alts;
      break;
    }
  }
  if (d.allow?.length && flags.only) out.enum = d.allow.filter((v: unknown) => v !== null);
  if (d.allow?.includes(null)) out.nullable = true;
  if (d.type !== 'object' && (d.whens?.length) && d.type !== 'any') {
    // a typed key with conditions (for example image required for some operations): keep the base type
  }
  return out;
}
