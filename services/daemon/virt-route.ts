// How a /virt, /import or /convert route is added (services/daemon/virt.ts and virt-actions.ts): the seed's success
// envelope {status: 'success', message, data, timestamp}, the daemon's error responses, and the route's role.
import type Joi from 'joi';
import type Koa from 'koa';
import type { Api } from '../../platform/http';
import type { Need } from '../../platform/auth';
import { daemonErrorSchema } from '../../domain/schemas/daemon';
import * as S from '../../domain/schemas/virt';
import type * as L from '../../domain/libvirt';

const ok = (message: string, data: unknown) => ({ status: 'success', message, data, timestamp: new Date().toISOString() });
const errs = {
  400: { description: 'invalid input (names the field)', schema: daemonErrorSchema },
  404: { description: 'unknown domain, network, pool or volume', schema: daemonErrorSchema },
  409: { description: 'the object exists already or its state does not allow this', schema: daemonErrorSchema },
  500: { description: "a failed libvirt operation, with libvirt's message", schema: daemonErrorSchema },
  503: { description: 'libvirtd does not answer at the configured URI', schema: daemonErrorSchema },
};

export interface VirtDeps { api: Api; virsh: L.Virsh; submitConvert: (def: unknown) => Promise<{ job_id: string }> }

/** A route's handler: its query and body as their schemas give them (typed by Joi.object<T>); the default
 *  types are what a route without that schema gets. */
type H<Q, B> = (input: { query: Q; body: B }, ctx: Koa.Context) => Promise<[string, unknown]>;
export type AddVirt = <Q = Record<string, unknown>, B = unknown>(
  method: 'get' | 'post', role: Need, path: string, summary: string,
  schemas: { query?: Joi.ObjectSchema<Q>; body?: Joi.ObjectSchema<B>; created?: boolean; data?: Joi.Schema }, h: H<Q, B>,
) => void;

/** One route with the success envelope and the virt error responses. Each route names its role: GETs read the
 *  host (`read`); whatever changes it is `admin`, because libvirtd runs as root and these routes reach the host's
 *  disks, networks and guests (docs/security.md). */
export function virtAdder(api: Api): AddVirt {
  return (method, role, path, summary, schemas, h) => api.add({
    method, role, path, summary, tags: [path.startsWith('/virt') ? 'virt' : 'conversion'], query: schemas.query, body: schemas.body,
    responses: { [schemas.created ? 201 : 200]: { description: 'success envelope', schema: S.virtSuccessSchema }, ...errs },
    handler: async (ctx, input) => {
      const [message, data] = await h(input, ctx);
      if (schemas.created) ctx.status = 201;
      return ok(message, data);
    },
  });
}
