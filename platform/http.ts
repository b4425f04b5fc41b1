// The HTTP plumbing both APIs share: routes declared once with their joi schemas (validation + OpenAPI),
// body parsing that answers 400 on bad input, errors in each API's envelope, and request metrics.
import Koa from 'koa';
import Router from '@koa/router';
import bodyParser from 'koa-bodyparser';
import Joi from 'joi';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { ApiError, badRequest, errorText, fieldError } from './errors';
import { checkTree, loadYamlBody, MAX_BODY_BYTES, readBodyText, readJsonBody } from './body-budget';
import { headersOf, toJsonSchema, type JsonSchema } from './openapi';
import { ApiKey, Auth, authorize, Need } from './auth';
import { config } from './config';
import { within } from './health';
import { browserRefusal, browserRule } from './browser';
import { RateLimiter, runAs } from './limits';
import { clientAddress, trustedRanges } from './client-address';
import type { HttpMetrics } from './metrics';
import type { Logger } from './log';
import { AuditLog } from './audit';

export type Method = 'get' | 'post' | 'put' | 'delete';
/** What a handler gets: each part as its route's joi schema gave it (validate() below), so typed as that schema
 *  is (`Joi.object<T>()`; joi's own default leaves it open); without a schema, what the router parsed.
 *  `warnings` collects what the request held that was ignored (the daemon API's unknown fields); a handler
 *  that validates further (a batch's jobs) adds to it. */
export interface Input<P = Record<string, string>, Q = Record<string, unknown>, B = unknown> { params: P; query: Q; body: B; warnings?: string[] }
export interface RouteDef<P = Record<string, string>, Q = Record<string, unknown>, B = unknown> {
  method: Method;
  path: string;
  summary: string;
  tags?: string[];
  params?: Joi.ObjectSchema<P>;
  query?: Joi.ObjectSchema<Q>;
  /** Request headers the route reads, keyed by their canonical names: validated (400 naming the header) and listed
   *  as OpenAPI header parameters. Default: the ones its query schema declares (declareHeaders, platform/openapi.ts). */
  headers?: Joi.ObjectSchema;
  body?: Joi.Schema<B>;
  bodyRequired?: boolean;
  requestTypes?: string[];
  /** Who may call it (platform/auth.ts), declared by every route: there is no default (docs/security.md). */
  role: Need;
  /** What the audit log keeps of it (docs/security.md "Audit log"): every state change by default; `refusals` for a
   *  worker's routine report (heartbeat, progress event, lease renewal), kept only when refused, rejected or failed,
   *  since a fleet's reports would push the operators' own records out of the capped log; the request metrics
   *  (svc_api_requests_total) count the rest. */
  audit?: 'refusals';
  /** `schema`: a joi schema, or a JSON Schema written out (shown as it is). */
  responses: Record<number, { description: string; schema?: Joi.Schema | JsonSchema; type?: string }>;
  handler: (ctx: Koa.Context, input: Input<P, Q, B>) => unknown; // the body, or a promise of it
}

/** A route as the API lists it, whatever its input types. */
export type DeclaredRoute = Omit<RouteDef, 'params' | 'query' | 'body' | 'handler'> & { params?: Joi.ObjectSchema<unknown>; query?: Joi.ObjectSchema<unknown>;
  body?: Joi.Schema<unknown> };

/** The declared headers' values in a request (absent and empty ones left out), under their canonical names. */
function pickHeaders(ctx: Koa.Context, names: string[]): Record<string, string> {
  return Object.fromEntries(names.map((n): [string, string] => [n, ctx.get(n)]).filter(([, v]) => v !== ''));
}

/** A joi result: checked, not typed yet (the caller of validate() names its type). */
type Checked = { error?: Joi.ValidationError; value: unknown };
const VALIDATION = { abortEarly: false, convert: true, errors: { wrap: { label: '"' } } } as const;

/** Removes the value at `path` (a joi error path) from `obj`. */
function dropPath(obj: unknown, path: (string | number)[]) {
  let o = obj;
  for (const k of path.slice(0, -1)) { if (o === null || typeof o !== 'object') return; o = (o as Record<string | number, unknown>)[k]; }
  if (o !== null && typeof o === 'object') delete (o as Record<string | number, unknown>)[path[path.length - 1]];
}

