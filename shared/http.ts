// The HTTP plumbing both APIs share: routes declared once with their joi schemas (validation + OpenAPI),
// body parsing that answers 400 on bad input, errors in each API's envelope, and request metrics.
import Koa from 'koa';
import Router from '@koa/router';
import bodyParser from 'koa-bodyparser';
import Joi from 'joi';
import { ApiError, badRequest } from './errors';
import { toJsonSchema } from './openapi';
import { Auth, authorize, Need } from './auth';
import type { HttpMetrics } from './metrics';
import type { Logger } from './log';

export type Method = 'get' | 'post' | 'put' | 'delete';
export interface Input { params: any; query: any; body: any }
export interface RouteDef {
  method: Method;
  path: string;
  summary: string;
  tags?: string[];
  params?: Joi.ObjectSchema;
  query?: Joi.ObjectSchema;
  body?: Joi.Schema;
  bodyRequired?: boolean;
  requestTypes?: string[];
  /** Who may call it (shared/auth.ts); default read for GET, submit for everything else. */
  role?: Need;
  responses: Record<number, { description: string; schema?: Joi.Schema | Record<string, any>; type?: string }>;
  handler: (ctx: Koa.Context, input: Input) => Promise<unknown> | unknown;
}

const VALIDATION = { abortEarly: false, convert: true, errors: { wrap: { label: '"' } } } as const;

/** Validates one part of a request; a 400 names every offending field. */
export function validate<T = any>(schema: Joi.Schema, value: unknown, where: string): T {
  const { error, value: v } = schema.validate(value, VALIDATION);
  if (error) {
    const fields = error.details.map((d) => ({ field: d.path.join('.') || where, message: d.message }));
    throw new ApiError(400, `invalid ${where}: ${fields.map((f) => f.message).join('; ')}`, { fields });
  }
  return v as T;
}

export class Api {
  readonly routes: RouteDef[] = [];
  readonly router = new Router();
  private needs = new Map<string, Need>();

  constructor(private prefixes: string[] = ['']) {}

  /** The role the route matching this request needs, or undefined when no route matches (404/405 follow). */
  needOf(method: string, path: string): Need | undefined {
    const m = method === 'HEAD' ? 'GET' : method;
    const layer = this.router.match(path, m).pathAndMethod.find((l) => l.methods.length);
    return layer ? this.needs.get(`${m} ${layer.path}`) : undefined;
  }

  add(def: RouteDef) {
    this.routes.push(def);
    for (const prefix of this.prefixes) {
      this.needs.set(`${def.method.toUpperCase()} ${prefix + def.path}`, def.role ?? (def.method === 'get' ? 'read' : 'submit'));
      this.router[def.method](prefix + def.path, async (ctx) => {
        const input: Input = {
          params: def.params ? validate(def.params, ctx.params, 'path parameters') : ctx.params,
          query: def.query ? validate(def.query, ctx.query, 'query') : ctx.query,
          body: undefined,
        };
        if (def.body) {
          const raw = (ctx.request as any).body;
          const empty = raw === undefined || (typeof raw === 'object' && raw !== null && !Array.isArray(raw) && Object.keys(raw).length === 0 && !ctx.request.length);
          if (empty && def.bodyRequired !== false) throw badRequest('request body is required (JSON)');
          input.body = validate(def.body, empty ? {} : raw, 'body');
        }
        const out = await def.handler(ctx, input);
        if (out !== undefined) ctx.body = out;
      });
    }
    return this;
  }

  openapi(info: { title: string; version: string; description?: string }, servers: string[] = []): Record<string, any> {
    const paths: Record<string, any> = {};
    for (const r of this.routes) {
      const p = r.path.replace(/:([A-Za-z_]+)/g, '{$1}');
      const op: Record<string, any> = { summary: r.summary, tags: r.tags, operationId: `${r.method}${p.replace(/[{}]/g, '').replace(/[^A-Za-z0-9]+(.)?/g, (_, c) => (c ? c.toUpperCase() : ''))}` };
      const parameters: any[] = [];
      for (const [where, schema] of [['path', r.params], ['query', r.query]] as const) {
        if (!schema) continue;
        const js = toJsonSchema(schema);
        for (const [name, s] of Object.entries<any>(js.properties || {})) {
          parameters.push({ name, in: where, required: where === 'path' || (js.required || []).includes(name), schema: s, description: s.description });
        }
      }
      if (parameters.length) op.parameters = parameters;
      const need = r.role ?? (r.method === 'get' ? 'read' : 'submit');
      op.security = need === 'public' ? [] : [{ apiKey: [] }, { bearer: [] }];
      op['x-ferry-role'] = need;
      if (r.body) {
        const schema = toJsonSchema(r.body);
        op.requestBody = { required: r.bodyRequired !== false, content: Object.fromEntries((r.requestTypes || ['application/json']).map((t) => [t, { schema }])) };
      }
      op.responses = Object.fromEntries(Object.entries(r.responses).map(([code, resp]) => [code, {
        description: resp.description,
        ...(resp.schema ? { content: { [resp.type || 'application/json']: { schema: Joi.isSchema(resp.schema) ? toJsonSchema(resp.schema as Joi.Schema) : resp.schema } } } : {}),
      }]));
      (paths[p] ||= {})[r.method] = op;
    }
    return {
      openapi: '3.0.3', info, servers: servers.map((url) => ({ url })), paths,
      components: { securitySchemes: { apiKey: { type: 'apiKey', in: 'header', name: 'X-API-Key' }, bearer: { type: 'http', scheme: 'bearer' } } },
    };
  }
}

