// Static files for the daemon: Swagger UI from the local swagger-ui-dist package (no CDN) and any directory
// another part mounts (the dashboard, issue 5), under both path forms.
import { createReadStream, promises as fs, type Stats } from 'node:fs';
import path from 'node:path';
import type Koa from 'koa';
import { fieldError } from '../../platform/errors';

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.mjs': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8',
  '.json': 'application/json', '.png': 'image/png', '.svg': 'image/svg+xml', '.ico': 'image/x-icon', '.map': 'application/json',
  '.txt': 'text/plain; charset=utf-8',
  '.woff2': 'font/woff2', '.yaml': 'application/yaml',
};

/** Files up to this size are kept in memory once read, while their size and mtime stay the same: a page load
 *  asks for ten small files at once, and each read from disk is three more trips through libuv's four threads. */
const CACHED_MAX_BYTES = 512 * 1024;
const cache = new Map<string, { size: number; mtimeMs: number; body: Buffer }>();

async function sendFile(ctx: Koa.Context, file: string, st: Stats) {
  ctx.type = TYPES[path.extname(file)] || 'application/octet-stream';
  ctx.set('Cache-Control', 'no-cache');
  // no-cache makes the browser ask again each load; the validators let it keep its copy when nothing changed.
  ctx.etag = `W/"${st.size.toString(16)}-${Math.floor(st.mtimeMs).toString(16)}"`;
  ctx.lastModified = st.mtime;
  ctx.status = 200;
  if (ctx.fresh) { ctx.status = 304; return; }
  ctx.length = st.size;
  if (ctx.method === 'HEAD') { ctx.body = null; return; }
  if (st.size > CACHED_MAX_BYTES) { ctx.body = createReadStream(file); return; }
  let hit = cache.get(file);
  if (!hit || hit.size !== st.size || hit.mtimeMs !== st.mtimeMs) {
    hit = { size: st.size, mtimeMs: st.mtimeMs, body: await fs.readFile(file) };
    cache.set(file, hit); // bounded by the mounted folders' files
  }
  ctx.body = hit.body;
}

export interface StaticMount { prefix: string; dir: string; overrides?: Record<string, { type: string; body: string }> }

/** Serves GET/HEAD under each mount's prefix; `prefix` (without a trailing slash) redirects to `prefix/`. */
export function staticMiddleware(mounts: StaticMount[]): Koa.Middleware {
  return async (ctx, next) => {
    if (ctx.method !== 'GET' && ctx.method !== 'HEAD') { await next(); return; }
    for (const m of mounts) {
      if (ctx.path === m.prefix) { ctx.redirect(m.prefix + '/' + (ctx.querystring ? '?' + ctx.querystring : '')); return; }
      if (!ctx.path.startsWith(m.prefix + '/')) continue;
      let rel: string;
      try { rel = decodeURIComponent(ctx.path.slice(m.prefix.length + 1)) || 'index.html'; } catch {
        throw fieldError(400, 'path', 'malformed percent-encoding', `path: malformed percent-encoding in ${ctx.path.slice(0, 256)}`);
      }
      if (rel.includes('\0')) throw fieldError(400, 'path', 'contains a NUL byte', 'path: contains a NUL byte');
      if (rel.endsWith('/')) rel += 'index.html';
      const o = m.overrides?.[rel];
      if (o) { ctx.type = o.type; ctx.body = o.body; return; }
      const file = path.resolve(m.dir, rel);
      if (!file.startsWith(path.resolve(m.dir) + path.sep)) { await next(); return; }
      const st = await fs.stat(file).catch(() => null);
      if (!st || !st.isFile()) { await next(); return; }
      await sendFile(ctx, file, st);
      return;
    }
    await next();
  };
}

export function swaggerMount(prefix: string, specUrl: string): StaticMount {
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- swagger-ui-dist ships no type declarations; one call
  const swaggerUi = require('swagger-ui-dist') as { getAbsoluteFSPath: () => string }; // its documented API
  const dir = swaggerUi.getAbsoluteFSPath();
  const init = 'window.onload = function () {\n'
    + `  window.ui = SwaggerUIBundle({ url: ${JSON.stringify(specUrl)}, dom_id: '#swagger-ui', deepLinking: true,\n`
    + '    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset], plugins: [SwaggerUIBundle.plugins.DownloadUrl], '
    + 'layout: \'StandaloneLayout\' });\n'
    + '};\n';
  return { prefix, dir, overrides: { 'swagger-initializer.js': { type: 'text/javascript; charset=utf-8', body: init } } };
}
