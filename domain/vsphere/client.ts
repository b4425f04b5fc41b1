// One vSphere manager: SOAP calls over HTTPS (undici), a login session reused by every caller of the same
// manager and credentials, re-established when the manager says NotAuthenticated (expired or logged out), TLS
// verified against the system CAs or FERRY_VSPHERE_CA unless `insecure`.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import tls from 'node:tls';
import { Agent, request } from 'undici';
import { networkError, VsphereError } from './errors';
import { arr, child, el, envelope, moref, MoRef, parseXml, text, XmlNode, XmlValue, xsiType } from './xml';
import { createLogger, ignoreError } from '../../platform/log';
import { setting } from '../../platform/settings';

export interface ManagerCredentials {
  /** https://host[:port][/sdk]; a bare host means https://host/sdk. */
  url: string;
  username?: string;
  password?: string;
  insecure?: boolean;
  /** PEM of a CA to trust (besides the system's); default: the file named by FERRY_VSPHERE_CA. */
  ca?: string;
}

const VIM_VERSION = '6.5';

/** The manager's SDK URL, normalised: a bare host or host:port becomes https://host/sdk. */
export function sdkUrl(raw: string): URL {
  const u = new URL(/^[a-z]+:\/\//i.test(raw) ? raw : `https://${raw}`);
  u.username = ''; u.password = '';
  if (u.pathname === '/' || u.pathname === '') u.pathname = '/sdk';
  u.search = ''; u.hash = '';
  return u;
}

/** How a manager is named in messages and logs: its URL without any credentials. */
export const managerName = (raw: string) => { try { return sdkUrl(raw).origin; } catch { return '(invalid manager URL)'; } };

const agents = new Map<string, Agent>();
function caFromEnv(): string | undefined {
  const f = setting('FERRY_VSPHERE_CA');
  if (!f) return undefined;
  try { return readFileSync(f, 'utf8'); } catch (e) { throw new VsphereError('tls', `FERRY_VSPHERE_CA (${f}) cannot be read: ${(e as Error).message}`); }
}

/** One connection pool per TLS setting, shared by SOAP calls and datastore downloads. */
export function agentFor(insecure: boolean, ca?: string): Agent {
  const extra = ca ?? caFromEnv();
  const key = `${insecure}|${extra ? createHash('sha256').update(extra).digest('hex') : ''}`;
  let a = agents.get(key);
  if (!a) {
    a = new Agent({
      // One secure context per agent: handed a `ca` list, Node would parse every root certificate again for each
      // new connection (about 50 ms of CPU each, paid by every parallel download stream).
      connect: { rejectUnauthorized: !insecure, ...(extra ? { secureContext: tls.createSecureContext({ ca: [...tls.rootCertificates, extra] }) } : {}) },
      keepAliveTimeout: 30_000, connections: 128, headersTimeout: 120_000, bodyTimeout: 120_000,
    });
    agents.set(key, a);
  }
  return a;
}

export interface ServiceContent {
  rootFolder: MoRef; propertyCollector: MoRef; viewManager: MoRef; sessionManager: MoRef; searchIndex: MoRef;
  fileManager?: MoRef; about: Record<string, string>;
}

const SI: MoRef = { type: 'ServiceInstance', value: 'ServiceInstance' };

export class Manager {
  readonly url: URL;
  readonly name: string;
  readonly agent: Agent;
  private cookie?: string;
  private loggingIn?: Promise<void>;
  private content?: ServiceContent;
  /** Objects a caller wants kept for the session (the inventory's ContainerView); dropped at re-login. */
  readonly sessionCache = new Map<string, unknown>();

  constructor(readonly creds: ManagerCredentials) {
    this.url = sdkUrl(creds.url);
    this.name = this.url.origin;
    this.agent = agentFor(!!creds.insecure, creds.ca);
  }

  /** The session cookie for datastore downloads (logs in first when needed). */
  async sessionCookie(): Promise<string> {
    await this.ensureLogin();
    return this.cookie!;
  }

  private async post(body: string, withCookie: boolean): Promise<{ status: number; xml: XmlNode; setCookie: string[] }> {
    let res;
    try {
      res = await request(this.url, {
        method: 'POST', dispatcher: this.agent,
        headers: { 'content-type': 'text/xml; charset=utf-8', soapaction: `urn:vim25/${VIM_VERSION}`,
          ...(withCookie && this.cookie ? { cookie: this.cookie } : {}) },
        body,
      });
    } catch (e) { throw networkError(e, this.name); }
    const textBody = await res.body.text().catch((e) => { throw networkError(e, this.name); });
    const setCookie = arr(res.headers['set-cookie']);
    let xml: XmlNode | undefined;
    try { xml = parseXml(textBody); } catch { xml = undefined; }
    if (!xml?.Envelope) throw new VsphereError('http',
      `vSphere manager ${this.name} answered HTTP ${res.statusCode} without a SOAP envelope (is ${this.url.pathname} its SDK endpoint?)`);
    return { status: res.statusCode, xml, setCookie };
  }

  /** One SOAP call, without session handling; faults become VsphereErrors. */
  private async rawCall(method: string, thisRef: MoRef, inner: string, withCookie = true): Promise<{ ret: XmlValue | undefined; setCookie: string[] }> {
    const { xml, setCookie } = await this.post(envelope(method, thisRef, inner), withCookie);
    const body = child(xml.Envelope, 'Body') ?? {};
    const f = child(body, 'Fault');
    if (f) {
      const d = child(f, 'detail');
      const detail = d && typeof d === 'object' ? d : {};
      const first = Object.keys(detail).find((k) => !k.startsWith('@_'));
      const fault = (first && (xsiType(child(detail, first)) || first.replace(/Fault$/, ''))) || 'unknown';
      const msg = text(child(f, 'faultstring')) || fault;
      const kind = fault === 'NotAuthenticated' || fault === 'InvalidLogin' || fault === 'NoPermission' &&
        /login/i.test(msg) ? 'auth' : fault === 'ManagedObjectNotFound' ? 'not_found' : 'fault';
      throw new VsphereError(kind, `vSphere manager ${this.name}: ${method} failed: ${msg} (${fault})`, fault);
    }
    return { ret: child(child(body, `${method}Response`), 'returnval'), setCookie };
  }

  private async ensureLogin(): Promise<void> {
    if (this.cookie) return;
    if (!this.loggingIn) {
      this.loggingIn = this.login().finally(() => { this.loggingIn = undefined; });
    }
    return this.loggingIn;
  }

  private async login() {
    const sc = await this.serviceContent();
    if (!this.creds.username || this.creds.password === undefined) {
      throw new VsphereError('auth', `no credentials for vSphere manager ${this.name}: give username and password (or GOVC_USERNAME and GOVC_PASSWORD)`);
    }
    try {
      const { setCookie } = await this.rawCall('Login', sc.sessionManager, el('userName', this.creds.username) + el('password', this.creds.password), false);
      const c = setCookie.map((s) => s.split(';')[0]).find((s) => s.startsWith('vmware_soap_session='));
      if (!c) throw new VsphereError('http', `vSphere manager ${this.name} answered the login without a session cookie`);
      this.cookie = c;
      this.sessionCache.clear();
    } catch (e) {
      if (e instanceof VsphereError && (e.fault === 'InvalidLogin' || e.kind === 'auth')) {
        throw new VsphereError('auth', `login to vSphere manager ${this.name} as ${this.creds.username} failed: the user name or password is wrong (401)`,
          e.fault);
      }
      throw e;
    }
  }

  async serviceContent(): Promise<ServiceContent> {
    if (this.content) return this.content;
    const { ret } = await this.rawCall('RetrieveServiceContent', SI, '', false);
    const r = (k: string) => moref(child(ret, k))!;
    const about = child(ret, 'about');
    this.content = {
      rootFolder: r('rootFolder'), propertyCollector: r('propertyCollector'), viewManager: r('viewManager'),
      sessionManager: r('sessionManager'), searchIndex: r('searchIndex'), fileManager: moref(child(ret, 'fileManager')),
      about: Object.fromEntries(Object.entries<XmlValue | undefined>(about || {}).map(([k, v]) => [k, String(text(v) ?? '')])),
    };
    return this.content;
  }

  /** A SOAP call in the session: logs in when needed, and once more when the session has expired. */
  async call(method: string, thisRef: MoRef, inner = ''): Promise<XmlValue | undefined> {
    await this.ensureLogin();
    const cookieUsed = this.cookie;
    try {
      return (await this.rawCall(method, thisRef, inner)).ret;
    } catch (e) {
      if (!(e instanceof VsphereError) || e.fault !== 'NotAuthenticated') throw e;
      if (this.cookie === cookieUsed) this.cookie = undefined; // expired: log in again (once, for all callers)
      await this.ensureLogin();
      return (await this.rawCall(method, thisRef, inner)).ret;
    }
  }

  async logout() {
    if (!this.cookie) return;
    const sc = await this.serviceContent();
    await this.rawCall('Logout', sc.sessionManager, '').catch(ignoreError('could not log out of a vSphere session; it expires on the manager by itself'));
    this.cookie = undefined;
    this.sessionCache.clear();
  }
}

// One Manager per manager URL and credentials, so sessions are shared by every request and job in a process.
const managers = new Map<string, Manager>();

export function managerFor(given: ManagerCredentials): Manager {
  // The CA in force is part of the identity: a manager reached with another CA is another connection.
  const creds = { ...given, ca: given.ca ?? caFromEnv() };
  const key = [sdkUrl(creds.url).href, creds.username ?? '', createHash('sha256').update(creds.password ?? '').digest('hex'), !!creds.insecure,
    creds.ca ? createHash('sha256').update(creds.ca).digest('hex') : ''].join('|');
  let m = managers.get(key);
  if (!m) {
    m = new Manager(creds);
    managers.set(key, m);
    // A bounded cache: a wrong password tried many times must not grow it without end.
    if (managers.size > 256) { const [k, old] = managers.entries().next().value!; managers.delete(k); void old.logout(); }
  }
  return m;
}

/** Logs every cached session out: called last by each process that opens sessions as it stops (the daemon and
 *  worker shutdowns, the end of a ferry-convert run). Waits at most `boundMs`: a manager that does not answer must
 *  not hold the exit (its session expires on the manager by itself). */
export async function logoutAll(boundMs = 5000) {
  const all = [...managers.values()];
  managers.clear();
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'late'>((res) => { timer = setTimeout(() => res('late'), boundMs); });
  const done = Promise.all(
    all.map((m) => m.logout().catch(ignoreError('shutting down: could not log out of a vSphere session; it expires on the manager by itself',
    { manager: m.name }))));
  const outcome = await Promise.race([done.then(() => 'done' as const), late]);
  clearTimeout(timer);
  if (outcome === 'late') {
    createLogger('vsphere').warn(
      `vSphere logout took more than ${boundMs} ms: shutting down without waiting longer; the sessions not logged out yet expire on their managers by ` +
      `themselves`, { managers: all.map((m) => m.name) });
  }
}
