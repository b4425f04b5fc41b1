// What every daemon route file shares: the error response's shape, the timestamp the daemon's answers carry and
// the caller's API key.
import type Koa from 'koa';
import type { ApiKey } from '../../platform/auth';
import { daemonErrorSchema } from '../../domain/schemas/daemon';

/** An error response in the OpenAPI document: the daemon's error envelope. */
export const err = (description: string) => ({ description, schema: daemonErrorSchema });
/** The `timestamp` field of an answer. */
export const now = () => new Date().toISOString();
/** The caller's key: Koa's state is untyped; authenticate() in platform/http.ts sets it (null or absent: no key). */
export const callerOf = (ctx: Koa.Context) => ctx.state.apiKey as ApiKey | null | undefined;
