// Plans, watched live: the list (GET /plans) and one plan's page (GET /plans/{id}), both changed in place by the
// `plan_update` messages of /ws (the plan view, as GET answers it). Per VM: status, stage, bytes, rate, ETA, the
// limit holding a waiting VM, its job, and a warm VM's rounds, last round's changed bytes and predicted downtime;
// the actions are the plans API (retry the failed VMs, cancel the plan or one VM, roll one VM back), disabled where
// the key's role does not reach them, and a warm VM's cutover (one or all), shown only to a key that may ask it.
import { api } from './api.js';
import { h, badge, bytes, duration, progressBar, say, time } from './dom.js';
// The plan state table (domain/plan-states.ts), served by the daemon as a module: never copied here.
import { PLAN_FINAL, VM_RETRYABLE, VM_TRANSITIONS } from './plan-states.js';

const FINAL = new Set(PLAN_FINAL);
const pct = (done, total) => (total ? (100 * done) / total : 0);
const rate = (r) => (r ? `${bytes(r)}/s` : '');
const enc = encodeURIComponent;

export class PlansList {
  constructor(el) {
    this.el = el;
    this.rows = new Map();
    this.body = h('tbody');
    el.replaceChildren(h('div', { class: 'toolbar' }, h('h2', {}, 'Plans'), h('a', { href: '#/migrate' }, 'New migration…')),
      h('div', { class: 'scroll' }, h('table', { class: 'plans' }, h('thead', {}, h('tr', {}, ['Plan', 'Status', 'VMs', 'Progress', 'Rate', 'ETA', 'Created'].map((t) => h('th', {}, t)))), this.body)));
  }

  async load() {
    const { plans } = await api('GET', '/plans');
    this.body.replaceChildren(...plans.reverse().map((p) => this.row(p)));
    if (!plans.length) this.body.append(h('tr', {}, h('td', { colspan: 7, class: 'empty' }, 'no plans yet')));
  }

  row(p) {
    const tr = h('tr', { dataset: { id: p.id } });
    this.rows.set(p.id, tr);
    this.fill(tr, p);
    return tr;
  }

  fill(tr, p) {
    tr.replaceChildren(h('td', {}, h('a', { href: `#/plan/${enc(p.id)}` }, p.name), h('small', {}, p.id)), h('td', {}, badge(p.status)),
      h('td', {}, Object.entries(p.counts).map(([k, n]) => `${n} ${k}`).join(', ')),
      h('td', {}, progressBar(pct(p.bytes_done, p.total_bytes), p.status)), h('td', {}, rate(p.rate_bytes_per_second)), h('td', {}, duration(p.eta_seconds)), h('td', {}, time(p.created_at)));
  }

  plan(p) { const tr = this.rows.get(p.id); if (tr) this.fill(tr, p); else void this.load().catch((e) => console.warn(`plans not re-read: ${e.message}`)); }
}

/** A warm VM still copying in a running plan: what POST /plans/{id}/cutover acts on. */
const cuttable = (p, v) => p.status === 'running' && v.status === 'running' && v.warm?.status === 'copying';

/** A warm VM's figures (GET /plans/{id} per VM `warm`): rounds, the last round's changed bytes, the prediction. */
function warmCell(v) {
  const w = v.warm;
  if (!w) return h('td', { class: 'warm' });
  const last = w.rounds?.[w.rounds.length - 1];
  return h('td', { class: 'warm' },
    h('span', { class: 'warm-rounds' }, `${w.rounds?.length ?? 0} rounds`),
    last ? h('small', { class: 'warm-changed' }, `last: ${bytes(last.changed_bytes)} changed`) : '',
    w.downtime ? h('small', { class: 'warm-downtime' }, `down ${duration(w.downtime.seconds)}`)
      : h('small', { class: 'warm-predicted', title: w.prediction?.basis ?? '' }, w.prediction ? `predicted downtime ${duration(w.prediction.seconds)}` : 'no prediction yet'),
    w.cutover_requested && w.status === 'copying' ? h('small', { class: 'warm-asked' }, 'cutover requested') : '');
}

export class PlanPage {
  constructor(el, id, me) {
    Object.assign(this, { el, id, canSubmit: me.roles.includes('submit'), canAdmin: me.roles.includes('admin') });
    this.msg = h('div', { class: 'msg', id: 'plan-msg' });
    this.box = h('div');
    el.replaceChildren(h('a', { href: '#/plans' }, '‹ all plans'), this.box, this.msg);
  }

  async load() { this.show(await api('GET', `/plans/${enc(this.id)}`)); }

  /** A plan_update from /ws, or an action's answer: the whole view is the new state. */
  plan(p) { if (p.id === this.id) this.show(p); }

  /** A click handler that calls the API and shows its answer (the new plan view) or its error. */
  act(method, path, body, done) {
    const run = async () => {
      try { this.show(await api(method, path, body)); say(this.msg, done); } catch (e) { say(this.msg, e.message, false); }
    };
    return () => void run();
  }

