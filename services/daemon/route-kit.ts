// What every daemon route file shares: the error response's shape and the timestamp the daemon's answers carry.
import { daemonErrorSchema } from '../../shared/schemas/daemon';

/** An error response in the OpenAPI document: the daemon's error envelope. */
export const err = (description: string) => ({ description, schema: daemonErrorSchema });
/** The `timestamp` field of an answer. */
export const now = () => new Date().toISOString();
