// The migration page: a plan (docs/plans.md) built in steps on one page — VMs (filter, folder, check boxes),
// destination host(s) from GET /virt/targets, the network and storage maps (source names from GET
// /vms/resources, target names from the chosen hosts, pre-filled where the names match), options and a window —
// then validated (findings per VM, blockers first, each with its fix and an override where the rule allows one)
// and started. Every action is the plans API with the caller's key: a read key sees the page, its buttons are
// disabled and the API would answer 403 anyway. Several hosts make one plan whose destination lists them all
// (destination.virt_uris), the VMs placed on them by the plan's placement rule (round robin or most free memory).
import { api } from './api.js';
import { h, bytes, say } from './dom.js';
import { listVms, VmPicker } from './inventory.js';
import { handoff, managerSelect } from './vms.js';

const errText = (e) => (e.body?.fields ? e.body.fields.map((x) => `${x.field}: ${x.message}`).join('; ') : e.message);
const shortUri = (u) => u.replace(/\/\/[^@/]*@/, '//');

export class Wizard {
  constructor(el, me) {
    Object.assign(this, { el, canSubmit: me.roles.includes('submit') });
    this.selected = handoff.paths;
    this.targets = new Set();
    this.netMap = {};
    this.dsMap = {};
    this.planId = null;
    this.result = null;
  }

  async load(params) {
    const { sel, server } = await managerSelect(params.get('server') || handoff.server, (s) => { handoff.paths = new Set(); location.hash = `#/migrate?server=${encodeURIComponent(s)}`; });
    this.server = server;
    const [vms, res, t] = await Promise.all([listVms(server), api('GET', `/vms/resources${server ? `?server=${encodeURIComponent(server)}` : ''}`), api('GET', '/virt/targets')]);
    Object.assign(this, { vms, res, all: t.data.targets });
    const first = this.all.find((x) => x.reachable);
    if (first) this.targets.add(first.virt_uri);
    this.render(sel);
  }

  render(sel) {
    this.msg = h('div', { class: 'msg', id: 'wizard-msg' });
    this.mapsBox = h('div', { class: 'maps' });
    this.findingsBox = h('div', { id: 'findings' });
    this.startBtn = h('button', { class: 'primary', id: 'start-plan', disabled: true, onclick: () => void this.guard(() => this.start()) }, 'Start migration');
    const picker = h('div');
    this.el.replaceChildren(
      h('div', { class: 'toolbar' }, h('h2', {}, 'Migrate VMs'), h('label', {}, 'Manager ', sel)),
      this.canSubmit ? '' : h('p', { class: 'msg err', id: 'read-only' }, 'This API key has the read role: it can look, not create or start plans.'),
      h('section', { class: 'step' }, h('h3', {}, '1. VMs'), picker),
      h('section', { class: 'step' }, h('h3', {}, '2. Destination host(s)'), this.targetList()),
      h('section', { class: 'step' }, h('h3', {}, '3. Network and storage maps'), this.mapsBox),
      h('section', { class: 'step' }, h('h3', {}, '4. Options and window'), this.optionsForm()),
      h('section', { class: 'step' }, h('h3', {}, '5. Validate'),
        h('button', { id: 'validate-plan', disabled: !this.canSubmit, onclick: () => void this.guard(() => this.validate()) }, 'Create plan and validate'), this.findingsBox),
      h('section', { class: 'step' }, h('h3', {}, '6. Start'), this.startBtn),
      this.msg,
    );
    new VmPicker(picker, { vms: this.vms, selected: this.selected, onChange: () => this.changed() });
    this.renderMaps();
  }

  async guard(f) { try { await f(); } catch (e) { say(this.msg, errText(e), false); } }

  /** Anything the plan is built from changed: the maps follow, and what was validated no longer holds. */
  changed() { this.renderMaps(); this.startBtn.disabled = true; }

  targetList() {
    return h('ul', { class: 'targets', id: 'targets' }, this.all.map((t) => h('li', {}, h('label', { class: 'check' },
      h('input', { type: 'checkbox', value: t.virt_uri, checked: this.targets.has(t.virt_uri), disabled: !t.reachable, onchange: (e) => {
        if (e.target.checked) this.targets.add(t.virt_uri); else this.targets.delete(t.virt_uri);
        this.changed();
      } }), ` ${shortUri(t.virt_uri)}${t.default ? ' (default)' : ''}`,
      t.reachable ? h('small', {}, `${t.networks.length} networks, ${t.pools.length} pools`) : h('small', { class: 'err' }, t.error)))));
  }