/** Validates one part of a request; a 400 names every offending field (by its path, prefixed with `prefix` when
 *  the value sits inside a larger body, such as jobs[2]), in `fields` and in the message. With `warnings`, fields
 *  the schema does not know are dropped and listed there instead of refused (the daemon API's rule). */
export function validate<T = unknown>(schema: Joi.Schema, value: unknown, where: string, prefix = '', warnings?: string[]): T {
  const name = (d: Joi.ValidationErrorItem) => [prefix, d.path.join('.')].filter(Boolean).join('.') || where;
  let { error, value: v } = schema.validate(value, VALIDATION) as Checked;
  // Dropping a field can let a schema look deeper (an alternative now matches) and find more: a few rounds.
  const copy = error && warnings ? structuredClone(value) : value;
  for (let round = 0; round < 4 && error && warnings && error.details.every((d) => d.type === 'object.unknown'); round++) {
    for (const d of error.details) { dropPath(copy, d.path); warnings.push(`${name(d)}: unknown field, ignored`); }
    ({ error, value: v } = schema.validate(copy, VALIDATION) as Checked);
  }
  if (error) {
    const unknownIgnored = warnings ? error.details.filter((d) => d.type !== 'object.unknown') : error.details;
    const fields = (unknownIgnored.length ? unknownIgnored : error.details).map((d) => {
      const field = name(d);
      // A schema's label (e.g. "ExportJob") can stand where the field's name would: the message must name it.
      return { field, message: d.message.includes(field) ? d.message : `${field}: ${d.message}` };
    });
    throw new ApiError(400, `invalid ${prefix || where}: ${fields.map((f) => f.message).join('; ')}`, { fields });
  }
  return v as T;
}

export interface ApiOptions {
  prefixes?: string[];
  /** 'reject' (400 naming the field) or 'warn' (ignored, listed in the answer's `warnings`). */
  unknownFields?: 'reject' | 'warn';
  /** Body types of the routes that do not name their own (`requestTypes`); default JSON only. */
  requestTypes?: string[];
}

export { MAX_BODY_BYTES };
const YAML_TYPES = /^(application|text)\/(x-)?yaml\b/i;
const bodyError = (status: number, message: string) => fieldError(status, 'body', message);
const tooLarge = () => bodyError(413, `larger than ${MAX_BODY_BYTES / 1024 / 1024} MiB`);

/** A YAML body within the budgets of platform/body-budget.ts (an empty one is {}). */
async function readYaml(req: IncomingMessage): Promise<unknown> {
  return loadYamlBody(await readBodyText(req));
}

export class Api {
  /** The routes as declared, for the OpenAPI document (their handlers are each wrapped in add()). */
  readonly routes: DeclaredRoute[] = [];
  readonly router = new Router();
  private needs = new Map<string, Need>();
  private prefixes: string[];
  private unknownFields: 'reject' | 'warn';
  private requestTypes: string[];
  private yamlRoutes = new Set<string>();
  private auditRefusalsOnly = new Set<string>();
  /** Methods of each parameter-free path, so that a path such as /jobs/submit is not taken for /jobs/:id by a
   *  method it does not have (a 405, not a 404 for a job called "submit"). */
  private literals = new Map<string, Set<string>>();

  constructor(opts: ApiOptions = {}) {
    this.prefixes = opts.prefixes || [''];
    this.unknownFields = opts.unknownFields || 'reject';
    this.requestTypes = opts.requestTypes || ['application/json'];
  }

  /** "METHOD /declared/path" of the route matching this request, or undefined (404/405 follow). */
  private routeOf(method: string, path: string): string | undefined {
    const m = method === 'HEAD' ? 'GET' : method;
    const layer = this.router.match(path, m).pathAndMethod.find((l) => l.methods.length);
    return layer && `${m} ${layer.path}`;
  }

