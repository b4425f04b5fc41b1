// Static files for the daemon: Swagger UI from the local swagger-ui-dist package (no CDN) and any directory
// another part mounts (the dashboard, issue 5), under both path forms.
import { promises as fs } from 'node:fs';
import path from 'node:path';
import type Koa from 'koa';
import { fieldError } from '../../shared/errors';

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.mjs': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8',
  '.json': 'application/json', '.png': 'image/png', '.svg': 'image/svg+xml', '.ico': 'image/x-icon', '.map': 'application/json', '.txt': 'text/plain; charset=utf-8',
  '.woff2': 'font/woff2', '.yaml': 'application/yaml',
};

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
      ctx.type = TYPES[path.extname(file)] || 'application/octet-stream';
      ctx.length = st.size;
      ctx.set('Cache-Control', 'no-cache');
      ctx.body = ctx.method === 'HEAD' ? null : (await import('node:fs')).createReadStream(file);
      return;
    }
    await next();
  };
}

export function swaggerMount(prefix: string, specUrl: string): StaticMount {
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- swagger-ui-dist ships no type declarations; one call
  const swaggerUi = require('swagger-ui-dist') as { getAbsoluteFSPath: () => string }; // its documented API
  const dir = swaggerUi.getAbsoluteFSPath();
  const init = `window.onload = function () {\n  window.ui = SwaggerUIBundle({ url: ${JSON.stringify(specUrl)}, dom_id: '#swagger-ui', deepLinking: true,\n    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset], plugins: [SwaggerUIBundle.plugins.DownloadUrl], layout: 'StandaloneLayout' });\n};\n`;
  return { prefix, dir, overrides: { 'swagger-initializer.js': { type: 'text/javascript; charset=utf-8', body: init } } };
}