  /** Names every chosen host has (the plan's maps hold on each of its hosts). */
  common(kind) {
    const chosen = this.all.filter((t) => this.targets.has(t.virt_uri));
    if (!chosen.length) return [];
    const names = (t) => (kind === 'networks' ? t.networks : t.pools.map((p) => p.name));
    return names(chosen[0]).filter((n) => chosen.every((t) => names(t).includes(n)));
  }

  renderMaps() {
    const picked = this.vms.filter((v) => this.selected.has(v.path));
    const used = (field, name) => picked.filter((v) => (v[field] || []).includes(name)).length;
    const pools = new Map(this.all.flatMap((t) => t.pools.map((p) => [p.name, p])));
    const rows = (kind, sources, field, map, targets, label) => {
      const ordered = [...sources].sort((a, b) => used(field, b.name) - used(field, a.name) || a.name.localeCompare(b.name));
      return h('table', { class: `map ${kind}` }, h('thead', {}, h('tr', {}, h('th', {}, kind === 'net' ? 'Source network' : 'Source datastore'), h('th', {}, kind === 'net' ? 'Target network' : 'Target pool'))),
        h('tbody', {}, ordered.map((s) => {
          if (!(s.name in map) && targets.includes(s.name)) map[s.name] = s.name; // pre-filled by name
          const n = used(field, s.name);
          return h('tr', { dataset: { source: s.name }, class: n ? 'used' : '' }, h('td', {}, s.name, h('small', {}, n ? `used by ${n} selected VM${n > 1 ? 's' : ''}` : 'not used by the selection', s.free_space !== undefined ? `, ${bytes(s.free_space)} free` : '')),
            h('td', {}, h('select', { 'aria-label': `map ${s.name}`, onchange: (e) => { map[s.name] = e.target.value; this.startBtn.disabled = true; } },
              h('option', { value: '' }, '— not mapped —'), targets.map((t) => h('option', { value: t, selected: map[s.name] === t }, label(t))))));
        })));
    };
    this.mapsBox.replaceChildren(
      rows('net', this.res.networks, 'networks', this.netMap, this.common('networks'), (t) => t),
      rows('ds', this.res.datastores, 'datastores', this.dsMap, this.common('pools'), (t) => `${t} (${bytes(pools.get(t)?.available)} free)`),
    );
  }