  /** The declared path (with its prefix) of the route matching this request, found before the router runs (a
   *  request refused by authentication still names its route). */
  patternOf(method: string, path: string): string | undefined {
    return this.routeOf(method, path)?.split(' ')[1];
  }

  /** The role the route matching this request needs, or undefined when no route matches (404/405 follow). */
  needOf(method: string, path: string): Need | undefined {
    const r = this.routeOf(method, path);
    return r ? this.needs.get(r) : undefined;
  }

  /** Whether the audit log keeps only the refused, rejected or failed requests of this route (RouteDef.audit). */
  auditsRefusalsOnly(method: string, path: string): boolean {
    const r = this.routeOf(method, path);
    return !!r && this.auditRefusalsOnly.has(r);
  }

  /** Whether the route matching this request takes a YAML body (its requestTypes name one). */
  takesYaml(method: string, path: string): boolean {
    const r = this.routeOf(method, path);
    return !!r && this.yamlRoutes.has(r);
  }

  add<P = Record<string, string>, Q = Record<string, unknown>, B = unknown>(def: RouteDef<P, Q, B>) {
    // A route without a role would be reachable by whatever a default said: refused at registration instead.
    if (!def.role) throw new Error(`route ${def.method.toUpperCase()} ${def.path} declares no role (RouteDef.role)`);
    if (def.body && !def.requestTypes) def.requestTypes = this.requestTypes;
    def.headers ??= headersOf(def.query);
    const headerNames = Object.keys((def.headers?.describe() as { keys?: Record<string, unknown> } | undefined)?.keys ?? {});
    this.routes.push(def);
    const yamlBody = !!def.requestTypes?.some((t) => YAML_TYPES.test(t));
    const literal = !def.path.includes(':');
    for (const prefix of this.prefixes) {
      this.needs.set(`${def.method.toUpperCase()} ${prefix + def.path}`, def.role);
      if (yamlBody) this.yamlRoutes.add(`${def.method.toUpperCase()} ${prefix + def.path}`);
      if (def.audit === 'refusals') this.auditRefusalsOnly.add(`${def.method.toUpperCase()} ${prefix + def.path}`);
      if (literal) {
        const set = this.literals.get(prefix + def.path) || new Set<string>();
        set.add(def.method.toUpperCase());
        if (def.method === 'get') set.add('HEAD');
        this.literals.set(prefix + def.path, set);
      }
      this.router[def.method](prefix + def.path, async (ctx) => {
        const shadowed = !literal && this.literals.get(ctx.path.replace(/\/+$/, ''));
        if (shadowed) throw methodNotAllowed(ctx.method, ctx.path, [...shadowed]);
        const warnings = this.unknownFields === 'warn' ? [] as string[] : undefined;
        // Without a schema a part is what the router parsed: P and Q are then their defaults (strings, the query).
        if (def.headers) validate(def.headers, pickHeaders(ctx, headerNames), 'headers');
        const input: Input<P, Q, B | undefined> = {
          params: def.params ? validate<P>(def.params, ctx.params, 'path parameters') : ctx.params as P,
          query: def.query ? validate<Q>(def.query, ctx.query, 'query', '', warnings) : ctx.query as Q,
          body: undefined,
          warnings,
        };
        if (def.body) {
          const empty = emptyBody(ctx);
          if (empty && def.bodyRequired !== false) throw badRequest('request body is required (JSON)');
          input.body = validate<B>(def.body, empty ? {} : ctx.request.body, 'body', '', warnings);
        }
        const out = await def.handler(ctx, input as Input<P, Q, B>); // body is set whenever the route has a body schema (else B is unknown)
        if (out !== undefined) ctx.body = withWarnings(out, warnings);
      });
    }
    return this;
  }

