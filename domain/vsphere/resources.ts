// What a manager offers VMs to sit on: its datastores (capacity, free space) and networks (standard port groups
// and distributed port groups), one RetrievePropertiesEx through the inventory view. A plan's storage_map and
// network_map name these on their left side; the dashboard's migration page lists them.
import type { Manager } from './client';
import { retrieveInventory } from './properties';
import { num, text } from './xml';

export interface SourceResources {
  datastores: { name: string; type: string; capacity: number; free_space: number }[];
  networks: { name: string; type: 'network' | 'portgroup' }[];
}

export async function listResources(m: Manager): Promise<SourceResources> {
  const objs = await retrieveInventory(m, [
    { type: 'Datastore', paths: ['name', 'summary.type', 'summary.capacity', 'summary.freeSpace'] },
    { type: 'Network', paths: ['name'] },
    { type: 'DistributedVirtualPortgroup', paths: ['name'] },
  ]);
  const byName = (a: { name: string }, b: { name: string }) => a.name.localeCompare(b.name);
  const datastores = objs.filter((o) => o.obj.type === 'Datastore').map((o) => ({
    name: text(o.props.name) ?? o.obj.value, type: text(o.props['summary.type']) ?? '',
    capacity: num(o.props['summary.capacity']) ?? 0, free_space: num(o.props['summary.freeSpace']) ?? 0,
  }));
  // One entry per name: a VM's NIC names its network by name, so two objects of one name are one choice.
  const networks = new Map<string, SourceResources['networks'][number]>();
  for (const o of objs) {
    if (o.obj.type === 'Datastore') continue;
    const name = text(o.props.name) ?? o.obj.value;
    if (!networks.has(name)) networks.set(name, { name, type: o.obj.type === 'DistributedVirtualPortgroup' ? 'portgroup' : 'network' });
  }
  return { datastores: datastores.sort(byName), networks: [...networks.values()].sort(byName) };
}