  show(p) {
    this.p = p;
    this.warm = p.vms.some((v) => v.warm);
    const base = `/plans/${enc(p.id)}`;
    const retryable = p.vms.some((v) => VM_RETRYABLE.includes(v.status));
    this.box.replaceChildren(
      h('h2', { id: 'plan-title' }, p.name, ' ', h('span', { id: 'plan-status' }, badge(p.status))),
      h('div', { class: 'job-progress' }, progressBar(pct(p.bytes_done, p.total_bytes), p.status),
        h('span', {}, `${bytes(p.bytes_done)} of ${bytes(p.total_bytes)}`), h('span', {}, rate(p.rate_bytes_per_second)), h('span', {}, p.eta_seconds != null ? `ETA ${duration(p.eta_seconds)}` : '')),
      h('p', { class: 'hint' }, `${p.vms.length} VMs → ${p.destination?.virt_uri ?? 'the default host'}; `, Object.entries(p.counts).map(([k, n]) => `${n} ${k}`).join(', '),
        p.started_at ? `; started ${time(p.started_at)}` : '', p.finished_at ? `; finished ${time(p.finished_at)}` : ''),
      h('div', { class: 'actions' },
        p.status === 'pending' ? h('button', { class: 'primary', id: 'plan-start', disabled: !this.canSubmit, onclick: this.act('POST', `${base}/start`, undefined, 'started') }, 'Start') : '',
        h('button', { id: 'plan-retry', disabled: !this.canSubmit || p.status === 'pending' || p.status === 'running' || !retryable, onclick: this.act('POST', `${base}/retry`, undefined, 'failed VMs run again') }, 'Retry failed VMs'),
        h('button', { class: 'danger', id: 'plan-cancel', disabled: !this.canSubmit || FINAL.has(p.status), onclick: this.act('POST', `${base}/cancel`, undefined, 'cancel requested') }, 'Cancel plan'),
        this.canSubmit && p.vms.some((v) => cuttable(p, v) && !v.warm.cutover_requested) ? h('button', { class: 'primary', id: 'plan-cutover', onclick: this.act('POST', `${base}/cutover`, undefined, 'cutover requested for every warm VM') }, 'Cut over all') : ''),
      h('div', { class: 'scroll' }, h('table', { class: 'plan-vms' },
        h('thead', {}, h('tr', {}, ['VM', 'Status', 'Stage', 'Progress', 'Rate', 'ETA', ...(this.warm ? ['Warm'] : []), 'Waiting for / error', ''].map((t) => h('th', {}, t)))),
        h('tbody', {}, p.vms.map((v) => this.vmRow(base, v))))),
    );
  }

  vmRow(base, v) {
    const name = v.vm_path.split('/').pop();
    const canRollback = this.canAdmin && v.job_id && (VM_TRANSITIONS[v.status] ?? []).includes('rolled_back');
    return h('tr', { dataset: { vm: v.vm_path, status: v.status } },
      h('td', {}, name, v.job_id ? h('small', {}, h('a', { href: `#/job/${enc(v.job_id)}` }, 'job')) : ''),
      h('td', { class: 'vm-status' }, badge(v.status)), h('td', { class: 'stage' }, v.stage || ''),
      h('td', {}, progressBar(pct(v.bytes_done, v.total_bytes), v.status), h('small', {}, v.total_bytes ? `${bytes(v.bytes_done)} of ${bytes(v.total_bytes)}` : '')),
      h('td', {}, rate(v.rate_bytes_per_second)), h('td', {}, duration(v.eta_seconds)), this.warm ? warmCell(v) : '',
      h('td', { class: v.error ? 'err' : 'waiting' }, v.error || v.waiting_reason || (v.rollback?.detail ? `rolled back: ${v.rollback.detail}` : '')),
      h('td', { class: 'actions' },
        this.canSubmit && cuttable(this.p, v) && !v.warm.cutover_requested ? h('button', { class: 'primary vm-cutover', onclick: this.act('POST', `${base}/cutover`, { vm_path: v.vm_path }, `cutover of ${name} requested`) }, 'Cut over') : '',
        ['running', 'pending'].includes(v.status) && this.p.status === 'running' ? h('button', { class: 'danger vm-cancel', disabled: !this.canSubmit, onclick: this.act('POST', `${base}/cancel`, { vm_path: v.vm_path }, `cancel of ${name} requested`) }, 'Cancel') : '',
        h('button', { class: 'danger rollback', disabled: !canRollback, title: this.canAdmin ? 'remove what Ferry created on the target, power the source back on' : 'needs an admin key',
          onclick: this.act('POST', `${base}/vms/${enc(v.vm_path)}/rollback`, undefined, `${name} rolled back`) }, 'Roll back')));
  }
}