  openapi(info: { title: string; version: string; description?: string }, servers: string[] = []): Record<string, unknown> {
    const paths: Record<string, Record<string, unknown>> = {};
    for (const r of this.routes) {
      const p = r.path.replace(/:([A-Za-z_]+)/g, '{$1}');
      const op: Record<string, unknown> = { summary: r.summary, tags: r.tags,
        operationId: `${r.method}${p.replace(/[{}]/g, '').replace(/[^A-Za-z0-9]+(.)?/g, (_: string, c: string | undefined) => (c ? c.toUpperCase() : ''))}` };
      const parameters: Record<string, unknown>[] = [];
      for (const [where, schema] of [['path', r.params], ['query', r.query], ['header', r.headers]] as const) {
        if (!schema) continue;
        const js = toJsonSchema(schema);
        for (const [name, s] of Object.entries(js.properties || {})) {
          parameters.push({ name, in: where, required: where === 'path' || (js.required || []).includes(name), schema: s, description: s.description });
        }
      }
      if (parameters.length) op.parameters = parameters;
      const need = r.role;
      op.security = need === 'public' ? [] : [{ apiKey: [] }, { bearer: [] }];
      op['x-ferry-role'] = need;
      if (r.audit) op['x-ferry-audit'] = r.audit;
      if (r.body) {
        const schema = toJsonSchema(r.body);
        op.requestBody = { required: r.bodyRequired !== false, content: Object.fromEntries(
          (r.requestTypes || ['application/json']).map((t) => [t, { schema }])) };
      }
      op.responses = Object.fromEntries(Object.entries(r.responses).map(([code, resp]) => [code, {
        description: resp.description,
        ...(resp.schema ? { content: { [resp.type || 'application/json']: {
          schema: Joi.isSchema(resp.schema) ? toJsonSchema(resp.schema) : resp.schema } } } : {}),
      }]));
      (paths[p] ||= {})[r.method] = op;
    }
    return {
      openapi: '3.0.3', info, servers: servers.map((url) => ({ url })), paths,
      components: { securitySchemes: { apiKey: { type: 'apiKey', in: 'header', name: 'X-API-Key' }, bearer: { type: 'http', scheme: 'bearer' } } },
    };
  }
}

export function methodNotAllowed(method: string, path: string, allow: string[]) {
  const list = [...new Set(allow)].sort();
  return new ApiError(405, `method ${method} is not allowed on ${path.slice(0, 256)} (allowed: ${list.join(', ')})`, { allow: list.join(', ') });
}

/** A thrown value as read here: usually an Error (name, message), a Koa/HTTP error (status, expose, code) or an
 *  ApiError (`details`: methodNotAllowed's `allow`, rateLimit's `retryAfter`); anything can be thrown, so the
 *  rest stays unknown and each use checks or stringifies it. */
type Thrown = { name?: string; message?: string; status?: unknown; code?: unknown; expose?: unknown; stack?: unknown;
  details?: { allow?: string; retryAfter?: number } } | null | undefined;

/** Redis refused or is unreachable (a failover, a restart): the caller may retry, so 503 rather than 500. */
export function isStorageError(err: unknown): boolean {
  const e = err as Thrown;
  const name = String(e?.name || '');
  return ['ReplyError', 'MaxRetriesPerRequestError', 'ClusterAllFailedError', 'AbortError'].includes(name)
    || /Connection is closed|ECONNREFUSED|ECONNRESET|Cluster redirections|CLUSTERDOWN|LOADING|MOVED|TRYAGAIN/.test(String(e?.message || ''));
}

/** What a 503 says when Redis is away: never Redis's own error text (it may name hosts or internals). */
export const STORAGE_RETRY = 'storage is unavailable for the moment; retry in a few seconds';

export interface AppOptions {
  log: Logger;
  metrics?: HttpMetrics;
  /** Renders an error in the API's own envelope. */
  envelope: (status: number, message: string, path: string, details?: unknown) => unknown;
  bodyTypes?: { json?: string[]; text?: string[] };
  /** API keys; each route's `role` is enforced before the body is read. The caller's key is ctx.state.apiKey. */
  auth: Auth;
  /** Where requests that change state, and refused ones, are recorded (platform/audit.ts). */
  audit?: AuditLog;
  /** The address the service listens on: a name the browser rule (platform/browser.ts) accepts in Host. */
  listenHost?: string;
  /** Requests per caller, shared across replicas (platform/limits.ts); none when absent. */
  limiter?: RateLimiter;
  /** Public files (the daemon's dashboard and Swagger UI): run after the browser rule and CORS, before
   *  authentication and the rate limit. They need no role, read no body and hold no data, and a file found there
   *  answers before any route is matched; not counting them keeps a page load off Redis (docs/security.md). */
  publicFiles?: Koa.Middleware[];
}

