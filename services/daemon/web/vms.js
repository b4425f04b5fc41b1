// The VMs page: one configured manager's inventory (folder tree, filter, /vms/list's columns), a VM's detail
// from /vms/info (hardware, firmware, disks with their backing chains, NICs, CD-ROMs, snapshots), and the way
// into the migration page with the VMs checked here.
import { api } from './api.js';
import { h, bytes, time } from './dom.js';
import { managers, managerQuery, listVms, VmPicker } from './inventory.js';

/** VMs checked on the VMs page, handed to the migration page (same tab, same manager). */
export const handoff = { server: '', paths: new Set() };

export async function managerSelect(current, onPick) {
  const list = await managers();
  const server = current || list[0]?.url || '';
  const sel = h('select', { id: 'manager', onchange: (e) => onPick(e.target.value) },
    list.length ? list.map((m) => h('option', { value: m.url, selected: m.url === server }, `${m.name}${m.default ? ' (default)' : ''}`)) : h('option', { value: '' }, 'GOVC_URL (default)'));
  return { sel, server };
}

export async function vmsView(el, params) {
  const { sel, server } = await managerSelect(params.get('server'), (s) => { location.hash = `#/vms?${managerQuery(s)}`; });
  const vms = await listVms(server);
  handoff.server = server;
  handoff.paths = new Set([...handoff.paths].filter((p) => vms.some((v) => v.path === p)));
  const go = h('button', { class: 'primary', id: 'migrate-selected', disabled: !handoff.paths.size, onclick: () => { location.hash = '#/migrate'; } }, 'Migrate selected…');
  const box = h('div');
  el.replaceChildren(h('div', { class: 'toolbar' }, h('h2', {}, 'VMs'), h('label', {}, 'Manager ', sel)), box, h('p', {}, go));
  new VmPicker(box, { vms, selected: handoff.paths, onChange: () => { go.disabled = !handoff.paths.size; },
    onOpen: (v) => { location.hash = `#/vm?${managerQuery(server)}&path=${encodeURIComponent(v.path)}`; } });
}

const kv = (rows) => h('table', { class: 'kv' }, h('tbody', {}, rows.filter(([, v]) => v !== undefined && v !== null && v !== '').map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, v)))));
const table = (cls, head, rows, empty) => h('table', { class: cls }, h('thead', {}, h('tr', {}, head.map((t) => h('th', {}, t)))),
  h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', { colspan: head.length, class: 'empty' }, empty))));

function snapshotTree(list, current) {
  return h('ul', { class: 'tree' }, list.map((s) => h('li', {}, h('b', {}, s.name), s.id === current ? ' (current)' : '', ` ${time(s.created)}`,
    s.description ? h('small', {}, s.description) : '', s.children?.length ? snapshotTree(s.children, current) : '')));
}

export async function vmView(el, params) {
  const server = params.get('server') || '';
  const path = params.get('path') || '';
  const q = managerQuery(server);
  const d = await api('GET', `/vms/info?path=${encodeURIComponent(path)}${q ? `&${q}` : ''}`);
  el.replaceChildren(
    h('a', { href: `#/vms?${q}` }, '‹ all VMs'),
    h('h2', { id: 'vm-name' }, d.name, ' ', h('span', { class: `badge ${d.power_state}` }, d.power_state)),
    h('div', { class: 'cols' },
      h('section', {}, h('h3', {}, 'VM'), kv([['path', h('code', {}, d.path)], ['guest OS', `${d.guest_os} (${d.guest_id})`], ['IP', d.ip_address], ['tools', d.tools_status],
        ['firmware', h('span', { id: 'vm-firmware' }, d.firmware)], ['CPUs', d.hardware.num_cpu], ['memory', bytes(d.hardware.memory_mb * 1024 * 1024)],
        ['hardware version', d.hardware.version], ['UUID', d.uuid], ['datacenter', d.datacenter]])),
      h('section', {}, h('h3', {}, 'Snapshots'), d.snapshots.length ? snapshotTree(d.snapshots, d.current_snapshot) : h('p', { class: 'hint', id: 'vm-snapshots' }, 'no snapshots'))),
    h('h3', {}, 'Disks'),
    table('disks', ['Disk', 'Capacity', 'File', 'Backing chain'], d.disks.map((x) => h('tr', {}, h('td', {}, x.label), h('td', {}, bytes(x.capacity_bytes)), h('td', {}, h('code', {}, x.file_path)),
      h('td', {}, x.chain.length > 1 ? x.chain.map((c) => h('code', { class: 'chain' }, c)) : 'no snapshot deltas'))), 'no disks'),
    h('h3', {}, 'Network adapters'),
    table('nics', ['NIC', 'Adapter', 'MAC', 'Network'], d.nics.map((x) => h('tr', {}, h('td', {}, x.label), h('td', {}, x.adapter), h('td', {}, h('code', {}, x.mac)), h('td', {}, x.network))), 'no NICs'),
    h('h3', {}, 'CD-ROMs'),
    table('cdroms', ['Device', 'Backing'], d.cdroms.map((x) => h('tr', {}, h('td', {}, x.label), h('td', {}, x.backing))), 'no CD-ROM drives'),
  );
}
