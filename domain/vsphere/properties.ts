// PropertyCollector retrieval: many objects' properties in one RetrievePropertiesEx (continued while the
// manager pages), and a ContainerView over the whole inventory kept for the session, so listing every VM is
// one round trip rather than one call per VM.
import type { Manager } from './client';
import { arr, child, el, esc, moref, MoRef, ref, text, XmlValue } from './xml';

/** One object's answer; `props` by property path, each value as the parser gave it (text, element, array). */
export interface ObjectContent { obj: MoRef; props: Record<string, XmlValue | undefined>; missing: string[] }

export interface PropSpec { type: string; paths: string[] }

function propSetXml(specs: PropSpec[]) {
  return specs.map((s) => `<propSet><type>${esc(s.type)}</type>${s.paths.map((p) => el('pathSet', p)).join('')}</propSet>`).join('');
}

function contents(ret: XmlValue | undefined): { objects: ObjectContent[]; token?: string } {
  const objects = arr(child(ret, 'objects')).map((o) => ({
    obj: moref(child(o, 'obj'))!,
    props: Object.fromEntries(arr(child(o, 'propSet')).map((p) => [text(child(p, 'name'))!, child(p, 'val')])),
    missing: arr(child(o, 'missingSet')).map((m) => text(child(m, 'path'))!),
  }));
  return { objects, token: text(child(ret, 'token')) };
}

async function retrieveAll(m: Manager, specSet: string): Promise<ObjectContent[]> {
  const sc = await m.serviceContent();
  let { objects, token } = contents(await m.call('RetrievePropertiesEx', sc.propertyCollector,
    `<specSet>${specSet}</specSet><options><maxObjects>1000</maxObjects></options>`));
  while (token) {
    const next = contents(await m.call('ContinueRetrievePropertiesEx', sc.propertyCollector, el('token', token)));
    objects = objects.concat(next.objects);
    token = next.token;
  }
  return objects;
}

/** Properties of the given objects (one call). */
export async function retrieve(m: Manager, objs: MoRef[], specs: PropSpec[], traversal = ''): Promise<ObjectContent[]> {
  const objSet = objs.map((o) => `<objectSet>${ref('obj', o)}<skip>false</skip>${traversal}</objectSet>`).join('');
  return retrieveAll(m, propSetXml(specs) + objSet);
}

/** A ContainerView of every object of these types below the root folder, created once per session. */
async function containerView(m: Manager, types: string[]): Promise<MoRef> {
  const key = `view:${types.join(',')}`;
  const cached = m.sessionCache.get(key) as MoRef | undefined;
  if (cached) return cached;
  const sc = await m.serviceContent();
  const v = moref(await m.call('CreateContainerView', sc.viewManager, ref('container',
    sc.rootFolder) + types.map((t) => el('type', t)).join('') + el('recursive', true)))!;
  m.sessionCache.set(key, v);
  return v;
}

/** Properties of every object of the given types in the inventory: one RetrievePropertiesEx through the view. */
export async function retrieveInventory(m: Manager, specs: PropSpec[]): Promise<ObjectContent[]> {
  try {
    return await throughView(m, specs);
  } catch (e) {
    // The view belonged to a session that has since been replaced: make a new one, once.
    if ((e as { kind?: string }).kind !== 'not_found') throw e;
    m.sessionCache.delete(`view:${specs.map((s) => s.type).join(',')}`);
    return throughView(m, specs);
  }
}

async function throughView(m: Manager, specs: PropSpec[]) {
  const view = await containerView(m, specs.map((s) => s.type));
  const traverse = '<selectSet xsi:type="TraversalSpec"><name>view</name><type>ContainerView</type><path>view</path><skip>false</skip></selectSet>';
  const objSet = `<objectSet>${ref('obj', view)}<skip>true</skip>${traverse}</objectSet>`;
  return retrieveAll(m, propSetXml(specs) + objSet);
}