const CORS_HEADERS = 'Content-Type, Authorization, X-API-Key, Last-Event-ID, X-VSphere-Username, X-VSphere-Password';
const CORS_METHODS = 'GET, POST, PUT, DELETE, OPTIONS';

/** CORS for the origins in FERRY_CORS_ORIGINS (none by default): an allowed origin gets its
 *  Access-Control-Allow-Origin; a preflight is answered here (204, or 403 naming the Origin), before any
 *  authentication (browsers send preflights without credentials). Returns true when it answered. */
function cors(ctx: Koa.Context, origins: string[]): boolean {
  const origin = ctx.get('Origin');
  if (!origin) return false;
  const allowed = origins.includes('*') || origins.includes(origin.replace(/\/+$/, ''));
  ctx.vary('Origin');
  if (allowed) {
    ctx.set('Access-Control-Allow-Origin', origin);
    ctx.set('Access-Control-Expose-Headers', 'Allow, WWW-Authenticate, Retry-After, X-RateLimit-Limit, X-RateLimit-Remaining');
  }
  if (ctx.method !== 'OPTIONS' || !ctx.get('Access-Control-Request-Method')) return false;
  if (!allowed) throw fieldError(403, 'Origin', 'not in FERRY_CORS_ORIGINS', `Origin ${origin.slice(0, 256)} is not allowed (FERRY_CORS_ORIGINS)`);
  ctx.set('Access-Control-Allow-Methods', CORS_METHODS);
  ctx.set('Access-Control-Allow-Headers', CORS_HEADERS);
  ctx.set('Access-Control-Max-Age', '600');
  ctx.status = 204;
  return true;
}

let rateLimitDownLogged = 0;
/** A count the request waits for gets a second with Redis away, then the request goes on without it. */
const COUNT_WAIT_MS = 1000;
/** Counts the request; over the limit a 429 with Retry-After. Redis away: the request passes (availability over
 *  the limit), logged at most once a minute. */
async function rateLimit(ctx: Koa.Context, limiter: RateLimiter, who: string, log: Logger) {
  let v;
  try { v = await within(limiter.hit(who), COUNT_WAIT_MS); } catch (e) {
    if (Date.now() - rateLimitDownLogged > 60_000) { rateLimitDownLogged = Date.now(); log.warn(
      'rate limit not counted (Redis unavailable); requests pass unlimited until it answers', { error: (e as Error).message }); }
    return;
  }
  if (!v) return;
  ctx.set('X-RateLimit-Limit', String(v.limit));
  ctx.set('X-RateLimit-Remaining', String(v.remaining));
  if (!v.allowed) {
    ctx.state.refusal = true; // audited with the refusals (AuditLog): a flood of them never evicts accepted records
    throw new ApiError(429,
      `rate limit of ${v.limit} requests per ${limiter.windowSeconds} s reached for this ${who.startsWith('key:') ? 'API key' : 'client address'}: retry in ` +
      `${v.retryAfterSeconds} s`, { retryAfter: v.retryAfterSeconds });
  }
}

/** Counts a refusal (401, 403) against the client address; past its budget (config.refusalLimit per
 *  config.refusalWindowSeconds) the answer is 429 with Retry-After instead. Keys that are accepted are never
 *  counted here, so other clients, and this one with a good key, are not slowed. Redis away: the refusal stands. */
async function refusalBudget(ctx: Koa.Context, refusals: RateLimiter, log: Logger) {
  ctx.state.refusal = true; // the audit keeps it in the refusal stream (platform/audit.ts)
  await countRefusal(ctx.req, refusals, log);
}

