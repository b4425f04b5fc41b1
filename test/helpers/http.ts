// Small HTTP helpers over fetch for tests.
import http from 'node:http';
import type { daemonEnvelope } from '../../platform/errors';

/** One invalid field of a 4xx answer (the `fields` list both envelopes carry on a validation failure). */
export interface FieldError { field: string; message: string; index?: number }
/** The job API's error envelope (port 8000 and the workers' ports): platform/errors.ts jobApiEnvelope. */
export interface JobApiError { error: { code: number; message: string; path: string; timestamp: string; fields?: FieldError[] } }
/** The daemon's error envelope (port 8080): platform/errors.ts daemonEnvelope. */
export type DaemonError = Omit<ReturnType<typeof daemonEnvelope>, 'fields'> & { fields?: FieldError[] };

/** An answer: `body` is the parsed JSON, typed as the caller says the endpoint answers (`req<JobStatus>`),
 *  undefined when the text is not JSON; `unknown` until the caller names a type. */
export interface Res<T> { status: number; body: T; text: string; headers: Headers }

/** An answer as a reused proof keeps it (plain data, test/helpers/proofs.ts): its status and text. */
export interface Answer { status: number; text: string }
export const answer = (r: Answer): Answer => ({ status: r.status, text: r.text });

export async function req<T = unknown>(base: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<Res<T>> {
  const res = await fetch(base + path, {
    method,
    headers: { ...(body !== undefined && typeof body !== 'string' ? { 'content-type': 'application/json' } : {}), ...headers },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json: T | undefined;
  try { json = JSON.parse(text) as T; } catch { json = undefined; } // not JSON (a page, a stream): body undefined
  return { status: res.status, body: json as T, text, headers: res.headers };
}

/** Polls `fn` until it returns a truthy value; an error it throws is remembered and polled past, unless the
 *  error has `fatal: true` (the awaited thing can no longer happen), which ends the wait at once. */
export async function until<T>(fn: () => T | undefined | null | false | Promise<T | undefined | null | false>, timeoutMs = 20000, what = 'condition'): Promise<T> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < end) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      if ((e as { fatal?: boolean } | undefined)?.fatal) throw e;
      last = e;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${(last as Error).message}` : ''}`);
}

/** POSTs a body over `limit` bytes and waits for the answer without sending the rest, so a service that refuses
 *  early (413) is heard, never raced by a reset: 'declared' sends only a Content-Length over the limit and a few
 *  bytes; 'streamed' (chunked, no length) sends limit + 64 KiB and stops there. */
export function postOversized<T = unknown>(base: string, path: string, type: string, how: 'declared' | 'streamed', limit = 2 * 1024 * 1024): Promise<{ status: number; body: T }> {
  const u = new URL(base);
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { 'content-type': type, ...(how === 'declared' ? { 'content-length': String(limit + 1024) } : {}) };
    const rq = http.request({ host: u.hostname, port: u.port, method: 'POST', path, headers, timeout: 30000 }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => { rq.destroy(); try { resolve({ status: res.statusCode || 0, body: JSON.parse(text) as T }); } catch (e) { reject(e instanceof Error ? e : new Error(String(e))); } });
    });
    rq.on('timeout', () => rq.destroy(new Error(`no answer within 30 s to POST ${path}`)));
    rq.on('error', reject);
    rq.write(how === 'declared' ? '{"a": ' : '"' + 'x'.repeat(limit + 64 * 1024));
  });
}

/** One request with exactly these headers (node http: Host, Origin and Sec-Fetch-* as a browser or an attacker
 *  would send them, which fetch does not allow). */
export function rawReq(base: string, method: string, path: string, headers: Record<string, string>, body?: string): Promise<{ status: number; text: string; headers: http.IncomingHttpHeaders }> {
  const u = new URL(base);
  return new Promise((resolve, reject) => {
    const rq = http.request({ host: u.hostname, port: u.port, method, path, headers, timeout: 15000 }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => resolve({ status: res.statusCode || 0, text, headers: res.headers }));
      res.on('error', reject);
    });
    rq.on('timeout', () => rq.destroy(new Error(`no answer within 15 s to ${method} ${path}`)));
    rq.on('error', reject);
    rq.end(body);
  });
}