  optionsForm() {
    this.form = h('form', { class: 'form options', id: 'plan-options', onsubmit: (e) => e.preventDefault(), onchange: () => { this.startBtn.disabled = true; } },
      h('label', {}, 'Plan name', h('input', { name: 'name', required: true, value: `wave ${new Date().toISOString().slice(0, 16).replace('T', ' ')}` })),
      h('label', {}, 'Source power-off', h('select', { name: 'power_off' }, ['shutdown', 'force', 'none'].map((x) => h('option', { value: x }, x)))),
      h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'remove_cdrom' }), ' remove CD-ROM drives first'),
      h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'rollback', checked: true }), ' roll back a VM whose migration fails'),
      h('label', {}, 'Boot check: console text that shows the guest up (a regular expression; empty: Linux boot milestones)', h('input', { name: 'boot_expect', placeholder: 'e.g. login:' })),
      h('label', {}, 'Boot check timeout (seconds)', h('input', { name: 'boot_timeout', type: 'number', min: '5', max: '3600', value: '300' })),
      h('label', {}, 'Placement over several hosts', h('select', { name: 'placement' }, [['round_robin', 'round robin'], ['most_free_memory', 'most free memory']].map(([v, t]) => h('option', { value: v }, t)))),
      h('label', {}, 'VMs in flight at once', h('input', { name: 'per_plan', type: 'number', min: '1', max: '1000', value: '4' })),
      h('fieldset', {}, h('legend', {}, 'Window (optional): VMs start only inside it'),
        h('label', {}, 'from', h('input', { name: 'window_start', type: 'datetime-local' })), h('label', {}, 'until', h('input', { name: 'window_end', type: 'datetime-local' }))));
    return this.form;
  }

  /** The plan's body: the selected VMs onto the chosen host(s). */
  body() {
    const f = new FormData(this.form);
    const pick = (m) => Object.fromEntries(Object.entries(m).filter(([, v]) => v));
    const hosts = [...this.targets];
    if (!this.selected.size) throw new Error('select at least one VM');
    if (!hosts.length) throw new Error('choose a destination host');
    const paths = this.vms.map((v) => v.path).filter((p) => this.selected.has(p));
    const windows = f.get('window_start') && f.get('window_end') ? [{ start: new Date(f.get('window_start')).toISOString(), end: new Date(f.get('window_end')).toISOString() }] : undefined;
    return {
      name: f.get('name'), ...(this.server ? { source: { manager_url: this.server } } : {}), vms: paths,
      destination: hosts.length === 1 ? { type: 'kvm', virt_uri: hosts[0] } : { type: 'kvm', virt_uris: hosts, placement: f.get('placement') },
      network_map: pick(this.netMap), storage_map: pick(this.dsMap),
      options: {
        power_off: f.get('power_off'), remove_cdrom: f.get('remove_cdrom') === 'on', rollback: f.get('rollback') === 'on',
        virt_test: { ...(f.get('boot_expect') ? { expect: f.get('boot_expect') } : {}), timeout_seconds: Number(f.get('boot_timeout')) },
      },
      limits: { per_plan: Number(f.get('per_plan')) }, ...(windows ? { windows } : {}),
    };
  }

  /** Creates the plan, or changes it while it has not started (overrides stay), then runs preflight. */
  async validate() {
    const body = this.body();
    if (this.planId) await api('PUT', `/plans/${encodeURIComponent(this.planId)}`, body);
    else this.planId = (await api('POST', '/plans', body)).id;
    this.multiHost = !!body.destination.virt_uris;
    this.result = await api('POST', `/plans/${encodeURIComponent(this.planId)}/validate`);
    this.renderFindings();
  }

  renderFindings() {
    const rows = this.result.vms.map((v) => ({ ...v, open: v.findings.filter((f) => f.severity === 'blocker' && !f.overridden).length }));
    rows.sort((a, b) => b.open - a.open || b.findings.length - a.findings.length || a.vm_path.localeCompare(b.vm_path));
    const blocked = rows.filter((r) => r.open).length;
    say(this.msg, blocked ? `${blocked} of ${rows.length} VMs have blockers: they will not run until fixed or overridden; the others will.` : `${rows.length} VMs are ready to start.`, !blocked);
    this.findingsBox.replaceChildren(h('table', { class: 'findings' },
      h('thead', {}, h('tr', {}, ['VM', 'Findings'].map((t) => h('th', {}, t)))),
      h('tbody', {}, rows.map((r) => h('tr', { dataset: { vm: r.vm_path }, class: r.open ? 'blocked' : '' },
        h('td', {}, r.vm_path.split('/').pop(), h('small', {}, r.open ? `${r.open} blocker${r.open > 1 ? 's' : ''}` : 'ready'), this.multiHost && r.placement?.virt_uri ? h('small', { class: 'host' }, `→ ${shortUri(r.placement.virt_uri)}`) : ''),
        h('td', {}, r.findings.length ? h('ul', { class: 'finding-list' }, [...r.findings].sort((a, b) => (a.severity === b.severity ? 0 : a.severity === 'blocker' ? -1 : 1)).map((f) => this.finding(r.vm_path, f))) : h('span', { class: 'ok' }, 'no findings')))))));
    this.startBtn.disabled = !this.canSubmit || !this.planId;
  }

  finding(vm, f) {
    const id = this.planId;
    const reason = h('input', { class: 'reason', placeholder: 'why it is acceptable', 'aria-label': `reason for ${f.rule}` });
    const act = f.overridden ? h('small', { class: 'ok' }, `accepted by ${f.overridden.by}${f.overridden.reason ? `: ${f.overridden.reason}` : ''}`)
      : f.overridable ? h('span', { class: 'override' }, reason, h('button', { class: 'override-btn', disabled: !this.canSubmit, onclick: () => void this.guard(async () => {
        await api('POST', `/plans/${encodeURIComponent(id)}/overrides`, { vm_path: vm, rule: f.rule, reason: reason.value });
        this.result = await api('POST', `/plans/${encodeURIComponent(id)}/validate`);
        this.renderFindings();
      }) }, 'Override'))
        : h('small', {}, 'cannot be overridden');
    return h('li', { class: `finding ${f.severity}${f.overridden ? ' overridden' : ''}`, dataset: { rule: f.rule } },
      h('span', { class: `badge ${f.severity}` }, f.severity), ' ', h('code', {}, f.rule), ' ', f.message, h('div', { class: 'fix' }, 'Fix: ', f.fix), act);
  }

  async start() {
    await api('POST', `/plans/${encodeURIComponent(this.planId)}/start`);
    handoff.paths = new Set();
    location.hash = `#/plan/${encodeURIComponent(this.planId)}`;
  }
}