/** The refusal budget's count for one refused request, on an API or a plain port (guardPlain): throws the 429. */
async function countRefusal(req: IncomingMessage, refusals: RateLimiter, log: Logger) {
  let v;
  try { v = await within(refusals.hit(`addr:${clientAddress(req)}`), COUNT_WAIT_MS); } catch (e) {
    if (Date.now() - rateLimitDownLogged > 60_000) { rateLimitDownLogged = Date.now(); log.warn('refusal not counted (Redis unavailable); the refusal stands',
      { error: errorText(e) }); }
    return;
  }
  if (v && !v.allowed) throw new ApiError(429,
    `too many refused requests from this client address (${v.limit} per ${refusals.windowSeconds} s, FERRY_REFUSAL_LIMIT): retry in ${v.retryAfterSeconds} s`,
    { retryAfter: v.retryAfterSeconds });
}

// The one inline style any page holds: Swagger UI's logo (an SVG <style> of swagger-ui-dist), allowed by its hash.
const SWAGGER_LOGO_STYLE = "'sha256-RL3ie0nH+Lzz2YNqQN83mnU0J1ot4QL7b99vMdIX99w='";
/** Sent on every answer of both APIs: no page of Ferry may be framed (a framing site could drive the console), and
 *  pages run only their own files (no inline script or style, nothing from elsewhere); docs/security.md. */
export const SECURITY_HEADERS: Record<string, string> = {
  'X-Frame-Options': 'DENY',
  'Content-Security-Policy': `default-src 'self'; script-src 'self'; style-src 'self' ${SWAGGER_LOGO_STYLE}; img-src 'self' data:; font-src 'self'; ` +
                             `connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'`,
  'X-Content-Type-Options': 'nosniff',
  'Referrer-Policy': 'no-referrer',
};

/** A plain node http server that is no koa app (the daemon's and the workers' metrics ports), gated as the APIs
 *  are: `refusals` counts its 401/403 against the client address's refusal budget (the APIs' count, in Redis),
 *  `audit` records them with the APIs' refusals. */
export interface PlainPort {
  auth: Auth; log: Logger; refusals?: RateLimiter; audit?: AuditLog;
  envelope: (status: number, message: string, path: string) => unknown;
}

/** The APIs' SECURITY_HEADERS on a plain port's answer (before anything is written). */
export function plainHeaders(res: ServerResponse): void {
  for (const [k, v] of Object.entries(SECURITY_HEADERS)) res.setHeader(k, v);
}

/** A plain port's request: the APIs' headers, the browser rule, then the role `need`. A refusal (401, 403) counts
 *  against the client address's refusal budget, past which the answer is the APIs' 429 with Retry-After; it is
 *  audited as theirs are. Answers a refusal itself and returns false. */
export async function guardPlain(port: PlainPort, req: IncomingMessage, res: ServerResponse, need: Need): Promise<boolean> {
  plainHeaders(res);
  const browser = browserRefusal(browserRule(config.host), req.method || 'GET', req.headers); // as on the APIs
  const v: { status: number; message?: string } = browser ? { status: browser.status, message: browser.message } : authorize(port.auth, req.headers, need);
  if (v.status === 0) return true;
  let { status } = v;
  let message = v.message || '';
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  // Only the key's refusals are counted, as on the APIs (a browser refusal is answered before authentication).
  if (!browser && port.refusals) {
    try { await countRefusal(req, port.refusals, port.log); } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      status = e.status;
      message = e.message;
      headers['retry-after'] = String((e.details as { retryAfter: number }).retryAfter);
    }
  }
  if (status === 401) headers['www-authenticate'] = 'Bearer';
  const path = (req.url || '/').split('?')[0];
  await port.audit?.plain(req, port.auth, { method: req.method || 'GET', path, status, reason: message })
    .catch((e) => port.log.warn('audit record of a refused metrics request not stored in Redis; its log line stands', { error: errorText(e) }));
  res.writeHead(status, headers);
  res.end(JSON.stringify(port.envelope(status, message, path)));
  return false;
}

/** The outermost middleware: the browser rule and CORS, then every error answered in the API's envelope (a storage
 *  outage as 503), each request measured and, when it changed state or was refused, audited. */
