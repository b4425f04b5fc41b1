// The daemon client of the `ferry` command: FERRY_URL (default http://localhost:8080) and FERRY_API_KEY from the
// environment, the key sent as a header (never in a URL or argv), and the daemon's error envelope turned into one
// line that names the status.
import { setting } from '../../platform/settings';
export interface ClientOptions { url?: string; key?: string }

export class DaemonError extends Error {
  constructor(readonly status: number, message: string, readonly body?: unknown) { super(message); }
}

export class DaemonClient {
  readonly base: string;
  private key?: string;
  constructor(opts: ClientOptions = {}, env: NodeJS.ProcessEnv = process.env) {
    this.base = (opts.url || setting('FERRY_URL', env)).replace(/\/+$/, '');
    this.key = opts.key || setting('FERRY_API_KEY', env);
  }

  async call<T = unknown>(method: string, path: string, body?: unknown, type = 'application/json'): Promise<T> {
    const headers: Record<string, string> = { accept: 'application/json' };
    if (this.key) headers['x-api-key'] = this.key;
    let payload: string | undefined;
    if (body !== undefined) { headers['content-type'] = type; payload = typeof body === 'string' ? body : JSON.stringify(body); }
    let res: Response;
    try { res = await fetch(`${this.base}${path}`, { method, headers, body: payload }); } catch (e) {
      const why = (e as Error & { cause?: Error }).cause?.message || (e as Error).message;
      throw new DaemonError(0, `cannot reach the daemon at ${this.base} (FERRY_URL): ${why}`);
    }
    const text = await res.text();
    let parsed: unknown;
    try { parsed = text ? JSON.parse(text) : undefined; } catch { parsed = text; /* not JSON: shown as text below */ }
    if (!res.ok) {
      // Either envelope: the job API's { error: { message } } or the daemon's { error: "..." }.
      const error = typeof parsed === 'object' && parsed ? (parsed as { error?: unknown }).error : undefined;
      const nested = typeof error === 'object' && error ? (error as { message?: unknown }).message : undefined;
      const msg = typeof parsed === 'object' && parsed ? (nested ?? error ?? text) : text;
      throw new DaemonError(res.status, `${method} ${path}: ${res.status} ${typeof msg === 'string' ? msg : JSON.stringify(msg)}`, parsed);
    }
    return parsed as T;
  }
}
