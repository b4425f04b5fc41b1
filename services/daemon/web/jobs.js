// Jobs: the paged list (server-side paging and filtering, live over /ws), one job's page (state history and
// live progress events over SSE), and the conversion form.
import { api, jobEvents } from './api.js';
import { h, $, badge, progressBar, rateText, duration, time, say, bytes } from './dom.js';

const STATUSES = ['pending', 'running', 'completed', 'failed', 'cancelled'];
const ACTIVE = new Set(['pending', 'running']);
const PAGE = 50;

async function cancel(id, msgEl) {
  try {
    const r = await api('POST', '/jobs/cancel', { job_ids: [id] });
    if (r.failed.length) say(msgEl, `could not cancel ${id}: ${r.errors[id]}`, false);
    else say(msgEl, `cancel requested for ${id}`);
  } catch (e) { say(msgEl, e.message, false); }
}

/** Rate and ETA come from the daemon's /jobs/{id}/progress (one rule for both); asked at most every 1.5 s per job. */
class ProgressCache {
  constructor(onChange) { this.onChange = onChange; this.last = new Map(); this.data = new Map(); }
  want(id) {
    const t = this.last.get(id) || 0;
    if (Date.now() - t < 1500) return;
    this.last.set(id, Date.now());
    api('GET', `/jobs/${encodeURIComponent(id)}/progress`).then((p) => { this.data.set(id, p); this.onChange(id, p); })
      // The rate shown stays the last one read; the next update of the job asks again (at most every 1.5 s).
      .catch((e) => console.warn(`progress of ${id} not read: ${e.message}; asked again on its next update`));
  }
  get(id) { return this.data.get(id); }
}

export class JobsList {
  constructor(el, params) {
    this.el = el;
    this.status = params.get('status') || '';
    this.offset = Number(params.get('offset') || 0);
    this.rows = new Map();
    this.progress = new ProgressCache((id, p) => this.fillRate(id, p));
    this.refetchTimer = null;
    this.render();
    this.load();
  }

  render() {
    const filter = h('select', { id: 'status-filter', onchange: (e) => { location.hash = `#/jobs?status=${e.target.value}`; } },
      h('option', { value: '' }, 'all states'), STATUSES.map((s) => h('option', { value: s, selected: s === this.status }, s)));
    this.pager = h('span', { class: 'pager' });
    this.msg = h('div', { class: 'msg' });
    this.body = h('tbody');
    this.el.replaceChildren(
      h('div', { class: 'toolbar' }, h('label', {}, 'Show ', filter), this.pager),
      this.msg,
      h('table', { class: 'jobs' },
        h('thead', {}, h('tr', {}, ['Job', 'Name', 'State', 'Progress', 'Rate', 'ETA', 'Created', ''].map((t) => h('th', {}, t)))),
        this.body),
    );
  }

  async load() {
    const q = `?limit=${PAGE}&offset=${this.offset}${this.status ? `&status=${this.status}` : ''}`;
    try {
      const page = await api('GET', `/jobs${q}`);
      this.total = page.total;
      this.rows.clear();
      this.body.replaceChildren(...page.jobs.map((j) => this.row(j)));
      if (!page.jobs.length) this.body.append(h('tr', {}, h('td', { colspan: 8, class: 'empty' }, 'no jobs')));
      this.renderPager();
    } catch (e) { say(this.msg, e.message, false); }
  }

  renderPager() {
    const from = this.total ? this.offset + 1 : 0;
    const to = Math.min(this.offset + PAGE, this.total);
    const go = (off) => { location.hash = `#/jobs?status=${this.status}&offset=${off}`; };
    this.pager.replaceChildren(
      h('button', { class: 'prev', disabled: this.offset === 0, onclick: () => go(Math.max(0, this.offset - PAGE)) }, '‹ newer'),
      h('span', { class: 'range' }, `${from}–${to} of ${this.total}`),
      h('button', { class: 'next', disabled: to >= this.total, onclick: () => go(this.offset + PAGE) }, 'older ›'),
    );
  }

  row(j) {
    const tr = h('tr', { dataset: { id: j.id } });
    this.rows.set(j.id, tr);
    this.fill(tr, j);
    return tr;
  }