function answerAndRecord(api: Api, opts: AppOptions): Koa.Middleware {
  const origins = config.corsOrigins;
  const browsers = browserRule(opts.listenHost);
  return async (ctx, next) => {
    const started = process.hrtime.bigint();
    const startedMs = Date.now();
    let reason: string | undefined;
    ctx.set(SECURITY_HEADERS);
    try {
      const refused = browserRefusal(browsers, ctx.method, ctx.req.headers);
      if (refused) throw refused;
      if (cors(ctx, origins)) return;
      await next();
      if (ctx.status === 404 && ctx.body === undefined) throw new ApiError(404, `no route for ${ctx.method} ${ctx.path}`);
    } catch (err) {
      reason = answerError(ctx, err, opts);
    } finally {
      const route = ctx._matchedRoute as string | undefined; // set by @koa/router on a matched route
      opts.metrics?.observe(ctx.method, route || 'unmatched', ctx.status, Number(process.hrtime.bigint() - started) / 1e9);
      // Awaited, so the record is in Redis when the caller has its answer; a Redis failure costs only the copy
      // there (the log line is written first).
      // The route's audit setting changes the answer only for a state change that succeeded or a read that failed:
      // the reads that succeed (most requests) skip the route lookup.
      const setting = AuditLog.wanted(ctx.method, ctx.status) ? ctx.status < 400 : ctx.status >= 400;
      const refusalsOnly = setting && api.auditsRefusalsOnly(ctx.method, ctx.path);
      await opts.audit?.request(ctx, opts.auth, startedMs, route ?? api.patternOf(ctx.method, ctx.path), reason,
        refusalsOnly).catch((e) => opts.log.warn('audit record not stored in Redis; its log line stands', { error: errorText(e) }));
    }
  };
}

/** Writes an error as the API's envelope with its status (and Allow, Retry-After); returns the message. */
/** No body sent: nothing parsed, or an empty object from a request without a length. */
function emptyBody(ctx: Koa.Context): boolean {
  const raw: unknown = ctx.request.body;
  return raw === undefined || (typeof raw === 'object' && raw !== null && !Array.isArray(raw) && Object.keys(raw).length === 0 && !ctx.request.length);
}

/** A route's answer with the unknown-field warnings added, when it is a plain object. */
function withWarnings(out: unknown, warnings: string[] | undefined): unknown {
  return warnings?.length && out && typeof out === 'object' && !Array.isArray(out) && !Buffer.isBuffer(out) ? { ...out, warnings } : out;
}

/** The answer's status: an ApiError's own, 503 when storage failed, a thrown 4xx (Koa's, a library's), else 500. */
function statusOf(err: unknown, storage: boolean): number {
  if (err instanceof ApiError) return err.status;
  if (storage) return 503;
  const s = (err as Thrown)?.status;
  return typeof s === 'number' && Number.isInteger(s) && s >= 400 && s < 500 ? s : 500;
}

function answerError(ctx: Koa.Context, err: unknown, opts: AppOptions): string {
  const e = err as Thrown;
  const storage = !(err instanceof ApiError) && isStorageError(err);
  const status = statusOf(err, storage);
  const message = err instanceof ApiError || status < 500 ? String(e?.message || 'request failed') : storage ? STORAGE_RETRY : 'internal error';
  if (status >= 500) opts.log.error('request failed', { method: ctx.method, path: ctx.path, error: e?.stack || String(err) });
  ctx.status = status;
  ctx.body = opts.envelope(status, message, ctx.path, err instanceof ApiError ? err.details : undefined);
  const allow = e?.details?.allow;
  if (status === 405 && allow) ctx.set('Allow', allow);
  const retryAfter = e?.details?.retryAfter;
  if (retryAfter) ctx.set('Retry-After', String(retryAfter));
  return message;
}

