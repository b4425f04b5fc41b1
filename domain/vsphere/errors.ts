// What can go wrong talking to a vSphere manager, by kind, so each caller maps it once: the daemon to an HTTP
// status (auth 401, not_found 404, unreachable/tls 502), a worker to retryable or not. Messages name the
// manager (its URL without credentials) and never carry a password.
export type VsphereErrorKind = 'auth' | 'unreachable' | 'tls' | 'not_found' | 'fault' | 'task' | 'state' | 'http' | 'config';

export class VsphereError extends Error {
  constructor(public kind: VsphereErrorKind, message: string, public fault?: string) {
    super(message);
    this.name = 'VsphereError';
  }
  /** A retry may succeed (the manager was away, a connection dropped); a wrong password or a missing VM will not. */
  get retryable() { return this.kind === 'unreachable' || this.kind === 'http'; }
}

/** The HTTP status the daemon answers for an error of this kind. */
export function httpStatusOf(e: VsphereError): number {
  switch (e.kind) {
    case 'auth': return 401;
    case 'not_found': return 404;
    case 'unreachable': case 'tls': case 'http': return 502;
    case 'state': return 409;
    case 'config': return 400;
    default: return 502;
  }
}

const TLS_CODES = /CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ERR_TLS|ERR_SSL|HOSTNAME/i;

/** Turns a network-level failure (undici's, with a cause) into a VsphereError naming the manager. */
export function networkError(e: unknown, manager: string): VsphereError {
  if (e instanceof VsphereError) return e;
  const err = e as Error & { code?: string; cause?: Error & { code?: string } };
  const code = err.cause?.code || err.code || '';
  const detail = err.cause?.message || err.message;
  if (TLS_CODES.test(code) || TLS_CODES.test(detail)) {
    return new VsphereError('tls',
      `the TLS certificate of vSphere manager ${manager} is not trusted (${code || detail}); give its CA in FERRY_VSPHERE_CA, or set insecure to accept it`);
  }
  return new VsphereError('unreachable', `vSphere manager ${manager} cannot be reached: ${code ? code + ' ' : ''}${detail}`);
}
