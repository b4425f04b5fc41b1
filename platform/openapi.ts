// joi -> JSON Schema (OpenAPI 3.0 flavour), so the schemas that validate requests also describe them.
import type Joi from 'joi';

/** What this converter reads of joi's describe() output (joi's own Description type leaves these `any`). */
interface Described {
  type?: string;
  flags?: { description?: string; default?: unknown; presence?: string; unknown?: boolean; only?: boolean };
  rules?: { name: string; args: { limit?: number; regex?: string } }[];
  keys?: Record<string, Described>;
  patterns?: { rule: Described }[];
  dependencies?: { rel: string; peers: string[] }[];
  items?: Described[];
  matches?: Branch[];
  whens?: Branch[];
  allow?: unknown[];
}
/** A conditional's choices: a plain choice (`schema`), then/otherwise, or switch cases. */
interface Branch { schema?: Described; then?: Described; otherwise?: Described; switch?: { then?: Described; otherwise?: Described }[] }

/** A JSON Schema (OpenAPI 3.0 flavour) node. */
export interface JsonSchema { description?: string; properties?: Record<string, JsonSchema>; required?: string[]; [keyword: string]: unknown }

/** A default joi computes (Joi.ref, a function's result) is described as `{ special: ... }`: no literal value. */
const isSpecial = (v: unknown) => typeof v === 'object' && v !== null && 'special' in v && !!v.special;

/** Request headers a query schema goes with (declareHeaders): every route that takes that query reads them. */
const HEADERS_OF = new WeakMap<Joi.Schema, Joi.ObjectSchema>();

/** Declares the request headers (keyed by their canonical names) that go with `query`, wherever it is used: the
 *  HTTP layer validates them (400 naming the header) and lists them as OpenAPI header parameters. Call it on the
 *  finished schema (a joi method returns a new one, which would not carry them). */
export function declareHeaders<T extends Joi.ObjectSchema>(query: T, headers: Joi.ObjectSchema): T {
  HEADERS_OF.set(query, headers);
  return query;
}

export const headersOf = (query: Joi.Schema | undefined): Joi.ObjectSchema | undefined => (query ? HEADERS_OF.get(query) : undefined);

export function toJsonSchema(schema: Joi.Schema | JsonSchema): JsonSchema {
  const d = (typeof schema.describe === 'function' ? (schema as Joi.Schema).describe() : schema) as Described;
  return convert(d);
}

/** The JSON Schema of one described joi schema: its description and default, its type's keywords, then enum and nullable. */
function convert(d: Described): JsonSchema {
  const out: JsonSchema = {};
  const flags = d.flags || {};
  if (flags.description) out.description = flags.description;
  if (flags.default !== undefined && typeof flags.default !== 'function' && !isSpecial(flags.default)) out.default = flags.default;
  convertType(d, out);
  if (d.allow?.length && flags.only) out.enum = d.allow.filter((v) => v !== null);
  if (d.allow?.includes(null)) out.nullable = true;
  return out;
}

/** Sets the keywords of the schema's joi type on `out` (none for a type without a JSON Schema counterpart). */
function convertType(d: Described, out: JsonSchema) {
  const rules = d.rules || [];
  const rule: RuleOf = (name: string) => rules.find((r) => r.name === name);
  switch (d.type) {
    case 'object': convertObject(d, out); break;
    case 'string': convertString(out, rule); break;
    case 'number': convertNumber(out, rule); break;
    case 'boolean': out.type = 'boolean'; break;
    case 'date': out.type = 'string'; out.format = 'date-time'; break;
    case 'array': convertArray(d, out, rule); break;
    case 'alternatives':
    case 'any': {
      // Joi.alternatives() lists its choices under matches; Joi.when() on a key puts them under whens.
      const alts = branches([...(d.matches || []), ...(d.whens || [])]);
      if (alts.length) out.oneOf = alts;
      break;
    }
  }
}

/** A described schema's rule by name (undefined when it has none). */
type RuleOf = (name: string) => NonNullable<Described['rules']>[number] | undefined;

/** Sets an object's keywords on `out`: properties, required, additionalProperties and an xor as oneOf. */
function convertObject(d: Described, out: JsonSchema) {
  const flags = d.flags || {};
  out.type = 'object';
  const props: Record<string, JsonSchema> = {};
  const required: string[] = [];
  for (const [k, v] of Object.entries(d.keys || {})) {
    if (v.flags?.presence === 'forbidden') continue; // a field named only to be refused by name (never offered)
    props[k] = convert(v);
    if (v.flags?.presence === 'required') required.push(k);
  }
  if (Object.keys(props).length) out.properties = props;
  if (required.length) out.required = required;
  if (d.patterns?.length) out.additionalProperties = convert(d.patterns[0].rule);
  else out.additionalProperties = flags.unknown === true || !d.keys;
  const xor = (d.dependencies || []).find((x) => x.rel === 'xor');
  if (xor) out.oneOf = xor.peers.map((p) => ({ required: [p] }));
}

/** Sets a string's keywords on `out`: pattern, date-time format, min and max length. */
function convertString(out: JsonSchema, rule: RuleOf) {
  out.type = 'string';
  const pat = rule('pattern');
  if (pat) out.pattern = String(pat.args.regex).replace(/^\/|\/[a-z]*$/g, '');
  if (rule('isoDate')) out.format = 'date-time';
  if (rule('min')) out.minLength = rule('min')!.args.limit;
  if (rule('max')) out.maxLength = rule('max')!.args.limit;
}

/** Sets a number's keywords on `out`: integer or number, minimum and maximum. */
function convertNumber(out: JsonSchema, rule: RuleOf) {
  out.type = rule('integer') ? 'integer' : 'number';
  if (rule('min')) out.minimum = rule('min')!.args.limit;
  if (rule('max')) out.maximum = rule('max')!.args.limit;
}

/** Sets an array's keywords on `out`: items (one schema, or oneOf several), min and max items. */
function convertArray(d: Described, out: JsonSchema, rule: RuleOf) {
  out.type = 'array';
  out.items = d.items?.length === 1 ? convert(d.items[0]) : d.items?.length ? { oneOf: d.items.map(convert) } : {};
  if (rule('min')) out.minItems = rule('min')!.args.limit;
  if (rule('max')) out.maxItems = rule('max')!.args.limit;
}

/** The schemas a conditional can resolve to: plain choices, then/otherwise, and switch cases. */
function branches(conds: Branch[]): JsonSchema[] {
  const out: JsonSchema[] = [];
  for (const c of conds) {
    for (const s of [c.schema, c.then, c.otherwise]) if (s) out.push(convert(s));
    for (const s of c.switch || []) for (const x of [s.then, s.otherwise]) if (x) out.push(convert(x));
  }
  return out;
}