/** The route's role checked before anything reads the body; then the rate limit and the caller's spawn caps. */
function authenticate(api: Api, opts: AppOptions): Koa.Middleware {
  const refusals = opts.limiter?.sibling('refusals');
  return async (ctx, next) => {
    const need = api.needOf(ctx.method, ctx.path);
    if (need) {
      const v = authorize(opts.auth, ctx.req.headers, need);
      if (v.status) {
        if (refusals) await refusalBudget(ctx, refusals, opts.log);
        if (v.status === 401) ctx.set('WWW-Authenticate', 'Bearer');
        throw new ApiError(v.status, v.message);
      }
      ctx.state.apiKey = v.key;
    }
    const apiKey = ctx.state.apiKey as ApiKey | null | undefined; // Koa's state is untyped; set just above
    const who = apiKey ? `key:${apiKey.name}` : `addr:${clientAddress(ctx.req)}`;
    // Probes are not rate limited: the limiter counts in Redis, and liveness must answer while Redis does not.
    if (opts.limiter && !(ctx.method === 'GET' && /^(\/api\/v1)?\/(health|livez)\/?$/.test(ctx.path))) await rateLimit(ctx, opts.limiter, who, opts.log);
    // Spawn caps (platform/limits.ts) count what this request starts against its caller.
    await runAs(who, next);
  };
}

/** The one body reader: YAML for the routes that take it, JSON for the rest, both within the budgets of
 *  platform/body-budget.ts (size 413, values, depth, aliases 400, each naming `body`); bodyParser only gives the
 *  other types their empty {}. Whatever was parsed is measured once more as a tree (shared nodes counted once),
 *  before validation walks it. */
function readBody(api: Api, opts: AppOptions): Koa.Middleware[] {
  return [
    async (ctx, next) => {
      if (YAML_TYPES.test(ctx.get('content-type')) && api.takesYaml(ctx.method, ctx.path)) ctx.request.body = await readYaml(ctx.req);
      else if (ctx.request.is('json') && ctx.request.length !== 0) ctx.request.body = await readJsonBody(ctx.req);
      await next();
    },
    bodyParser({
      enableTypes: ['json', ...(opts.bodyTypes?.text ? ['text'] : [])],
      extendTypes: { json: opts.bodyTypes?.json || [], text: opts.bodyTypes?.text || [] },
      jsonLimit: `${MAX_BODY_BYTES}b`,
      textLimit: `${MAX_BODY_BYTES}b`,
      strict: false,
      onerror: (err: Error & { status?: number }) => { throw err?.status === 413 ? tooLarge() : bodyError(400, `malformed request body: ${err.message}`); },
    }),
    async (ctx, next) => {
      checkTree(ctx.request.body);
      await next();
    },
  ];
}

/** After the routes: a known path with another method is a 405 with Allow (an unknown method too, rather than
 *  the router's 501). */
function refuseOtherMethods(api: Api): Koa.Middleware {
  const allowed = api.router.allowedMethods();
  return async (ctx, next) => {
    await allowed(ctx as Parameters<typeof allowed>[0], next); // the router's own context type; Koa's is the same object
    if (ctx.status === 405 || ctx.status === 501) throw methodNotAllowed(ctx.method, ctx.path,
      String(ctx.response.get('Allow') || '').split(/,\s*/).filter(Boolean));
  };
}

/** A koa app with error handling, body parsing and metrics in front of `api`, in this order. */
export function createApp(api: Api, opts: AppOptions): Koa {
  const app = new Koa();
  // ctx.ip would believe anyone's X-Forwarded-For: the client address is clientAddress(), checked here at start.
  app.proxy = false;
  trustedRanges();
  // Errors after the response started (a streamed file): a client that closed the connection is not an error
  // worth a stack trace; anything else is logged as one JSON line instead of Koa's console dump.
  app.on('error', (err: unknown) => {
    const e = err as Thrown;
    if ((typeof e?.code === 'string' && ['ERR_STREAM_PREMATURE_CLOSE', 'ECONNRESET', 'EPIPE', 'ECONNABORTED'].includes(e.code)) || e?.status === 404 ||
      e?.expose) return;
    opts.log.error('response failed', { error: errorText(err) });
  });
  for (const m of [answerAndRecord(api, opts), ...(opts.publicFiles ?? []), authenticate(api, opts), ...readBody(api, opts)]) app.use(m);
  app.use(api.router.routes());
  app.use(refuseOtherMethods(api));
  return app;
}