/** Redis refused or is unreachable (a failover, a restart): the caller may retry, so 503 rather than 500. */
export function isStorageError(err: any): boolean {
  const name = String(err?.name || '');
  return ['ReplyError', 'MaxRetriesPerRequestError', 'ClusterAllFailedError', 'AbortError'].includes(name)
    || /Connection is closed|ECONNREFUSED|ECONNRESET|Cluster redirections|CLUSTERDOWN|LOADING|MOVED|TRYAGAIN/.test(String(err?.message || ''));
}

export interface AppOptions {
  log: Logger;
  metrics?: HttpMetrics;
  /** Renders an error in the API's own envelope. */
  envelope: (status: number, message: string, path: string, details?: unknown) => unknown;
  bodyTypes?: { json?: string[]; text?: string[] };
  /** API keys; each route's `role` is enforced before the body is read. The caller's key is ctx.state.apiKey. */
  auth: Auth;
}

/** A koa app with error handling, body parsing and metrics in front of `api`. */
export function createApp(api: Api, opts: AppOptions): Koa {
  const app = new Koa();
  app.proxy = true;
  app.use(async (ctx, next) => {
    const started = process.hrtime.bigint();
    try {
      await next();
      if (ctx.status === 404 && ctx.body === undefined) throw new ApiError(404, `no route for ${ctx.method} ${ctx.path}`);
    } catch (err: any) {
      const storage = !(err instanceof ApiError) && isStorageError(err);
      const status = err instanceof ApiError ? err.status : storage ? 503 : Number.isInteger(err?.status) && err.status >= 400 && err.status < 500 ? err.status : 500;
      let message = err instanceof ApiError || status < 500 ? String(err.message || 'request failed') : storage ? `storage unavailable, try again: ${err.message}` : 'internal error';
      if (status === 405) message = `method ${ctx.method} is not allowed on ${ctx.path}`;
      if (status >= 500) opts.log.error('request failed', { method: ctx.method, path: ctx.path, error: err?.stack || String(err) });
      ctx.status = status;
      ctx.body = opts.envelope(status, message, ctx.path, err instanceof ApiError ? err.details : undefined);
      if (status === 405 && err.headers?.allow) ctx.set('Allow', err.headers.allow);
    } finally {
      const route = (ctx as any)._matchedRoute as string | undefined;
      opts.metrics?.observe(ctx.method, route || 'unmatched', ctx.status, Number(process.hrtime.bigint() - started) / 1e9);
    }
  });
  // Authentication before anything reads the body (createApp's second middleware; the daemon inserts its own after it).
  app.use(async (ctx, next) => {
    const need = api.needOf(ctx.method, ctx.path);
    if (need) {
      const v = authorize(opts.auth, ctx.req.headers, need);
      if (v.status) {
        if (v.status === 401) ctx.set('WWW-Authenticate', 'Bearer');
        throw new ApiError(v.status, v.message);
      }
      ctx.state.apiKey = v.key;
    }
    return next();
  });
  app.use(bodyParser({
    enableTypes: ['json', ...(opts.bodyTypes?.text ? ['text'] : [])],
    extendTypes: { json: opts.bodyTypes?.json || [], text: opts.bodyTypes?.text || [] } as any,
    jsonLimit: '2mb',
    textLimit: '2mb',
    strict: false,
    onerror: (err: Error) => { throw badRequest(`malformed request body: ${err.message}`); },
  }));
  app.use(api.router.routes());
  app.use(api.router.allowedMethods({ throw: true }));
  return app;
}
