// Errors that carry an HTTP status; each API renders them in its own envelope.
export class ApiError extends Error {
  constructor(public status: number, message: string, public details?: unknown) {
    super(message);
    this.name = 'ApiError';
  }
}
export const badRequest = (m: string, d?: unknown) => new ApiError(400, m, d);
/** A 4xx about one field: `fields` names it for clients, `text` (default "field: message") for people. */
export const fieldError = (status: number, field: string, message: string, text = `${field}: ${message}`) => new ApiError(status, text,
  { fields: [{ field, message }] });
export const notFound = (m: string) => new ApiError(404, m);
export const conflict = (m: string, d?: unknown) => new ApiError(409, m, d);

/** An operation failure; retryable ones go back to the queue while retry_count allows. */
export class OperationError extends Error {
  constructor(message: string, public retryable = false) {
    super(message);
    this.name = 'OperationError';
  }
}

/** What a thrown value says: its `message` when it has a non-empty one, else the value itself as a string. */
export function errorText(e: unknown): string {
  const m = typeof e === 'object' && e !== null && 'message' in e ? e.message : undefined;
  return String(m || e);
}

/** `{ fields }` when an ApiError's details carry a `fields` list (fieldError, validation failures), else `{}`. */
function fieldsOf(details: unknown): { fields?: unknown } {
  return typeof details === 'object' && details !== null && 'fields' in details && details.fields ? { fields: details.fields } : {};
}

/** The error envelope of the daemon API (port 8080): its HTTP answers, metrics port and WebSocket refusals. */
export function daemonEnvelope(status: number, message: string, _path?: string, details?: unknown) {
  return { error: message, status, timestamp: new Date().toISOString(), ...fieldsOf(details) };
}

/** The error envelope of the job API (port 8000) and of the workers' own ports. */
export function jobApiEnvelope(status: number, message: string, path: string, details?: unknown) {
  return { error: { code: status, message, path, timestamp: new Date().toISOString(), ...fieldsOf(details) } };
}
