// A manager's VMs as the VMs page and the migration page show them: the folder tree, the filter (name, power
// state, guest OS, datastore, network) and the table of /vms/list's columns, with an optional check box per row.
import { api } from './api.js';
import { h, bytes } from './dom.js';

export const managerQuery = (server) => (server ? `server=${encodeURIComponent(server)}` : '');

/** The configured managers (GET /vms/managers); the first is GOVC_URL's when one is set. */
export async function managers() { return (await api('GET', '/vms/managers')).managers; }

export async function listVms(server) {
  const q = managerQuery(server);
  return (await api('GET', `/vms/list${q ? `?${q}` : ''}`)).vms.filter((v) => !v.template);
}

/** `/DC0/vm/a/b/web1` -> `/DC0/vm/a/b` */
export const folderOf = (p) => p.slice(0, p.lastIndexOf('/'));

/** Folders (every ancestor of a VM's folder down from /<dc>/vm) with the number of VMs below each. */
export function folders(vms) {
  const count = new Map();
  for (const v of vms) {
    const parts = folderOf(v.path).split('/');
    for (let i = 3; i <= parts.length; i++) { const f = parts.slice(0, i).join('/'); count.set(f, (count.get(f) || 0) + 1); }
  }
  return [...count].sort((a, b) => a[0].localeCompare(b[0])).map(([path, n]) => ({ path, n, depth: path.split('/').length - 3, name: path.split('/').pop() }));
}

const FIELDS = [['power', 'power_state', 'power state'], ['os', 'guest_os', 'guest OS'], ['datastore', 'datastores', 'datastore'], ['network', 'networks', 'network']];

export function matches(v, f) {
  if (f.name && !v.name.toLowerCase().includes(f.name.toLowerCase())) return false;
  if (f.folder && v.path !== f.folder && !v.path.startsWith(`${f.folder}/`)) return false;
  for (const [k, field] of FIELDS) {
    if (!f[k]) continue;
    const val = v[field];
    if (Array.isArray(val) ? !val.includes(f[k]) : val !== f[k]) return false;
  }
  return true;
}

const distinct = (vms, field) => [...new Set(vms.flatMap((v) => v[field] ?? []))].filter(Boolean).sort();

/** The picker: folder tree beside a filter bar and the table. `selected` (a Set of paths) turns on check boxes;
 *  `onOpen(vm)` makes names links; `onChange()` is called when the selection changes. */
export class VmPicker {
  constructor(el, { vms, selected = null, onOpen = null, onChange = () => undefined }) {
    Object.assign(this, { el, vms, selected, onOpen, onChange });
    this.f = { name: '', folder: '', power: '', os: '', datastore: '', network: '' };
    this.render();
  }

  shown() { return this.vms.filter((v) => matches(v, this.f)); }

  render() {
    const set = (k) => (e) => { this.f[k] = e.target.value; this.fill(); };
    const bar = h('div', { class: 'filters' },
      h('input', { id: 'filter-name', type: 'search', placeholder: 'name contains…', value: this.f.name, oninput: set('name') }),
      FIELDS.map(([k, field, label]) => h('select', { id: `filter-${k}`, onchange: set(k), 'aria-label': label },
        h('option', { value: '' }, `any ${label}`), distinct(this.vms, field).map((x) => h('option', { value: x, selected: this.f[k] === x }, x)))));
    this.tree = h('ul', { class: 'tree', id: 'folder-tree' });
    this.body = h('tbody');
    this.summary = h('p', { class: 'hint', id: 'vm-summary' });
    const head = ['Name', 'Power', 'CPU', 'Memory', 'Storage', 'Guest OS', 'IP', 'Datastores', 'Networks'];
    this.all = this.selected ? h('input', { type: 'checkbox', id: 'select-shown', title: 'select every VM shown', onchange: (e) => this.selectShown(e.target.checked) }) : null;
    this.el.replaceChildren(bar, h('div', { class: 'inventory' },
      h('nav', { class: 'folders' }, h('b', {}, 'Folders'), this.tree),
      h('div', { class: 'scroll' }, this.summary, h('table', { class: 'vms' },
        h('thead', {}, h('tr', {}, this.selected ? h('th', {}, this.all) : null, head.map((t) => h('th', {}, t)))), this.body))));
    this.fill();
  }

  selectShown(on) {
    for (const v of this.shown()) { if (on) this.selected.add(v.path); else this.selected.delete(v.path); }
    this.fill();
    this.onChange();
  }

  fill() {
    const pick = (path) => { this.f.folder = this.f.folder === path ? '' : path; this.fill(); };
    this.tree.replaceChildren(h('li', {}, h('button', { class: `link${this.f.folder ? '' : ' active'}`, onclick: () => pick('') }, `all (${this.vms.length})`)),
      ...folders(this.vms).map((f) => h('li', { style: `padding-left:${f.depth * 0.8}rem` },
        h('button', { class: `link${this.f.folder === f.path ? ' active' : ''}`, dataset: { folder: f.path }, onclick: () => pick(f.path) }, `${f.name} (${f.n})`))));
    const shown = this.shown();
    this.body.replaceChildren(...shown.map((v) => this.row(v)));
    if (!shown.length) this.body.append(h('tr', {}, h('td', { colspan: 10, class: 'empty' }, 'no VM matches')));
    const sel = this.selected ? `, ${this.selected.size} selected` : '';
    this.summary.textContent = `${shown.length} of ${this.vms.length} VMs shown${sel}`;
    if (this.all) this.all.checked = shown.length > 0 && shown.every((v) => this.selected.has(v.path));
  }

  row(v) {
    const box = this.selected ? h('td', {}, h('input', { type: 'checkbox', class: 'pick', checked: this.selected.has(v.path), 'aria-label': `select ${v.name}`, onchange: (e) => {
      if (e.target.checked) this.selected.add(v.path); else this.selected.delete(v.path);
      this.fill();
      this.onChange();
    } })) : null;
    return h('tr', { dataset: { path: v.path } }, box,
      h('td', {}, this.onOpen ? h('a', { href: '#', class: 'open', onclick: (e) => { e.preventDefault(); this.onOpen(v); } }, v.name) : v.name, h('small', {}, folderOf(v.path))),
      h('td', {}, h('span', { class: `badge ${v.power_state}` }, v.power_state)), h('td', {}, v.num_cpu), h('td', {}, bytes(v.memory_mb * 1024 * 1024)),
      h('td', {}, bytes(v.storage)), h('td', {}, v.guest_os), h('td', {}, v.ip_address), h('td', {}, (v.datastores || []).join(', ')), h('td', {}, (v.networks || []).join(', ')));
  }
}