  fill(tr, j) {
    tr.dataset.status = j.status;
    const p = this.progress.get(j.id);
    tr.replaceChildren(
      h('td', {}, h('a', { href: `#/job/${encodeURIComponent(j.id)}` }, j.id.length > 20 ? j.id.slice(0, 8) + '…' + j.id.slice(-6) : j.id)),
      h('td', {}, j.definition?.name || j.definition?.operation || ''),
      h('td', {}, badge(j.status)),
      h('td', { class: 'progress' }, progressBar(j.progress?.percent_complete, j.status), h('small', {}, j.progress?.phase || '')),
      h('td', { class: 'rate' }, j.status === 'running' ? rateText(p) : ''),
      h('td', { class: 'eta' }, j.status === 'running' && p?.eta_seconds != null ? duration(p.eta_seconds) : ''),
      h('td', { class: 'created' }, time(j.created_at)),
      h('td', {}, ACTIVE.has(j.status) ? h('button', { class: 'cancel danger', onclick: () => cancel(j.id, this.msg) }, 'Cancel') : ''),
    );
    if (j.status === 'running') this.progress.want(j.id);
  }

  fillRate(id, p) {
    const tr = this.rows.get(id);
    if (!tr || tr.dataset.status !== 'running') return;
    $('.rate', tr).textContent = rateText(p);
    $('.eta', tr).textContent = p.eta_seconds != null ? duration(p.eta_seconds) : '';
  }

  /** A job_update from /ws: change the row in place; a job not shown may belong on the first page, which is
   *  then asked for again (at most once a second, so a burst of updates is one request). */
  update(j) {
    const tr = this.rows.get(j.id);
    if (tr && (!this.status || this.status === j.status)) return this.fill(tr, j);
    if (tr || (this.offset === 0 && (!this.status || this.status === j.status))) {
      if (!this.refetchTimer) this.refetchTimer = setTimeout(() => { this.refetchTimer = null; this.load(); }, 1000);
    }
  }

  destroy() { clearTimeout(this.refetchTimer); }
}

export class JobPage {
  constructor(el, id) {
    this.el = el;
    this.id = id;
    this.events = [];
    this.el.replaceChildren(h('p', {}, 'loading…'));
    this.load().then(() => { this.stop = jobEvents(id, (ev, evId) => this.onEvent(ev, evId), () => this.load()); });
  }

  async load() {
    try {
      this.job = await api('GET', `/jobs/${encodeURIComponent(this.id)}/record`);
      this.prog = await api('GET', `/jobs/${encodeURIComponent(this.id)}/progress`).catch(() => null);
      this.render();
    } catch (e) {
      this.el.replaceChildren(h('p', { class: 'msg err' }, e.status === 404 ? `job ${this.id} not found` : e.message), h('a', { href: '#/jobs' }, '‹ all jobs'));
    }
  }

  render() {
    const j = this.job;
    const s = j.spec || {};
    this.msg = h('div', { class: 'msg' });
    this.eventsBody = h('tbody', {}, this.events.map((e) => this.eventRow(e)));
    const field = (k, v) => (v === undefined || v === null || v === '' ? null : h('tr', {}, h('th', {}, k), h('td', {}, v)));
    this.el.replaceChildren(
      h('a', { href: '#/jobs' }, '‹ all jobs'),
      h('h2', {}, j.definition?.name || s.operation, ' ', badge(j.status)),
      h('div', { class: 'job-progress', id: 'job-progress' }, progressBar(j.progress?.percent_complete, j.status),
        h('span', { class: 'phase' }, j.progress?.phase || ''),
        h('span', { class: 'rate' }, j.status === 'running' ? rateText(this.prog) : ''),
        h('span', { class: 'eta' }, j.status === 'running' && this.prog?.eta_seconds != null ? `ETA ${duration(this.prog.eta_seconds)}` : '')),
      ACTIVE.has(j.status) ? h('button', { class: 'cancel danger', onclick: async () => { await cancel(j.id, this.msg); this.load(); } }, 'Cancel job') : '',
      this.msg,
      h('div', { class: 'cols' },
        h('section', {}, h('h3', {}, 'Job'), h('table', { class: 'kv' }, h('tbody', {},
          field('id', j.id), field('operation', s.operation), field('state', j.state),
          field('image', s.image ? `${s.image.path} (${s.image.format})` : null),
          field('parameters', Object.keys(s.parameters || {}).length ? h('code', {}, JSON.stringify(s.parameters)) : null),
          field('priority', j.priority), field('queue', j.queue), field('worker', j.worker_id),
          field('attempts', `${j.attempts} of ${j.max_attempts}`), field('created', time(j.created_at)),
          field('started', time(j.started_at)), field('finished', time(j.completed_at)),
          field('error', j.error ? h('span', { class: 'err' }, j.error) : null),
          field('result', j.result ? h('code', {}, JSON.stringify(j.result)) : null)))),
        h('section', {}, h('h3', {}, 'State history'), h('table', { class: 'history' },
          h('thead', {}, h('tr', {}, h('th', {}, 'State'), h('th', {}, 'When'), h('th', {}, 'Reason'))),
          h('tbody', {}, (j.state_history || []).map((e) => h('tr', {}, h('td', {}, e.state), h('td', {}, time(e.timestamp)), h('td', {}, e.reason, e.worker_id ? ` (${e.worker_id})` : ''))))))),
      h('section', {}, h('h3', {}, 'Progress events (live)'), h('table', { class: 'events' },
        h('thead', {}, h('tr', {}, h('th', {}, 'When'), h('th', {}, 'Phase'), h('th', {}, '%'), h('th', {}, 'Message'), h('th', {}, 'Bytes'))),
        this.eventsBody)),
    );
  }

  eventRow(e) {
    const d = e.details || {};
    const b = d.bytes_processed ?? d.bytes_downloaded;
    return h('tr', {}, h('td', {}, time(e.timestamp)), h('td', {}, e.phase), h('td', {}, String(e.percentage)), h('td', {}, e.message || ''),
      h('td', {}, b !== undefined ? `${bytes(Number(b))}${d.total_bytes ? ' / ' + bytes(Number(d.total_bytes)) : ''}` : ''));
  }

  async onEvent(ev) {
    this.events.push(ev);
    if (this.events.length > 500) this.events.shift();
    this.eventsBody?.append(this.eventRow(ev));
    if (this.job && !['completed', 'failed', 'cancelled'].includes(this.job.status)) {
      this.job.progress = { ...this.job.progress, percent_complete: ev.percentage, phase: ev.phase };
      this.prog = await api('GET', `/jobs/${encodeURIComponent(this.id)}/progress`).catch(() => this.prog);
      const box = $('#job-progress', this.el);
      if (box) box.replaceChildren(progressBar(ev.percentage, this.job.status), h('span', { class: 'phase' }, ev.phase),
        h('span', { class: 'rate' }, rateText(this.prog)), h('span', { class: 'eta' }, this.prog?.eta_seconds != null ? `ETA ${duration(this.prog.eta_seconds)}` : ''));
    }
  }

  /** A job_update from /ws: a change of state reloads the page (new history entry). */
  update(j) { if (j.id === this.id && this.job && j.status !== this.job.status) this.load(); }

  destroy() { this.stop?.(); }
}

export function submitForm(el) {
  const msg = h('div', { class: 'msg', id: 'submit-msg' });
  const form = h('form', { id: 'convert-form', class: 'form', onsubmit: async (e) => {
    e.preventDefault();
    const f = new FormData(form);
    const body = {
      operation: 'convert',
      image: { path: f.get('image_path'), format: f.get('image_format') },
      parameters: { output_format: f.get('output_format'), output_dir: f.get('output_dir'), compress: f.get('compress') === 'on' },
      execution_policy: { priority: Number(f.get('priority')) },
    };
    try {
      const r = await api('POST', '/jobs/operation', body);
      say(msg, r.message);
      location.hash = `#/job/${encodeURIComponent(r.job_id)}`;
    } catch (err) { say(msg, err.body?.fields ? err.body.fields.map((x) => `${x.field}: ${x.message}`).join('; ') : err.message, false); }
  } },
  h('label', {}, 'Source image path', h('input', { name: 'image_path', required: true, placeholder: '/srv/images/disk.vmdk' })),
  h('label', {}, 'Source format', h('select', { name: 'image_format' }, ['vmdk', 'vhdx', 'vhd', 'qcow2', 'raw', 'vdi'].map((x) => h('option', {}, x)))),
  h('label', {}, 'Output format', h('select', { name: 'output_format' }, ['qcow2', 'raw', 'vdi'].map((x) => h('option', {}, x)))),
  h('label', {}, 'Output directory', h('input', { name: 'output_dir', required: true, placeholder: '/srv/converted' })),
  h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'compress' }), ' compress (qcow2 only)'),
  h('label', {}, 'Priority (0–100, higher first)', h('input', { name: 'priority', type: 'number', min: '0', max: '100', value: '50' })),
  h('button', { type: 'submit', class: 'primary' }, 'Submit conversion'));
  el.replaceChildren(h('h2', {}, 'Convert a disk image'), h('p', { class: 'hint' }, 'Runs qemu-img convert on a worker with the img_tool capability; the file is written as <job id>.<format> in the output directory.'), form, msg);
}
